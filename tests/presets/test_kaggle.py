"""`kaggle://` handles: checked, then fetched through the kagglehub seam (replaced here by a local copy)."""

import os
import sys

import numpy as np
import pytest

import keras
from keras_vit.convert.kerashub import load_kerashub_preset
from keras_vit.presets import kaggle

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "fixtures", "kerashub")


def test_kaggle_handle_is_fetched_through_the_seam_and_loads(monkeypatch):
    asked = []

    def download(handle):
        asked.append(handle)
        return os.path.join(FIXTURES, "vit_classifier")

    monkeypatch.setattr(kaggle, "_download_model", download)
    directory = kaggle.kaggle_directory("kaggle://keras/vit/keras/vit_tiny_test/3")
    assert asked == ["keras/vit/keras/vit_tiny_test/3"]
    reference = np.load(os.path.join(FIXTURES, "reference.npz"), allow_pickle=False)
    model = load_kerashub_preset(directory, activation=None)
    logits = keras.ops.convert_to_numpy(model(reference["images"].astype("float32")))
    np.testing.assert_allclose(logits, reference["logits"], atol=1e-4)


@pytest.mark.parametrize("handle", [
    "kaggle://../../x/y", "kaggle://keras/vit/keras/..", "kaggle://keras/vit/keras", "kaggle://keras//keras/v",
    "kaggle://keras/vit/keras/v/latest", "kaggle:///etc/passwd/a/b", "kaggle://keras/vit/keras/v\\..", "hf://a/b",
    "kaggle://keras/vit/keras/v/3/extra",
])
def test_bad_kaggle_handles_are_refused(handle, monkeypatch):
    monkeypatch.setattr(kaggle, "_download_model", lambda h: pytest.fail(f"downloaded {h}"))
    with pytest.raises(ValueError, match="kaggle://owner/model/framework/variation"):
        kaggle.kaggle_directory(handle)


def test_kaggle_failures_say_what_to_do(monkeypatch):
    def offline(handle):
        raise ConnectionError("Name or service not known")

    monkeypatch.setattr(kaggle, "_download_model", offline)
    with pytest.raises(ConnectionError, match="Could not download kaggle://keras/vit/keras/v from Kaggle"):
        kaggle.kaggle_directory("kaggle://keras/vit/keras/v")
    monkeypatch.undo()
    monkeypatch.setitem(sys.modules, "kagglehub", None)
    with pytest.raises(ImportError, match="pip install kagglehub"):
        kaggle.kaggle_directory("kaggle://keras/vit/keras/v")


def test_from_preset_loads_keras_hub_presets_from_a_directory_the_hub_and_kaggle(monkeypatch, mirror):
    import shutil

    import keras_vit

    reference = np.load(os.path.join(FIXTURES, "reference.npz"), allow_pickle=False)
    x = reference["images"].astype("float32")
    probabilities = np.exp(reference["logits"]) / np.exp(reference["logits"]).sum(-1, keepdims=True)
    classifier_dir = os.path.join(FIXTURES, "vit_classifier")
    shutil.copytree(classifier_dir, mirror.repo("keras/vit_tiny_test"), dirs_exist_ok=True)
    monkeypatch.setattr(kaggle, "_download_model", lambda handle: classifier_dir)
    for handle in (classifier_dir, "hf://keras/vit_tiny_test", "kaggle://keras/vit/keras/vit_tiny_test/1"):
        model = keras_vit.ViTClassifier.from_preset(handle)
        np.testing.assert_allclose(keras.ops.convert_to_numpy(model(x)), probabilities, atol=1e-5)
        backbone = keras_vit.ViTBackbone.from_preset(handle)
        np.testing.assert_allclose(keras.ops.convert_to_numpy(backbone(x)), reference["features"], atol=1e-4)
    assert {call[1] for call in mirror.calls} == {"config.json", "model.weights.h5", "task.json", "task.weights.h5",
                                                  "image_converter.json", "preprocessor.json"}
