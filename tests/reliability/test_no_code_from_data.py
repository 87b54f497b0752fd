"""Promise: no code runs from data. Pickles are refused by their bytes whatever their name, the
refusal's suggested command is safe to paste, and Keras files load in safe mode."""

import os
import pickle
import shlex
import stat
import subprocess
import sys
import zipfile

import numpy as np
import pytest

from keras_vit import cli
from keras_vit.convert import load_checkpoint, read_npz, read_safetensors


class _Payload:
    """Unpickling this runs `touch MARKER`: it must never happen."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {shlex.quote(str(self.marker))}",))


def _torch_style_zip(path, payload):
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("archive/data.pkl", payload)
        archive.writestr("archive/version", "3\n")


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
@pytest.mark.parametrize("name", ["model.pth", "model.bin", "model.safetensors", "weights.npz", "model.ckpt"])
def test_raw_pickles_are_refused_without_running(tmp_path, protocol, name):
    marker = tmp_path / "MARKER"
    path = tmp_path / name
    path.write_bytes(pickle.dumps(_Payload(marker), protocol=protocol))
    reader = read_npz if name.endswith(".npz") else read_safetensors
    for load in (reader, load_checkpoint):
        with pytest.raises(ValueError, match="pickled"):
            load(path)
    assert not marker.exists()


@pytest.mark.parametrize("name", ["model.pth", "model.safetensors", "pytorch_model.bin"])
def test_torch_zip_archives_are_refused_without_running(tmp_path, name):
    marker = tmp_path / "MARKER"
    _torch_style_zip(tmp_path / name, pickle.dumps(_Payload(marker), protocol=2))
    with pytest.raises(ValueError, match="pickled PyTorch checkpoint"):
        load_checkpoint(tmp_path / name)
    assert not marker.exists()


def test_hub_directory_with_only_a_pickle(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "vit"}')
    (tmp_path / "pytorch_model.bin").write_bytes(pickle.dumps(_Payload(tmp_path / "MARKER")))
    with pytest.raises(ValueError, match="never unpickles"):
        load_checkpoint(tmp_path)
    assert not (tmp_path / "MARKER").exists()


@pytest.mark.parametrize("name", ["x$(touch MARKER).pth", "it's `touch MARKER`; \"q\".pth", "a b\n$HOME.pth"])
def test_suggested_command_is_safe_to_paste(tmp_path, name):
    """The refusal's `python -c ...` line, pasted into bash, passes the path as data, never expands it."""
    path = tmp_path / name
    path.write_bytes(pickle.dumps({"w": 1}, protocol=2))
    with pytest.raises(ValueError) as error:
        load_checkpoint(path)
    message = str(error.value)
    line = next(l.strip() for l in message.splitlines() if l.strip().startswith("python -c "))
    # A stub `python` records its arguments instead of running torch.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stub = bin_dir / "python"
    stub.write_text(f"#!{sys.executable}\nimport sys, json\nopen(sys.argv[0] + '.args', 'w').write(json.dumps(sys.argv[1:]))\n")
    stub.chmod(stub.stat().st_mode | stat.S_IEXEC)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path)}
    subprocess.run(["bash", "-c", line], cwd=tmp_path, env=env, check=True, timeout=60)
    assert not (tmp_path / "MARKER").exists()
    import json

    argv = json.loads((bin_dir / "python.args").read_text())
    assert argv[0] == "-c" and repr(str(path)) in argv[1]
    compile(argv[1], "<suggested>", "exec")  # valid Python, the path a literal inside it


def test_npz_object_arrays_never_unpickled(tmp_path):
    np.save(tmp_path / "a.npy", np.array([_Payload(tmp_path / "MARKER")], dtype=object), allow_pickle=True)
    with zipfile.ZipFile(tmp_path / "weights.npz", "w") as archive:
        archive.write(tmp_path / "a.npy", "a.npy")
    with pytest.raises(ValueError, match="pickled Python objects"):
        read_npz(tmp_path / "weights.npz")
    assert not (tmp_path / "MARKER").exists()


def test_keras_files_load_in_safe_mode(tmp_path, capsys):
    """A .keras file carrying Python code (a Lambda) is refused by `keras-vit convert`."""
    import keras

    inputs = keras.Input((8, 8, 3))
    model = keras.Model(inputs, keras.layers.Lambda(lambda x: x * 2)(inputs))
    model.save(tmp_path / "lambda.keras")
    assert cli.main(["convert", str(tmp_path / "lambda.keras"), str(tmp_path / "out.safetensors")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("keras-vit convert: error:") and "safe_mode" in err
    assert not (tmp_path / "out.safetensors").exists()
