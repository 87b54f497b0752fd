"""keras-hub ViT presets load through the strict name map and compute what keras-hub computes.

The fixtures (tests/fixtures/kerashub) were saved by keras-hub 0.32.0 itself with its outputs, by
scripts/make_kerashub_fixtures.py in a side environment: a 2-block, width-24 ViT on 32x32 images
with 8x8 patches, random weights, and a 5-class ViTImageClassifier on it.
"""

import json
import os
import shutil

import numpy as np
import pytest

import keras
from keras_vit.convert.kerashub import load_kerashub_preset
from keras_vit.presets.formats import detect_format

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "fixtures", "kerashub")
REFERENCE = np.load(os.path.join(FIXTURES, "reference.npz"), allow_pickle=False)
IMAGES = REFERENCE["images"].astype("float32")


def to_numpy(x):
    return np.asarray(keras.ops.convert_to_numpy(x))


def test_backbone_matches_keras_hub():
    backbone = load_kerashub_preset(os.path.join(FIXTURES, "vit_backbone"))
    assert type(backbone).__name__ == "ViTBackbone"
    np.testing.assert_allclose(to_numpy(backbone(IMAGES)), REFERENCE["features"], atol=1e-4)


def test_classifier_matches_keras_hub():
    directory = os.path.join(FIXTURES, "vit_classifier")
    logits = load_kerashub_preset(directory, activation=None)
    assert logits.num_classes == 5
    np.testing.assert_allclose(to_numpy(logits(IMAGES)), REFERENCE["logits"], atol=1e-4)
    probabilities = load_kerashub_preset(directory)  # keras_vit's default: softmax
    expected = np.exp(REFERENCE["logits"]) / np.exp(REFERENCE["logits"]).sum(-1, keepdims=True)
    np.testing.assert_allclose(to_numpy(probabilities(IMAGES)), expected, atol=1e-5)
    backbone = load_kerashub_preset(directory, include_head=False)
    np.testing.assert_allclose(to_numpy(backbone(IMAGES)), REFERENCE["features"], atol=1e-4)
    bigger = load_kerashub_preset(directory, image_size=48)
    assert tuple(to_numpy(bigger(np.zeros((1, 48, 48, 3), "float32"))).shape) == (1, 5)


def test_detection_and_refusals(tmp_path):
    # One detector (the reading table) for keras-hub presets, by either name keras-hub writes.
    assert detect_format(os.path.join(FIXTURES, "vit_backbone")) == "kerashub"
    by_module = tmp_path / "by_module"
    by_module.mkdir()
    (by_module / "config.json").write_text(json.dumps({"module": "keras_hub.src.models.vit", "class_name": "x"}))
    assert detect_format(str(by_module)) == "kerashub"
    with pytest.raises(ValueError, match="holds neither a keras_vit preset"):
        detect_format(str(tmp_path / "empty" if (tmp_path / "empty").mkdir() is None else ""))
    changed = tmp_path / "no_mha_bias"
    shutil.copytree(os.path.join(FIXTURES, "vit_backbone"), changed)
    config = json.loads((changed / "config.json").read_text())
    config["config"]["use_mha_bias"] = False
    (changed / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="use_mha_bias=False has no keras_vit equivalent"):
        load_kerashub_preset(changed)
    fewer = tmp_path / "fewer_layers"  # the config says 1 block, the weights hold 2
    shutil.copytree(os.path.join(FIXTURES, "vit_backbone"), fewer)
    config["config"].update(use_mha_bias=True, num_layers=1)
    (fewer / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"blocks\.1\."):
        load_kerashub_preset(fewer)
    os.remove(fewer / "model.weights.h5")
    with pytest.raises(ValueError, match="lacks .*model.weights.h5"):
        load_kerashub_preset(fewer)
