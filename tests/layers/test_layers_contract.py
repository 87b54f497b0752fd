"""The layer contract (tests/helpers.py) for every core layer, on the current backend."""

import keras
import numpy as np
import pytest

from keras_vit import layers
from tests.helpers import run_layer_contract

CASES = {
    "patches_square": (layers.Patches, {"patch_size": 4}, (2, 8, 8, 3), (2, 4, 48), 0),
    "patches_rectangular": (layers.Patches, {"patch_size": (2, 4)}, (2, 4, 8, 1), (2, 4, 8), 0),
    "patch_encoder_learned": (layers.PatchEncoder, {"hidden_dim": 8}, (2, 4, 12), (2, 5, 8), 4),
    "patch_encoder_registers_no_embed_class": (
        layers.PatchEncoder,
        {"hidden_dim": 8, "grid_size": (2, 3), "num_register_tokens": 2, "prefix_position_embedding": False},
        (2, 6, 12),
        (2, 9, 8),
        5,
    ),
    "patch_encoder_sincos_no_class": (
        layers.PatchEncoder,
        {"hidden_dim": 8, "use_class_token": False, "position_embedding": "sincos2d"},
        (2, 4, 12),
        (2, 4, 8),
        2,
    ),
    "attention": (layers.MultiHeadSelfAttention, {"num_heads": 2}, (2, 5, 8), (2, 5, 8), 4),
    "mlp": (layers.MLP, {"mlp_dim": 16}, (2, 5, 8), (2, 5, 8), 4),
    "transformer_block": (layers.TransformerBlock, {"num_heads": 2, "mlp_dim": 16}, (2, 5, 8), (2, 5, 8), 12),
    "transformer_block_layer_scale": (
        layers.TransformerBlock,
        {"num_heads": 2, "mlp_dim": 16, "layer_scale_init": 0.1, "drop_path": 0.1, "dropout": 0.1},
        (2, 5, 8),
        (2, 5, 8),
        14,
    ),
    "drop_path": (layers.DropPath, {"rate": 0.2, "seed": 1}, (4, 5, 8), (4, 5, 8), 0),
    "layer_scale": (layers.LayerScale, {"init_value": 1e-5}, (2, 5, 8), (2, 5, 8), 1),
    "image_normalization": (
        layers.ImageNormalization,
        {"scale": 1 / 255, "mean": (0.485, 0.456, 0.406), "std": (0.229, 0.224, 0.225), "num_channels": 3},
        (2, 4, 4, 3),
        (2, 4, 4, 3),
        0,
    ),
    "token_pooling_gap": (layers.TokenPooling, {"pooling": "gap", "num_prefix_tokens": 2}, (2, 6, 8), (2, 8), 0),
    "token_pooling_token": (layers.TokenPooling, {"pooling": "token"}, (2, 6, 8), (2, 8), 0),
    # The parts of SigLIP, CLIP, DINOv2, DeiT and qk-norm ViTs (issue 48).
    "attention_qk_norm": (layers.MultiHeadSelfAttention, {"num_heads": 2, "qk_norm": True}, (2, 5, 8), (2, 5, 8), 8),
    "mlp_quick_gelu": (layers.MLP, {"mlp_dim": 16, "activation": "quick_gelu"}, (2, 5, 8), (2, 5, 8), 4),
    "mlp_gelu_tanh": (layers.MLP, {"mlp_dim": 16, "activation": "gelu_tanh"}, (2, 5, 8), (2, 5, 8), 4),
    "transformer_block_qk_norm_quick_gelu": (
        layers.TransformerBlock, {"num_heads": 2, "mlp_dim": 16, "qk_norm": True, "activation": "quick_gelu"},
        (2, 5, 8), (2, 5, 8), 16,
    ),
    # probe, q and kv and proj (kernel + bias each), the LayerNorm, the MLP's two Dense layers
    "attention_pooling": (layers.AttentionPooling, {"num_heads": 2, "mlp_dim": 16}, (2, 5, 8), (2, 8), 13),
    "patch_encoder_distillation_no_bias": (
        layers.PatchEncoder, {"hidden_dim": 8, "use_distillation_token": True, "projection_bias": False},
        (2, 4, 12), (2, 6, 8), 4,
    ),
}

# Layers whose call takes more than the one input tensor, or returns more than one.
# PatchCorruption applies a fixed corruption plan: in each image one patch masked
# (mode 1), one replaced by another patch (mode 2, its source), one selected but
# unchanged (mode 3), one left out (mode 0); the mask embedding is its one weight.
_MODE = np.array([[1, 2, 3, 0], [0, 3, 2, 1]], dtype="int32")
_SOURCE = np.array([[0, 3, 2, 3], [0, 1, 0, 3]], dtype="int32")
# The explicit attention path (the "AttentionScores" case): outputs and the
# (batch, heads, tokens, tokens) probabilities, through a fit and a .keras round trip.
MULTI_CASES = {
    "patch_corruption": dict(
        layer_class=layers.PatchCorruption, init_kwargs={"seed": 3}, input_shape=(2, 4, 8),
        expected_output_shape=(2, 4, 8), expected_num_trainable_weights=1,
        extra_inputs={"mode": _MODE, "source": _SOURCE},
    ),
    "attention_scores": dict(
        layer_class=layers.MultiHeadSelfAttention, init_kwargs={"num_heads": 2}, input_shape=(2, 5, 8),
        expected_output_shape=[(2, 5, 8), (2, 2, 5, 5)], expected_num_trainable_weights=4,
        call_kwargs={"return_attention_scores": True},
    ),
    "attention_qk_norm_scores": dict(
        layer_class=layers.MultiHeadSelfAttention, init_kwargs={"num_heads": 2, "qk_norm": True},
        input_shape=(2, 5, 8), expected_output_shape=[(2, 5, 8), (2, 2, 5, 5)], expected_num_trainable_weights=8,
        call_kwargs={"return_attention_scores": True},
    ),
    "attention_pooling_scores": dict(
        layer_class=layers.AttentionPooling, init_kwargs={"num_heads": 2, "mlp_dim": 16}, input_shape=(2, 5, 8),
        expected_output_shape=[(2, 8), (2, 2, 5)], expected_num_trainable_weights=13,
        call_kwargs={"return_attention_scores": True},
    ),
    "transformer_block_attention_scores": dict(
        layer_class=layers.TransformerBlock, init_kwargs={"num_heads": 2, "mlp_dim": 16}, input_shape=(2, 5, 8),
        expected_output_shape=[(2, 5, 8), (2, 2, 5, 5)], expected_num_trainable_weights=12,
        call_kwargs={"return_attention_scores": True},
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_layer_contract(case):
    layer_class, kwargs, input_shape, output_shape, num_trainable = CASES[case]
    run_layer_contract(layer_class, kwargs, input_shape, output_shape, num_trainable)


@pytest.mark.parametrize("case", sorted(MULTI_CASES))
def test_layer_contract_with_several_inputs_or_outputs(case):
    run_layer_contract(**MULTI_CASES[case])


def test_patch_corruption_applies_the_plan_it_is_given():
    """Beyond the contract: each mode does what the paper's B.1.2 says, checked with numpy."""
    layer = layers.PatchCorruption(seed=3)
    embeddings = np.random.default_rng(0).normal(size=(2, 4, 8)).astype("float32")
    corrupted = keras.ops.convert_to_numpy(layer(embeddings, mode=_MODE, source=_SOURCE))
    mask = keras.ops.convert_to_numpy(layer.mask_token)
    for image in range(2):
        for patch in range(4):
            mode = _MODE[image, patch]
            expected = {1: mask, 2: embeddings[image, _SOURCE[image, patch]]}.get(mode, embeddings[image, patch])
            np.testing.assert_array_equal(corrupted[image, patch], expected)
