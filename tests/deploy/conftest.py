import keras
import numpy as np
import pytest

import keras_vit

CLASS_NAMES = ["cat", "dog", "bird"]


def tiny_classifier(seed=0):
    """A one-block ViT on 16x16 RGB images with a random (not zero) head, so outputs depend on the input."""
    keras.utils.set_random_seed(seed)
    model = keras_vit.ViTClassifier.from_variant(
        "ViT-Ti/16", image_size=16, patch_size=8, hidden_dim=32, num_layers=1, num_heads=2, mlp_dim=64,
        num_classes=len(CLASS_NAMES), class_names=CLASS_NAMES,
    )
    head = model.get_layer("head")
    head.kernel.assign(np.random.default_rng(seed).normal(0, 1, head.kernel.shape).astype("float32"))
    return model


def images(batch, seed=0):
    return np.random.default_rng(seed).uniform(0, 255, (batch, 16, 16, 3)).astype("float32")


@pytest.fixture
def classifier():
    return tiny_classifier()
