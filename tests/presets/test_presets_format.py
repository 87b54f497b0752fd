"""The keras_vit preset format: exact round trips, image_size / num_classes / load_weights, config checks."""

import datetime
import json
import os

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit.convert import resample_position_embedding
from tests.presets.preset_helpers import images, tiny_classifier, to_numpy


def test_classifier_round_trip_is_exact(tmp_path):
    model = tiny_classifier(num_classes=5, pooled_norm=True, representation_size=16)
    model.save_to_preset(tmp_path / "preset", note="hello")
    assert sorted(os.listdir(tmp_path / "preset")) == [".keras_vit.json", "config.json", "metadata.json",
                                                       "model.weights.h5"]
    loaded = keras_vit.ViTClassifier.from_preset(str(tmp_path / "preset"))
    x = images()
    np.testing.assert_array_equal(to_numpy(loaded(x)), to_numpy(model(x)))
    for a, b in zip(model.weights, loaded.weights):
        np.testing.assert_array_equal(to_numpy(a), to_numpy(b))
    assert loaded.get_config()["pooled_norm"] and loaded.representation_size == 16

    metadata = json.loads((tmp_path / "preset" / "metadata.json").read_text())
    assert metadata["keras_vit_version"] == keras_vit.__version__ and metadata["keras_version"] == keras.__version__
    assert metadata["backend"] == keras.backend.backend() and metadata["class_name"] == "ViTClassifier"
    # 2 blocks of width 24, MLP 32, 16 patches of 8x8x3, 5 classes, pre-logits 16, fc_norm: by arithmetic.
    width, mlp = 24, 32
    block = 4 * width + 3 * width * width + 3 * width + width * width + width + 2 * width * mlp + mlp + width
    expected = 8 * 8 * 3 * width + width + width + 17 * width + 2 * block + 2 * width + 2 * width
    expected += width * 16 + 16 + 16 * 5 + 5
    assert metadata["parameter_count"] == expected
    assert datetime.datetime.fromisoformat(metadata["date"]).tzinfo is not None
    assert metadata["note"] == "hello"


def test_backbone_round_trip_and_backbone_of_a_classifier(tmp_path):
    model = tiny_classifier()
    model.backbone.save_to_preset(tmp_path / "backbone")
    model.save_to_preset(tmp_path / "classifier")
    x = images()
    reference = to_numpy(model.backbone(x))
    for directory in ("backbone", "classifier"):
        loaded = keras_vit.ViTBackbone.from_preset(str(tmp_path / directory))
        assert isinstance(loaded, keras_vit.ViTBackbone)
        np.testing.assert_array_equal(to_numpy(loaded(x)), reference)
    with pytest.raises(ValueError, match="holds a backbone without a classification head.*num_classes="):
        keras_vit.ViTClassifier.from_preset(str(tmp_path / "backbone"))
    with_head = keras_vit.ViTClassifier.from_preset(str(tmp_path / "backbone"), num_classes=3)
    np.testing.assert_allclose(to_numpy(with_head(x)), np.full((2, 3), 1 / 3), atol=1e-6)


def test_image_size_resamples_position_embedding(tmp_path):
    model = tiny_classifier()
    model.save_to_preset(tmp_path / "preset")
    bigger = keras_vit.ViTClassifier.from_preset(str(tmp_path / "preset"), image_size=48)
    assert bigger.backbone.grid_size == (6, 6) and tuple(bigger.input_shape[1:]) == (48, 48, 3)
    assert bigger(images(size=48)).shape == (2, 5)

    table = to_numpy(model.backbone.get_layer("patch_encoder").position_embedding_table)  # (1, 1 + 16, 24)
    new = to_numpy(bigger.backbone.get_layer("patch_encoder").position_embedding_table)  # (1, 1 + 36, 24)
    np.testing.assert_array_equal(new[:, :1], table[:, :1])  # the class token's row is kept
    # The grid is resized like timm's resample_abs_pos_embed: torch bicubic, antialias, align_corners=False.
    # torch is the reference; it is imported only where it is the backend already (the resize is numpy).
    if keras.backend.backend() == "torch":
        import torch

        grid = torch.tensor(table[:, 1:]).reshape(1, 4, 4, 24).permute(0, 3, 1, 2).double()
        reference = torch.nn.functional.interpolate(
            grid, size=(6, 6), mode="bicubic", antialias=True, align_corners=False)
        reference = reference.permute(0, 2, 3, 1).reshape(1, 36, 24).numpy()
    else:
        reference = resample_position_embedding(table, 1, (4, 4), (6, 6))[:, 1:]
    np.testing.assert_allclose(new[:, 1:], reference, atol=1e-5)
    for name in ("transformer_block_1", "final_norm"):
        for a, b in zip(model.backbone.get_layer(name).weights, bigger.backbone.get_layer(name).weights):
            np.testing.assert_array_equal(to_numpy(a), to_numpy(b))
    np.testing.assert_array_equal(to_numpy(model.get_layer("head").kernel), to_numpy(bigger.get_layer("head").kernel))
    # Same size as saved: nothing is resampled.
    same = keras_vit.ViTBackbone.from_preset(str(tmp_path / "preset"), image_size=32)
    np.testing.assert_array_equal(to_numpy(same.get_layer("patch_encoder").position_embedding_table), table)


def test_num_classes_replaces_only_the_head(tmp_path):
    model = tiny_classifier(pooled_norm=True, representation_size=16)
    model.save_to_preset(tmp_path / "preset")
    new = keras_vit.ViTClassifier.from_preset(str(tmp_path / "preset"), num_classes=7)
    x = images()
    assert new.num_classes == 7
    np.testing.assert_array_equal(to_numpy(new.get_layer("head").kernel), np.zeros((16, 7)))
    np.testing.assert_allclose(to_numpy(new(x)), np.full((2, 7), 1 / 7), atol=1e-6)  # zero head: uniform
    for layer in ("fc_norm", "pre_logits"):
        for a, b in zip(model.get_layer(layer).weights, new.get_layer(layer).weights):
            np.testing.assert_array_equal(to_numpy(a), to_numpy(b))
    np.testing.assert_array_equal(to_numpy(new.backbone(x)), to_numpy(model.backbone(x)))
    with pytest.raises(ValueError, match="num_classes` must be a positive int. Received: num_classes=0"):
        keras_vit.ViTClassifier.from_preset(str(tmp_path / "preset"), num_classes=0)


def test_load_weights_false_builds_the_same_architecture(tmp_path):
    model = tiny_classifier()
    model.save_to_preset(tmp_path / "preset")
    os.remove(tmp_path / "preset" / "model.weights.h5")  # not needed without weights
    fresh = keras_vit.ViTClassifier.from_preset(str(tmp_path / "preset"), load_weights=False)
    assert fresh.count_params() == model.count_params()
    assert fresh.backbone.get_config() == model.backbone.get_config()
    assert np.abs(to_numpy(fresh.get_layer("head").kernel)).max() == 0  # fresh zero head, not the saved one


def test_registry_preset_without_weights_downloads_nothing(no_network):
    with keras.StatelessScope(initialize_variables=False):
        model = keras_vit.ViTClassifier.from_preset("vit_ti16_augreg_in21k_ft_in1k", load_weights=False, num_classes=3)
        assert model.num_classes == 3 and tuple(model.input_shape[1:]) == (224, 224, 3)
    keras.utils.clear_session(free_memory=False)
    with pytest.raises(ValueError, match="pre-trained backbone without a classification head.*num_classes="):
        keras_vit.ViTClassifier.from_preset("vit_b16_in21k")


# === Config checks: by the constructors, before any variable is created ===


@pytest.fixture
def saved(tmp_path):
    tiny_classifier().save_to_preset(tmp_path / "preset")
    path = tmp_path / "preset" / "config.json"
    original = path.read_text()

    def edit(change):
        document = json.loads(original)  # each change starts from the valid file
        change(document)
        path.write_text(json.dumps(document))
        return str(tmp_path / "preset")

    return edit


INVALID_CONFIGS = [
    (lambda d: d.update(class_name="Lambda"), r"`class_name` must be one of \['MaskedPatchPredictor', 'ViTBackbone'"),
    (lambda d: d.update(format_version=99), "unsupported keras_vit preset format_version 99"),
    (lambda d: d["config"].update(num_classes=-1), "`num_classes` must be a positive int"),
    (lambda d: d["config"].update(eval_me="os.system"), r"Unknown argument for ViTClassifier: eval_me. Valid"),
    (lambda d: d["config"]["backbone"]["config"].update(image_size=30), r"Image height 30 is not divisible by the patch height"),
    (lambda d: d["config"]["backbone"]["config"].update(hidden_dim="24"), "`hidden_dim` must be a positive int"),
    (lambda d: d["config"]["backbone"]["config"].update(hidden_dim=10**9), "`hidden_dim` of ViTBackbone is at most"),
    (lambda d: d["config"]["backbone"]["config"].update(dropout=1.5), "`dropout` must be a number in"),
    (lambda d: d["config"]["backbone"].update(class_name="Sequential"), "`backbone` must be a serialized ViTBackbone"),
    (lambda d: d["config"]["backbone"]["config"].update(position_embedding="rope"), "Unknown `position_embedding`"),
    (lambda d: d["config"].update(class_names=["a"]), "`class_names` must hold one name per class"),
]


def test_invalid_config_is_rejected_naming_the_file(saved):
    for change, message in INVALID_CONFIGS:
        with pytest.raises(ValueError, match=message) as error:
            keras_vit.ViTClassifier.from_preset(saved(change))
        assert "config.json" in str(error.value)


def test_damaged_files_get_clear_errors(tmp_path):
    tiny_classifier().save_to_preset(tmp_path / "preset")
    (tmp_path / "preset" / "model.weights.h5").write_bytes(b"\x80\x04 not hdf5")
    with pytest.raises(ValueError, match="is not an HDF5 .weights.h5 file"):
        keras_vit.ViTClassifier.from_preset(str(tmp_path / "preset"))
    (tmp_path / "preset" / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="is not valid JSON"):
        keras_vit.ViTClassifier.from_preset(str(tmp_path / "preset"))
    os.remove(tmp_path / "preset" / "model.weights.h5")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="holds neither a keras_vit preset"):
        keras_vit.ViTClassifier.from_preset(str(tmp_path / "empty"))
    (tmp_path / "weights.bin").write_bytes(b"pickle")
    with pytest.raises(ValueError, match="pickled PyTorch checkpoint. keras_vit never unpickles"):
        keras_vit.ViTClassifier.from_preset(str(tmp_path / "weights.bin"))


def test_weights_that_do_not_fit_the_config(tmp_path):
    tiny_classifier(num_classes=5).save_to_preset(tmp_path / "five")
    tiny_classifier(num_classes=6).save_to_preset(tmp_path / "six")
    os.replace(tmp_path / "six" / "model.weights.h5", tmp_path / "five" / "model.weights.h5")
    with pytest.raises(ValueError, match="do not fit the model described by its config.json"):
        keras_vit.ViTClassifier.from_preset(str(tmp_path / "five"))


def test_unknown_handle_lists_close_matches():
    with pytest.raises(ValueError, match=r"Unknown preset 'vit_b16_in21k_ft'.*Close matches: .*vit_b16_in21k_ft_in1k"):
        keras_vit.ViTClassifier.from_preset("vit_b16_in21k_ft")
    with pytest.raises(ValueError, match="hf://org/repo"):
        keras_vit.ViTClassifier.from_preset("hf://not a repo")


def test_preset_saved_on_another_backend_reproduces_timm():
    """tests/fixtures/presets/timm_cls_token was saved with TensorFlow (make_preset_fixture.py)."""
    fixtures = os.path.join(os.path.dirname(__file__), "..", "fixtures")
    model = keras_vit.ViTClassifier.from_preset(os.path.join(fixtures, "presets", "timm_cls_token"))
    reference = np.load(os.path.join(fixtures, "timm", "cls_token", "reference.npz"), allow_pickle=False)
    logits = reference["logits"]
    probabilities = np.exp(logits - logits.max(-1, keepdims=True))
    probabilities /= probabilities.sum(-1, keepdims=True)
    np.testing.assert_allclose(to_numpy(model(reference["images"].astype("float32"))), probabilities, atol=1e-5)
