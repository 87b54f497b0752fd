"""Calling a model on images of another size names the package's own resize, as docs/models.md says."""

import keras
import numpy as np
import pytest

import keras_vit


def test_another_image_size_names_resize_images_with_the_models_size():
    model = keras_vit.ViTClassifier.from_variant("ViT-Ti/16", image_size=(16, 24), patch_size=8, hidden_dim=8,
                                                 num_layers=1, num_heads=1, mlp_dim=8, num_classes=2)
    with pytest.raises(ValueError) as error:
        model(np.zeros((1, 32, 32, 3), "float32"))
    message = str(error.value)
    assert "keras_vit.data.resize_images(images, (16, 24))" in message
    assert "(32, 32)" in message  # what it received
    assert "crop_to_aspect_ratio=True" in message  # the in-graph alternative crops the same way
    # The named call does bring the batch to the model's size.
    resized = keras_vit.data.resize_images(np.zeros((1, 32, 32, 3)), (16, 24))
    assert keras.ops.convert_to_numpy(model(resized)).shape == (1, 2)
