"""Pixel preprocessing carried inside the model."""

import keras
import numpy as np
from keras import ops

from keras_vit.layers.patches import check_dtype, check_image_shape


@keras.saving.register_keras_serializable(package="keras_vit")
class ImageNormalization(keras.layers.Layer):
    """Maps raw pixels to the range the weights were trained on.

    Computes `(images * scale - mean) / std` per channel, folded into one
    multiply-add. The defaults take [0, 255] pixels to [-1, 1], the
    preprocessing of the original ViT checkpoints; ImageNet-statistics
    models use `mean=(0.485, 0.456, 0.406)`, `std=(0.229, 0.224, 0.225)`.

    The layer also checks the image shape, so a wrong channel count or a
    missing batch axis fails with a message that says how to fix it.

    Args:
        scale: float. Multiplier applied first. Defaults to `1 / 255`.
        mean: float or sequence of floats, one per channel. Defaults to
            `0.5`.
        std: float or sequence of floats, one per channel. Defaults to
            `0.5`.
        num_channels: int or `None`. Expected channel count, checked on each
            call. Defaults to `None` (not checked).
        image_size: tuple of two ints or `None`. Expected `(height, width)`,
            checked on each call. Defaults to `None` (not checked).
        **kwargs: Base layer keyword arguments.
    """

    def __init__(self, scale=1.0 / 255.0, mean=0.5, std=0.5, num_channels=None, image_size=None, **kwargs):
        super().__init__(**kwargs)
        self.scale = float(scale)
        self.mean = self._per_channel(mean, "mean", num_channels)
        self.std = self._per_channel(std, "std", num_channels)
        if any(s <= 0 for s in self.std):
            raise ValueError(f"`std` must be positive. Received: std={std!r}")
        self.num_channels = num_channels
        self.image_size = None if image_size is None else tuple(image_size)
        # Fold (x * scale - mean) / std into x * multiplier + offset.
        self._multiplier = np.asarray([self.scale / s for s in self.std], "float32")
        self._offset = np.asarray([-m / s for m, s in zip(self.mean, self.std)], "float32")

    @staticmethod
    def _per_channel(value, name, num_channels):
        values = [float(value)] if np.isscalar(value) else [float(v) for v in value]
        if num_channels is not None and len(values) not in (1, num_channels):
            raise ValueError(
                f"`{name}` must have one value or one per channel ({num_channels}). "
                f"Received: {name}={value!r}"
            )
        return tuple(values)

    def _check(self, shape):
        if shape and shape[0] == 0:
            check_image_shape(shape, (1, 1), layer_name="The model")  # the empty-batch message
        if self.num_channels is None and self.image_size is None:
            return
        check_image_shape(shape, (1, 1), self.num_channels, layer_name="The model")
        size = tuple(shape[1:3])
        if self.image_size is not None and None not in size and size != self.image_size:
            height, width = self.image_size
            # Name the package's own transform first: `keras-vit predict`, the image folders and
            # `model.predict` on numpy batches all use it, so the pixels match what was evaluated.
            raise ValueError(
                f"The model was built for images of size {self.image_size} "
                f"(height, width) but received {size}. Resize them with "
                f"`keras_vit.data.resize_images(images, ({height}, {width}))` (shorter side to the "
                "size, centre crop, bicubic: what `model.predict` does to numpy batches itself), "
                f"inside a graph with `keras.layers.Resizing({height}, {width}, crop_to_aspect_ratio=True)`, "
                f"or build the model with `image_size={size}` (from_preset(..., image_size=...) "
                "resamples the position embedding of a pretrained model)."
            )

    def build(self, input_shape):
        self._check(tuple(input_shape))
        if keras.backend.backend() == "torch":
            # torch.compile cannot trace numpy attribute access (8 graph breaks per ViT forward,
            # one per cast): hold the constants as tensors. JAX and TensorFlow fold numpy constants.
            self._multiplier = ops.convert_to_tensor(self._multiplier)
            self._offset = ops.convert_to_tensor(self._offset)
        self.built = True

    def call(self, images):
        check_dtype(images, layer_name="The model")
        self._check(tuple(images.shape))
        images = ops.cast(images, self.compute_dtype)
        return images * ops.cast(self._multiplier, images.dtype) + ops.cast(self._offset, images.dtype)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "scale": self.scale,
                "mean": self.mean,
                "std": self.std,
                "num_channels": self.num_channels,
                "image_size": self.image_size,
            }
        )
        return config
