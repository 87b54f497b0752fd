"""Promise: a damaged keras_vit preset or `.keras` file is refused with a `ValueError` that names the file (and
the key or archive member), before a model is built: never a raw Python error, never a model built from the
constructors' defaults in place of what the file lost.

The cases are generated: every key of a saved preset's `config.json` (at every level, for a classifier and a
masked patch predictor) crossed with every kind of damage (missing, null, a string, a negative number, a
float, a list, an object); every file of a preset directory crossed with every way to spoil a file (a
directory in its place, empty, bytes that are not UTF-8, cut in half); every member of a `.keras` archive
likewise. What each key accepts is stated here, from the constructors' documented arguments, not read from
the code under test.
"""

import json
import os
import random
import shutil
import zipfile

import numpy as np
import pytest

from keras_vit.presets import check_model_handle, load_model
from tests.reliability.helpers import tiny_backbone, tiny_classifier

pytestmark = pytest.mark.one_backend("a preset's files are checked before any backend computes")

MISSING = object()
DAMAGE = {"missing": MISSING, "null": None, "string": "x", "negative": -3, "float": 2.5, "list": ["x", "y"],
          "object": {"x": 1}}


def _int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool) and np.isfinite(value)


def _positive_int(value):
    return _int(value) and value > 0


def _rate(value):
    return _number(value) and 0 <= value < 1


def _numbers(check):
    return lambda value: check(value) or (isinstance(value, list) and value and all(check(v) for v in value))


def _pair(value):
    return _positive_int(value) or (isinstance(value, list) and len(value) == 2 and all(map(_positive_int, value)))


def _nothing(value):
    return False  # any other value describes another model or no model


# What each key of a preset's config.json takes (the constructors' documented arguments). Every key is
# required but those in OPTIONAL below.
ACCEPTS = {
    "format_version": lambda value: _int(value) and value == 1,
    "class_name": _nothing, "config": _nothing, "backbone": _nothing,
    "image_size": _pair, "patch_size": _pair,
    "num_channels": _positive_int, "hidden_dim": _positive_int, "num_layers": _positive_int,
    "num_heads": _positive_int, "mlp_dim": _positive_int, "num_classes": _positive_int,
    "color_bits": lambda value: _positive_int(value) and value <= 8,
    "num_register_tokens": lambda value: _int(value) and value >= 0,
    "representation_size": lambda value: value is None or _positive_int(value),
    "dropout": _rate, "attention_dropout": _rate, "drop_path_rate": _rate, "head_dropout": _rate,
    "corruption_rate": lambda value: _number(value) and 0 < value <= 1,
    "mask_rate": lambda value: _number(value) and 0 <= value <= 1,
    "random_rate": lambda value: _number(value) and 0 <= value <= 1,
    "layer_norm_epsilon": lambda value: _number(value) and value > 0,
    "pixel_scale": _number, "pixel_mean": _numbers(_number), "pixel_std": _numbers(lambda v: _number(v) and v > 0),
    "layer_scale_init": lambda value: value is None or _number(value),
    "use_class_token": lambda value: isinstance(value, bool), "prefix_position_embedding": lambda v: isinstance(v, bool),
    "use_qkv_bias": lambda value: isinstance(value, bool), "final_norm": lambda value: isinstance(value, bool),
    "pooled_norm": lambda value: isinstance(value, bool),
    "position_embedding": lambda value: value in ("learned", "sincos2d", "none"),
    "pooling": lambda value: value in ("token", "gap", "map"),
    "target": lambda value: value in ("mean_color", "mean_color_4x4", "pixels"),
    "activation": lambda value: value is None or value in ("softmax", "sigmoid", "linear"),
    "class_names": lambda value: value is None,  # or one name per class: never among the damages
    "stem": lambda value: value is None,  # or a serialized Keras layer: never among the damages
    "seed": lambda value: value is None or _int(value),
    "name": lambda value: value is None or isinstance(value, str),
    "dtype": lambda value: value is None or value in ("float32", "bfloat16", "mixed_bfloat16"),
    # The evaluation transform (issue 47) and the later families' parts (issue 48).
    "resize_mode": lambda value: value in ("center_crop", "stretch"),
    "crop_fraction": lambda value: _number(value) and 0 < value <= 1,
    "interpolation": lambda value: value in ("bicubic", "bilinear", "nearest"),
    "alpha": lambda value: value in ("white", "drop"),
    "mlp_activation": lambda value: value in ("gelu", "gelu_tanh", "quick_gelu"),
    "pre_norm": lambda value: isinstance(value, bool), "qk_norm": lambda value: isinstance(value, bool),
    "use_distillation_token": lambda value: isinstance(value, bool),
    "attention_pooling": lambda value: isinstance(value, bool),
}
# Missing is harmless for these: `name` and `dtype` have defaults, and the others came after format 1, so
# presets written before them lack them and their defaults rebuild those presets' models.
OPTIONAL = ("name", "dtype", "class_names", "resize_mode", "crop_fraction", "interpolation", "alpha",
            "mlp_activation", "pre_norm", "qk_norm", "use_distillation_token", "attention_pooling")


@pytest.fixture(scope="module")
def presets(tmp_path_factory):
    import keras_vit

    root = tmp_path_factory.mktemp("presets")
    tiny_classifier().save_to_preset(root / "classifier")
    keras_vit.MaskedPatchPredictor(tiny_backbone()).save_to_preset(root / "mpp")
    return root


def _key_paths(document, prefix=()):
    """Every key of a config document, as a path of keys from the top."""
    for key, value in document.items():
        yield prefix + (key,)
        if isinstance(value, dict) and key in ("config", "backbone"):
            yield from _key_paths(value, prefix + (key,))


def _damaged(document, path, value):
    document = json.loads(json.dumps(document))
    node = document
    for key in path[:-1]:
        node = node[key]
    if value is MISSING:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return document


def _cases(presets):
    cases = []
    for name in ("classifier", "mpp"):
        document = json.loads((presets / name / "config.json").read_text())
        for path in _key_paths(document):
            if name == "mpp" and path[:3] == ("config", "backbone", "config"):
                continue  # the classifier's draw covers the backbone's keys
            for damage, value in DAMAGE.items():
                original = document
                for key in path:
                    original = original[key]
                if value is not MISSING and json.dumps(value) == json.dumps(original):
                    continue  # not a change
                cases.append((name, path, damage))
    return cases


def _accepted(path, damage):
    key, value = path[-1], DAMAGE[damage]
    if value is MISSING:
        return key in OPTIONAL
    return ACCEPTS[key](value)


def test_the_draw_covers_every_key_the_presets_hold(presets):
    keys = {path[-1] for _, path, _ in _cases(presets)}
    assert keys == set(ACCEPTS), sorted(keys ^ set(ACCEPTS))


def test_every_key_missing_or_of_another_kind_is_named_before_a_model_is_built(presets, tmp_path):
    """Each (preset, key, damage) drawn: a value the key takes builds; any other is refused naming the key."""
    cases = _cases(presets)
    drawn = random.Random(40).sample(cases, 120)  # of about 300; the wide run takes them all
    if os.environ.get("KERAS_VIT_WIDE_CASES") == "1":
        drawn = cases
    wrong = []
    for name, path, damage in drawn:
        directory = tmp_path / f"{name}-{'.'.join(path)}-{damage}"
        shutil.copytree(presets / name, directory)
        document = json.loads((directory / "config.json").read_text())
        (directory / "config.json").write_text(json.dumps(_damaged(document, path, DAMAGE[damage])))
        label = f"{name}: {'.'.join(path)} {damage}"
        try:
            load_model(directory, load_weights=False)
        except ValueError as error:
            message = str(error)
            if _accepted(path, damage):
                wrong.append(f"{label}: refused a value the key takes: {message[:200]}")
            elif "config.json" not in message or f"{path[-1]}" not in message:
                wrong.append(f"{label}: the message does not name the file and the key: {message[:200]}")
            elif damage == "missing" and "missing" not in message:
                wrong.append(f"{label}: the message does not say the key is missing: {message[:200]}")
            else:
                try:  # the cheap check before any work refuses it too
                    check_model_handle(directory)
                    wrong.append(f"{label}: check_model_handle accepted it")
                except ValueError:
                    pass
        except Exception as error:  # noqa: BLE001 - a raw error is what this test looks for
            wrong.append(f"{label}: {type(error).__name__}: {str(error)[:200]}")
        else:
            if not _accepted(path, damage):
                wrong.append(f"{label}: loaded")
        shutil.rmtree(directory)
    assert wrong == [], "\n".join(wrong)


@pytest.mark.parametrize("value, phrase", [
    ("1", "the integer 1, not the string '1'"),
    (1.0, "the integer 1"),
    (True, "the integer 1"),
    (0, "never written"),
    (2, "Upgrade keras_vit"),
])
def test_format_version_of_another_type_says_what_to_write(presets, tmp_path, value, phrase):
    directory = tmp_path / "preset"
    shutil.copytree(presets / "classifier", directory)
    document = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**document, "format_version": value}))
    with pytest.raises(ValueError, match="format_version") as error:
        load_model(directory)
    assert phrase in str(error.value) and str(directory / "config.json") in str(error.value)
    if value != 2:
        assert "Upgrade" not in str(error.value)  # a newer keras_vit would not read it either


@pytest.fixture(scope="module")
def quantized(tmp_path_factory):
    model = tiny_classifier()
    model.quantize("int8")
    directory = tmp_path_factory.mktemp("quantized") / "preset"
    model.save_to_preset(directory)
    return directory


@pytest.mark.parametrize("entry", ["no_such_policy", {"class_name": "no_such_policy", "config": {}}, 5, None],
                         ids=["unknown name", "unknown class", "a number", "null"])
def test_a_policy_map_entry_that_is_no_policy_is_named(quantized, tmp_path, entry):
    directory = tmp_path / "preset"
    shutil.copytree(quantized, directory)
    document = json.loads((directory / "config.json").read_text())
    policies = document["config"]["dtype"]["config"]["policy_map"]
    layer = sorted(policies)[0]
    policies[layer] = entry
    (directory / "config.json").write_text(json.dumps(document))
    with pytest.raises(ValueError) as error:
        load_model(directory)
    message = str(error.value)
    assert "config.json" in message and "dtype" in message and repr(layer) in message, message


# === Files of a preset directory, and members of a .keras archive ===

SPOIL = {
    "a directory": None,
    "empty": lambda data: b"",
    "non-UTF-8 bytes": lambda data: b"\xff\xfe\x00\x80 not text",
    "cut in half": lambda data: data[: len(data) // 2],
}
# The files the reader needs; the ownership marker is the writer's, and a load never needs it.
NEEDED = ("config.json", "model.weights.h5", "metadata.json")
MARKER = ".keras_vit.json"


def _spoil(path, how):
    data = path.read_bytes()
    path.unlink()
    if SPOIL[how] is None:
        path.mkdir()
    else:
        path.write_bytes(SPOIL[how](data))


def _weights(model):
    return [np.asarray(w) for w in model.get_weights()]


def test_every_file_of_a_preset_spoiled_is_named(presets, tmp_path):
    original = _weights(load_model(presets / "classifier"))
    names = sorted(os.listdir(presets / "classifier"))
    assert set(names) == set(NEEDED) | {MARKER}, names  # a new file of the format joins the draw
    wrong = []
    for name in names:
        for how in SPOIL:
            directory = tmp_path / f"{name}-{how}"
            shutil.copytree(presets / "classifier", directory)
            _spoil(directory / name, how)
            label = f"{name} {how}"
            try:
                if name in NEEDED:
                    try:
                        check_model_handle(directory)
                        wrong.append(f"{label}: check_model_handle accepted it")
                    except ValueError as error:
                        if name not in str(error):
                            wrong.append(f"{label}: the check does not name the file: {str(error)[:200]}")
                model = load_model(directory)
            except ValueError as error:
                if name not in NEEDED:
                    wrong.append(f"{label}: refused, though a load does not need it: {str(error)[:200]}")
                elif str(directory / name) not in str(error).replace("'", ""):
                    wrong.append(f"{label}: the message does not name the file: {str(error)[:200]}")
            except Exception as error:  # noqa: BLE001 - a raw error is what this test looks for
                wrong.append(f"{label}: {type(error).__name__}: {str(error)[:200]}")
            else:
                if name in NEEDED:
                    wrong.append(f"{label}: loaded")
                elif any(not np.array_equal(a, b) for a, b in zip(_weights(model), original)):
                    wrong.append(f"{label}: loaded other weights")
    assert wrong == [], "\n".join(wrong)


# Keras reads a .keras archive's config.json and model.weights.h5; its metadata.json is a note Keras never reads.
KERAS_NEEDED = ("config.json", "model.weights.h5")


def test_every_member_of_a_keras_file_spoiled_is_named(tmp_path):
    path = tmp_path / "model.keras"
    tiny_classifier().save(path)
    original = _weights(load_model(path))
    with zipfile.ZipFile(path) as archive:
        members = {name: archive.read(name) for name in archive.namelist()}
    assert set(members) >= set(KERAS_NEEDED), sorted(members)
    wrong = []
    for member in sorted(members):
        for how in ("empty", "non-UTF-8 bytes", "cut in half", "not JSON"):
            if how == "not JSON" and not member.endswith(".json"):
                continue
            spoiled = tmp_path / f"{member}-{how}.keras"
            with zipfile.ZipFile(spoiled, "w") as archive:
                for name, data in members.items():
                    if name == member:
                        data = b"{not json" if how == "not JSON" else SPOIL[how](data)
                    archive.writestr(name, data)
            label = f"{member} {how}"
            try:
                if member == "config.json":
                    try:
                        check_model_handle(spoiled)
                        wrong.append(f"{label}: check_model_handle accepted it")
                    except ValueError:
                        pass
                model = load_model(spoiled)
            except ValueError as error:
                if member not in KERAS_NEEDED:
                    wrong.append(f"{label}: refused, though Keras does not read it: {str(error)[:200]}")
                elif str(spoiled) not in str(error) or member not in str(error):
                    wrong.append(f"{label}: the message does not name the file and member: {str(error)[:200]}")
            except Exception as error:  # noqa: BLE001
                wrong.append(f"{label}: {type(error).__name__}: {str(error)[:200]}")
            else:
                if member in KERAS_NEEDED:
                    wrong.append(f"{label}: loaded")
                elif any(not np.array_equal(a, b) for a, b in zip(_weights(model), original)):
                    wrong.append(f"{label}: loaded other weights")
    assert wrong == [], "\n".join(wrong)


# === The command line: one line of the house style, before the images are read ===


@pytest.mark.parametrize("damage", ["config.json without num_heads", "config.json a directory",
                                    "format_version a string", "model.keras config not JSON"])
def test_the_command_line_names_the_file_in_one_error_line(presets, tmp_path, capsys, damage):
    from keras_vit import cli

    directory = tmp_path / "preset"
    shutil.copytree(presets / "classifier", directory)
    config = directory / "config.json"
    document = json.loads(config.read_text())
    if damage == "config.json without num_heads":
        del document["config"]["backbone"]["config"]["num_heads"]
        config.write_text(json.dumps(document))
        handle, phrase = directory, "num_heads` is missing"
    elif damage == "config.json a directory":
        config.unlink()
        config.mkdir()
        handle, phrase = directory, "config.json is a directory, not a file"
    elif damage == "format_version a string":
        config.write_text(json.dumps({**document, "format_version": "1"}))
        handle, phrase = directory, "the integer 1, not the string '1'"
    else:
        handle = tmp_path / "model.keras"
        with zipfile.ZipFile(handle, "w") as archive:
            archive.writestr("config.json", b"{not json")
            archive.writestr("model.weights.h5", b"")
        phrase = "config.json is not valid JSON"
    from PIL import Image

    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(tmp_path / "photo.png")
    code = cli.main(["predict", str(tmp_path / "photo.png"), "--preset", str(handle)])
    err = capsys.readouterr().err
    assert code in (1, 2), err
    assert err.startswith("keras-vit predict: error: ") and phrase in err and str(handle) in err, err
    assert "Traceback" not in err and len(err.strip().splitlines()) <= 3, err
