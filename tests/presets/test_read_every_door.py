"""Every command reads its model through the one reader, `keras_vit.presets.load_model`.

Each command takes each handle kind it documents (a `.keras` file, a preset
directory, a converted checkpoint) and refuses a model of the wrong kind
with one message style ("X holds a K; keras-vit CMD takes a A or B"). A
format added as one row of `READ_FORMATS`, even under a suffix another row
already has, loads through every door: `load_model`, `from_preset`,
`load_checkpoint` and the command line.
"""

import os
import sys

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit import cli
from keras_vit.convert import export_timm, load_checkpoint, write_safetensors
from keras_vit.convert.io import read_safetensors_with_metadata
from keras_vit.presets import formats
from tests.finetune.helpers import write_folder

TINY = dict(image_size=8, patch_size=4, hidden_dim=16, num_layers=1, num_heads=2, mlp_dim=32)


class StopAfterLoad(Exception):
    """Raised by the spy once a command's model is read: the rest of the command is not this test's subject."""


def tiny_classifier(seed=0, num_classes=3):
    keras.utils.set_random_seed(seed)
    return keras_vit.ViTClassifier(backbone=keras_vit.ViTBackbone(**TINY), num_classes=num_classes)


@pytest.fixture(scope="module")
def handles(tmp_path_factory):
    """One tiny classifier as each handle kind, and models of the wrong kinds as .keras files."""
    root = tmp_path_factory.mktemp("handles")
    model = tiny_classifier()
    model.save(str(root / "classifier.keras"))
    model.save_to_preset(str(root / "preset"))
    export_timm(model, str(root / "converted.safetensors"))
    model.backbone.save(str(root / "backbone.keras"))
    keras_vit.MaskedPatchPredictor(model.backbone, seed=0).save(str(root / "mpp.keras"))
    inputs = keras.Input((4,))
    keras.Model(inputs, keras.layers.Dense(2)(inputs)).save(str(root / "other.keras"))
    write_folder(str(root / "photos"), classes=2, per_class=3, size=(8, 8))
    from PIL import Image

    Image.fromarray(np.full((8, 8, 3), 128, "uint8")).save(str(root / "photo.png"))
    return {name: str(root / name) for name in ("classifier.keras", "preset", "converted.safetensors",
                                                 "backbone.keras", "mpp.keras", "other.keras", "photos",
                                                 "photo.png")} | {"root": str(root)}


@pytest.fixture
def spy(monkeypatch):
    """Records each `load_model` call and what it returned, then stops the command."""
    from keras_vit import presets
    from keras_vit.presets import load as load_module

    real = load_module.load_model
    calls = []

    def recording(handle, *args, **kwargs):
        model = real(handle, *args, **kwargs)
        calls.append((os.fspath(handle), type(model).__name__))
        raise StopAfterLoad(type(model).__name__)

    monkeypatch.setattr(presets, "load_model", recording)
    monkeypatch.setattr(load_module, "load_model", recording)
    # A module that imported the reader by name (`from keras_vit.presets import load_model`) holds it too;
    # one imported after this point binds the recording one, which monkeypatch does not undo: the teardown puts
    # the reader back there, or a later test's calls would go to this test's list (or stop after loading).
    for name, module in list(sys.modules.items()):
        if name.startswith("keras_vit.") and getattr(module, "load_model", None) is real:
            monkeypatch.setattr(module, "load_model", recording)
    yield calls
    for name, module in list(sys.modules.items()):
        if name.startswith("keras_vit.") and getattr(module, "load_model", None) is recording:
            module.load_model = real


@pytest.fixture(autouse=True)
def any_export_format(monkeypatch):
    """Every backend may export here: this test's subject is reading the model, which comes first."""
    from keras_vit.workflows import export

    monkeypatch.setattr(export, "check_export", lambda *args, **kwargs: None)


def command_lines(h, handle, tmp):
    """`{command: argv}` with `handle` as each command's model."""
    return {
        "predict": ["predict", h["photo.png"], "--preset", handle],
        "explain": ["explain", h["photo.png"], "--preset", handle, "--out", f"{tmp}/figures"],
        "fewshot": ["fewshot", h["photos"], "--preset", handle],
        "export": ["export", handle, "--format", "saved_model", "--out", f"{tmp}/graph"],
        "convert": ["convert", handle, f"{tmp}/out.keras"],
        "quantize": ["quantize", handle, "--out", f"{tmp}/int8.keras"],
        "finetune": ["finetune", h["photos"], "--preset", handle, "--epochs", "1", "--output", f"{tmp}/tuned"],
        "train": ["train", "--init-from", handle, "--epochs", "1"],
    }


COMMANDS = ("predict", "explain", "fewshot", "export", "convert", "quantize", "finetune", "train")


@pytest.mark.one_backend("reads tiny models the same way on every backend; the readers' numbers are tested elsewhere")
@pytest.mark.parametrize("kind", ["classifier.keras", "preset", "converted.safetensors"])
@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_reads_every_documented_handle_through_the_one_reader(command, kind, handles, spy, tmp_path,
                                                                            capsys):
    argv = command_lines(handles, handles[kind], tmp_path)[command]
    assert cli.main(argv) == 1
    err = capsys.readouterr().err
    assert "StopAfterLoad" in err, err  # the command reached the one reader and it read the model
    # fewshot and train --init-from take the backbone of what they read.
    assert spy == [(handles[kind], "ViTBackbone" if command in ("fewshot", "train") else "ViTClassifier")]


# What each command refuses, and the kinds its message names.
WRONG_KINDS = {
    "predict": ("backbone.keras", "ViTClassifier"),
    "export": ("mpp.keras", "ViTClassifier or ViTBackbone"),
    "quantize": ("mpp.keras", "ViTClassifier or ViTBackbone"),
    "explain": ("other.keras", "ViTClassifier, ViTBackbone or MaskedPatchPredictor"),
    "fewshot": ("other.keras", "ViTClassifier, ViTBackbone or MaskedPatchPredictor"),
    "convert": ("other.keras", "ViTClassifier, ViTBackbone or MaskedPatchPredictor"),
    "finetune": ("other.keras", "ViTClassifier, ViTBackbone or MaskedPatchPredictor"),
    "train": ("other.keras", "ViTClassifier, ViTBackbone or MaskedPatchPredictor"),
}


@pytest.mark.one_backend("refusals of tiny models, the same on every backend")
@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_refuses_the_wrong_kind_in_one_message_style(command, handles, tmp_path, capsys):
    name, takes = WRONG_KINDS[command]
    argv = command_lines(handles, handles[name], tmp_path)[command]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    found = {"backbone.keras": "ViTBackbone", "mpp.keras": "MaskedPatchPredictor", "other.keras": "Functional"}[name]
    # One style: the command, the handle, what it holds, who asks and what that takes.
    assert f"keras-vit {command}: error: {handles[name]} holds a {found}; " in err, err
    assert f"takes a {takes}." in err, err
    assert "Traceback" not in err


# --- A format added as one row, under a suffix the timm row already has ---

TOY_FORMAT = "toy-vit"


def is_toy(path):
    """The row's content test: a `.safetensors` file whose metadata names this format."""
    _, metadata = read_safetensors_with_metadata(path)
    return (metadata or {}).get("format") == TOY_FORMAT


def read_toy(path, *, image_size=None, include_head=True, load_weights=True, where=None, **options):
    """The toy converter: the file holds a seed; the model is a tiny classifier drawn from it."""
    tensors, _ = read_safetensors_with_metadata(path)
    model = tiny_classifier(seed=int(tensors["seed"][0]))
    return model if include_head else model.backbone


@pytest.fixture
def toy_row(monkeypatch, tmp_path):
    monkeypatch.setitem(formats.READ_FORMATS, "toy", formats.ReadFormat(
        "a toy ViT (.safetensors with metadata format=toy-vit)", read_toy, suffixes=(".safetensors",),
        claims_file=is_toy))
    path = str(tmp_path / "toy.safetensors")
    write_safetensors(path, {"seed": np.array([7], "int64")}, metadata={"format": TOY_FORMAT})
    return path


@pytest.mark.one_backend("a tiny model read through each door; the same on every backend")
def test_a_new_row_with_a_claimed_suffix_loads_through_every_door(toy_row, handles, tmp_path, capsys):
    expected = tiny_classifier(seed=7).get_weights()
    assert formats.detect_format(toy_row) == "toy"
    assert formats.detect_format(handles["converted.safetensors"]) == "timm"  # the other flavour is still timm's
    models = [keras_vit.presets.load_model(toy_row), keras_vit.ViTClassifier.from_preset(toy_row),
              load_checkpoint(toy_row)]
    assert cli.main(["convert", toy_row, str(tmp_path / "toy.keras")]) == 0
    models.append(keras.saving.load_model(str(tmp_path / "toy.keras")))
    for model in models:
        assert isinstance(model, keras_vit.ViTClassifier)
        for got, want in zip(model.get_weights(), expected):
            np.testing.assert_array_equal(keras.ops.convert_to_numpy(got), want)
    assert cli.main(["predict", handles["photo.png"], "--preset", toy_row]) == 0
    assert "1. class" in capsys.readouterr().out
