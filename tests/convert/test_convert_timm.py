"""Parity with timm through committed fixtures (made by scripts/make_timm_fixtures.py)."""

import shutil

import numpy as np
import pytest

from keras_vit import ViTBackbone, ViTClassifier
from keras_vit.convert import export_timm, from_timm, load_checkpoint, read_safetensors
from tests.convert.helpers import TOLERANCE, fixture_path, max_abs_diff, predict

MODEL_FIXTURES = [
    "cls_token",
    "gap_fc_norm",
    "registers_no_embed_class",
    "layerscale_no_qkv_bias",
    "nonsquare",
    "no_class_token_gap",
]
FEATURE_FIXTURES = ("cls_token", "gap_fc_norm", "registers_no_embed_class")


def test_fixtures_record_timm_version(manifest):
    assert manifest["timm_version"].startswith("1.")
    reference = np.load(fixture_path("cls_token", "reference.npz"), allow_pickle=False)
    assert str(reference["timm_version"]) == manifest["timm_version"]
    assert set(manifest["fixtures"]) >= set(MODEL_FIXTURES) | {"google_vit", "big_vision_gap"}


@pytest.mark.parametrize("name", MODEL_FIXTURES)
def test_timm_parity(name, manifest):
    reference = np.load(fixture_path(name, "reference.npz"), allow_pickle=False)
    model = load_checkpoint(fixture_path(name), activation=None)
    assert isinstance(model, ViTClassifier)
    assert model.activation is None  # logits, like timm
    assert model.input_shape[1:3] == tuple(manifest["fixtures"][name]["image_size"])
    assert max_abs_diff(predict(model, reference["images"]), reference["logits"]) <= TOLERANCE

    # The backbone alone reproduces timm's forward_features (tokens after
    # `norm`; before it for fc_norm models, whose `norm` is an identity).
    assert isinstance(model.backbone, ViTBackbone)
    if name not in FEATURE_FIXTURES:
        return  # (one compile fewer per fixture; the logits already cover the rest)
    assert max_abs_diff(predict(model.backbone, reference["images"]), reference["features"]) <= TOLERANCE


def test_inferred_architecture(manifest):
    model = load_checkpoint(fixture_path("registers_no_embed_class"), activation=None)
    backbone = model.backbone
    assert backbone.num_register_tokens == 3
    assert backbone.prefix_position_embedding is False
    assert (backbone.hidden_dim, backbone.num_layers, backbone.num_heads, backbone.mlp_dim) == (16, 2, 2, 32)
    gap = load_checkpoint(fixture_path("gap_fc_norm"), activation=None)
    assert gap.pooling == "gap" and gap.pooled_norm and not gap.backbone.final_norm
    # timm's pretrained-cfg mean/std travel with the model.
    np.testing.assert_allclose(gap.backbone.pixel_mean, manifest["fixtures"]["gap_fc_norm"]["mean"])
    np.testing.assert_allclose(gap.backbone.pixel_std, manifest["fixtures"]["gap_fc_norm"]["std"])
    scaled = load_checkpoint(fixture_path("layerscale_no_qkv_bias"), activation=None).backbone
    assert scaled.layer_scale_init is not None and not scaled.use_qkv_bias


def test_state_dict_without_config(tmp_path):
    # A bare state dict: the grid comes from the position embedding (square),
    # registers' no_embed_class from its row count; heads must be given.
    reference = np.load(fixture_path("registers_no_embed_class", "reference.npz"), allow_pickle=False)
    path = tmp_path / "weights.safetensors"
    shutil.copy(fixture_path("registers_no_embed_class", "model.safetensors"), path)
    with pytest.raises(ValueError, match="num_heads"):
        load_checkpoint(path, activation=None)
    model = load_checkpoint(path, num_heads=2, activation=None)
    assert max_abs_diff(predict(model, reference["images"]), reference["logits"]) <= TOLERANCE

    state_dict = read_safetensors(fixture_path("nonsquare", "model.safetensors"))
    reference = np.load(fixture_path("nonsquare", "reference.npz"), allow_pickle=False)
    model = from_timm(state_dict, num_heads=2, source_image_size=(12, 20),
                      pixel_mean=(0.485, 0.456, 0.406), pixel_std=(0.229, 0.224, 0.225), activation=None)
    assert max_abs_diff(predict(model, reference["images"]), reference["logits"]) <= TOLERANCE


@pytest.mark.parametrize(
    "name, target",
    [
        ("cls_token", "24x24"),  # up: the 224 -> 384 case in small
        ("cls_token", "8x8"),  # down: antialiasing matters
        ("cls_token", "12x20"),  # square -> rectangular
        ("registers_no_embed_class", "24x24"),  # no prefix rows in the table
        ("nonsquare", "16x24"),  # rectangular -> rectangular
    ],
)
def test_resampled_matches_timm(name, target):
    reference = np.load(fixture_path(name, f"reference_{target}.npz"), allow_pickle=False)
    size = tuple(int(v) for v in reference["image_size"])
    model = load_checkpoint(fixture_path(name), image_size=size, activation=None)
    table = model.backbone.get_layer("patch_encoder").position_embedding_table.numpy()
    assert max_abs_diff(table, reference["pos_embed"]) <= TOLERANCE
    assert max_abs_diff(predict(model, reference["images"]), reference["logits"]) <= TOLERANCE


def test_resampling_to_same_size_is_identity():
    state_dict = read_safetensors(fixture_path("nonsquare", "model.safetensors"))
    model = load_checkpoint(fixture_path("nonsquare"), image_size=(12, 20), activation=None)
    table = model.backbone.get_layer("patch_encoder").position_embedding_table.numpy()
    np.testing.assert_array_equal(table, state_dict["pos_embed"])


@pytest.mark.parametrize("name", ["google_vit", "big_vision_gap"])
def test_npz_parity_with_timm_npz_loader(name):
    reference = np.load(fixture_path(f"{name}_reference.npz"), allow_pickle=False)
    model = load_checkpoint(fixture_path(f"{name}.npz"), activation=None)
    assert max_abs_diff(predict(model, reference["images"]), reference["logits"]) <= TOLERANCE


def test_npz_layouts_inferred():
    google = load_checkpoint(fixture_path("google_vit.npz"), activation=None)
    assert google.pooling == "token" and google.backbone.prefix_position_embedding
    assert google.backbone.num_heads == 2
    backbone = load_checkpoint(fixture_path("google_vit.npz"), include_head=False)
    assert isinstance(backbone, ViTBackbone) and not isinstance(backbone, ViTClassifier)
    big_vision = load_checkpoint(fixture_path("big_vision_gap.npz"), activation=None)
    assert big_vision.pooling == "gap" and not big_vision.backbone.use_class_token


@pytest.mark.parametrize("name", ["registers_no_embed_class", "gap_fc_norm", "nonsquare"])
def test_export_timm_round_trip(name, tmp_path):
    source = read_safetensors(fixture_path(name, "model.safetensors"))
    model = load_checkpoint(fixture_path(name), activation=None)
    path = tmp_path / "exported.safetensors"
    export_timm(model, path)
    exported = read_safetensors(path)
    # Same names, shapes and values as the state dict timm itself wrote, so
    # timm's load_state_dict accepts it.
    assert sorted(exported) == sorted(source)
    for key in source:
        np.testing.assert_array_equal(exported[key], source[key], err_msg=key)
    # And it comes back as the same model, config included (non-square, heads).
    reference = np.load(fixture_path(name, "reference.npz"), allow_pickle=False)
    again = load_checkpoint(path, activation=None)
    assert max_abs_diff(predict(again, reference["images"]), reference["logits"]) <= TOLERANCE


def test_npz_with_pre_logits_round_trip(tmp_path):
    # The original in21k checkpoints carry a tanh `pre_logits` layer; timm
    # drops it, so check the mapping by writing our model in the Google layout.
    arrays = dict(np.load(fixture_path("google_vit.npz"), allow_pickle=False))
    rng = np.random.default_rng(0)
    # (width 32 and 16 classes reuse the MLP's weight shapes: fewer JAX compiles)
    arrays["opt/target/pre_logits/kernel"] = rng.normal(size=(16, 32)).astype("float32")
    arrays["opt/target/pre_logits/bias"] = rng.normal(size=(32,)).astype("float32")
    arrays["opt/target/head/kernel"] = rng.normal(size=(32, 16)).astype("float32")
    arrays["opt/target/head/bias"] = rng.normal(size=(16,)).astype("float32")
    arrays["opt/state/step"] = np.array(1000)  # optimizer state beside opt/target/ is ignored
    path = tmp_path / "with_pre_logits.npz"
    np.savez(path, **arrays)
    model = load_checkpoint(path, activation=None)
    assert model.representation_size == 32 and model.num_classes == 16
    reference = np.load(fixture_path("google_vit_reference.npz"), allow_pickle=False)
    backbone = load_checkpoint(path, include_head=False)
    tokens = predict(backbone, reference["images"])
    # numpy reference of the head: tanh(x W1 + b1) W2 + b2 on the class token
    hidden = np.tanh(tokens[:, 0] @ arrays["opt/target/pre_logits/kernel"] + arrays["opt/target/pre_logits/bias"])
    expected = hidden @ arrays["opt/target/head/kernel"] + arrays["opt/target/head/bias"]
    assert max_abs_diff(predict(model, reference["images"]), expected) <= TOLERANCE
