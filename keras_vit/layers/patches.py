"""Cut images into flattened, non-overlapping patches."""

import keras
from keras import ops

from keras_vit.utils.values import to_pair


def _looks_channels_first(shape, num_channels):
    # (B, C, H, W): the expected channel count second and something else
    # last. Without a known channel count, a small axis second and a large
    # one last only makes a hint (a hybrid's feature map can be (B, 4, 6, 128)).
    _, second, _, last = shape
    if second is None or last is None:
        return False
    if num_channels is not None:
        return second == num_channels and last != num_channels
    return second in (1, 3, 4) and last > 4


def _channels_first_advice(shape, num_channels):
    expected = "C" if num_channels is None else num_channels
    return (
        f"The input shape {tuple(shape)} looks channels-first (batch, channels, height, width). Transpose it "
        f"with `ops.transpose(x, (0, 2, 3, 1))` (numpy: `np.transpose(x, (0, 2, 3, 1))`) to get "
        f"{(shape[0], shape[2], shape[3], shape[1])}; the model takes {expected} channel(s) last."
    )


def check_dtype(images, layer_name="Patches"):
    """Refuse boolean images: True/False are not pixels (a mask passed by mistake)."""
    if keras.backend.standardize_dtype(images.dtype) == "bool":
        raise ValueError(
            f"{layer_name} received boolean images (shape {tuple(images.shape)}). True/False are not pixel "
            "values; convert them first, e.g. `ops.cast(x, 'float32') * 255` for [0, 255] pixels."
        )


def check_image_shape(shape, patch_size, num_channels=None, layer_name="Patches"):
    """Raise a `ValueError` that names the fix if `shape` cannot be patched.

    Args:
        shape: tuple. A `(batch, height, width, channels)` shape; entries may
            be `None` when unknown.
        patch_size: tuple. `(patch_height, patch_width)`.
        num_channels: int or `None`. The channel count the layer expects.
        layer_name: str. Used in the message.
    """
    if len(shape) != 4:
        raise ValueError(
            f"{layer_name} expects a batch of images shaped (batch, height, "
            f"width, channels) in channels-last order. Received an input of "
            f"rank {len(shape)} with shape {tuple(shape)}. Add a batch axis "
            "with `images[None]` for one image, or a channel axis with "
            "`images[..., None]` for grayscale."
        )
    batch, height, width, channels = shape
    if batch == 0:
        raise ValueError(
            f"{layer_name} received an empty batch (shape {tuple(shape)}): there is nothing to compute. "
            "Pass at least one image; check the filter or split that produced the batch."
        )
    if num_channels is not None and _looks_channels_first(shape, num_channels):
        raise ValueError(
            f"{layer_name} expects channels-last images (batch, height, width, channels). "
            + _channels_first_advice(shape, num_channels)
        )
    for size, patch, axis in ((height, patch_size[0], "height"), (width, patch_size[1], "width")):
        if size is not None and size % patch != 0:
            if _looks_channels_first(shape, num_channels):
                raise ValueError(
                    f"{layer_name}: image {axis} {size} is not divisible by the patch {axis} {patch}. "
                    + _channels_first_advice(shape, num_channels)
                )
            raise ValueError(
                f"Image {axis} {size} is not divisible by the patch {axis} "
                f"{patch}. Resize or crop the images to a multiple of {patch}, "
                f"or choose a patch size that divides {size}. Received: "
                f"image shape {tuple(shape[1:])}, patch_size={patch_size}"
            )
    if num_channels is not None and channels is not None and channels != num_channels:
        raise ValueError(
            f"The model expects images with {num_channels} channel(s), but the "
            f"input has {channels}. Received: image shape {tuple(shape[1:])}. "
            + (
                "Repeat a grayscale channel with `np.repeat(images, 3, axis=-1)`, "
                if num_channels == 3 and channels == 1
                else ""
            )
            + f"or build the model with `num_channels={channels}`."
        )


@keras.saving.register_keras_serializable(package="keras_vit")
class Patches(keras.layers.Layer):
    """Cuts images into non-overlapping patches and flattens each one.

    This is the first step of the Vision Transformer: an image of size
    `(H, W, C)` becomes a sequence of `N = (H / P_h) * (W / P_w)` vectors of
    length `P_h * P_w * C`. Patches are ordered row by row (row-major, as in
    the paper) and each patch is flattened in (row, column, channel) order.
    The layer only reshapes and transposes with static shapes, so it compiles
    well under XLA.

    Args:
        patch_size: int or tuple of two ints. The patch height and width.
        **kwargs: Base layer keyword arguments, such as `name` and `dtype`.

    Call arguments:
        images: A tensor of shape `(batch, height, width, channels)`; height
            and width must be multiples of the patch size.

    Returns:
        A tensor of shape `(batch, num_patches, patch_h * patch_w * channels)`.

    Example:

    >>> images = np.zeros((2, 32, 48, 3))
    >>> keras_vit.layers.Patches(patch_size=16)(images).shape
    (2, 6, 768)
    """

    def __init__(self, patch_size, **kwargs):
        super().__init__(**kwargs)
        self.patch_size = to_pair(patch_size, "patch_size")

    def build(self, input_shape):
        check_image_shape(input_shape, self.patch_size, layer_name=f"Layer '{self.name}'")
        self.built = True

    def call(self, images):
        check_dtype(images, layer_name=f"Layer '{self.name}'")
        check_image_shape(tuple(images.shape), self.patch_size, layer_name=f"Layer '{self.name}'")
        patch_h, patch_w = self.patch_size
        _, height, width, channels = images.shape
        rows, cols = height // patch_h, width // patch_w
        # (B, rows, Ph, cols, Pw, C): split both spatial axes into grid x patch.
        x = ops.reshape(images, (-1, rows, patch_h, cols, patch_w, channels))
        # (B, rows, cols, Ph, Pw, C): bring the two grid axes together.
        x = ops.transpose(x, (0, 1, 3, 2, 4, 5))
        # (B, N, Ph * Pw * C)
        return ops.reshape(x, (-1, rows * cols, patch_h * patch_w * channels))

    def compute_output_shape(self, input_shape):
        check_image_shape(input_shape, self.patch_size, layer_name=f"Layer '{self.name}'")
        batch, height, width, channels = input_shape
        patch_h, patch_w = self.patch_size
        num_patches = None
        if height is not None and width is not None:
            num_patches = (height // patch_h) * (width // patch_w)
        features = None if channels is None else patch_h * patch_w * channels
        return (batch, num_patches, features)

    def get_config(self):
        config = super().get_config()
        config.update({"patch_size": self.patch_size})
        return config
