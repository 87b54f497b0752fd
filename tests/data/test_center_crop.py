"""Every image size reaches every model size: the centre crop's box never leaves the image.

On 2026-11-25's main the box was computed in floating point (`out_h * (height / out_h)` is not
always `height`) and came out at -1.4e-14 or a hair past the edge for some sizes; Pillow refuses
such a box ("box offset can't be negative"). At a model size of 224, 146 of the side lengths
1-4096 failed (29, 58, 116, 123, 225, 232, ...); `keras-vit finetune` stopped after its first
epoch on a folder holding a 58 x 76 photo.
"""

import os
from fractions import Fraction

import numpy as np
import pytest
from PIL import Image

import keras_vit
from keras_vit.data import ImageFolderDataset, load_image, read_image_folder, resize_images
from keras_vit.data import center_crop, images
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


def _sweep(model_size):
    out_h, out_w = model_size
    shapes = [shape for side in SIDES for other in _other_sides(side) for shape in ((side, other), (other, side))]
    heights, widths = np.array(shapes, dtype="float64").T
    boxes = np.array([images.center_crop_box(h, w, out_h, out_w) for h, w in shapes], dtype="float64")
    return heights, widths, boxes


@pytest.mark.one_backend("pure arithmetic on image and model sizes")
@pytest.mark.parametrize("model_size", MODEL_SIZES, ids=[f"{h}x{w}" for h, w in MODEL_SIZES])
def test_the_box_stays_inside_keeps_the_aspect_ratio_and_is_centred(model_size):
    out_h, out_w = model_size
    heights, widths, boxes = _sweep(model_size)
    left, top, right, bottom = boxes.T
    # Inside the image, as Pillow requires of a box (exact comparisons, no tolerance).
    outside = (left < 0) | (top < 0) | (right > widths) | (bottom > heights)
    assert not outside.any(), [(h, w) for h, w in zip(heights[outside], widths[outside])][:10]
    assert ((right > left) & (bottom > top)).all()
    # The largest such region: it spans the image's full height or its full width.
    assert (((left == 0) & (right == widths)) | ((top == 0) & (bottom == heights))).all()
    # The model's aspect ratio, and centred, to a few units in the last place of the image's coordinates
    # (a crop a fraction of a pixel high, 3 x 500 on a tall image, is a difference of two large numbers).
    crop_w, crop_h = right - left, bottom - top
    ulps = 1e-12 * np.maximum(heights, widths)
    assert (np.abs(crop_w * out_h - crop_h * out_w) <= ulps * max(out_h, out_w)).all()
    assert (np.abs(left - (widths - right)) <= ulps).all()
    assert (np.abs(top - (heights - bottom)) <= ulps).all()


def _exact_box(height, width, out_h, out_w):
    """The centred crop with the model's aspect ratio, in exact rationals (the independent reference)."""
    scale = min(Fraction(height, out_h), Fraction(width, out_w))
    crop_h, crop_w = out_h * scale, out_w * scale
    top, left = (height - crop_h) / 2, (width - crop_w) / 2
    return left, top, left + crop_w, top + crop_h


@pytest.mark.one_backend("pure arithmetic on image and model sizes")
def test_the_box_is_the_exact_centred_box_rounded_once():
    rng = np.random.default_rng(0)
    for out_h, out_w in MODEL_SIZES:
        for height, width in rng.integers(1, 4097, (300, 2)).tolist() + [[58, 76], [235, 232], [232, 309]]:
            exact = _exact_box(height, width, out_h, out_w)
            box = images.center_crop_box(height, width, out_h, out_w)
            assert box == tuple(float(v) for v in exact), (height, width, out_h, out_w)


def _photo(height, width, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (height, width, 3)).astype("float32")


def _pillow_reference(image, out_h, out_w):
    """Pillow's bicubic resize of the exact centred box: what `center_crop` must give."""
    box = tuple(float(v) for v in _exact_box(image.shape[0], image.shape[1], out_h, out_w))
    resized = Image.fromarray(image.astype(np.uint8)).resize((out_w, out_h), Image.BICUBIC, box=box)
    return np.asarray(resized, dtype="float32")


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
            np.testing.assert_array_equal(resized, _pillow_reference(image, out_h, out_w), err_msg=str((height, width)))


def _old_box(height, width, out_h, out_w):
    """The floating-point box of 2026-11-25's main, for the sizes where it stayed inside the image."""
    scale = min(height / out_h, width / out_w)
    crop_h, crop_w = out_h * scale, out_w * scale
    top, left = (height - crop_h) / 2, (width - crop_w) / 2
    return left, top, left + crop_w, top + crop_h


@pytest.mark.one_backend("numpy and Pillow resampling")
def test_sizes_that_worked_give_the_same_pixels_as_before():
    # The exact box differs from the old one by ~1e-15 pixel for about one working size in ten
    # (e.g. a top of 3.6e-15 instead of 0 for 61 x 123 at 224); Pillow's resampling gives the same pixels.
    rng = np.random.default_rng(1)
    checked = 0
    while checked < 150:
        (out_h, out_w) = MODEL_SIZES[rng.integers(len(MODEL_SIZES))]
        height, width = rng.integers(1, 700, 2).tolist()
        old = _old_box(height, width, out_h, out_w)
        if min(old[:2]) < 0 or old[2] > width or old[3] > height or (height, width) == (out_h, out_w):
            continue  # one of the sizes the old code refused, or returned as it is
        image = _photo(height, width, checked)
        before = Image.fromarray(image.astype(np.uint8)).resize((out_w, out_h), Image.BICUBIC, box=old)
        np.testing.assert_array_equal(center_crop(image, (out_h, out_w)), np.asarray(before, dtype="float32"),
                                      err_msg=str((height, width, out_h, out_w)))
        checked += 1


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
