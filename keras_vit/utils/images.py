"""Reading image files safely: a bounded pixel count, and errors that name the file.

`load_image` is what `keras-vit predict` (and any tool that reads user image
files) uses. It refuses, with a message naming the file and the fix:
a missing path or a directory, an empty (0-byte) file, a text file or any
other file Pillow cannot identify, an image whose header declares more than
`max_pixels` pixels (checked before anything is decoded, so a small file that
decompresses to gigabytes is never decoded), and a truncated or corrupt file.
"""

import os

from keras_vit.utils.files import quote
from keras_vit.utils.values import to_pair

# 64 Mpx: an 8K x 8K image. Phone photos are 12-50 Mpx; a 20,000 x 20,000
# "decompression bomb" PNG of a few KB (400 Mpx, 1.2 GB decoded) is refused.
DEFAULT_MAX_PIXELS = 64_000_000


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
        ValueError: the file is missing, empty, not an image, or too large.
    """
    try:
        from PIL import Image
    except ImportError as error:
        raise ImportError("Reading images needs Pillow: `pip install pillow`.") from error
    path = os.fspath(path)
    if not os.path.exists(path):
        raise ValueError(f"No such image file: {quote(path)}")
    if os.path.isdir(path):
        raise ValueError(f"{quote(path)} is a directory; give image files (JPEG, PNG, ...).")
    if os.path.getsize(path) == 0:
        raise ValueError(f"{quote(path)} is empty (0 bytes), not an image. Copy or download it again.")
    # `max_pixels` replaces Pillow's own decompression-bomb limit (a warning
    # at 89 Mpx, an error naming no file at 179 Mpx): the size is read from
    # the header and compared below, before anything is decoded.
    pillow_limit = Image.MAX_IMAGE_PIXELS
    try:
        Image.MAX_IMAGE_PIXELS = None
        image = Image.open(path)
    except (Image.UnidentifiedImageError, OSError, SyntaxError, ValueError) as error:
        raise ValueError(
            f"{quote(path)} is not an image Pillow can read: {_describe_content(path)} "
            f"({type(error).__name__}). Give a JPEG, PNG, WebP, BMP, GIF or TIFF file."
        ) from None
    finally:
        Image.MAX_IMAGE_PIXELS = pillow_limit
    if image.width * image.height > max_pixels:
        image.close()
        raise ValueError(
            f"{quote(path)} declares {image.width} x {image.height} = {image.width * image.height:,} pixels, over "
            f"the limit of {max_pixels:,}. Decoding it would take gigabytes of memory. Downscale it first, or "
            "raise the limit (`max_pixels=`, or `--max-pixels` on the command line) if you trust the file."
        )
    return image


def load_image(path, image_size, num_channels=3, max_pixels=DEFAULT_MAX_PIXELS):
    """Read an image as a float32 `(height, width, channels)` array of [0, 255] pixels.

    The shorter side is resized to the target (bicubic), then the center is
    cropped, so the whole object stays in view without distortion.

    Args:
        path: str or path-like. An image file.
        image_size: int or `(height, width)`. The output size.
        num_channels: int. 3 (RGB) or 1 (grayscale). Defaults to `3`.
        max_pixels: int. See `open_image`.

    Returns:
        A numpy float32 array.

    Raises:
        ValueError: naming the file, for every way the file can be bad.
    """
    import warnings

    import numpy as np
    from PIL import Image

    height, width = to_pair(image_size, "image_size")
    if num_channels not in (1, 3):
        raise ValueError(f"`num_channels` must be 1 or 3 to read image files. Received: num_channels={num_channels!r}")
    with open_image(path, max_pixels) as image, warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # the size was checked on open
        try:
            image = image.convert("RGB" if num_channels == 3 else "L")
        except (OSError, SyntaxError, ValueError) as error:
            raise ValueError(
                f"{quote(os.fspath(path))} is truncated or corrupt ({error}); copy or download it again."
            ) from None
        scale = max(height / image.height, width / image.width)
        resized = image.resize(
            (max(width, round(image.width * scale)), max(height, round(image.height * scale))), Image.BICUBIC
        )
    top = (resized.height - height) // 2
    left = (resized.width - width) // 2
    array = np.asarray(resized.crop((left, top, left + width, top + height)), dtype="float32")
    return array if num_channels == 3 else array[..., None]
