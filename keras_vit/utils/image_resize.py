"""Resizing of image arrays: the centre crop of the evaluation transform, and its one resampling.

The pixels of the image path (`keras_vit.data.images`, which decodes files)
and of `ViTClassifier.predict` on raw images of another size are resized
here, with Pillow's bicubic filter on [0, 255] arrays: numpy and Pillow only,
no backend and nothing above `utils`, so the models can use it as well as
the data pipeline.
"""

import numpy as np

from keras_vit.utils.values import to_pair

# What every door of the image path does to a file, recorded in each preset's metadata.json:
# `keras_vit.data.images.read_image` turns the image upright and composites its alpha, the
# functions below resize and crop it.
EVAL_TRANSFORM = {"exif_orientation": True, "alpha": "over white", "resize": "shorter side to the model's size",
                  "crop": "centre", "interpolation": "bicubic"}


def pil_image():
    """Pillow's `Image` module, or an error that says how to install Pillow."""
    try:
        from PIL import Image
    except ImportError as error:  # pragma: no cover - Pillow is a dependency
        raise ImportError("Reading images needs Pillow: `pip install pillow`.") from error
    return Image


def _to_pil(image):
    array = np.clip(np.rint(image), 0, 255).astype("uint8")
    return pil_image().fromarray(array[..., 0] if array.shape[-1] == 1 else array)


def resize_region(image, box, size):
    """Crop `box` (left, top, right, bottom; fractional allowed) of `image` and resize it to `size`, bicubic.

    The one resampling of the image path: `center_crop` and the training
    crops of `keras_vit.data.augment` both use it. A box a rounding error
    outside the image (Pillow refuses any) is clamped to its edges.
    """
    height, width = size
    left, top, right, bottom = (float(v) for v in box)
    box = (min(max(left, 0.0), image.shape[1]), min(max(top, 0.0), image.shape[0]),
           min(max(right, 0.0), image.shape[1]), min(max(bottom, 0.0), image.shape[0]))
    resized = _to_pil(image).resize((width, height), pil_image().BICUBIC, box=box)
    array = np.asarray(resized, dtype="float32")
    return array[..., None] if image.shape[-1] == 1 else array


def center_crop_box(height, width, out_h, out_w):
    """The largest centred region of a `height x width` image with the aspect ratio of `out_h x out_w`.

    Computed from integers: each coordinate is one exact fraction rounded
    once to the nearest float (Python's `int / int`), so it never leaves
    `[0, width] x [0, height]` (Pillow refuses a box that does). A float
    formula (`out_h * (height / out_h)`) missed `height` by a rounding
    error for some sizes, e.g. a top of -1.4e-14 for 232 x 309 at 224.

    Args:
        height: int. The image's height.
        width: int. The image's width.
        out_h: int. The output's height.
        out_w: int. The output's width.

    Returns:
        A tuple of floats `(left, top, right, bottom)`, Pillow's box.
    """
    height, width, out_h, out_w = int(height), int(width), int(out_h), int(out_w)
    if height * out_w <= width * out_h:
        # The full height; the crop is `height * out_w / out_h` wide, centred: left = (width - that) / 2.
        return ((width * out_h - height * out_w) / (2 * out_h), 0.0,
                (width * out_h + height * out_w) / (2 * out_h), float(height))
    # The full width; the crop is `width * out_h / out_w` high, centred.
    return (0.0, (height * out_w - width * out_h) / (2 * out_w),
            float(width), (height * out_w + width * out_h) / (2 * out_w))


def center_crop(image, size):
    """The evaluation transform: resize the shorter side to fit `size`, then crop the centre.

    Args:
        image: float array `(height, width, channels)` of [0, 255] pixels.
        size: int or `(height, width)` of the output.

    Returns:
        float32 array `size + (channels,)`; the image itself when it already
        has that size.
    """
    out_h, out_w = to_pair(size, "size")
    height, width = image.shape[:2]
    if (height, width) == (out_h, out_w):
        return np.asarray(image, dtype="float32")
    return resize_region(image, center_crop_box(height, width, out_h, out_w), (out_h, out_w))


def resize_images(images, image_size):
    """A batch of raw images of any size brought to `image_size` by `center_crop`, image by image.

    Args:
        images: array `(batch, height, width, channels)` of [0, 255] pixels.
        image_size: int or `(height, width)`.

    Returns:
        float32 array `(batch,) + image_size + (channels,)`.
    """
    return np.stack([center_crop(np.asarray(image), image_size) for image in images])
