"""Checks at the entry of fit / evaluate / predict and save_to_preset, before anything is traced or written."""

import json
import os
import warnings

import numpy as np
import pytest

import keras_vit


def tiny_classifier(num_classes=3):
    return keras_vit.ViTClassifier.from_variant(
        "ViT-Ti/16", image_size=8, patch_size=4, hidden_dim=16, num_layers=1, num_heads=2, mlp_dim=16,
        num_classes=num_classes,
    )


def test_boolean_batches_are_refused_before_the_input_casts_them():
    model = tiny_classifier()
    with pytest.raises(ValueError, match="boolean"):
        model.predict(np.ones((2, 8, 8, 3), bool), verbose=0)
    assert model.predict(np.zeros((1, 8, 8, 3), "float32"), verbose=0).shape == (1, 3)  # still usable


def test_unit_range_pixels_warn_once_per_model():
    model = tiny_classifier()
    unit = np.random.default_rng(0).random((2, 8, 8, 3)).astype("float32")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.predict(unit, verbose=0)
        model.predict(unit, verbose=0)
        model.predict(unit * 255, verbose=0)
    messages = [str(w.message) for w in caught if "scaled to [0, 1]" in str(w.message)]
    assert len(messages) == 1


@pytest.mark.parametrize("labels, message", [
    (np.array([0, 1, 2, 7]), r"labels from 0 to 7"),
    (np.array([-1, 0, 1, 2]), r"labels from -1 to 2"),
    (np.array(["a", "b", "c", "a"]), "integer class indices"),
    (np.array([0.5, 1.0, 2.0, 0.0]), "integer class indices"),
])
def test_labels_out_of_range_or_not_indices_are_refused(labels, message):
    model = tiny_classifier()
    model.compile()
    images = np.zeros((4, 8, 8, 3), "float32")
    with pytest.raises(ValueError, match=message):
        model.fit(images, labels, verbose=0)
    with pytest.raises(ValueError, match=message):
        model.evaluate(images, labels, verbose=0)


def test_metadata_that_is_not_json_is_refused_before_anything_is_written(tmp_path):
    target = tmp_path / "preset"
    with pytest.raises(ValueError, match="'tags'"):
        tiny_classifier().save_to_preset(target, tags={1, 2})
    assert not target.exists()


def test_a_directory_holding_another_models_files_is_not_overwritten(tmp_path):
    hf_dir = tmp_path / "hf_model"
    hf_dir.mkdir()
    (hf_dir / "config.json").write_text(json.dumps({"model_type": "vit"}))
    (hf_dir / "model.safetensors").write_bytes(b"not ours")
    with pytest.raises(ValueError, match=r"holds files keras_vit did not write there \(config.json, model.safetensors\)"):
        tiny_classifier().save_to_preset(hf_dir)
    assert (hf_dir / "model.safetensors").read_bytes() == b"not ours"
    assert sorted(os.listdir(hf_dir)) == ["config.json", "model.safetensors"]


def test_replacing_a_different_preset_warns_and_the_same_one_does_not(tmp_path):
    target = tmp_path / "preset"
    model = tiny_classifier()
    model.save_to_preset(target)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.save_to_preset(target)  # re-saving the same model (e.g. after training) is quiet
    assert not [w for w in caught if "different model" in str(w.message)]
    with pytest.warns(UserWarning, match="by a different model"):
        tiny_classifier(num_classes=5).save_to_preset(target)
    assert keras_vit.ViTClassifier.from_preset(str(target)).num_classes == 5
