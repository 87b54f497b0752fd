"""Class names travel both ways: Hugging Face `id2label`, timm `pretrained_cfg`, `export.json` (issue 47)."""

import json

import numpy as np
import pytest

from keras_vit import ViTBackbone, ViTClassifier
from keras_vit.convert import export_huggingface, export_timm, from_timm, load_checkpoint
from keras_vit.convert.io import read_safetensors_with_metadata
from keras_vit.convert.timm import timm_config_from_metadata
from keras_vit.workflows.export import describe

transformers = pytest.importorskip("transformers")

TINY = dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32, patch_size=4,
            image_size=8)
ANIMALS = ["cat", "dog", "eel"]
# The first ImageNet-1k classes, as `keras-vit predict` prints them (the first WordNet lemma).
IMAGENET_FIRST = ["tench", "goldfish", "great white shark"]


def _classifier(num_classes, class_names=None):
    backbone = ViTBackbone(image_size=8, patch_size=4, hidden_dim=16, num_layers=1, num_heads=2, mlp_dim=32)
    return ViTClassifier(backbone, num_classes=num_classes, class_names=class_names)


def _hf_checkpoint(directory, **labels):
    config = transformers.ViTConfig(**TINY, **labels)
    transformers.ViTForImageClassification(config).save_pretrained(directory)


@pytest.mark.one_backend("reads config.json; the names do not depend on the backend")
def test_hf_id2label_is_read_on_import(tmp_path):
    _hf_checkpoint(tmp_path, id2label={0: "cat", 1: "dog", 2: "eel"}, label2id={"cat": 0, "dog": 1, "eel": 2})
    assert load_checkpoint(tmp_path).class_names == ANIMALS


@pytest.mark.one_backend("reads config.json; the names do not depend on the backend")
def test_hf_placeholder_labels_are_no_names(tmp_path):
    _hf_checkpoint(tmp_path, num_labels=3)  # transformers writes LABEL_0, LABEL_1, LABEL_2
    assert load_checkpoint(tmp_path).class_names is None


@pytest.mark.one_backend("writes config.json; the names do not depend on the backend")
def test_hf_export_writes_the_class_names(tmp_path):
    export_huggingface(_classifier(3, ANIMALS), tmp_path / "named")
    config = transformers.AutoConfig.from_pretrained(tmp_path / "named")
    assert [config.id2label[i] for i in range(3)] == ANIMALS
    assert config.label2id == {"cat": 0, "dog": 1, "eel": 2}
    # Read back, the names are the model's again.
    assert load_checkpoint(tmp_path / "named").class_names == ANIMALS


@pytest.mark.one_backend("writes config.json; the names do not depend on the backend")
def test_hf_export_of_a_1000_class_model_writes_imagenet_names(tmp_path):
    export_huggingface(_classifier(1000), tmp_path / "imagenet")
    config = json.loads((tmp_path / "imagenet" / "config.json").read_text())
    assert [config["id2label"][str(i)] for i in range(3)] == IMAGENET_FIRST
    assert len(config["id2label"]) == 1000
    assert load_checkpoint(tmp_path / "imagenet").class_names == "imagenet-1k"


def _timm_config(path):
    _, metadata = read_safetensors_with_metadata(path)
    return timm_config_from_metadata(metadata)


@pytest.mark.one_backend("writes safetensors metadata; the names do not depend on the backend")
def test_timm_export_writes_pretrained_cfg_with_label_names(tmp_path):
    export_timm(_classifier(3, ANIMALS), tmp_path / "named.safetensors")
    cfg = _timm_config(tmp_path / "named.safetensors")["pretrained_cfg"]
    assert cfg["label_names"] == ANIMALS and cfg["num_classes"] == 3
    assert cfg["crop_pct"] == 1.0 and cfg["crop_mode"] == "center" and cfg["interpolation"] == "bicubic"
    assert len(cfg["mean"]) == 3 and len(cfg["std"]) == 3
    assert load_checkpoint(tmp_path / "named.safetensors").class_names == ANIMALS


@pytest.mark.one_backend("reads a timm config; the names do not depend on the backend")
def test_timm_label_names_and_the_imagenet_convention_are_read(tmp_path):
    model = _classifier(3)
    export_timm(model, tmp_path / "plain.safetensors")
    state, _ = read_safetensors_with_metadata(tmp_path / "plain.safetensors")
    named = {"pretrained_cfg": {"label_names": ANIMALS, "num_classes": 3}}
    assert from_timm(state, config=named, num_heads=2).class_names == ANIMALS
    assert from_timm(state, config={"pretrained_cfg": {"num_classes": 3}}, num_heads=2).class_names is None
    # A 1000-class timm checkpoint without label names is ImageNet-1k (timm's `infer_imagenet_subset`).
    big = {**state, "head.weight": np.zeros((1000, 16), "float32"), "head.bias": np.zeros((1000,), "float32")}
    assert from_timm(big, config={"pretrained_cfg": {"num_classes": 1000}}, num_heads=2).class_names == "imagenet-1k"


@pytest.mark.one_backend("builds a document; the names do not depend on the backend")
def test_export_json_lists_the_real_class_names():
    assert describe(_classifier(1000))["class_names"][:3] == IMAGENET_FIRST
    assert describe(_classifier(3, ANIMALS))["class_names"] == ANIMALS
    assert describe(_classifier(3))["class_names"] == ["0", "1", "2"]


@pytest.mark.one_backend("writes safetensors metadata; the fields do not depend on the backend")
def test_timm_export_carries_the_transform(tmp_path):
    backbone = ViTBackbone(image_size=8, patch_size=4, hidden_dim=16, num_layers=1, num_heads=2, mlp_dim=32,
                           resize_mode="stretch", crop_fraction=0.9, interpolation="bilinear",
                           pixel_mean=(0.485, 0.456, 0.406), pixel_std=(0.229, 0.224, 0.225))
    export_timm(backbone, tmp_path / "stretch.safetensors")
    cfg = _timm_config(tmp_path / "stretch.safetensors")["pretrained_cfg"]
    assert (cfg["crop_pct"], cfg["crop_mode"], cfg["interpolation"]) == (0.9, "squash", "bilinear")
    np.testing.assert_allclose(cfg["mean"], (0.485, 0.456, 0.406), rtol=1e-6)
    np.testing.assert_allclose(cfg["std"], (0.229, 0.224, 0.225), rtol=1e-6)
    assert cfg["num_classes"] == 0 and "label_names" not in cfg
