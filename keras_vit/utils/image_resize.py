"""Resizing of image arrays: a model's evaluation transform, and its one resampling.

The pixels of the image path (`keras_vit.data.images`, which decodes files)
and of `ViTClassifier.predict` on raw images of another size are resized
here, by the model's `ImageTransform` (a centre crop at a crop fraction or a
stretch, with Pillow's bicubic, bilinear or nearest filter on [0, 255]
arrays, in timm's arithmetic): numpy and Pillow only, no backend and nothing
above `utils`, so the models can use it as well as the data pipeline.
"""

import dataclasses
import math

import numpy as np

from keras_vit.utils.values import check_image_transform, to_pair

# Pillow's filter for each `interpolation` choice (`keras_vit.utils.values.INTERPOLATIONS`): the same
# numbers torchvision (timm's evaluation) and transformers' image processors get, both resample with Pillow.
_PILLOW_FILTERS = {"bicubic": "BICUBIC", "bilinear": "BILINEAR", "nearest": "NEAREST"}
TRANSFORM_ARGUMENTS = ("resize_mode", "crop_fraction", "interpolation", "alpha")
# A crop fraction derived from two sizes (224 / 256 from a Hugging Face processor) may land a hair below
# the size it came from: `size / fraction` is floored after this much slack (timm's own fractions,
# 0.875, 0.9, 0.95, 1.0, are nowhere near an integer boundary).
_FLOOR_SLACK = 1e-6
# Above this many pixels the resized image is not made whole (a 1 x 4096 strip resized to 224 rows would
# be 900,000 columns): only the region the centre crop keeps is resized, by `ImageTransform.crop_box`.
_WHOLE_RESIZE_PIXELS = 16_000_000


@dataclasses.dataclass(frozen=True)
class ImageTransform:
    """A model's evaluation transform: how an image of any size becomes its input.

    The four fields are `ViTBackbone` arguments (saved in its config, its
    `.keras` file and its preset, like `pixel_mean`); `image_transform(model)`
    reads them from a backbone or a classifier. Every door of the image path
    (`keras-vit predict`, `explain`, few-shot, `load_image`, the held-out
    images of an image folder, `ViTClassifier.predict` on raw arrays of
    another size) applies the model's own.

    Args:
        resize_mode: str. `"center_crop"`: resize the shorter side to
            `floor(size / crop_fraction)` and crop the model's size from the
            centre (timm's "center" mode, torchvision's `Resize` then
            `CenterCrop`). `"stretch"`: resize the whole image to
            `floor(size / crop_fraction)` on each side, the aspect ratio
            ignored, then crop the centre; with `crop_fraction=1` the image
            is stretched to the model's size (transformers'
            `ViTImageProcessor`, SigLIP; timm's "squash" mode otherwise).
            Defaults to `"center_crop"`.
        crop_fraction: float in (0, 1]. The share of the resized image's
            side the crop keeps (timm's `crop_pct`). Defaults to `1.0`.
        interpolation: str. `"bicubic"`, `"bilinear"` or `"nearest"`,
            Pillow's filter of that name. Defaults to `"bicubic"`.
        alpha: str. What happens to transparency when a file is read:
            `"white"` composites it over white (as a browser shows it),
            `"drop"` discards the alpha channel (Pillow's `convert("RGB")`,
            what timm, transformers and keras-hub do). Defaults to
            `"white"`.
    """

    resize_mode: str = "center_crop"
    crop_fraction: float = 1.0
    interpolation: str = "bicubic"
    alpha: str = "white"

    def __post_init__(self):
        check_image_transform(self.resize_mode, self.crop_fraction, self.interpolation, self.alpha)

    def config(self):
        """The four `ViTBackbone` arguments, as a dict."""
        return {key: getattr(self, key) for key in TRANSFORM_ARGUMENTS}

    def resized_size(self, height, width, size):
        """`(height, width)` the whole image is resized to before the centre crop of `size`.

        timm's arithmetic (`transforms_imagenet_eval`): the scaled size is
        `floor(size / crop_fraction)`; "center_crop" gives the shorter side
        that length and the longer side `int(length * longer / shorter)`
        (torchvision's `Resize(int)`) for a square model size, and
        `round(side / min(height / scaled_h, width / scaled_w))` for each side
        otherwise (timm's `ResizeKeepRatio`); "stretch" resizes to the
        scaled size itself.
        """
        out_h, out_w = to_pair(size, "size")
        scaled_h, scaled_w = (math.floor(side / self.crop_fraction + _FLOOR_SLACK) for side in (out_h, out_w))
        if self.resize_mode == "stretch":
            return scaled_h, scaled_w
        if scaled_h == scaled_w:
            if width <= height:
                return int(scaled_w * height / width), scaled_w
            return scaled_h, int(scaled_h * width / height)
        ratio = min(height / scaled_h, width / scaled_w)
        return max(out_h, round(height / ratio)), max(out_w, round(width / ratio))

    def crop_box(self, height, width, size):
        """The region of a `height x width` image that becomes the model's input: Pillow's box.

        The centre crop of the resized image at torchvision's whole-pixel
        offsets (`int(round((resized - size) / 2))`), mapped back onto the
        image: resizing that region alone, one direction at a time, gives the
        pixels of resizing the whole image and cropping (Pillow's kernels are
        placed by the same scale and clipped at the image's edges, not the
        box's), to a level where a kernel's position differs in its last bit.
        Used for images whose whole resized copy would be too large. Each coordinate
        is one fraction of integers rounded once, so it never leaves the
        image.
        """
        out_h, out_w = to_pair(size, "size")
        resized_h, resized_w = self.resized_size(height, width, size)
        top, left = int(round((resized_h - out_h) / 2.0)), int(round((resized_w - out_w) / 2.0))
        return (left * width / resized_w, top * height / resized_h,
                (left + out_w) * width / resized_w, (top + out_h) * height / resized_h)

    def __call__(self, image, size):
        """`image` (float `(height, width, channels)` in [0, 255]) as the model's input of `size`.

        Returns:
            float32 array `size + (channels,)`; the image itself when it
            already has that size and the transform would not resample it.
        """
        out_h, out_w = to_pair(size, "size")
        height, width = image.shape[:2]
        resized_h, resized_w = self.resized_size(height, width, size)
        if (resized_h, resized_w) == (height, width) == (out_h, out_w):
            return np.asarray(image, dtype="float32")
        if resized_h * resized_w > _WHOLE_RESIZE_PIXELS:
            # A long strip: only the kept region is resized, in Pillow's order (the rows, then the
            # columns), one direction per call: each pass is then within a level of the whole one's.
            left, top, right, bottom = self.crop_box(height, width, size)
            rows = resize_region(image, (left, 0, right, height), (height, out_w), self.interpolation)
            return resize_region(rows, (0, top, out_w, bottom), (out_h, out_w), self.interpolation)
        # timm's order exactly: the whole image resized, then whole pixels cropped from its centre.
        top, left = int(round((resized_h - out_h) / 2.0)), int(round((resized_w - out_w) / 2.0))
        resized = resize_region(image, (0, 0, width, height), (resized_h, resized_w), self.interpolation)
        return np.ascontiguousarray(resized[top:top + out_h, left:left + out_w])

    def describe(self):
        """The transform in words a serving client can follow (each preset's `metadata.json`)."""
        fraction = f"{self.crop_fraction:g}"
        if self.resize_mode == "center_crop":
            resize = ("shorter side to the model's size, then the centre (size x size) cropped"
                      if self.crop_fraction == 1.0 else
                      f"shorter side to floor(size / {fraction}), then the centre (size x size) cropped")
        else:
            resize = ("whole image to the model's size, aspect ratio ignored" if self.crop_fraction == 1.0 else
                      f"whole image to floor(size / {fraction}) on each side, aspect ratio ignored, then the "
                      "centre (size x size) cropped")
        transparency = {"white": "composited over white", "drop": "alpha channel dropped"}[self.alpha]
        return {**self.config(), "exif_orientation": True, "transparency": transparency, "resize": resize}


def image_transform(model):
    """The `ImageTransform` of a `ViTBackbone`, or of a model with a `backbone` (a classifier).

    A model without the fields (saved before they existed, or another kind)
    gets the defaults, the transform every model had then.
    """
    backbone = getattr(model, "backbone", model)
    return ImageTransform(**{key: getattr(backbone, key) for key in TRANSFORM_ARGUMENTS
                             if getattr(backbone, key, None) is not None})


def as_transform(transform):
    """An `ImageTransform` from one, a dict of its fields, a model, or `None` (the defaults)."""
    if transform is None:
        return ImageTransform()
    if isinstance(transform, ImageTransform):
        return transform
    if isinstance(transform, dict):
        return ImageTransform(**transform)
    return image_transform(transform)


# What every door of the image path does to a file by default (a model built from scratch), described
# as a preset's metadata.json does the model's own.
EVAL_TRANSFORM = ImageTransform().describe()


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


def resize_region(image, box, size, interpolation="bicubic"):
    """Crop `box` (left, top, right, bottom; fractional allowed) of `image` and resize it to `size`.

    The one resampling of the image path, with Pillow's filter named by
    `interpolation` (bicubic for the training crops of
    `keras_vit.data.augment`; the model's own for its evaluation transform).
    A box a rounding error outside the image (Pillow refuses any) is clamped
    to its edges.
    """
    height, width = size
    left, top, right, bottom = (float(v) for v in box)
    box = (min(max(left, 0.0), image.shape[1]), min(max(top, 0.0), image.shape[0]),
           min(max(right, 0.0), image.shape[1]), min(max(bottom, 0.0), image.shape[0]))
    Image = pil_image()
    resized = _to_pil(image).resize((width, height), getattr(Image, _PILLOW_FILTERS[interpolation]), box=box)
    array = np.asarray(resized, dtype="float32")
    return array[..., None] if image.shape[-1] == 1 else array


def center_crop(image, size, transform=None):
    """The evaluation transform of a model: `image` brought to `size`.

    Args:
        image: float array `(height, width, channels)` of [0, 255] pixels.
        size: int or `(height, width)` of the output.
        transform: the model's `ImageTransform`, a dict of its fields, the
            model itself, or `None` for a model built from scratch's (the
            shorter side resized to the size, the centre cropped, bicubic).
            Defaults to `None`.

    Returns:
        float32 array `size + (channels,)`; the image itself when it already
        has that size and the transform would not resample it.
    """
    return as_transform(transform)(image, size)


def resize_images(images, image_size, transform=None):
    """A batch of raw images of any size brought to `image_size` by `center_crop`, image by image.

    Args:
        images: array `(batch, height, width, channels)` of [0, 255] pixels.
        image_size: int or `(height, width)`.
        transform: as for `center_crop`; pass the model (or
            `image_transform(model)`) to get its own. Defaults to `None`.

    Returns:
        float32 array `(batch,) + image_size + (channels,)`.
    """
    transform = as_transform(transform)
    return np.stack([transform(np.asarray(image), image_size) for image in images])
