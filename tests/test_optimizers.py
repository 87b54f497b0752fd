"""keras_vit.workflows.optimizers.AdamW trains exactly like keras.optimizers.AdamW (issue 17).

On torch it takes torch's fused Adam kernel; on jax and tensorflow it is
Keras' own. The weights after a few `fit` steps are compared with Keras'
AdamW on the same model and data, and with numpy written from the formulas.
"""

import keras
import numpy as np
import pytest

from keras_vit.workflows.optimizers import AdamW


def _model(seed=0):
    inputs = keras.Input((4,))
    x = keras.layers.Dense(8, activation="tanh", name="hidden")(inputs)
    outputs = keras.layers.Dense(3, name="out")(x)
    model = keras.Model(inputs, outputs)
    rng = np.random.default_rng(seed)
    model.set_weights([rng.normal(size=w.shape).astype("float32") * 0.5 for w in model.weights])
    return model


def _data():
    rng = np.random.default_rng(1)
    return rng.normal(size=(16, 4)).astype("float32"), rng.integers(0, 3, (16,)).astype("int32")


def _train(optimizer, steps=4):
    model = _model()
    model.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x, y = _data()
    for _ in range(steps):
        model.train_on_batch(x[:8], y[:8])
        model.train_on_batch(x[8:], y[8:])
    return model


SETTINGS = [
    {"learning_rate": 0.05, "weight_decay": 0.1},
    {"learning_rate": 0.05, "weight_decay": 0.0, "epsilon": 0.1, "beta_2": 0.9},
    {"learning_rate": keras.optimizers.schedules.CosineDecay(0.05, decay_steps=8), "weight_decay": 0.05},
    {"learning_rate": 0.05, "weight_decay": 0.1, "amsgrad": True},
    {"learning_rate": 0.05, "weight_decay": 0.1, "clipnorm": 0.1},
]


@pytest.mark.parametrize("settings", SETTINGS, ids=["decay", "epsilon", "schedule", "amsgrad", "clipnorm"])
def test_same_weights_as_keras_adamw(settings):
    ours = _train(AdamW(**settings))
    theirs = _train(keras.optimizers.AdamW(**settings))
    changed = False
    for a, b, start in zip(ours.get_weights(), theirs.get_weights(), _model().get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
        changed = changed or not np.allclose(a, start)
    assert changed


def test_exclude_from_weight_decay_is_honoured():
    def train(optimizer_class):
        optimizer = optimizer_class(learning_rate=0.05, weight_decay=0.5)
        optimizer.exclude_from_weight_decay(var_names=["bias"])
        return _train(optimizer, steps=2).get_weights()

    for a, b in zip(train(AdamW), train(keras.optimizers.AdamW)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_matches_numpy_adamw_on_one_weight():
    # One scalar weight, loss = w * g_t: the gradient is g_t, known in advance.
    gradients = [0.3, -1.2, 0.7]
    lr, wd, beta_1, beta_2, epsilon = 0.1, 0.2, 0.9, 0.999, 1e-7
    weight = keras.Variable(np.array([1.5], "float32"))
    optimizer = AdamW(learning_rate=lr, weight_decay=wd, beta_1=beta_1, beta_2=beta_2, epsilon=epsilon)
    w, m, v = 1.5, 0.0, 0.0
    for t, g in enumerate(gradients, start=1):
        optimizer.apply([keras.ops.convert_to_tensor(np.array([g], "float32"))], [weight])
        w = w - w * wd * lr  # decoupled decay first, as Keras applies it
        m, v = m + (g - m) * (1 - beta_1), v + (g * g - v) * (1 - beta_2)
        w = w - lr * np.sqrt(1 - beta_2**t) / (1 - beta_1**t) * m / (np.sqrt(v) + epsilon)
        np.testing.assert_allclose(keras.ops.convert_to_numpy(weight), [w], rtol=1e-6)


def test_config_is_keras_adamw_config():
    ours = AdamW(learning_rate=0.01, weight_decay=0.05, name="adamw").get_config()
    theirs = keras.optimizers.AdamW(learning_rate=0.01, weight_decay=0.05, name="adamw").get_config()
    assert ours == theirs
    assert isinstance(keras.optimizers.deserialize(keras.optimizers.serialize(AdamW())), AdamW)


def test_keras_file_round_trip_keeps_the_optimizer_and_its_state(tmp_path):
    model = _train(AdamW(learning_rate=0.05, weight_decay=0.1), steps=1)
    path = str(tmp_path / "model.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert type(loaded.optimizer) is AdamW
    x, y = _data()
    model.train_on_batch(x[:8], y[:8])
    loaded.train_on_batch(x[:8], y[:8])
    for a, b in zip(model.get_weights(), loaded.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_fit_with_a_string_free_compile():
    model = _model()
    model.compile(optimizer=AdamW(1e-2), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x, y = _data()
    history = model.fit(x, y, batch_size=8, epochs=3, verbose=0)
    losses = history.history["loss"]
    assert np.all(np.isfinite(losses)) and losses[-1] < losses[0]


def test_torch_takes_the_fused_kernel_and_others_keras_path(monkeypatch):
    from keras_vit.layers import fused

    calls = []
    original = fused.adam_update
    monkeypatch.setattr(fused, "adam_update", lambda *a, **k: calls.append(1) or original(*a, **k))
    _train(AdamW(learning_rate=0.05), steps=1)
    assert bool(calls) == (keras.backend.backend() == "torch")
    calls.clear()
    _train(AdamW(learning_rate=0.05, amsgrad=True), steps=1)
    assert not calls
