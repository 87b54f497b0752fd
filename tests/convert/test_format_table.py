"""`presets.formats.READ_FORMATS` is the one place a model format is described, detected and read."""

import os

import numpy as np
import pytest

import keras_vit
from keras_vit.convert import load_checkpoint
from keras_vit.presets import formats, load_preset

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


@pytest.mark.one_backend("reads the table; no model is built")
@pytest.mark.parametrize("name", sorted(formats.READ_FORMATS))
def test_every_row_is_complete(name):
    row = formats.READ_FORMATS[name]
    assert row.description and f"- {name}: {row.description}" in formats.describe_formats()
    assert callable(row.read)  # the reader itself, imported by the table (no "module:function" string)
    # Every row is recognisable: by its config.json, or by a file suffix.
    assert row.claims_config is not None or row.suffixes
    assert not row.optional_hub_files or row.hub_files


@pytest.mark.one_backend("reads the table; no model is built")
def test_detection_asks_the_rows_in_order():
    assert formats.detect_config_format({"architecture": "vit_base_patch16_224", "model_type": "x"}) == "timm"
    assert formats.detect_config_format({"model_type": "vit"}) == "huggingface"
    assert formats.detect_config_format({"registered_name": "keras_hub>ViTBackbone", "class_name": "a",
                                         "format_version": 1}) == "kerashub"
    with pytest.raises(ValueError, match="not a config keras_vit can load") as refused:
        formats.detect_config_format({"nothing": 1})
    # The refusal lists the directory formats from the rows, so a new row needs no new message.
    for name, row in formats.READ_FORMATS.items():
        assert (f"- {name}: {row.description}" in str(refused.value)) == (row.claims_config is not None)


def test_a_new_source_is_one_row(monkeypatch, tmp_path):
    """A format added as one row is detected, loaded by load_checkpoint and by from_preset, and in the help."""
    monkeypatch.setitem(formats.READ_FORMATS, "fake", formats.ReadFormat(
        "a test checkpoint (a seed in a text file)", load_fake_checkpoint, suffixes=(FAKE_SUFFIX,)))
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


@pytest.mark.one_backend("refused before anything is read")
def test_formats_that_are_already_keras_vit_models_are_not_converted(tmp_path):
    keras_file = tmp_path / "model.keras"
    keras_file.write_bytes(b"PK")
    with pytest.raises(ValueError, match="not a checkpoint to convert.*load_model"):
        load_checkpoint(str(keras_file))


@pytest.mark.one_backend("refused before anything is read")
def test_a_weights_file_alone_is_refused_with_the_fix(tmp_path):
    weights = tmp_path / "model.weights.h5"
    weights.write_bytes(b"\x89HDF\r\n\x1a\n")
    with pytest.raises(ValueError, match=r"weights but no architecture.*load_weights"):
        keras_vit.presets.load_model(str(weights))
