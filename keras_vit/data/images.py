"""The one image path: every image keras_vit reads goes through `read_image` and the model's transform.

`keras-vit predict` and `explain`, few-shot evaluation, the image folders of
`finetune` (their held-out images, and their training crops, which share the
same resampling) and `ViTClassifier.predict` on raw images of another size all
read a file and bring it to the model's size the same way, by the model's
own evaluation transform (`keras_vit.utils.image_resize.ImageTransform`, four
`ViTBackbone` arguments; a converted model's is its source library's), so the
held-out images and every door that serves a model get the same pixels:

- decode with Pillow, after checking the header: a missing path or a
  directory, an empty (0-byte) file, a text file or any other file Pillow
  cannot identify, and an image whose header declares more than `max_pixels`
  pixels (so a small file that decompresses to gigabytes is never decoded) are
  refused with a message naming the file and the fix; so is a truncated file;
- turn the image upright by its EXIF orientation (phone photos);
- composite transparency over white (as a browser shows it; `alpha="white"`,
  a model built from scratch's) or drop the alpha channel (`alpha="drop"`, as
  timm, transformers and keras-hub read files), then convert to RGB or
  grayscale (the first frame of an animated GIF); 16-bit and float pixels
  become [0, 255] levels by a stated rule, pixels without one (32-bit
  integers, out-of-range floats, LAB) are refused (`read_image`);
- resize and crop by the model's transform: the shorter side to
  `size / crop_fraction` and the centre cropped, or the whole image
  stretched, with the model's filter, in timm's arithmetic (torchvision's
  `Resize` then `CenterCrop`), which is the source's own evaluation for a
  timm checkpoint. The resizing of arrays lives in
  `keras_vit.utils.image_resize` (below the models, which resize raw arrays
  in `predict`) and is served from here too.
"""

import os

import numpy as np

from keras_vit.writer.files import quote
from keras_vit.utils.values import ALPHA_RULES, check_choice
from keras_vit.utils.image_resize import (  # noqa: F401
    EVAL_TRANSFORM,
    ImageTransform,
    as_transform,
    center_crop,
    image_transform,
    pil_image,
    resize_images,
    resize_region,
)

# 64 Mpx: an 8K x 8K image. Phone photos are 12-50 Mpx; a 20,000 x 20,000
# "decompression bomb" PNG of a few KB (400 Mpx, 1.2 GB decoded) is refused.
DEFAULT_MAX_PIXELS = 64_000_000


class ImageFileError(ValueError):
    """An image file that cannot be used; the message names the file."""


def _describe_content(path):
    with open(path, "rb") as handle:
        head = handle.read(512)
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError:
        return f"it starts with {head[:8]!r}"
    if text.isprintable() or all(c.isprintable() or c in "\r\n\t" for c in text):
        return f"it looks like a text file ({text[:40]!r}...)"
    return f"it starts with {head[:8]!r}"


def open_image(path, max_pixels=DEFAULT_MAX_PIXELS):
    """Open an image file lazily and check it before decoding.

    Args:
        path: str or path-like.
        max_pixels: int. Largest `width * height` accepted. Defaults to
            `DEFAULT_MAX_PIXELS` (64 million).

    Returns:
        An open `PIL.Image.Image` (not yet decoded); close it when done.

    Raises:
        ImageFileError: the file is missing, empty, not an image, or too large.
    """
    Image = pil_image()
    path = os.fspath(path)
    if not os.path.exists(path):
        raise ImageFileError(f"No such image file: {quote(path)}")
    if os.path.isdir(path):
        raise ImageFileError(f"{quote(path)} is a directory; give image files (JPEG, PNG, ...).")
    if os.path.getsize(path) == 0:
        raise ImageFileError(f"{quote(path)} is empty (0 bytes), not an image. Copy or download it again.")
    # `max_pixels` replaces Pillow's own decompression-bomb limit (a warning
    # at 89 Mpx, an error naming no file at 179 Mpx): the size is read from
    # the header and compared below, before anything is decoded.
    pillow_limit = Image.MAX_IMAGE_PIXELS
    try:
        Image.MAX_IMAGE_PIXELS = None
        image = Image.open(path)
    except (Image.UnidentifiedImageError, OSError, SyntaxError, ValueError) as error:
        raise ImageFileError(
            f"{quote(path)} is not an image Pillow can read: {_describe_content(path)} "
            f"({type(error).__name__}). Give a JPEG, PNG, WebP, BMP, GIF or TIFF file."
        ) from None
    finally:
        Image.MAX_IMAGE_PIXELS = pillow_limit
    if image.width * image.height > max_pixels:
        image.close()
        raise ImageFileError(
            f"{quote(path)} declares {image.width} x {image.height} = {image.width * image.height:,} pixels, over "
            f"the limit of {max_pixels:,}. Decoding it would take gigabytes of memory. Downscale it first, or "
            "raise the limit (`max_pixels=`, or `--max-pixels` on the command line) if you trust the file."
        )
    return image


# Pillow modes of 8 bits per sample, converted to RGB or luminance by Pillow itself: bilevel,
# gray, palette, RGB, CMYK (the plain formula, R = (255 - C) * (255 - K) / 255, without an ICC
# profile, as for RGB), YCbCr (JPEG's formula), and the same with transparency. Pillow decodes
# 16-bit colour PNGs to RGB / RGBA by each sample's high byte (within one level of value / 257).
_EIGHT_BIT_MODES = frozenset({"1", "L", "P", "RGB", "RGBX", "CMYK", "YCbCr"})
_ALPHA_MODES = frozenset({"RGBA", "LA", "PA", "RGBa", "La"})
# Pillow widens 16-bit grayscale to mode I (32-bit integers) for these formats, scaled to
# [0, 65535] (a PGM's maxval of 4095 reads as 0-65535); older Pillows did so for PNG too.
_SIXTEEN_BIT_AS_I = frozenset({"PNG", "PPM"})


def _refuse_pixels(path, image_format, mode, what, fix):
    raise ImageFileError(f"{quote(os.fspath(path))} ({image_format or 'image'}, Pillow mode {mode}) {what}. {fix}")


def _high_depth_gray(image, path, image_format, alpha="white"):
    """A 16-bit, 32-bit integer or float grayscale image as [0, 255] gray levels (the rule below)."""
    mode = image.mode
    values = np.asarray(image).astype("float64")
    if mode.startswith("I;16"):
        white = 65535.0  # 16-bit samples: white is 65535, so value * 255 / 65535 (= value / 257)
    elif mode == "I":
        # 32-bit integers have no agreed white level (a TIFF of counts, depths or labels); the one
        # known case is 16-bit data Pillow widened, which is scaled like I;16. Anything else would be
        # a guess that silently turns a [0, 255] or a [0, 4095] image black: refused.
        if image_format not in _SIXTEEN_BIT_AS_I or values.min() < 0 or values.max() > 65535:
            _refuse_pixels(path, image_format, mode, f"holds 32-bit integer pixels (from {values.min():g} to "
                           f"{values.max():g}) with no agreed white level",
                           "Save it as an 8-bit image (0-255) or a 16-bit PNG (0-65535 for black to white), "
                           "or pass its pixels to the model as a [0, 255] array")
        white = 65535.0
    else:  # "F": 32-bit floats, from float TIFFs and PFM files
        low, high = (values.min(), values.max()) if np.isfinite(values).all() else (np.nan, np.nan)
        # [0, 1] is the float convention of image libraries (scikit-image, TIFFs from scientific
        # pipelines): scaled to [0, 255]; values already in [0, 255] are kept. An image whose
        # brightest pixel is at most 1 is read as [0, 1] data.
        if 0.0 <= low and high <= 1.0:
            white = 1.0
        elif 0.0 <= low and high <= 255.0:
            white = 255.0
        else:
            _refuse_pixels(path, image_format, mode, f"holds float pixels from {low:g} to {high:g}, neither in "
                           "[0, 1] nor in [0, 255]", "Rescale them to [0, 1] or [0, 255] and save it again, or "
                           "pass them to the model as a [0, 255] array")
    gray = np.rint(values * (255.0 / white))
    transparent = image.info.get("transparency")
    if isinstance(transparent, int) and alpha == "white":  # a 16-bit PNG's tRNS gray level: transparent pixels
        gray[np.asarray(image) == transparent] = 255.0  # over white, as for every other mode
    return gray


def read_image(path, num_channels=3, max_pixels=DEFAULT_MAX_PIXELS, alpha="white"):
    """Decode an image file to a float32 `(height, width, num_channels)` array of [0, 255] pixels.

    Upright by its EXIF orientation, transparency composited over white
    (`alpha="white"`) or its alpha channel dropped (`"drop"`, Pillow's
    `convert("RGB")`: each pixel keeps its stored colour), converted to RGB
    (`num_channels=3`) or luminance (`1`). Every pixel
    format becomes the 8-bit levels a viewer shows, or is refused:

    - 8-bit modes (1, L, P, RGB, CMYK, YCbCr and their transparent forms):
      Pillow's conversion; 16-bit colour PNGs are read by their high byte.
    - 16-bit grayscale (I;16, I;16B, I;16L; 16-bit PNG and TIFF, PGM):
      `value / 257` rounded, so 65535 is white.
    - 32-bit integers (mode I, e.g. a TIFF): no agreed white level, refused.
    - floats (mode F: float TIFF, PFM): `[0, 1]` scaled to `[0, 255]`,
      `[0, 255]` kept (rounded), anything else (or NaN) refused.
    - other modes (LAB, HSV, ...): refused, naming the mode.

    Args:
        path: str or path-like. An image file.
        num_channels: int. 3 or 1. Defaults to `3`.
        max_pixels: int. See `open_image`.
        alpha: str. `"white"` or `"drop"`, the model's rule
            (`ViTBackbone(alpha=...)`). Defaults to `"white"`.

    Raises:
        ImageFileError: naming the file, for every way the file can be bad.
    """
    import warnings

    from PIL import ImageOps

    Image = pil_image()
    mode = {1: "L", 3: "RGB"}.get(num_channels)
    if mode is None:
        raise ValueError(f"`num_channels` must be 1 or 3 to read image files. Received: num_channels={num_channels!r}")
    check_choice(alpha, ALPHA_RULES, "alpha")
    with open_image(path, max_pixels) as image, warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # the size was checked on open
        image_format = image.format  # the transposed copy below forgets it
        if image.mode not in _EIGHT_BIT_MODES | _ALPHA_MODES and not image.mode.startswith("I;16") \
                and image.mode not in ("I", "F"):
            _refuse_pixels(path, image_format, image.mode, "has a pixel format keras_vit does not read",
                           "Convert it to RGB (8 or 16 bits) or grayscale with an image editor and save it as PNG")
        try:
            image = ImageOps.exif_transpose(image)
            if image.mode.startswith("I") or image.mode == "F":
                gray = _high_depth_gray(image, path, image_format, alpha)
                array = gray if num_channels == 1 else np.repeat(gray[..., None], 3, axis=-1)
                array = array.astype("float32")
            else:
                if alpha == "white" and (image.mode in _ALPHA_MODES or "transparency" in image.info):
                    rgba = image.convert("RGBA")
                    image = Image.alpha_composite(Image.new("RGBA", rgba.size, (255, 255, 255, 255)), rgba)
                array = np.asarray(image.convert(mode), dtype="float32")
        except ImageFileError:
            raise
        except (OSError, SyntaxError, ValueError) as error:
            raise ImageFileError(
                f"{quote(os.fspath(path))} is truncated or corrupt ({error}); copy or download it again."
            ) from None
    return array[..., None] if array.ndim == 2 else array


def load_image(path, image_size, num_channels=3, max_pixels=DEFAULT_MAX_PIXELS, transform=None):
    """`read_image`, then the evaluation transform to `image_size`: a file as the model's input.

    Pass the model as `image_size` to get its input exactly: its size, its
    channels and its evaluation transform (`image_transform(model)`: resize
    mode, crop fraction, interpolation and alpha rule, the source library's
    for a converted model).

    Args:
        path: str or path-like. An image file.
        image_size: int, `(height, width)`, or a keras_vit model whose
            input size, channels and transform are used.
        num_channels: int. 3 (RGB) or 1 (grayscale). Defaults to `3`
            (the model's, when a model is given).
        max_pixels: int. See `open_image`.
        transform: `ImageTransform`, a dict of its fields, a model, or
            `None`: the model's when `image_size` is a model, otherwise a
            model built from scratch's (shorter side to the size, centre
            crop, bicubic, alpha over white). Defaults to `None`.

    Returns:
        A float32 numpy array `(height, width, num_channels)` in [0, 255].

    Example:

    >>> image = keras_vit.data.load_image("cat.jpg", model)
    >>> model.predict(image[None])
    """
    if hasattr(image_size, "image_shape"):  # a keras_vit model
        model = image_size
        *image_size, num_channels = model.image_shape()
        transform = model if transform is None else transform
    transform = as_transform(transform)
    return transform(read_image(path, num_channels, max_pixels, alpha=transform.alpha), image_size)
