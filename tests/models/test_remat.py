"""Rematerialisation: the same training with each block recomputed in the backward pass."""

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit.utils.seeds import set_random_seed

LAYERS = 2


def tiny_classifier(**overrides):
    set_random_seed(0)
    arguments = dict(image_size=16, patch_size=8, hidden_dim=32, num_layers=LAYERS, num_heads=2, mlp_dim=64,
                     num_classes=3)
    return keras_vit.ViTClassifier.from_variant("ViT-Ti/16", **{**arguments, **overrides})


def train(remat, monkeypatch=None):
    model = tiny_classifier()
    model.set_remat(remat)
    model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9), loss="sparse_categorical_crossentropy")
    rng = np.random.default_rng(0)
    x, y = rng.uniform(0, 255, (6, 16, 16, 3)).astype("float32"), rng.integers(0, 3, 6)
    losses = model.fit(x, y, epochs=3, batch_size=3, shuffle=False, verbose=0).history["loss"]
    return model, losses, [keras.ops.convert_to_numpy(weight.value) for weight in model.weights], x


def test_remat_trains_exactly_as_without(monkeypatch):
    calls = []
    real_remat = keras.remat

    def recording_remat(function):
        calls.append(function)
        return real_remat(function)

    plain, plain_losses, plain_weights, x = train(False)
    monkeypatch.setattr(keras, "remat", recording_remat)
    model, losses, weights, _ = train(True)
    # Each block's forward went through keras.remat (at least once per block: once per trace on
    # JAX and TensorFlow, once per step on eager PyTorch) ...
    assert len(calls) >= LAYERS
    # ... and the training is the same: losses and weights within float32 noise.
    np.testing.assert_allclose(losses, plain_losses, atol=1e-5, rtol=0)
    for got, expected in zip(weights, plain_weights):
        np.testing.assert_allclose(got, expected, atol=1e-5, rtol=0)
    assert not np.allclose(losses[0], losses[-1])  # it trained
    calls.clear()
    model.predict(x, verbose=0)
    assert calls == []  # inference keeps its own path
    model.set_remat(False)
    model.fit(x, np.zeros(6, "int32"), epochs=1, verbose=0)
    assert calls == []


@pytest.mark.parametrize("argument", ["dropout", "attention_dropout", "drop_path_rate"])
def test_random_blocks_are_refused(argument):
    model = tiny_classifier(**{argument: 0.1})
    with pytest.raises(ValueError, match="draw random masks in training"):
        model.set_remat(True)
    model.set_remat(False)  # turning it off is always fine
