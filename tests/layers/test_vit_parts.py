"""The parts of SigLIP, CLIP, DINOv2, DeiT and qk-norm ViTs, each against a numpy reference (issue 48).

The references below are written from the papers' and sources' definitions in
float64 numpy (tests/numpy_reference.py's helpers), not from keras_vit's code:
quick-GELU `x * sigmoid(1.702 x)` (OpenAI CLIP), the tanh GELU, per-head
LayerNorm on queries and keys (Dehghani et al. 2023; timm's `qk_norm`), and
the MAP head (big_vision's `MAPHead`, timm's `AttentionPoolLatent`): a probe
queries the tokens, the result is projected, then `y + MLP(LN(y))`. Whole-model
parity against timm lives in tests/convert.
"""

import math

import keras
import numpy as np
import pytest

from keras_vit import layers
from tests.numpy_reference import gelu, layer_norm, softmax


def _numpy(x):
    return np.asarray(keras.ops.convert_to_numpy(x), dtype="float64")


def _randomise(layer, seed=1):
    rng = np.random.default_rng(seed)
    for variable in layer.weights:
        variable.assign(rng.normal(0.0, 0.5, variable.shape).astype("float32"))


X = np.random.default_rng(0).normal(0.0, 1.0, (2, 5, 8)).astype("float32")


@pytest.mark.parametrize("activation, reference", [
    ("gelu", gelu),
    ("gelu_tanh", lambda x: 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))),
    ("quick_gelu", lambda x: x / (1.0 + np.exp(-1.702 * x))),
])
def test_mlp_activation_is_the_named_formula(activation, reference):
    mlp = layers.MLP(16, activation=activation)
    mlp.build(X.shape)
    _randomise(mlp)
    fc1_kernel, fc1_bias, fc2_kernel, fc2_bias = (_numpy(w) for w in mlp.weights)
    expected = reference(X.astype("float64") @ fc1_kernel + fc1_bias) @ fc2_kernel + fc2_bias
    np.testing.assert_allclose(_numpy(mlp(X)), expected, atol=1e-5, rtol=0)


def test_activations_differ_enough_to_matter():
    # The reason the config names the activation: converted weights would be off by more than the 1e-4 parity.
    outputs = {}
    for activation in ("gelu", "gelu_tanh", "quick_gelu"):
        mlp = layers.MLP(16, activation=activation)
        mlp.build(X.shape)
        _randomise(mlp)
        outputs[activation] = _numpy(mlp(X))
    assert np.abs(outputs["gelu"] - outputs["gelu_tanh"]).max() > 1e-4
    assert np.abs(outputs["gelu"] - outputs["quick_gelu"]).max() > 1e-3


def _qk_norm_attention_reference(x, attention, num_heads):
    """Self-attention with per-head LayerNorm on q and k, from the definition (float64)."""
    qkv_kernel, qkv_bias, proj_kernel, proj_bias, q_gamma, q_beta, k_gamma, k_beta = (
        _numpy(w) for w in (attention.qkv.kernel, attention.qkv.bias, attention.output_projection.kernel,
                            attention.output_projection.bias, attention.query_norm.gamma, attention.query_norm.beta,
                            attention.key_norm.gamma, attention.key_norm.beta))
    batch, tokens, width = x.shape
    head_dim = width // num_heads
    # keras_vit's documented column layout: [q k v] of head 0, then of head 1, ...
    qkv = (x.astype("float64") @ qkv_kernel + qkv_bias).reshape(batch, tokens, num_heads, 3, head_dim)
    q = layer_norm(qkv[..., 0, :], q_gamma, q_beta, 1e-6)
    k = layer_norm(qkv[..., 1, :], k_gamma, k_beta, 1e-6)
    v = qkv[..., 2, :]
    probabilities = softmax(np.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(head_dim))
    context = np.einsum("bhqk,bkhd->bqhd", probabilities, v).reshape(batch, tokens, width)
    return context @ proj_kernel + proj_bias, probabilities


def test_qk_norm_attention_matches_the_definition_on_both_paths():
    attention = layers.MultiHeadSelfAttention(2, qk_norm=True)
    attention.build(X.shape)
    _randomise(attention)
    expected, probabilities = _qk_norm_attention_reference(X, attention, 2)
    np.testing.assert_allclose(_numpy(attention(X)), expected, atol=1e-5, rtol=0)
    outputs, scores = attention(X, return_attention_scores=True)
    np.testing.assert_allclose(_numpy(outputs), expected, atol=1e-5, rtol=0)
    np.testing.assert_allclose(_numpy(scores), probabilities, atol=1e-6, rtol=0)


@pytest.mark.parametrize("layer_class, kwargs", [
    (layers.MultiHeadSelfAttention, {"num_heads": 2, "qk_norm": True}),
    (layers.AttentionPooling, {"num_heads": 2, "mlp_dim": 16}),
])
def test_the_fast_path_goes_through_keras_fused_attention(monkeypatch, layer_class, kwargs):
    """With qk-norm and in the MAP head, attention is still `keras.ops.dot_product_attention` (fused stays fused)."""
    layer = layer_class(**kwargs)
    layer.build(X.shape)
    calls = []
    fused = keras.ops.dot_product_attention

    def counting(*args, **kw):
        calls.append(1)
        return fused(*args, **kw)

    monkeypatch.setattr(keras.ops, "dot_product_attention", counting)
    layer(X)
    assert calls, f"{layer_class.__name__} did not call keras.ops.dot_product_attention"


def _map_reference(tokens, pool, num_heads, activation):
    """big_vision's MAPHead from its definition (float64)."""
    w = {variable.path.split("/", 1)[1]: _numpy(variable) for variable in pool.weights}
    batch, length, width = tokens.shape
    head_dim = width // num_heads
    query = (w["probe"].reshape(1, width) @ w["q/kernel"] + w["q/bias"]).reshape(1, num_heads, head_dim)
    key_value = (tokens.astype("float64") @ w["kv/kernel"] + w["kv/bias"]).reshape(batch, length, 2, num_heads,
                                                                                  head_dim)
    key, value = key_value[:, :, 0], key_value[:, :, 1]
    probabilities = softmax(np.einsum("qhd,bkhd->bhk", query, key) / math.sqrt(head_dim))  # (B, H, N)
    context = np.einsum("bhk,bkhd->bhd", probabilities, value).reshape(batch, width)
    y = context @ w["proj/kernel"] + w["proj/bias"]
    hidden = activation(layer_norm(y, w["norm/gamma"], w["norm/beta"], 1e-6) @ w["mlp/fc1/kernel"] + w["mlp/fc1/bias"])
    return y + hidden @ w["mlp/fc2/kernel"] + w["mlp/fc2/bias"], probabilities


def test_attention_pooling_is_big_visions_map_head():
    pool = layers.AttentionPooling(num_heads=2, mlp_dim=16, name="map")
    pool.build(X.shape)
    _randomise(pool)
    expected, probabilities = _map_reference(X, pool, 2, gelu)
    np.testing.assert_allclose(_numpy(pool(X)), expected, atol=1e-5, rtol=0)
    pooled, scores = pool(X, return_attention_scores=True)
    np.testing.assert_allclose(_numpy(pooled), expected, atol=1e-5, rtol=0)
    np.testing.assert_allclose(_numpy(scores), probabilities, atol=1e-6, rtol=0)
    np.testing.assert_allclose(_numpy(scores).sum(-1), 1.0, atol=1e-6)


def test_distillation_token_follows_the_class_token_with_a_position_row():
    encoder = layers.PatchEncoder(8, use_distillation_token=True, num_register_tokens=1, projection_bias=False)
    patches = np.random.default_rng(2).normal(size=(2, 4, 12)).astype("float32")
    encoder.build(patches.shape)
    _randomise(encoder)
    assert encoder.num_prefix_tokens == 3 and not encoder.projection.use_bias
    kernel = _numpy(encoder.projection.kernel)
    position = _numpy(encoder.position_embedding_table)[0]  # (3 + 4, 8): class, distillation, register, patches
    expected = np.concatenate([
        _numpy(encoder.class_token)[0], _numpy(encoder.distillation_token)[0], _numpy(encoder.register_tokens)[0],
    ])[None] + position[:3]
    tokens = _numpy(encoder(patches))
    np.testing.assert_allclose(tokens[:, :3], np.broadcast_to(expected, (2, 3, 8)), atol=1e-6)
    np.testing.assert_allclose(tokens[:, 3:], patches @ kernel + position[3:], atol=1e-5)


@pytest.mark.one_backend("argument checks run before any backend op")
def test_unknown_activation_is_refused_with_the_choices():
    with pytest.raises(ValueError, match="quick_gelu"):
        layers.MLP(16, activation="relu")
    with pytest.raises(ValueError, match="gelu_tanh"):
        layers.AttentionPooling(num_heads=2, mlp_dim=16, activation="gelu_new")
