"""What each core layer computes, against numpy written from the paper."""

import math

import keras
import numpy as np
import pytest
from keras import ops

from keras_vit import layers
from keras_vit.layers.attention import qkv_column_order
from tests import numpy_reference as ref


def to_numpy(x):
    return keras.ops.convert_to_numpy(x)


def test_patches_follow_row_major_order_and_row_col_channel_flattening():
    rng = np.random.default_rng(0)
    images = rng.normal(size=(2, 8, 12, 3)).astype("float32")
    got = to_numpy(layers.Patches(4)(images))
    expected = np.stack([ref.patchify(image, 4) for image in images])
    np.testing.assert_array_equal(got, expected)


def test_patches_rectangular_patch_size():
    images = np.arange(2 * 4 * 6 * 1, dtype="float32").reshape(2, 4, 6, 1)
    got = to_numpy(layers.Patches((2, 3))(images))
    assert got.shape == (2, 4, 6)
    # Second patch of the first image: rows 0-1, columns 3-5.
    np.testing.assert_array_equal(got[0, 1], images[0, 0:2, 3:6, 0].reshape(-1))


@pytest.mark.parametrize(
    "shape, message",
    [
        ((1, 30, 32, 3), "not divisible by the patch height"),
        ((1, 32, 30, 3), "not divisible by the patch width"),
        ((32, 32, 3), "rank 3"),
    ],
)
def test_patches_reject_bad_images_with_the_fix(shape, message):
    with pytest.raises(ValueError, match=message):
        layers.Patches(16)(np.zeros(shape, "float32"))


def test_patch_size_validation():
    with pytest.raises(ValueError, match="Received: patch_size=0"):
        layers.Patches(0)
    with pytest.raises(ValueError, match="tuple of two ints"):
        layers.Patches((2, 2, 2))


def _sincos_reference(rows, cols, width):
    # Independent loop form of big_vision's posemb_sincos_2d (temperature 1e4).
    quarter = width // 4
    table = np.zeros((rows * cols, width))
    for r in range(rows):
        for c in range(cols):
            for i in range(quarter):
                omega = 1.0 / 10000 ** (i / (quarter - 1))
                n = r * cols + c
                table[n, i] = math.sin(c * omega)
                table[n, quarter + i] = math.cos(c * omega)
                table[n, 2 * quarter + i] = math.sin(r * omega)
                table[n, 3 * quarter + i] = math.cos(r * omega)
    return table


def test_patch_encoder_prepends_class_token_then_adds_learned_positions():
    encoder = layers.PatchEncoder(hidden_dim=6)
    patches = np.random.default_rng(1).normal(size=(2, 4, 5)).astype("float32")
    encoder.build(patches.shape)
    rng = np.random.default_rng(2)
    kernel, bias = rng.normal(size=(5, 6)), rng.normal(size=(6,))
    cls, pos = rng.normal(size=(1, 1, 6)), rng.normal(size=(1, 5, 6))
    encoder.projection.set_weights([kernel, bias])
    encoder.class_token.assign(cls)
    encoder.position_embedding_table.assign(pos)
    got = to_numpy(encoder(patches))
    tokens = patches @ kernel + bias
    expected = np.concatenate([np.broadcast_to(cls, (2, 1, 6)), tokens], axis=1) + pos
    np.testing.assert_allclose(got, expected, atol=1e-5)


def test_patch_encoder_no_embed_class_and_registers():
    encoder = layers.PatchEncoder(hidden_dim=4, num_register_tokens=2, prefix_position_embedding=False)
    patches = np.random.default_rng(1).normal(size=(1, 4, 3)).astype("float32")
    out = to_numpy(encoder(patches))
    assert out.shape == (1, 7, 4)
    assert encoder.position_embedding_table.shape == (1, 4, 4)
    # Prefix tokens carry no position embedding: they are the raw weights.
    np.testing.assert_allclose(out[0, 0], to_numpy(encoder.class_token)[0, 0])
    np.testing.assert_allclose(out[0, 1:3], to_numpy(encoder.register_tokens)[0])


def test_patch_encoder_sincos2d_matches_reference_and_has_no_weight():
    encoder = layers.PatchEncoder(hidden_dim=8, grid_size=(2, 3), use_class_token=False, position_embedding="sincos2d")
    patches = np.zeros((1, 6, 4), "float32")
    out = to_numpy(encoder(patches))  # zero patches, zero bias: just the table
    np.testing.assert_allclose(out[0], _sincos_reference(2, 3, 8), atol=1e-6)
    assert [w.name for w in encoder.weights] == ["kernel", "bias"]


def test_patch_encoder_errors():
    with pytest.raises(ValueError, match="Unknown `position_embedding`"):
        layers.PatchEncoder(8, position_embedding="rope")
    with pytest.raises(ValueError, match="square grid"):
        layers.PatchEncoder(8)(np.zeros((1, 6, 3), "float32"))
    with pytest.raises(ValueError, match="divisible by 4"):
        layers.PatchEncoder(6, position_embedding="sincos2d")(np.zeros((1, 4, 3), "float32"))


def _attention_weights(layer):
    kernel, bias = [to_numpy(w) for w in layer.qkv.weights]
    width = kernel.shape[0]
    # Back to timm's q | k | v columns from the layer's per-head order.
    to_timm = np.argsort(qkv_column_order(layer.num_heads, width // layer.num_heads))
    kernel, bias = kernel[:, to_timm], bias[to_timm]
    out_kernel, out_bias = [to_numpy(w) for w in layer.output_projection.weights]
    return {
        "wq": kernel[:, :width], "wk": kernel[:, width : 2 * width], "wv": kernel[:, 2 * width :],
        "bq": bias[:width], "bk": bias[width : 2 * width], "bv": bias[2 * width :],
        "wo": out_kernel, "bo": out_bias,
    }


def test_attention_fast_and_explicit_paths_match_numpy():
    x = np.random.default_rng(3).normal(size=(2, 5, 8)).astype("float32")
    layer = layers.MultiHeadSelfAttention(num_heads=2)
    fast = to_numpy(layer(x))
    explicit, scores = layer(x, return_attention_scores=True)
    weights = _attention_weights(layer)
    expected = np.stack([ref.attention(sample.astype("float64"), weights, 2) for sample in x])
    np.testing.assert_allclose(fast, expected, atol=1e-5)
    np.testing.assert_allclose(to_numpy(explicit), expected, atol=1e-5)
    scores = to_numpy(scores)
    assert scores.shape == (2, 2, 5, 5)
    np.testing.assert_allclose(scores.sum(-1), 1.0, atol=1e-5)


def test_attention_dropout_only_in_training():
    x = np.random.default_rng(4).normal(size=(2, 5, 8)).astype("float32")
    layer = layers.MultiHeadSelfAttention(num_heads=2, attention_dropout=0.5)
    inference = to_numpy(layer(x, training=False))
    np.testing.assert_allclose(inference, to_numpy(layer(x)), atol=1e-6)
    assert not np.allclose(to_numpy(layer(x, training=True)), inference, atol=1e-4)


def test_attention_rejects_indivisible_width():
    with pytest.raises(ValueError, match=r"`hidden_dim` must be divisible by `num_heads`.*Received: hidden_dim=8, num_heads=3"):
        layers.MultiHeadSelfAttention(num_heads=3)(np.zeros((1, 4, 8), "float32"))


def test_mlp_uses_exact_gelu():
    x = np.random.default_rng(5).normal(size=(2, 3, 4)).astype("float32") * 3
    mlp = layers.MLP(mlp_dim=6)
    got = to_numpy(mlp(x))
    w1, b1 = [to_numpy(w) for w in mlp.fc1.weights]
    w2, b2 = [to_numpy(w) for w in mlp.fc2.weights]
    expected = ref.gelu(x.astype("float64") @ w1 + b1) @ w2 + b2
    np.testing.assert_allclose(got, expected, atol=1e-5)


def test_transformer_block_is_pre_layer_norm():
    x = np.random.default_rng(6).normal(size=(2, 5, 8)).astype("float32")
    block = layers.TransformerBlock(num_heads=2, mlp_dim=16)
    got = to_numpy(block(x))
    g1, b1 = [to_numpy(w) for w in block.norm1.weights]
    g2, b2 = [to_numpy(w) for w in block.norm2.weights]
    w = _attention_weights(block.attention)
    f1, c1 = [to_numpy(v) for v in block.mlp.fc1.weights]
    f2, c2 = [to_numpy(v) for v in block.mlp.fc2.weights]
    expected = []
    for z in x.astype("float64"):
        z = z + ref.attention(ref.layer_norm(z, g1, b1, 1e-6), w, 2)
        z = z + ref.gelu(ref.layer_norm(z, g2, b2, 1e-6) @ f1 + c1) @ f2 + c2
        expected.append(z)
    np.testing.assert_allclose(got, np.stack(expected), atol=1e-5)
    assert block.norm1.epsilon == 1e-6


def test_drop_path_drops_whole_samples_and_rescales():
    x = np.ones((2000, 3, 4), "float32")
    out = to_numpy(layers.DropPath(0.25, seed=0)(x, training=True))
    per_sample = out.reshape(2000, -1)
    # Each sample is either all zeros or all 1 / 0.75.
    assert np.all(per_sample.min(1) == per_sample.max(1))
    kept_values = per_sample[per_sample[:, 0] != 0, 0]
    np.testing.assert_allclose(kept_values, 1 / 0.75, rtol=1e-6)
    dropped = np.mean(per_sample[:, 0] == 0)
    assert abs(dropped - 0.25) < 0.04  # 2000 draws: 4 standard deviations
    np.testing.assert_array_equal(to_numpy(layers.DropPath(0.25)(x, training=False)), x)


def test_image_normalization_maps_uint8_range_to_minus_one_one():
    layer = layers.ImageNormalization()
    out = to_numpy(layer(np.array([[[[0.0, 127.5, 255.0]]]], "float32")))
    np.testing.assert_allclose(out, [[[[-1.0, 0.0, 1.0]]]], atol=1e-6)
    with pytest.raises(ValueError, match="3 channel"):
        layers.ImageNormalization(num_channels=3)(np.zeros((1, 4, 4, 1), "float32"))


def test_layer_scale_and_pooling_errors():
    with pytest.raises(ValueError, match="Unknown `pooling`"):
        layers.TokenPooling("max")
    with pytest.raises(ValueError, match="needs a class token"):
        layers.TokenPooling("token", num_prefix_tokens=0)
    out = to_numpy(layers.LayerScale(0.5)(np.ones((1, 2, 3), "float32")))
    np.testing.assert_allclose(out, 0.5)


def test_qkv_column_order_regroups_timm_columns_per_head():
    # Written out by hand: 2 heads of width 2, timm columns q0 q0 q1 q1 k0 k0 k1 k1 v0 v0 v1 v1.
    np.testing.assert_array_equal(qkv_column_order(2, 2), [0, 1, 4, 5, 8, 9, 2, 3, 6, 7, 10, 11])


def test_attention_with_timm_weights_regrouped_per_head_computes_timm_attention():
    x = np.random.default_rng(5).normal(size=(2, 5, 12)).astype("float32")
    layer = layers.MultiHeadSelfAttention(num_heads=3)
    layer.build(x.shape)
    rng = np.random.default_rng(6)
    timm_kernel, timm_bias = rng.normal(size=(12, 36)), rng.normal(size=(36,))
    to_layer = qkv_column_order(3, 4)
    layer.qkv.kernel.assign(timm_kernel[:, to_layer].astype("float32"))
    layer.qkv.bias.assign(timm_bias[to_layer].astype("float32"))
    weights = _attention_weights(layer)
    np.testing.assert_allclose(weights["wq"], timm_kernel[:, :12], atol=1e-6)  # the helper reads timm's q back
    expected = np.stack([ref.attention(sample.astype("float64"), weights, 3) for sample in x])
    np.testing.assert_allclose(to_numpy(layer(x)), expected, atol=1e-5)
    np.testing.assert_allclose(to_numpy(layer(x, return_attention_scores=True)[0]), expected, atol=1e-5)
