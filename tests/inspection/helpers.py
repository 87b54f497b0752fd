"""Tiny models for the inspection tests, built once per test module."""

import keras
import numpy as np

from keras_vit import ViTBackbone

TINY = dict(hidden_dim=16, num_layers=2, num_heads=2, mlp_dim=32)


def sharpen(backbone, factor=4.0, seed=0):
    """Scale the qkv kernels and randomise tokens so the attention is far from uniform."""
    rng = np.random.default_rng(seed)
    for i in range(backbone.num_layers):
        qkv = backbone.get_layer(f"transformer_block_{i}").attention.qkv
        qkv.kernel.assign(keras.ops.convert_to_numpy(qkv.kernel) * factor)
    encoder = backbone.get_layer("patch_encoder")
    for name in ("class_token", "register_tokens", "position_embedding_table"):
        variable = getattr(encoder, name, None)
        if variable is not None:
            variable.assign(rng.normal(scale=0.5, size=variable.shape).astype("float32"))
    return backbone


class StridedStem(keras.layers.Layer):
    """A 2x2 stride-2 convolution: the smallest CNN stem, so the hybrid's tokens are feature-map cells."""

    def __init__(self, filters=8, **kwargs):
        super().__init__(**kwargs)
        self.filters = filters
        self.conv = keras.layers.Conv2D(filters, 2, strides=2, name="conv")

    def build(self, input_shape):
        self.conv.build(input_shape)
        self.built = True

    def call(self, x):
        return self.conv(x)

    def compute_output_shape(self, input_shape):
        return self.conv.compute_output_shape(input_shape)

    def get_config(self):
        return {**super().get_config(), "filters": self.filters}

    def numpy(self, image):
        """The same stem in numpy for one image: each 2x2 cell times the kernel."""
        kernel, bias = [keras.ops.convert_to_numpy(w).astype("float64") for w in self.conv.weights]
        height, width, _ = image.shape
        out = np.zeros((height // 2, width // 2, self.filters))
        for r in range(height // 2):
            for c in range(width // 2):
                out[r, c] = np.einsum("ijc,ijcf->f", image[2 * r : 2 * r + 2, 2 * c : 2 * c + 2], kernel) + bias
        return out


def build(case):
    """A tiny backbone for `case`, sharpened; hybrids return `(backbone, stem)`."""
    keras.utils.set_random_seed(0)
    if case == "class_registers_nonsquare":
        backbone = ViTBackbone(image_size=(8, 12), patch_size=4, num_register_tokens=2,
                               prefix_position_embedding=False, **TINY)
    elif case == "class_token":
        backbone = ViTBackbone(image_size=8, patch_size=2, **TINY)
    elif case == "gap_no_class_token":
        backbone = ViTBackbone(image_size=8, patch_size=2, use_class_token=False, num_channels=1, **TINY)
    elif case == "hybrid":
        stem = StridedStem(name="stem")
        backbone = ViTBackbone(image_size=16, patch_size=2, stem=stem, **TINY)
        return sharpen(backbone), stem
    else:
        raise ValueError(case)
    return sharpen(backbone), None


def images_for(backbone, count=2, seed=1):
    height, width, channels = backbone.input_shape[1:]
    return np.random.default_rng(seed).uniform(0, 255, size=(count, height, width, channels)).astype("float32")
