"""Every image size reaches every model size: the centre crop's box never leaves the image.

Since issue 47 the crop follows timm's arithmetic (the whole image resized by torchvision's rule, then
whole pixels cropped from the centre), at the model's crop fraction; the box is that crop mapped back
onto the image, used for strips whose whole resized copy would be too large.

On 2026-11-25's main the box was computed in floating point (`out_h * (height / out_h)` is not
always `height`) and came out at -1.4e-14 or a hair past the edge for some sizes; Pillow refuses
such a box ("box offset can't be negative"). At a model size of 224, 146 of the side lengths
1-4096 failed (29, 58, 116, 123, 225, 232, ...); `keras-vit finetune` stopped after its first
epoch on a folder holding a 58 x 76 photo.
"""

import math
import os
from fractions import Fraction

import numpy as np
import pytest
from PIL import Image

import keras_vit
from keras_vit.data import ImageFolderDataset, load_image, read_image_folder, resize_images
from keras_vit.utils.image_resize import ImageTransform
from keras_vit.presets.registry import PRESETS
from keras_vit.utils.values import to_pair

# Every model size of the preset registry, the sizes of the bug report and a few odd ones.
MODEL_SIZES = sorted({to_pair(entry["image_size"], "image_size") for entry in PRESETS.values()}
                     | {(56, 56), (97, 97), (224, 224), (232, 232), (384, 384), (488, 488), (224, 160), (160, 224),
                        (16, 16), (1, 1), (3, 500)})
SIDES = range(1, 4097)

# Side lengths that failed at these model sizes on the old code (found by the sweep below run on it).
OLD_FAILURES = {
    (224, 224): [29, 58, 116, 123, 225, 232, 239, 246],
    (56, 56): [29, 58, 116, 123],
    (97, 97): [101, 107, 113, 119, 125, 201],
    (232, 232): [15, 30, 60, 119, 120, 125],
    (488, 488): [247, 251, 255, 493, 494],
    (224, 160): [28, 29, 57, 58, 115, 116],
}


def _other_sides(side):
    # The other side of the image: square, off by one, far narrower, far wider, fixed odd sizes.
    return sorted({1, 2, max(1, side - 1), side, side + 1, 2 * side + 1, 333, 4096})


# Centre crops at timm's fractions, and the stretch (transformers' ViT, timm's squash at 0.9).
TRANSFORMS = [ImageTransform(), ImageTransform(crop_fraction=0.9), ImageTransform(crop_fraction=0.875),
              ImageTransform("stretch"), ImageTransform("stretch", crop_fraction=0.9)]


def _timm_size(height, width, out_h, out_w, transform):
    """The resized size written from timm's eval transform (the independent reference)."""
    scaled_h, scaled_w = (math.floor(side / transform.crop_fraction + 1e-6) for side in (out_h, out_w))
    if transform.resize_mode == "stretch":  # timm's "squash": both sides to floor(size / crop_pct)
        return scaled_h, scaled_w
    if scaled_h == scaled_w:  # torchvision Resize(int): the shorter side, the longer one truncated
        short, long = sorted((height, width))
        other = int(Fraction(scaled_h * long, short))
        return (other, scaled_w) if width <= height else (scaled_h, other)
    ratio = min(Fraction(height, scaled_h), Fraction(width, scaled_w))  # timm's ResizeKeepRatio
    return round(height / ratio), round(width / ratio)


def _timm_sizes(heights, widths, out_h, out_w, transform):
    """`_timm_size` over arrays of whole sides, in exact integer arithmetic: `(resized heights, resized widths)`."""
    heights, widths = np.asarray(heights, dtype="int64"), np.asarray(widths, dtype="int64")
    scaled_h, scaled_w = (math.floor(side / transform.crop_fraction + 1e-6) for side in (out_h, out_w))
    if transform.resize_mode == "stretch":
        return np.full_like(heights, scaled_h), np.full_like(widths, scaled_w)

    def rounded(numerator, denominator):  # round(numerator / denominator), halves to even, as Python's round
        quotient, remainder = np.divmod(numerator, denominator)
        up = (2 * remainder > denominator) | ((2 * remainder == denominator) & (quotient % 2 == 1))
        return quotient + up

    if scaled_h == scaled_w:  # the shorter side to the scaled size, the longer one truncated
        short, long = np.minimum(heights, widths), np.maximum(heights, widths)
        other = scaled_h * long // short
        return np.where(widths <= heights, other, scaled_h), np.where(widths <= heights, scaled_w, other)
    # The side whose ratio is the smaller goes to its scaled size exactly; the other is rounded.
    height_decides = heights * scaled_w <= widths * scaled_h
    return (np.where(height_decides, scaled_h, rounded(heights * scaled_w, widths)),
            np.where(height_decides, rounded(widths * scaled_h, heights), scaled_w))


def _exact_box(height, width, out_h, out_w, transform):
    """torchvision's CenterCrop offsets in the resized image, mapped onto the image in exact rationals."""
    resized_h, resized_w = _timm_size(height, width, out_h, out_w, transform)
    top, left = int(round((resized_h - out_h) / 2.0)), int(round((resized_w - out_w) / 2.0))
    return (Fraction(left * width, resized_w), Fraction(top * height, resized_h),
            Fraction((left + out_w) * width, resized_w), Fraction((top + out_h) * height, resized_h))


def _sweep(model_size, transform):
    # Every side for today's default transform, every 13th for the others (the same arithmetic).
    sides = SIDES if transform == ImageTransform() else SIDES[::13]
    shapes = [shape for side in sides for other in _other_sides(side) for shape in ((side, other), (other, side))]
    heights, widths = np.array(shapes, dtype="float64").T
    boxes = np.array([transform.crop_box(h, w, model_size) for h, w in shapes], dtype="float64")
    return heights, widths, boxes


@pytest.mark.one_backend("pure arithmetic on image and model sizes")
@pytest.mark.parametrize("model_size", MODEL_SIZES, ids=[f"{h}x{w}" for h, w in MODEL_SIZES])
def test_the_box_stays_inside_and_is_centred(model_size):
    for transform in TRANSFORMS:
        heights, widths, boxes = _sweep(model_size, transform)
        left, top, right, bottom = boxes.T
        # Inside the image, as Pillow requires of a box (exact comparisons, no tolerance).
        outside = (left < 0) | (top < 0) | (right > widths) | (bottom > heights)
        assert not outside.any(), [(h, w) for h, w in zip(heights[outside], widths[outside])][:10]
        assert ((right > left) & (bottom > top)).all()
        # Centred to within one pixel of the resized image (the crop's offset is a whole pixel there), the
        # resized size from timm's rule (`_timm_sizes`, whole arrays at once: a call of keras_vit's own
        # `resized_size` per shape was a third of this test's time).
        resized_h, resized_w = _timm_sizes(heights, widths, *model_size, transform)
        pixel_h, pixel_w = heights / resized_h, widths / resized_w
        assert (np.abs(left - (widths - right)) <= pixel_w * (1 + 1e-9)).all()
        assert (np.abs(top - (heights - bottom)) <= pixel_h * (1 + 1e-9)).all()


@pytest.mark.one_backend("pure arithmetic on image and model sizes")
def test_the_box_is_timms_crop_rounded_once():
    rng = np.random.default_rng(0)
    for out_h, out_w in MODEL_SIZES:
        for height, width in rng.integers(1, 4097, (60, 2)).tolist() + [[58, 76], [235, 232], [232, 309]]:
            for transform in TRANSFORMS:
                exact = _exact_box(height, width, out_h, out_w, transform)
                box = transform.crop_box(height, width, (out_h, out_w))
                assert box == tuple(float(v) for v in exact), (height, width, out_h, out_w, transform)


def _photo(height, width, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (height, width, 3)).astype("float32")


def _pillow_reference(image, out_h, out_w, transform=ImageTransform()):
    """timm's order with Pillow alone: the whole image resized (bicubic), then whole pixels cropped."""
    resized_h, resized_w = _timm_size(image.shape[0], image.shape[1], out_h, out_w, transform)
    top, left = int(round((resized_h - out_h) / 2.0)), int(round((resized_w - out_w) / 2.0))
    resized = Image.fromarray(image.astype(np.uint8)).resize((resized_w, resized_h), Image.BICUBIC)
    return np.asarray(resized.crop((left, top, left + out_w, top + out_h)), dtype="float32")


@pytest.mark.one_backend("numpy and Pillow resampling")
@pytest.mark.parametrize("model_size", sorted(OLD_FAILURES), ids=[f"{h}x{w}" for h, w in sorted(OLD_FAILURES)])
def test_sizes_that_failed_now_resize(model_size):
    out_h, out_w = model_size
    for side in OLD_FAILURES[model_size] + [1, 2, 4096]:
        shapes = {(side, side), (side, side + 1), (side + 1, side)} if side < 1000 else set()
        for height, width in shapes | {(side, 7), (7, side)}:
            image = _photo(height, width, side)
            resized = resize_images(image[None], model_size)[0]  # `ViTClassifier.predict`'s door
            assert resized.shape == (out_h, out_w, 3), (height, width)
            resized_h, resized_w = _timm_size(height, width, out_h, out_w, ImageTransform())
            if resized_h * resized_w > 100_000_000:
                # 4096 x 7 at 488: the Pillow reference alone would resize to 557 x 325,924 pixels (8 s of the
                # torch pass). The strip path it would check is checked at 224 x 224, 232 x 232 and 224 x 160
                # (whole copies of 38, 41 and 19 million pixels); 488's old failures are its squares above.
                continue
            if resized_h * resized_w > 16_000_000:
                # A strip whose whole resized copy is not made: only the kept region is resized (the
                # same kernels placed by the same scale), within two levels (one per pass) of timm's pixels.
                difference = np.abs(resized - _pillow_reference(image, out_h, out_w))
                assert difference.max() <= 2 and difference.mean() < 0.1, (height, width, difference.max(), difference.mean())
                continue
            np.testing.assert_array_equal(resized, _pillow_reference(image, out_h, out_w), err_msg=str((height, width)))


def test_the_reported_photos_reach_the_model_through_every_door(tmp_path):
    # The two photos of the report (58 x 76 and 235 x 232) at the registry's 224: the folder's held-out
    # images, few-shot's reader, `predict` / `explain` and `ViTClassifier.predict` on raw pixels.
    size = (224, 224)
    folder = tmp_path / "photos" / "only"
    os.makedirs(folder)
    paths = []
    for index, (height, width) in enumerate([(58, 76), (235, 232)]):
        paths.append(str(folder / f"{index}.png"))
        Image.fromarray(_photo(height, width, index).astype(np.uint8)).save(paths[-1])
    model = keras_vit.ViTClassifier.from_variant("ViT-Ti/16", image_size=size, patch_size=56, hidden_dim=8,
                                                 num_layers=1, num_heads=1, mlp_dim=8, num_classes=2)
    folder_images, _, _ = read_image_folder(str(tmp_path / "photos"), size)
    for index, path in enumerate(paths):
        served = load_image(path, size)
        reference = _pillow_reference(np.asarray(Image.open(path), dtype="float32"), *size)
        np.testing.assert_array_equal(served, reference)
        np.testing.assert_array_equal(ImageFolderDataset([path], [0], size, training=False, workers=1)[0][0][0], served)
        np.testing.assert_array_equal(folder_images[index], served)
        raw = np.asarray(Image.open(path), dtype="float32")[None]
        np.testing.assert_array_equal(model.resize_raw_images(raw)[0], served)
        assert model.predict(raw, verbose=0).shape == (1, 2)
