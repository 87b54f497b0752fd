"""The hot path runs its Dense layers on 2-D (tokens, width) views (issue 7).

These check that the reshapes around the matmuls keep every input rank and
a batch size unknown until run time (compiled predict on jax/tensorflow)
working, against numpy written from the formulas.
"""

import keras
import numpy as np
import pytest

from keras_vit import layers
from tests import numpy_reference as ref
from tests.layers.test_layers_behaviour import _attention_weights


def to_numpy(x):
    return keras.ops.convert_to_numpy(x)


def _mlp_reference(mlp, x):
    w1, b1 = [to_numpy(w).astype("float64") for w in mlp.fc1.weights]
    w2, b2 = [to_numpy(w).astype("float64") for w in mlp.fc2.weights]
    return ref.gelu(x.astype("float64") @ w1 + b1) @ w2 + b2


@pytest.mark.parametrize("shape", [(7, 4), (2, 3, 4), (2, 3, 5, 4)])
def test_mlp_keeps_any_leading_shape(shape):
    x = np.random.default_rng(11).normal(size=shape).astype("float32")
    mlp = layers.MLP(mlp_dim=6)
    got = to_numpy(mlp(x))
    assert got.shape == shape
    np.testing.assert_allclose(got, _mlp_reference(mlp, x), atol=1e-5)
    assert mlp.compute_output_shape((None,) + shape[1:]) == (None,) + shape[1:]


def test_block_in_a_model_with_unknown_batch_matches_numpy():
    # Symbolic (None) batch, then compiled predict with two batch sizes.
    inputs = keras.Input(shape=(5, 8))
    block = layers.TransformerBlock(num_heads=2, mlp_dim=16)
    model = keras.Model(inputs, block(inputs))
    assert model.output.shape == (None, 5, 8)
    g1, b1 = [to_numpy(w) for w in block.norm1.weights]
    g2, b2 = [to_numpy(w) for w in block.norm2.weights]
    w = _attention_weights(block.attention)
    for batch in (3, 2):
        x = np.random.default_rng(batch).normal(size=(batch, 5, 8)).astype("float32")
        got = model.predict(x, batch_size=batch, verbose=0)
        expected = []
        for z in x.astype("float64"):
            z = z + ref.attention(ref.layer_norm(z, g1, b1, 1e-6), w, 2)
            z = z + _mlp_reference(block.mlp, ref.layer_norm(z, g2, b2, 1e-6))
            expected.append(z)
        np.testing.assert_allclose(got, np.stack(expected), atol=1e-5)


def test_attention_explicit_path_with_unknown_batch_matches_fast_path():
    inputs = keras.Input(shape=(6, 8))
    attention = layers.MultiHeadSelfAttention(num_heads=4)
    outputs, scores = attention(inputs, return_attention_scores=True)
    model = keras.Model(inputs, [outputs, scores])
    x = np.random.default_rng(12).normal(size=(3, 6, 8)).astype("float32")
    got, got_scores = model.predict(x, verbose=0)
    np.testing.assert_allclose(got, to_numpy(attention(x)), atol=1e-5)
    assert got_scores.shape == (3, 4, 6, 6)
