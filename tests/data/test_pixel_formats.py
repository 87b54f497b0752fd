"""Every pixel format is read as the [0, 255] levels a viewer shows, or refused naming the file, mode and fix.

On 2026-11-25's main a 16-bit grayscale PNG came out with 99.6% of its pixels at 255 (Pillow's
conversion to 8 bits clips instead of scaling), and a float TIFF of [0, 1] values was read as
[0, 1] pixels for a model that expects [0, 255], without a word. Each case below writes a file
and computes what it must read as with numpy from the array it wrote.
"""

import struct
import zlib

import numpy as np
import pytest
from PIL import Image

from keras_vit.data import ImageFileError, read_image

pytestmark = pytest.mark.one_backend("numpy and Pillow decoding")

RAMP16 = np.linspace(0, 65535, 4096).reshape(64, 64).astype("uint16")  # every 16th level, black to white
RGB8 = np.random.default_rng(0).integers(0, 256, (16, 24, 3), dtype=np.uint8)
ALPHA8 = np.random.default_rng(1).integers(0, 256, (16, 24), dtype=np.uint8)


def _over_white(rgb, alpha):
    alpha = alpha.astype("float64")[..., None] / 255.0
    return rgb.astype("float64") * alpha + 255.0 * (1.0 - alpha)


def _luma(rgb):
    # ITU-R 601-2, the luminance Pillow's "L" uses.
    return rgb[..., 0] * 299 / 1000 + rgb[..., 1] * 587 / 1000 + rgb[..., 2] * 114 / 1000


def _gray3(gray):
    return np.repeat(np.asarray(gray, "float64")[..., None], 3, axis=-1)


def _write_png16(path, samples):
    """A 16-bit PNG written byte by byte (Pillow cannot write 16-bit colour): gray, gray+alpha, RGB, RGBA."""
    samples = np.asarray(samples, dtype=">u2")
    samples = samples[..., None] if samples.ndim == 2 else samples
    height, width, channels = samples.shape

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 16, {1: 0, 2: 4, 3: 2, 4: 6}[channels], 0, 0, 0)
    rows = b"".join(b"\0" + samples[row].tobytes() for row in range(height))
    with open(path, "wb") as handle:
        handle.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows))
                     + chunk(b"IEND", b""))


def _write_pgm(path, samples, maxval):
    with open(path, "wb") as handle:
        header = b"P5\n%d %d\n%d\n" % (samples.shape[1], samples.shape[0], maxval)
        handle.write(header + samples.astype(">u2").tobytes())


def _save(name, image, **kwargs):
    def write(path):
        image().save(path, **kwargs)
    return name, write


def _palette():
    return Image.fromarray(RGB8).convert("P", palette=Image.Palette.ADAPTIVE, colors=50)


def _palette_rgb():
    image = _palette()
    return np.array(image.getpalette()[:768] + [0] * (768 - len(image.getpalette()[:768]))).reshape(256, 3)[
        np.asarray(image)]


CMYK = np.random.default_rng(2).integers(0, 256, (16, 24, 4), dtype=np.uint8)
FLOAT01 = np.linspace(0, 1, 4096, dtype="float32").reshape(64, 64)
BITS = np.random.default_rng(3).random((16, 24)) < 0.5
RGB16 = np.stack([RAMP16, RAMP16[::-1], RAMP16.T], axis=-1)

# (file name, how to write it, the RGB it must read as (or None if refused), tolerance in levels, refusal words)
CASES = {
    "1": (*_save("bits.png", lambda: Image.fromarray(BITS)), lambda: _gray3(BITS * 255.0), 0),
    "L": (*_save("gray.png", lambda: Image.fromarray(RGB8[..., 0])), lambda: _gray3(RGB8[..., 0]), 0),
    "P": (*_save("palette.png", _palette), _palette_rgb, 0),
    "PA": (*_save("palette_alpha.tif", lambda: Image.merge("PA", (_palette(), Image.fromarray(ALPHA8)))),
           lambda: _over_white(_palette_rgb(), ALPHA8), 1),
    "RGB": (*_save("rgb.png", lambda: Image.fromarray(RGB8)), lambda: RGB8, 0),
    "RGBA": (*_save("rgba.png", lambda: Image.fromarray(np.dstack([RGB8, ALPHA8]))),
             lambda: _over_white(RGB8, ALPHA8), 1),
    "LA": (*_save("gray_alpha.png", lambda: Image.fromarray(np.dstack([RGB8[..., 0], ALPHA8]), "LA")),
           lambda: _gray3(_over_white(RGB8[..., :1], ALPHA8)[..., 0]), 1),
    "CMYK": (*_save("cmyk.tif", lambda: Image.fromarray(CMYK, "CMYK")),
             lambda: (255.0 - CMYK[..., :3]) * (255.0 - CMYK[..., 3:]) / 255.0, 1),
    # JPEG's YCbCr (ITU-R 601 full range), then back: a level or two of rounding.
    "YCbCr": (*_save("ycbcr.tif", lambda: Image.fromarray(RGB8).convert("YCbCr")), lambda: RGB8, 3),
    "I;16 PNG": ("gray16.png", lambda path: _write_png16(path, RAMP16), lambda: _gray3(RAMP16 / 257), 0.5),
    "I;16 TIFF": (*_save("gray16.tif", lambda: Image.fromarray(RAMP16)), lambda: _gray3(RAMP16 / 257), 0.5),
    "I;16B TIFF": (*_save("gray16b.tif", lambda: Image.fromarray(RAMP16.astype(">u2"))),
                   lambda: _gray3(RAMP16 / 257), 0.5),
    "I PGM 16-bit": ("gray16.pgm", lambda path: _write_pgm(path, RAMP16, 65535), lambda: _gray3(RAMP16 / 257), 0.5),
    "I PGM 12-bit": ("gray12.pgm", lambda path: _write_pgm(path, RAMP16 >> 4, 4095),
                     lambda: _gray3((RAMP16 >> 4) / 4095 * 255), 1),
    "I 32-bit TIFF": (*_save("counts.tif", lambda: Image.fromarray(RAMP16.astype("int32") * 1000)), None,
                      ["mode I", "32-bit integer", "0 to 6.5535e+07", "8-bit"]),
    "F [0, 1] TIFF": (*_save("unit.tif", lambda: Image.fromarray(FLOAT01)), lambda: _gray3(FLOAT01 * 255.0), 0.5),
    "F [0, 255] TIFF": (*_save("levels.tif", lambda: Image.fromarray(FLOAT01 * 255.0)), lambda: _gray3(FLOAT01 * 255.0),
                        0.5),
    "F float64 TIFF": (*_save("unit64.tif", lambda: Image.fromarray(FLOAT01.astype("float64"))),
                       lambda: _gray3(FLOAT01 * 255.0), 0.5),
    "F [-1, 1] TIFF": (*_save("signed.tif", lambda: Image.fromarray(FLOAT01 * 2 - 1)), None,
                       ["mode F", "from -1 to 1", "[0, 1]", "[0, 255]"]),
    "F NaN TIFF": (*_save("nan.tif", lambda: Image.fromarray(np.where(FLOAT01 > 0.5, np.nan, FLOAT01))), None,
                   ["mode F", "nan", "Rescale"]),
    "RGB 16-bit PNG": ("rgb16.png", lambda path: _write_png16(path, RGB16), lambda: RGB16 / 257, 1),
    "RGBA 16-bit PNG": ("rgba16.png", lambda path: _write_png16(path, np.dstack([RGB16, RAMP16])),
                        lambda: _over_white(RGB16 / 257, RAMP16 / 257), 2),
    "LA 16-bit PNG": ("gray_alpha16.png", lambda path: _write_png16(path, np.dstack([RAMP16, RAMP16[::-1]])),
                      lambda: _gray3(_over_white((RAMP16 / 257)[..., None], RAMP16[::-1] / 257)[..., 0]), 2),
    "LAB TIFF": (*_save("lab.tif", lambda: Image.merge("LAB", [Image.fromarray(RGB8[..., i]) for i in range(3)])),
                 None, ["mode LAB", "pixel format", "Convert it to RGB"]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_each_pixel_format_reads_as_a_viewer_shows_it_or_is_refused(tmp_path, case):
    name, write, expected, tolerance = CASES[case]
    path = str(tmp_path / name)
    write(path)
    if expected is None:
        with pytest.raises(ImageFileError) as error:
            read_image(path)
        for words in [name, *tolerance]:  # the file, the format, and the fix
            assert words in str(error.value), (words, str(error.value))
        return
    expected = np.asarray(expected(), "float64")
    rgb = read_image(path)
    assert rgb.shape == expected.shape and rgb.dtype == np.float32
    np.testing.assert_allclose(rgb, expected, rtol=0, atol=tolerance, err_msg=case)
    np.testing.assert_array_equal(rgb, np.rint(rgb))  # whole levels, as any 8-bit file gives
    # One channel: the luminance of what a viewer shows (the gray level itself for gray files).
    gray = read_image(path, 1)
    assert gray.shape == expected.shape[:2] + (1,)
    np.testing.assert_allclose(gray[..., 0], _luma(expected), rtol=0, atol=tolerance + 1, err_msg=case)


def test_the_reported_16_bit_ramp_keeps_its_levels(tmp_path):
    path = str(tmp_path / "g16.png")
    Image.fromarray(RAMP16).save(path)  # the report's file, written by Pillow
    pixels = read_image(path, 1)[..., 0]
    assert (pixels == 255).mean() < 0.01  # was 99.6%: every level above 255 clipped to white
    np.testing.assert_array_equal(pixels, np.rint(RAMP16 / 257))


def test_a_transparent_level_of_a_16_bit_png_is_white(tmp_path):
    path = str(tmp_path / "g16_trns.png")
    Image.fromarray(RAMP16).save(path, transparency=0)  # black marked transparent (a tRNS chunk)
    pixels = read_image(path, 1)[..., 0]
    np.testing.assert_array_equal(pixels, np.where(RAMP16 == 0, 255, np.rint(RAMP16 / 257)))
