"""The layer contract (tests/helpers.py) for every core layer, on the current backend."""

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
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_layer_contract(case):
    layer_class, kwargs, input_shape, output_shape, num_trainable = CASES[case]
    run_layer_contract(layer_class, kwargs, input_shape, output_shape, num_trainable)
