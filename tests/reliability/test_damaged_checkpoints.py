"""Promise: a damaged or mislabelled checkpoint is refused with the file and the key named, never loaded silently.

Each case is one distinct bad input. Files are built by hand so each breaks
exactly one rule of the safetensors format (the rules the reference
`safetensors` library enforces), or one assumption of the ViT name map.
"""

import json
import os
import struct

import numpy as np
import pytest

from keras_vit.convert import export_huggingface, export_timm, load_checkpoint, read_npz, read_safetensors
from tests.reliability.helpers import f32, raw_safetensors, tiny_classifier

W = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}
B = {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}
DATA = f32(1, 2, 3, 4)

# (case id, header, data, phrase the message must contain, key the message must name)
HEADER_CASES = [
    ("overlap", {"a": W, "b": {**B, "data_offsets": [4, 12]}}, f32(1, 2, 3), "overlap", "'b'"),
    ("gap", {"a": W, "b": {**B, "data_offsets": [12, 20]}}, f32(1, 2, 3, 4, 5), "belong to no tensor", "'b'"),
    ("trailing bytes", {"a": W}, DATA, "cover only 8", None),
    ("extent past the end", {"a": W, "b": B}, f32(1, 2, 3), "truncated", "'b'"),
    ("F32 labelled F16", {"a": {**W, "dtype": "F16"}}, f32(1, 2), "labelled F16", "'a'"),
    ("F32 labelled F64", {"a": {**W, "dtype": "F64"}}, f32(1, 2), "labelled F64", "'a'"),
    ("shape [2**32, 2**32]", {"a": {**W, "shape": [2**32, 2**32]}}, f32(1, 2), "labelled F32", "'a'"),
    ("shape [2**62, 4] overflowing int64", {"a": {**W, "shape": [2**62, 4]}}, f32(1, 2), "labelled F32", "'a'"),
    ("float offsets", {"a": {**W, "data_offsets": [0.0, 8.0]}}, f32(1, 2), "data_offsets", "'a'"),
    ("string offsets", {"a": {**W, "data_offsets": ["0", "8"]}}, f32(1, 2), "data_offsets", "'a'"),
    ("negative offset", {"a": {**W, "data_offsets": [-8, 8]}}, f32(1, 2), "data_offsets", "'a'"),
    ("begin after end", {"a": {**W, "data_offsets": [8, 0]}}, f32(1, 2), "data_offsets", "'a'"),
    ("three offsets", {"a": {**W, "data_offsets": [0, 4, 8]}}, f32(1, 2), "data_offsets", "'a'"),
    ("negative dimension", {"a": {**W, "shape": [-2]}}, f32(1, 2), "shape", "'a'"),
    ("float dimension", {"a": {**W, "shape": [2.0]}}, f32(1, 2), "shape", "'a'"),
    ("boolean dimension", {"a": {**W, "shape": [True, 2]}}, f32(1, 2), "shape", "'a'"),
    ("shape not a list", {"a": {**W, "shape": "2"}}, f32(1, 2), "shape", "'a'"),
    ("missing dtype", {"a": {"shape": [2], "data_offsets": [0, 8]}}, f32(1, 2), "exactly", "'a'"),
    ("extra field", {"a": {**W, "offsets": [0, 8]}}, f32(1, 2), "exactly", "'a'"),
    ("entry not an object", {"a": [0, 8]}, f32(1, 2), "exactly", "'a'"),
    ("dtype not a string", {"a": {**W, "dtype": 7}}, f32(1, 2), "dtype", "'a'"),
    ("unknown dtype", {"a": {**W, "dtype": "F8_E4M3", "shape": [8]}}, f32(1, 2), "cannot read", "'a'"),
    ("metadata not strings", {"__metadata__": {"n": 1}, "a": W}, f32(1, 2), "__metadata__", None),
    ("metadata not an object", {"__metadata__": ["x"], "a": W}, f32(1, 2), "__metadata__", None),
    ("keras_vit_config not JSON", {"__metadata__": {"keras_vit_config": "{model_args"}, "a": W}, f32(1, 2),
     "not JSON", "'keras_vit_config'"),
]


@pytest.mark.parametrize("case", HEADER_CASES, ids=[c[0] for c in HEADER_CASES])
def test_header_rule_broken(tmp_path, case):
    _, header, data, phrase, key = case
    path = raw_safetensors(tmp_path / "bad.safetensors", header, data)
    with pytest.raises(ValueError, match="bad.safetensors") as error:
        read_safetensors(path)
    assert phrase in str(error.value)
    if key:
        assert key in str(error.value)


FRAME_CASES = [
    ("empty file", b"", "0 bytes"),
    ("shorter than the length field", b"\x01\x02\x03", "3 bytes"),
    ("header length over 100 MB", struct.pack("<Q", 200_000_000) + b"{}", "header length"),
    ("header length past the end", struct.pack("<Q", 4096) + b"{}", "truncated"),
    ("header not JSON", struct.pack("<Q", 6) + b"{nope}", "not JSON"),
    ("header not UTF-8", struct.pack("<Q", 4) + b"{\xff\xfe}", "not JSON"),
    ("header a JSON list", struct.pack("<Q", 2) + b"[]", "start with '{'"),
    ("header starting with a space", struct.pack("<Q", 3) + b" {}", "start with '{'"),
    ("header nested 100000 deep", struct.pack("<Q", 200_001) + b"{" + b'"a":' + b"[" * 99_998 + b"]" * 99_998
     + b"}", "not JSON"),
    ("random bytes", np.random.default_rng(0).bytes(4096), "not a valid safetensors file"),
    ("an HDF5 file", b"\x89HDF\r\n\x1a\n" + b"\x00" * 64, "HDF5"),
]


@pytest.mark.parametrize("case", FRAME_CASES, ids=[c[0] for c in FRAME_CASES])
def test_frame_broken(tmp_path, case):
    _, content, phrase = case
    path = tmp_path / "bad.safetensors"
    path.write_bytes(content)
    with pytest.raises(ValueError, match="bad.safetensors") as error:
        read_safetensors(path)
    assert phrase in str(error.value)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A tiny classifier exported as timm safetensors, plus its state."""
    import keras

    keras.utils.set_random_seed(0)
    directory = tmp_path_factory.mktemp("exported")
    model = tiny_classifier()
    export_timm(model, directory / "model.safetensors")
    tensors, metadata = __import__("keras_vit.convert.io", fromlist=["x"]).read_safetensors_with_metadata(
        directory / "model.safetensors")
    return tensors, metadata


def _write(path, tensors, metadata, retype=None):
    from keras_vit.convert import write_safetensors

    write_safetensors(path, tensors, metadata=metadata)
    if retype:  # relabel one tensor's dtype in place, bytes unchanged
        data = path.read_bytes()
        length = struct.unpack("<Q", data[:8])[0]
        header = json.loads(data[8 : 8 + length])
        header[retype[0]]["dtype"] = retype[1]
        encoded = json.dumps(header, separators=(",", ":")).encode()
        encoded += b" " * (length - len(encoded))
        path.write_bytes(data[:8] + encoded + data[8 + length :])
    return path


def test_float_bytes_labelled_integer(tmp_path, exported):
    tensors, metadata = exported
    path = _write(tmp_path / "relabelled.safetensors", tensors, metadata, retype=("head.weight", "I32"))
    with pytest.raises(ValueError, match=r"non-floating-point dtype: head\.weight \(int32\)"):
        load_checkpoint(path)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf], ids=["nan", "inf", "-inf"])
def test_non_finite_weights_refused_unless_allowed(tmp_path, exported, bad, capsys):
    tensors, metadata = exported
    tensors = dict(tensors)
    weight = tensors["blocks.0.mlp.fc1.weight"].copy()
    weight[0, :3] = bad
    tensors["blocks.0.mlp.fc1.weight"] = weight
    path = _write(tmp_path / "diverged.safetensors", tensors, metadata)
    with pytest.raises(ValueError, match=r"NaN or infinite: blocks\.0\.mlp\.fc1\.weight \(3 of .*pass `allow_non_finite=True`"):
        load_checkpoint(path)
    # The command line names its flag, not the Python keyword; a damaged file is a failure (1), not a usage error.
    from keras_vit import cli

    assert cli.main(["convert", str(path), str(tmp_path / "out.keras")]) == 1
    err = capsys.readouterr().err
    assert "pass --allow-non-finite to load it anyway" in err and "allow_non_finite" not in err
    model = load_checkpoint(path, allow_non_finite=True)
    kernel = next(w for w in model.weights if w.path.endswith("mlp/fc1/kernel"))
    assert not np.isfinite(kernel.numpy()).all()


def test_keras_vit_config_json_but_not_an_object(tmp_path, exported):
    tensors, metadata = exported
    path = _write(tmp_path / "odd.safetensors", tensors, {**metadata, "keras_vit_config": "[1, 2]"})
    with pytest.raises(ValueError, match="keras_vit_config.*JSON object"):
        load_checkpoint(path)


# --- Hugging Face: the config must describe the weights ---


@pytest.fixture(scope="module")
def hf_directory(tmp_path_factory):
    import keras

    keras.utils.set_random_seed(0)
    directory = tmp_path_factory.mktemp("hf") / "vit"
    export_huggingface(tiny_classifier(), directory)
    return directory


HF_CASES = [
    ("id2label disagrees with the head", {"id2label": {str(i): f"c{i}" for i in range(5)}}, "id2label has 5 classes"),
    ("num_labels disagrees with the head", {"id2label": None, "num_labels": 7}, "num_labels is 7"),
    ("heads do not divide hidden_size", {"num_attention_heads": 3}, "does not divide"),
    ("hidden_size disagrees", {"hidden_size": 32, "num_attention_heads": 2}, "hidden_size=32"),
    ("intermediate_size disagrees", {"intermediate_size": 64}, "intermediate_size=64"),
    ("image_size disagrees", {"image_size": 16}, "image_size=[16, 16]"),
    ("patch_size disagrees", {"patch_size": 2}, "patch_size=[2, 2]"),
    ("missing num_hidden_layers", {"num_hidden_layers": None}, "lacks ['num_hidden_layers']"),
    ("string hidden_size", {"hidden_size": "16"}, "positive integer"),
    ("zero image size", {"image_size": 0}, "image_size"),
]


@pytest.mark.parametrize("case", HF_CASES, ids=[c[0] for c in HF_CASES])
def test_huggingface_config_against_weights(tmp_path, hf_directory, case):
    import shutil

    _, change, phrase = case
    directory = tmp_path / "vit"
    shutil.copytree(hf_directory, directory)
    config = json.loads((directory / "config.json").read_text())
    for key, value in change.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    (directory / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError) as error:
        load_checkpoint(directory)
    assert phrase in str(error.value)


def test_huggingface_config_not_json(tmp_path, hf_directory):
    import shutil

    directory = tmp_path / "vit"
    shutil.copytree(hf_directory, directory)
    (directory / "config.json").write_text('{"model_type": "vit",')
    with pytest.raises(ValueError, match="config.json is not valid JSON"):
        load_checkpoint(directory)


# --- .npz archives ---


def test_npz_holding_a_torch_archive(tmp_path):
    import zipfile

    with zipfile.ZipFile(tmp_path / "weights.npz", "w") as archive:
        archive.writestr("archive/data.pkl", b"\x80\x02}q\x00.")
    with pytest.raises(ValueError, match="pickled PyTorch checkpoint"):
        read_npz(tmp_path / "weights.npz")


def test_npz_with_object_arrays(tmp_path):
    np.savez(tmp_path / "objects.npz", a=np.array([{"x": 1}], dtype=object))
    with pytest.raises(ValueError, match="objects.npz holds pickled Python objects"):
        read_npz(tmp_path / "objects.npz")


def test_npz_truncated(tmp_path):
    np.savez(tmp_path / "full.npz", a=np.zeros(1000, np.float32))
    data = (tmp_path / "full.npz").read_bytes()
    (tmp_path / "cut.npz").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="cut.npz is not a readable .npz archive"):
        read_npz(tmp_path / "cut.npz")


# --- Keras files: a truncated one is named, not "File not found" ---


@pytest.fixture(scope="module")
def keras_files(tmp_path_factory):
    directory = tmp_path_factory.mktemp("keras_files")
    model = tiny_classifier()
    model.save(directory / "model.keras")
    model.save_weights(directory / "model.weights.h5")
    return directory


@pytest.mark.parametrize("name", ["model.keras", "model.weights.h5"])
@pytest.mark.parametrize("cut", ["half", "empty", "other format"])
def test_damaged_keras_files(tmp_path, keras_files, name, cut):
    from keras_vit.utils.checks import check_keras_file, check_weights_file

    check = check_keras_file if name == "model.keras" else check_weights_file
    data = (keras_files / name).read_bytes()
    content = {"half": data[: len(data) // 2], "empty": b"",
               "other format": (keras_files / ("model.weights.h5" if name == "model.keras" else "model.keras"))
               .read_bytes()}[cut]
    path = tmp_path / name
    path.write_bytes(content)
    phrase = {"half": "truncated or damaged", "empty": "empty (0 bytes)", "other format": "is not a"}[cut]
    with pytest.raises(ValueError, match=name.replace(".", r"\.")) as error:
        check(path)
    assert phrase in str(error.value)
    check(keras_files / name)  # the intact file passes
    assert os.path.getsize(keras_files / name) == len(data)


def test_truncated_file_with_a_0x80_length_byte_is_called_truncated(tmp_path):
    """Cut inside its header, a safetensors file whose length starts 0x80 0x02 is truncated, not a pickle."""
    path = tmp_path / "cut.safetensors"
    path.write_bytes(struct.pack("<Q", 0x0280) + b'{"w":{"dtype"')
    with pytest.raises(ValueError, match="cut.safetensors is truncated"):
        read_safetensors(path)
