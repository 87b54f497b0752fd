"""Promise: no silent acceptance of out-of-range data where a check is cheap. Backend-specific: runs
on each backend (the suite runs once per KERAS_BACKEND)."""

import warnings

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit.utils.checks import check_image_batch, check_pixel_range
from tests.reliability.helpers import tiny_classifier


@pytest.fixture(scope="module")
def model():
    return tiny_classifier()


def _call(model, images):
    return keras.ops.convert_to_numpy(model(images, training=False))


BAD_BATCHES = [
    ("empty batch", np.zeros((0, 8, 8, 3), "float32"), "empty batch"),
    ("channels-first", np.zeros((2, 3, 8, 8), "float32"), "ops.transpose(x, (0, 2, 3, 1))"),
    ("channels-first single image", np.zeros((1, 3, 8, 8), "float32"), "looks channels-first"),
    ("no batch axis", np.zeros((8, 8, 3), "float32"), "images[None]"),
    ("grayscale for RGB", np.zeros((2, 8, 8, 1), "float32"), "np.repeat"),
    ("wrong size", np.zeros((2, 12, 12, 3), "float32"), "Resizing"),
]


@pytest.mark.parametrize("case", BAD_BATCHES, ids=[c[0] for c in BAD_BATCHES])
def test_model_refuses_with_the_fix(model, case):
    _, images, phrase = case
    with pytest.raises(ValueError) as error:
        _call(model, images)
    assert phrase in str(error.value)
    assert "num_channels=8" not in str(error.value)  # the old, wrong advice for channels-first input
    # The refused call leaves the model usable (on JAX too).
    assert _call(model, np.zeros((2, 8, 8, 3), "float32")).shape == (2, 3)


PATCH_CASES = [
    ("empty batch", np.zeros((0, 8, 8, 3), "float32"), "empty batch"),
    ("channels-first", np.zeros((2, 3, 32, 32), "float32"), "looks channels-first"),
    ("boolean", np.ones((2, 8, 8, 3), bool), "boolean images"),
]


@pytest.mark.parametrize("case", PATCH_CASES, ids=[c[0] for c in PATCH_CASES])
def test_patches_layer_refuses(case):
    _, images, phrase = case
    with pytest.raises(ValueError, match=phrase):
        keras_vit.layers.Patches(patch_size=4)(images)


def test_image_normalization_refuses_boolean():
    layer = keras_vit.layers.ImageNormalization(num_channels=3)
    with pytest.raises(ValueError, match="boolean images"):
        layer(np.ones((1, 4, 4, 3), bool))


def test_channels_last_with_three_rows_is_not_mistaken(model):
    """A genuine (B, 3, W, 3) image is channels-last; the hint must not fire on it."""
    images = np.zeros((1, 3, 8, 3), "float32")
    with pytest.raises(ValueError) as error:
        _call(model, images)
    assert "channels-first" not in str(error.value)


@pytest.mark.parametrize(
    "images, phrase",
    [(np.zeros((0, 8, 8, 3)), "empty batch"), (np.ones((2, 8, 8, 3), bool), "boolean")],
    ids=["empty", "boolean"],
)
def test_check_image_batch(images, phrase):
    with pytest.raises(ValueError, match=phrase):
        check_image_batch(images)
    check_image_batch(np.zeros((1, 8, 8, 3)))


def test_pixel_range_warns_once_per_model():
    first, second = object.__new__(type("M", (), {})), object.__new__(type("M", (), {}))
    unit = np.random.default_rng(0).uniform(0, 1, (2, 8, 8, 3)).astype("float32")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert check_pixel_range(unit, 255.0, model=first)
        assert not check_pixel_range(unit, 255.0, model=first)  # once per model
        assert check_pixel_range(unit, 255.0, model=second)
        assert not check_pixel_range(unit * 255, 255.0, model=object())  # [0, 255]: fine
        assert not check_pixel_range(np.zeros((2, 8, 8, 3), "float32"), 255.0, model=object())  # black images
        assert not check_pixel_range((unit * 255).astype("uint8"), 255.0, model=object())  # integer pixels
        assert not check_pixel_range(unit, 1.0, model=object())  # a [0, 1] model
    assert len(caught) == 2 and "looks like images already scaled to [0, 1]" in str(caught[0].message)
