"""`convert.formats.FORMATS` is the one place a checkpoint format is described, detected and loaded."""

import importlib
import os

import numpy as np
import pytest

import keras_vit
from keras_vit.convert import formats, load_checkpoint
from keras_vit.presets import load_preset

FAKE_SUFFIX = ".fakevit"


def load_fake_checkpoint(path, *, image_size=None, include_head=True, load_weights=True, where=None, **options):
    """A checkpoint source of this test's own: the file holds a seed; the model is a tiny backbone from it."""
    with open(path) as file:
        seed = int(file.read())
    backbone = keras_vit.ViTBackbone(image_size=16, patch_size=8, hidden_dim=16, num_layers=1, num_heads=2,
                                     mlp_dim=32)
    rng = np.random.default_rng(seed)
    backbone.set_weights([rng.normal(size=w.shape).astype("float32") for w in backbone.get_weights()])
    return backbone


@pytest.mark.parametrize("name", sorted(formats.FORMATS))
def test_every_row_is_complete(name):
    row = formats.FORMATS[name]
    assert row.description and f"- {name}: {row.description}" in formats.describe_formats()
    module_name, function_name = row.loader.split(":")
    assert callable(getattr(importlib.import_module(module_name), function_name))
    # Every row is recognisable: by its config.json, or by a file suffix.
    assert row.claims_config is not None or row.suffixes
    assert not row.optional_hub_files or row.hub_files


def test_detection_asks_the_rows_in_order():
    assert formats.detect_config_format({"architecture": "vit_base_patch16_224", "model_type": "x"}) == "timm"
    assert formats.detect_config_format({"model_type": "vit"}) == "huggingface"
    assert formats.detect_config_format({"registered_name": "keras_hub>ViTBackbone", "class_name": "a",
                                         "format_version": 1}) == "kerashub"
    with pytest.raises(ValueError, match="not a config keras_vit can load") as refused:
        formats.detect_config_format({"nothing": 1})
    # The refusal lists the directory formats from the rows, so a new row needs no new message.
    for name, row in formats.FORMATS.items():
        assert (f"- {name}: {row.description}" in str(refused.value)) == (row.claims_config is not None)


def test_a_new_source_is_one_row(monkeypatch, tmp_path):
    """A format added as one row is detected, loaded by load_checkpoint and by from_preset, and in the help."""
    monkeypatch.setitem(formats.FORMATS, "fake", formats.CheckpointFormat(
        "a test checkpoint (a seed in a text file)", f"{__name__}:load_fake_checkpoint", suffixes=(FAKE_SUFFIX,)))
    path = str(tmp_path / f"model{FAKE_SUFFIX}")
    with open(path, "w") as file:
        file.write("7")
    assert formats.detect_format(path) == "fake"
    assert "- fake: a test checkpoint" in formats.describe_formats()
    unknown = tmp_path / "model.unknown"
    unknown.write_text("?")
    with pytest.raises(ValueError, match="- fake: a test checkpoint"):  # the refusal lists the new row too
        formats.detect_format(str(unknown))
    expected = load_fake_checkpoint(path).get_weights()
    converted = load_checkpoint(path)
    preset = load_preset(path, target="backbone")
    for model in (converted, preset):
        for got, want in zip(model.get_weights(), expected):
            np.testing.assert_array_equal(got, want)
    assert os.path.exists(path)


def test_formats_that_are_already_keras_vit_models_are_not_converted(tmp_path):
    keras_file = tmp_path / "model.keras"
    keras_file.write_bytes(b"PK")
    with pytest.raises(ValueError, match="not a checkpoint to convert.*load_keras_file"):
        load_checkpoint(str(keras_file))
