"""Torch's fused Adam step (`keras_vit.optimizers.AdamW` on torch) equals Keras' Adam formula.

The step lived in `keras_vit.layers.fused` until issue 35; it is an optimizer step, not a layer
operation, so it moved to `keras_vit.integrations.torch_optimizers`. On torch it runs torch's fused
kernel; elsewhere it is the `keras.ops` formula. Either way it is checked against numpy written from
the definition.
"""

import keras
import numpy as np
from keras import ops

from keras_vit.integrations import torch_optimizers


def to_numpy(x):
    return ops.convert_to_numpy(x).astype("float64")


def _adam_numpy(w, g_steps, lr, beta_1, beta_2, epsilon):
    m, v = np.zeros_like(w), np.zeros_like(w)
    for t, g in enumerate(g_steps, start=1):
        alpha = lr * np.sqrt(1 - beta_2**t) / (1 - beta_1**t)
        m = m + (g - m) * (1 - beta_1)
        v = v + (g * g - v) * (1 - beta_2)
        w = w - alpha * m / (np.sqrt(v) + epsilon)
    return w, m, v


def test_adam_update_equals_keras_adam_formula():
    shapes = [(3, 4), (4,)]
    rng = np.random.default_rng(11)
    weights = [rng.normal(size=s) for s in shapes]
    grads = [[rng.normal(size=s) for s in shapes] for _ in range(3)]
    variables = [keras.Variable(w.astype("float32")) for w in weights]
    momentums = [keras.Variable(np.zeros(s, "float32")) for s in shapes]
    velocities = [keras.Variable(np.zeros(s, "float32")) for s in shapes]
    # A large epsilon makes its placement (before or after bias correction) visible.
    lr, beta_1, beta_2, epsilon = 0.1, 0.9, 0.99, 0.1
    for t in range(3):
        step_grads = [ops.convert_to_tensor(g.astype("float32")) for g in grads[t]]
        torch_optimizers.adam_update(variables, step_grads, momentums, velocities, lr, t + 1, beta_1, beta_2, epsilon)
    for i in range(len(shapes)):
        w, m, v = _adam_numpy(weights[i], [grads[t][i] for t in range(3)], lr, beta_1, beta_2, epsilon)
        np.testing.assert_allclose(to_numpy(variables[i]), w, atol=1e-5)
        np.testing.assert_allclose(to_numpy(momentums[i]), m, atol=1e-5)
        np.testing.assert_allclose(to_numpy(velocities[i]), v, atol=1e-5)


def test_has_fused_adam_only_on_torch_and_one_dtype():
    a = keras.Variable(np.zeros((2,), "float32"))
    b = keras.Variable(np.zeros((2,), "float32"))
    grads = [ops.zeros((2,)), ops.zeros((2,))]
    assert torch_optimizers.has_fused_adam([a, b], grads) == (keras.backend.backend() == "torch")
    c = keras.Variable(np.zeros((2,), "float16"))
    assert not torch_optimizers.has_fused_adam([a, c], [grads[0], ops.zeros((2,), "float16")])
    assert not torch_optimizers.has_fused_adam([], [])


def test_the_layers_fused_operations_hold_no_optimizer_step():
    from keras_vit.layers import fused

    # Until workflows/optimizers.py imports the step from its new place, `fused` re-exports it; the
    # step itself is defined once, in the integration.
    for name in ("adam_update", "has_fused_adam"):
        assert getattr(torch_optimizers, name).__module__ == "keras_vit.integrations.torch_optimizers"
        assert getattr(fused, name, None) in (None, getattr(torch_optimizers, name))
