"""Small image folders and tiny models for the fine-tuning tests."""

import os

import numpy as np


def write_folder(root, classes=3, per_class=8, size=(10, 12), mode="RGB", seed=0, extension="png"):
    """A class-per-subfolder folder whose classes differ by colour (so a model can learn them)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    for label in range(classes):
        os.makedirs(os.path.join(root, f"class_{label}"), exist_ok=True)
        for index in range(per_class):
            base = np.zeros(size + (3,))
            base[..., label % 3] = 200
            pixels = np.clip(base + rng.normal(0, 30, base.shape), 0, 255).astype("uint8")
            image = Image.fromarray(pixels, "RGB").convert(mode)
            image.save(os.path.join(root, f"class_{label}", f"{index}.{extension}"))
    return root


def tiny_backbone_file(path, image_size=8, num_channels=3, dropout=0.1, seed=0):
    """A saved tiny ViTBackbone (the kind of .keras file `keras-vit pretrain` writes)."""
    import keras

    import keras_vit

    keras.utils.set_random_seed(seed)
    backbone = keras_vit.ViTBackbone(image_size=image_size, patch_size=4, num_channels=num_channels, hidden_dim=16,
                                     num_layers=1, num_heads=2, mlp_dim=32, dropout=dropout)
    backbone.save(path)
    return path
