"""Parity with timm for issue 48's architectures, through committed fixtures.

The fixtures (tests/fixtures/timm/parts/, made by scripts/make_timm_part_fixtures.py
in the reference environment) are tiny random timm models of SigLIP (attention
pooling, no class token, with and without a head), CLIP with quick-GELU
(pre-norm), a qk-norm ViT, a distilled DeiT and a DINOv2 with registers (the
last two at 12x20 px), each with timm's own outputs, and big_vision SigLIP
`.npz` archives (bare and two-tower) with the outputs of timm's `.npz` loader.
"""

import json

import numpy as np
import pytest

from keras_vit import ViTBackbone, ViTClassifier
from keras_vit.convert import export_timm, load_checkpoint, read_safetensors
from tests.convert.helpers import TOLERANCE, fixture_path, max_abs_diff, predict

FIXTURES = ["siglip_map", "siglip_map_nonsquare_no_head", "clip_quickgelu", "qk_norm", "deit_distilled_nonsquare",
            "dinov2_reg_nonsquare"]


@pytest.fixture(scope="module")
def parts_manifest():
    with open(fixture_path("parts", "MANIFEST.json")) as handle:
        return json.load(handle)


def _reference(name):
    return np.load(fixture_path("parts", name, "reference.npz"), allow_pickle=False)


@pytest.mark.parametrize("name", FIXTURES)
def test_timm_parity_of_the_new_parts(name, parts_manifest):
    reference = _reference(name)
    model = load_checkpoint(fixture_path("parts", name), activation=None)
    entry = parts_manifest["fixtures"][name]
    assert model.count_params() == entry["num_params"]  # every timm tensor has its weight, and no more
    if isinstance(model, ViTClassifier):
        backbone = model.backbone
        assert max_abs_diff(predict(model, reference["images"]), reference["logits"]) <= TOLERANCE
    elif model.attention_pooling:
        # A head-less SigLIP tower: timm's model(x) is the attention-pooled embedding.
        backbone = model
        assert max_abs_diff(predict(backbone.pooled_model(), reference["images"]), reference["logits"]) <= TOLERANCE
    else:
        # A head-less DINOv2: timm's model(x) is the normalised class token.
        backbone = model
        assert max_abs_diff(predict(backbone, reference["images"])[:, 0], reference["logits"]) <= TOLERANCE
    assert backbone.input_shape[1:3] == tuple(entry["image_size"])
    assert max_abs_diff(predict(backbone, reference["images"]), reference["features"]) <= TOLERANCE


@pytest.mark.one_backend("reads the architecture from the checkpoint: no backend op")
def test_the_parts_are_read_from_the_checkpoint():
    siglip = load_checkpoint(fixture_path("parts", "siglip_map"), activation=None)
    assert siglip.pooling == "map" and siglip.backbone.attention_pooling and not siglip.backbone.use_class_token
    tower = load_checkpoint(fixture_path("parts", "siglip_map_nonsquare_no_head"))
    assert isinstance(tower, ViTBackbone) and tower.attention_pooling
    clip = load_checkpoint(fixture_path("parts", "clip_quickgelu"), activation=None).backbone
    assert clip.pre_norm and clip.mlp_activation == "quick_gelu" and clip.layer_norm_epsilon == 1e-5
    assert load_checkpoint(fixture_path("parts", "qk_norm"), activation=None).backbone.qk_norm
    deit = load_checkpoint(fixture_path("parts", "deit_distilled_nonsquare"), activation=None)
    assert deit.backbone.use_distillation_token and deit.backbone.num_prefix_tokens == 2


@pytest.mark.parametrize("name", ["siglip_map", "clip_quickgelu", "deit_distilled_nonsquare", "qk_norm",
                                  "dinov2_reg_nonsquare"])
def test_export_timm_round_trip_of_the_new_parts(name, tmp_path):
    source = read_safetensors(fixture_path("parts", name, "model.safetensors"))
    model = load_checkpoint(fixture_path("parts", name), activation=None)
    path = tmp_path / "exported.safetensors"
    export_timm(model, path)
    exported = read_safetensors(path)
    # timm's own names, shapes and values, so timm's load_state_dict takes the file.
    assert sorted(exported) == sorted(source)
    for key in source:
        np.testing.assert_array_equal(exported[key], source[key], err_msg=key)
    reference = _reference(name)
    again = load_checkpoint(path, activation=None)
    parts = ("pre_norm", "mlp_activation", "qk_norm", "use_distillation_token", "attention_pooling",
             "layer_norm_epsilon", "image_size", "num_register_tokens", "layer_scale_init")
    if isinstance(model, ViTBackbone):  # a head-less tower: its tokens are timm's forward_features
        assert {k: getattr(again, k) for k in parts} == {k: getattr(model, k) for k in parts}
        assert max_abs_diff(predict(again, reference["images"]), reference["features"]) <= TOLERANCE
        return
    assert {k: getattr(again.backbone, k) for k in parts} == {k: getattr(model.backbone, k) for k in parts}
    assert max_abs_diff(predict(again, reference["images"]), reference["logits"]) <= TOLERANCE
