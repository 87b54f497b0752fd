"""Resizing raw image arrays lives below the models (issue 35): `ViTClassifier.predict` resizes numpy
batches of another size, and the models may not import `keras_vit.data`, a higher layer."""

import numpy as np
import pytest
from PIL import Image

import keras_vit
from keras_vit.utils import image_resize

pytestmark = pytest.mark.one_backend("numpy and Pillow arithmetic, no backend")


def test_resize_images_is_a_centre_crop_then_bicubic_as_pillow_computes_it():
    rng = np.random.default_rng(0)
    batch = rng.integers(0, 256, size=(2, 6, 10, 3)).astype("float32")
    resized = image_resize.resize_images(batch, (3, 3))
    assert resized.shape == (2, 3, 3, 3) and resized.dtype == np.float32
    for image, result in zip(batch, resized):
        # The reference by hand, timm's order: the shorter side 6 -> 3 makes the image 3 x int(3 * 10 / 6) = 5
        # (bicubic), then columns round((5 - 3) / 2) = 1 to 4 are kept.
        expected = Image.fromarray(image.astype("uint8")).resize((5, 3), Image.BICUBIC).crop((1, 0, 4, 3))
        np.testing.assert_array_equal(result, np.asarray(expected, dtype="float32"))


def test_the_image_path_serves_the_same_functions_under_its_public_names():
    # `keras_vit.data.resize_images` is named in the models' error message; it stays what it was.
    assert keras_vit.data.resize_images is image_resize.resize_images
    assert keras_vit.data.center_crop is image_resize.center_crop
    assert keras_vit.data.images.EVAL_TRANSFORM is image_resize.EVAL_TRANSFORM
