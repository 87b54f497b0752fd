"""Hybrid checkpoints converted from timm and Google .npz match timm's outputs.

The fixtures (tests/fixtures/hybrid, made by scripts/make_hybrid_fixtures.py
with timm 1.0.31) hold a reduced R50+ViT-B/16-shaped hybrid: BiT ResNet
stages (1, 2, 1) of root width 8 with 4 GroupNorm groups (output stride 16,
1x1 patches), a 2-block ViT of width 32, and timm's logits and tokens for
uint8 images at 224x224 and 96x160.
"""

import os

import keras
import numpy as np
import pytest

from keras_vit.convert import (
    from_npz, from_timm, load_checkpoint, read_npz, read_safetensors, resample_position_embedding,
)
from keras_vit.convert.hybrid import from_timm_hybrid, npz_hybrid_to_timm

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "fixtures", "hybrid")
WEIGHTS = os.path.join(FIXTURES, "tiny_r50_vit.safetensors")
GOOGLE = os.path.join(FIXTURES, "tiny_r50_vit_google.npz")
TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def reference():
    with np.load(os.path.join(FIXTURES, "reference.npz"), allow_pickle=False) as data:
        return {key: data[key] for key in data.files}


def _run(model, images):
    # predict() compiles the whole forward pass once, much faster than eager ops on JAX.
    return np.asarray(model.predict(images.astype("float32"), verbose=0))


def test_timm_hybrid_matches_timm_at_224(reference):
    model = load_checkpoint(WEIGHTS, num_groups=4, num_heads=4, activation=None)
    backbone = model.backbone
    assert backbone.stem.name == "bit_resnet" and backbone.patch_size == (1, 1) and backbone.grid_size == (14, 14)
    assert [layer.name for layer in backbone.stem.layers] == [
        "root", "block1_unit1", "block2_unit1", "block2_unit2", "block3_unit1"
    ]
    images = reference["images_224"]
    np.testing.assert_allclose(_run(model, images), reference["logits_224"], atol=TOLERANCE, rtol=0)
    np.testing.assert_allclose(_run(backbone, images), reference["tokens_224"], atol=TOLERANCE, rtol=0)


def test_timm_hybrid_matches_timm_non_square(reference):
    state_dict = read_safetensors(WEIGHTS)
    state_dict["pos_embed"] = reference["pos_embed_96x160"]  # timm's table for the 6x10 token grid
    model = from_timm(state_dict, num_groups=4, num_heads=4, source_image_size=(96, 160), activation=None)
    assert model.backbone.image_size == (96, 160) and model.backbone.grid_size == (6, 10)
    images = reference["images_96x160"]
    np.testing.assert_allclose(_run(model, images), reference["logits_96x160"], atol=TOLERANCE, rtol=0)
    np.testing.assert_allclose(_run(model.backbone, images), reference["tokens_96x160"], atol=TOLERANCE, rtol=0)


def test_google_npz_hybrid_matches_timm(reference):
    # The .npz was checked against timm's own .npz reader when it was made.
    arrays = read_npz(GOOGLE)
    assert "block1/unit1/conv_proj/kernel" in arrays and "gn_root/scale" in arrays
    model = from_npz(arrays, num_groups=4, activation=None)
    assert model.backbone.num_heads == 4
    np.testing.assert_allclose(_run(model, reference["images_224"]), reference["logits_224"], atol=TOLERANCE, rtol=0)


def test_npz_names_map_onto_timm_names():
    state_dict, num_heads = npz_hybrid_to_timm(read_npz(GOOGLE))
    timm_state = read_safetensors(WEIGHTS)
    assert num_heads == 4
    assert sorted(state_dict) == sorted(timm_state)
    for key, value in timm_state.items():
        np.testing.assert_array_equal(np.asarray(state_dict[key], np.float32), np.asarray(value, np.float32), key)


def test_resolution_change_resamples_the_token_grid():
    state_dict = read_safetensors(WEIGHTS)
    model = from_timm_hybrid(state_dict, num_groups=4, num_heads=4, image_size=(64, 96), include_head=False)
    assert model.grid_size == (4, 6)  # the 64x96 image gives a 4x6 feature map at stride 16
    table = keras.ops.convert_to_numpy(model.get_layer("patch_encoder").position_embedding_table)
    expected = resample_position_embedding(np.asarray(state_dict["pos_embed"], np.float32), 1, (14, 14), (4, 6))
    np.testing.assert_allclose(table, expected, atol=1e-6)


def test_group_count_mismatch_is_a_clear_error():
    # GroupNorm's group count is in no weight; timm's default (32) cannot split 8 channels.
    with pytest.raises(ValueError, match="num_groups"):
        load_checkpoint(WEIGHTS, num_heads=4, activation=None)


def test_stray_backbone_tensors_are_refused():
    state_dict = read_safetensors(WEIGHTS)
    state_dict["patch_embed.backbone.stem.extra.weight"] = np.zeros(3, np.float32)
    with pytest.raises(ValueError, match="stem.extra.weight"):
        from_timm(state_dict, num_groups=4, num_heads=4, activation=None)
