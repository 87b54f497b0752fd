"""Shared helpers for the checkpoint-interop tests."""

import os

import keras
import numpy as np

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures", "timm")
TOLERANCE = 1e-4  # max abs difference, float32


def fixture_path(*parts):
    return os.path.join(FIXTURES, *parts)


def max_abs_diff(actual, expected):
    actual = np.asarray(actual, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    return float(np.max(np.abs(actual - expected)))


def predict(model, images):
    """Run `model` on raw [0, 255] pixels (it carries the source's mean/std)."""
    images = np.asarray(images, dtype="float32")
    if keras.backend.backend() == "jax":
        # One jitted graph compiles faster than eager JAX's per-op compiles.
        return np.asarray(model.predict_on_batch(images))
    return keras.ops.convert_to_numpy(model(images, training=False))
