"""Helpers of the preset tests: tiny models with random weights, inputs."""

import keras
import numpy as np

from keras_vit.models.vit_classifier import ViTClassifier

TINY = dict(image_size=32, patch_size=8, hidden_dim=24, num_layers=2, num_heads=2, mlp_dim=32)


def randomize(model, seed=0):
    """Give every weight (the zero-initialised head too) distinct random values."""
    rng = np.random.default_rng(seed)
    for variable in model.weights:
        variable.assign(rng.normal(0.0, 0.2, size=variable.shape).astype("float32"))
    return model


def tiny_classifier(num_classes=5, seed=0, **overrides):
    return randomize(ViTClassifier.from_variant("ViT-Ti/16", **{**TINY, "num_classes": num_classes, **overrides}), seed)


def images(count=2, size=32, seed=1):
    return np.random.default_rng(seed).uniform(0, 255, size=(count, size, size, 3)).astype("float32")


def to_numpy(x):
    return np.asarray(keras.ops.convert_to_numpy(x))


def http_response(status, repo_id, filename="config.json"):
    import httpx2

    url = f"https://huggingface.co/{repo_id}/resolve/main/{filename}"
    return httpx2.Response(status, request=httpx2.Request("GET", url))
