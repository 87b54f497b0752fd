"""The product's main uses on the later families (issue 48): SigLIP (no class token, attention pooling) and
DINOv2 (registers), through their registry names.

Each registry entry is served its stand-in (tests/fixtures/presets/standins, timm 1.0.31's architecture and
tag shrunk to 2 blocks on 32 px; see tests/presets/test_later_presets.py) from a local mirror at the entry's
hub address, so the commands go the registry's whole way offline. Numbers are compared with timm's.
"""

import os

import numpy as np
import pytest
from PIL import Image

import keras_vit
from keras_vit import cli
from keras_vit.presets import hub
from keras_vit.presets.registry import PRESETS
from keras_vit.workflows.fewshot import extract_features
from tests.finetune.helpers import write_folder
from tests.inspection.reference import rollout_reference
from tests.presets.conftest import Mirror
from tests.presets.preset_helpers import to_numpy
from tests.presets.test_later_presets import serve

SIGLIP, DINOV2 = "siglip_b16_webli", "dinov2_s14_reg4_lvd142m"


@pytest.fixture
def registry(tmp_path, monkeypatch):
    """Both entries served their stand-ins; `registry[name]` is timm's reference for it."""
    monkeypatch.setenv("KERAS_VIT_CACHE", str(tmp_path / "cache"))
    mirror = Mirror(str(tmp_path / "mirror"))
    monkeypatch.setattr(hub, "_download_file", mirror.download)
    return {name: serve(monkeypatch, mirror, name) for name in (SIGLIP, DINOV2)}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write_folder(str(tmp_path_factory.mktemp("data") / "data"), classes=3, per_class=6, size=(40, 36))


def test_fewshot_feature_is_the_pooled_embedding_timm_gives(registry):
    # No class token: SigLIP's few-shot feature is its attention-pooled embedding; DINOv2's is its class
    # token (registers after it are not features). Both are timm's `forward_head(pre_logits=True)`.
    for name in (SIGLIP, DINOV2):
        backbone = keras_vit.ViTBackbone.from_preset(name)
        reference = registry[name]
        features = extract_features(backbone, reference["images"].astype("float32"))
        np.testing.assert_allclose(features, reference["pooled"], atol=1e-4, err_msg=name)


@pytest.mark.parametrize("name", [SIGLIP, DINOV2])
def test_fewshot_command_on_a_registry_name(name, registry, folder, capsys):
    assert cli.main(["fewshot", folder, "--preset", name, "--shots", "1,2", "--seeds", "1"]) == 0
    out = capsys.readouterr().out
    assert "1-shot:" in out and "2-shot:" in out


def test_a_new_head_pools_as_the_backbone_does():
    # A new head on a backbone without a class token takes its own feature (no pooling to choose).
    siglip = keras_vit.ViTBackbone(image_size=16, patch_size=8, hidden_dim=8, num_layers=1, num_heads=2, mlp_dim=8,
                                   use_class_token=False, attention_pooling=True)
    gap = keras_vit.ViTBackbone(image_size=16, patch_size=8, hidden_dim=8, num_layers=1, num_heads=2, mlp_dim=8,
                                use_class_token=False)
    registers = keras_vit.ViTBackbone(image_size=16, patch_size=8, hidden_dim=8, num_layers=1, num_heads=2,
                                      mlp_dim=8, num_register_tokens=2)
    assert [keras_vit.ViTClassifier(b, num_classes=2).pooling for b in (siglip, gap, registers)] == [
        "map", "gap", "token"]


@pytest.mark.parametrize("name", [SIGLIP, DINOV2])
def test_finetune_then_predict_on_a_registry_name(name, registry, folder, tmp_path, capsys):
    output = str(tmp_path / "tuned")
    argv = ["finetune", folder, "--preset", name, "--epochs", "1", "--batch-size", "6", "--output", output]
    assert cli.main(argv) == 0, capsys.readouterr().err
    tuned = keras_vit.ViTClassifier.from_preset(output)
    assert tuned.pooling == ("map" if name == SIGLIP else "token") and tuned.num_classes == 3
    assert tuned.backbone.num_register_tokens == (4 if name == DINOV2 else 0)
    capsys.readouterr()
    photo = os.path.join(folder, "class_1", "0.png")
    assert cli.main(["predict", photo, "--preset", output]) == 0
    assert "class_" in capsys.readouterr().out


def test_explain_draws_the_probes_attention_for_attention_pooling(registry, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    backbone = keras_vit.ViTBackbone.from_preset(SIGLIP)
    reference = registry[SIGLIP]
    maps = keras_vit.inspection.attention_maps(backbone, reference["images"].astype("float32"))
    # The probe's weights over the patches, as timm's attention-pooling head computes them (heads averaged).
    np.testing.assert_allclose(maps.probe.mean(axis=1), reference["probe_attention"], atol=1e-4)
    assert maps.probe_map.shape == (3, 2, 4, 4)
    # The rollout of the pooled feature: the probe's fused weights times an independent rollout's patch rows.
    rollout = keras_vit.inspection.attention_rollout(maps)
    expected = np.einsum("bq,bqk->bk", maps.probe.mean(axis=1), rollout_reference(maps.scores))
    assert rollout.query == "probe"
    np.testing.assert_allclose(rollout.grid.reshape(3, -1), expected, atol=1e-6)

    photo = str(tmp_path / "photo.png")
    Image.fromarray(reference["images"][0]).save(photo)
    assert cli.main(["explain", photo, "--preset", SIGLIP, "--out", str(tmp_path / "figures")]) == 0
    out = capsys.readouterr().out
    assert "attention of the attention-pooling probe" in out
    assert os.path.isfile(tmp_path / "figures" / "000_photo_rollout.png")
    # A model with a class token (DINOv2, registers) still shows the class token's.
    assert cli.main(["explain", photo, "--preset", DINOV2, "--out", str(tmp_path / "dinov2")]) == 0
    assert "attention of the class token" in capsys.readouterr().out


def test_model_card_of_a_siglip_preset(registry, tmp_path):
    from keras_vit.presets.upload import model_card

    backbone = keras_vit.ViTBackbone.from_preset(SIGLIP)
    directory = str(tmp_path / "siglip")
    backbone.save_to_preset(directory, license=PRESETS[SIGLIP]["license"])
    import json

    with open(os.path.join(directory, "config.json")) as file:
        document = json.load(file)
    with open(os.path.join(directory, "metadata.json")) as file:
        metadata = json.load(file)
    card = model_card(backbone, document, metadata, "someone/siglip-test")
    assert "ViTBackbone (no classification head)" in card and f"{backbone.count_params():,} parameters" in card
    assert "| License | apache-2.0 |" in card
    # The card says what sets the model apart from the paper's ViT: its pooled feature is the probe's.
    assert "attention pooling" in card and "class token" not in card.split("| Parts |")[1].split("\n")[0]
