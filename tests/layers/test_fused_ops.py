"""Each fused operation equals the keras.ops formula it replaces (issue 17).

On torch the operations take their own kernels; on jax and tensorflow they
are the formula. Either way the result is checked against the formula
written here with keras.ops and against numpy written from the definition.
"""

import keras
import numpy as np
import pytest
from keras import ops

from keras_vit import layers
from keras_vit.layers import fused
from tests import numpy_reference as ref


def to_numpy(x):
    return ops.convert_to_numpy(x).astype("float64")


def rng(seed=0):
    return np.random.default_rng(seed)


@pytest.mark.parametrize("shape", [(5, 4), (2, 3, 4)])
@pytest.mark.parametrize("use_bias", [True, False])
def test_linear_equals_matmul_plus_bias(shape, use_bias):
    x = rng(1).normal(size=shape).astype("float32")
    kernel = rng(2).normal(size=(4, 6)).astype("float32")
    bias = rng(3).normal(size=(6,)).astype("float32") if use_bias else None
    got = to_numpy(fused.linear(ops.convert_to_tensor(x), ops.convert_to_tensor(kernel),
                                None if bias is None else ops.convert_to_tensor(bias)))
    # keras.ops throughout: a numpy bias added to a GPU tensor would be read back to the host.
    formula = ops.matmul(ops.convert_to_tensor(x), ops.convert_to_tensor(kernel))
    if bias is not None:
        formula = ops.add(formula, ops.convert_to_tensor(bias))
    np.testing.assert_allclose(got, to_numpy(formula), atol=1e-5)
    expected = x.astype("float64") @ kernel + (0.0 if bias is None else bias)
    np.testing.assert_allclose(got, expected, atol=1e-5)


def test_linear_gradients_equal_the_formulas():
    x = rng(4).normal(size=(3, 4)).astype("float32")
    layer = keras.layers.Dense(5, bias_initializer="random_normal")
    layer.build((None, 4))
    upstream = rng(5).normal(size=(3, 5))
    # d/dW sum(upstream * (x W + b)) = x^T upstream; d/db = sum over rows.
    kernel_grad, bias_grad = _gradients(lambda: fused.dense(layer, ops.convert_to_tensor(x)), layer, upstream)
    np.testing.assert_allclose(kernel_grad, x.astype("float64").T @ upstream, atol=1e-5)
    np.testing.assert_allclose(bias_grad, upstream.sum(axis=0), atol=1e-5)


def _gradients(fn, layer, upstream):
    """Gradients of sum(upstream * fn()) with respect to layer's weights, per backend."""
    upstream = ops.convert_to_tensor(upstream.astype("float32"))
    backend = keras.backend.backend()
    if backend == "torch":
        out = ops.sum(fn() * upstream)
        out.backward()
        grads = [w.value.grad for w in layer.trainable_weights]
    elif backend == "tensorflow":
        import tensorflow as tf

        with tf.GradientTape() as tape:
            out = ops.sum(fn() * upstream)
        grads = tape.gradient(out, [w.value for w in layer.trainable_weights])
    else:
        import jax

        def loss(values):
            with keras.StatelessScope(state_mapping=list(zip(layer.trainable_weights, values))):
                return ops.sum(fn() * upstream)

        grads = jax.grad(loss)([w.value for w in layer.trainable_weights])
    return [to_numpy(g) for g in grads]


def test_dense_through_fused_equals_the_layer():
    x = rng(6).normal(size=(7, 4)).astype("float32")
    layer = keras.layers.Dense(3, bias_initializer="random_normal")
    layer.build((None, 4))
    np.testing.assert_allclose(to_numpy(fused.dense(layer, x)), to_numpy(layer(x)), atol=1e-6)


def test_dense_with_an_activation_is_called_as_a_layer():
    x = rng(7).normal(size=(7, 4)).astype("float32")
    layer = keras.layers.Dense(3, activation="relu")
    layer.build((None, 4))
    got = to_numpy(fused.dense(layer, x))
    assert got.min() >= 0.0
    np.testing.assert_allclose(got, to_numpy(layer(x)), atol=1e-6)


def _qkv_formula(qkv, num_heads, scale):
    batch, tokens, width = qkv.shape
    head_dim = width // 3 // num_heads
    split = ops.reshape(qkv, (batch, tokens, 3, num_heads, head_dim))
    context = ops.dot_product_attention(split[:, :, 0], split[:, :, 1], split[:, :, 2], scale=scale)
    return ops.reshape(context, (batch, tokens, width // 3))


def _qkv_numpy(qkv, num_heads, scale):
    batch, tokens, width = qkv.shape
    head_dim = width // 3 // num_heads
    split = qkv.astype("float64").reshape(batch, tokens, 3, num_heads, head_dim)
    q, k, v = (split[:, :, i].transpose(0, 2, 1, 3) for i in range(3))  # (B, H, T, Dh)
    probs = ref.softmax(q @ k.transpose(0, 1, 3, 2) * scale)
    return (probs @ v).transpose(0, 2, 1, 3).reshape(batch, tokens, width // 3)


@pytest.mark.parametrize("num_heads", [1, 2, 4])
def test_qkv_attention_equals_dot_product_attention(num_heads):
    qkv = rng(8).normal(size=(2, 5, 3 * 8)).astype("float32")
    scale = (8 // num_heads) ** -0.5
    # The formula reads timm's q | k | v columns; the fused op the same columns regrouped per head.
    got = to_numpy(fused.qkv_attention(ops.convert_to_tensor(_per_head_columns(qkv, num_heads)), num_heads, scale))
    np.testing.assert_allclose(got, to_numpy(_qkv_formula(qkv, num_heads, scale)), atol=1e-5)
    np.testing.assert_allclose(got, _qkv_numpy(qkv, num_heads, scale), atol=1e-5)


def _per_head_columns(qkv, num_heads):
    """timm's q | k | v columns regrouped by hand as [q_h k_h v_h] per head."""
    width = qkv.shape[-1] // 3
    head_dim = width // num_heads
    blocks = [qkv[..., part * width + h * head_dim: part * width + (h + 1) * head_dim]
              for h in range(num_heads) for part in range(3)]
    return np.concatenate(blocks, axis=-1)


@pytest.mark.parametrize("num_heads", [1, 2, 4])
def test_qkv_attention_reads_per_head_columns(num_heads):
    qkv = rng(11).normal(size=(2, 5, 3 * 8)).astype("float32")
    scale = (8 // num_heads) ** -0.5
    got = to_numpy(fused.qkv_attention(ops.convert_to_tensor(_per_head_columns(qkv, num_heads)), num_heads, scale))
    np.testing.assert_allclose(got, _qkv_numpy(qkv, num_heads, scale), atol=1e-5)
    if num_heads > 1:  # the orders differ: timm's columns read as per-head ones must not agree
        wrong = to_numpy(fused.qkv_attention(ops.convert_to_tensor(qkv), num_heads, scale))
        assert not np.allclose(wrong, got, atol=1e-3)


def test_fused_ops_under_mixed_bfloat16():
    keras.config.set_dtype_policy("mixed_bfloat16")
    block = layers.TransformerBlock(num_heads=2, mlp_dim=16)
    x = rng(9).normal(size=(2, 5, 8)).astype("float32")
    got = block(x)
    assert keras.backend.standardize_dtype(got.dtype) == "bfloat16"
    assert all(w.dtype == "float32" for w in block.weights)
    timm_columns = rng(10).normal(size=(2, 5, 24)).astype("float32")
    qkv = ops.cast(ops.convert_to_tensor(_per_head_columns(timm_columns, 2)), "bfloat16")
    fast = to_numpy(fused.qkv_attention(qkv, 2, 0.5))
    np.testing.assert_allclose(fast, _qkv_numpy(to_numpy(ops.cast(timm_columns, "bfloat16")), 2, 0.5), atol=3e-2)


def _conv_numpy(x, kernel, stride):
    kh, kw = kernel.shape[:2]
    batch, height, width, _ = x.shape
    out_h, out_w = (height - kh) // stride + 1, (width - kw) // stride + 1
    out = np.zeros((batch, out_h, out_w, kernel.shape[-1]))
    for i in range(out_h):
        for j in range(out_w):
            window = x[:, i * stride:i * stride + kh, j * stride:j * stride + kw, :]  # (B, kh, kw, C)
            out[:, i, j] = np.tensordot(window, kernel, axes=([1, 2, 3], [0, 1, 2]))
    return out


@pytest.mark.parametrize("kernel_size,stride", [(1, 1), (3, 1), (3, 2), (1, 2), (7, 2)])
def test_conv2d_equals_keras_conv(kernel_size, stride):
    x = rng(12).normal(size=(2, 9, 8, 3)).astype("float32")
    kernel = rng(13).normal(size=(kernel_size, kernel_size, 3, 4)).astype("float32")
    got = to_numpy(fused.conv2d(ops.convert_to_tensor(x), ops.convert_to_tensor(kernel), stride))
    formula = ops.conv(x, kernel, strides=stride, padding="valid", data_format="channels_last")
    np.testing.assert_allclose(got, to_numpy(formula), atol=1e-4)
    np.testing.assert_allclose(got, _conv_numpy(x.astype("float64"), kernel, stride), atol=1e-4)


@pytest.mark.parametrize("groups", [1, 2, 4])
def test_group_norm_equals_the_layer(groups):
    x = rng(14).normal(size=(2, 5, 3, 8)).astype("float32") * 3 + 1
    layer = keras.layers.GroupNormalization(groups=groups, epsilon=1e-5, gamma_initializer="random_normal",
                                            beta_initializer="random_normal")
    layer.build(x.shape)
    got = to_numpy(fused.group_norm(layer, ops.convert_to_tensor(x)))
    np.testing.assert_allclose(got, to_numpy(layer(x)), atol=1e-5)
    grouped = x.astype("float64").reshape(2, 5, 3, groups, 8 // groups)
    mean = grouped.mean(axis=(1, 2, 4), keepdims=True)
    var = grouped.var(axis=(1, 2, 4), keepdims=True)
    expected = ((grouped - mean) / np.sqrt(var + 1e-5)).reshape(x.shape)
    expected = expected * to_numpy(layer.gamma) + to_numpy(layer.beta)
    np.testing.assert_allclose(got, expected, atol=1e-5)
