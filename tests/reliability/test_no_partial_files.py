"""Promise: no partial files, and no writes outside the target. A write that fails leaves the
previous file as it was and no temporary file behind."""

import os

import numpy as np
import pytest

from keras_vit.convert import export_huggingface, read_safetensors, write_safetensors
from tests.reliability.helpers import tiny_classifier


class _Unwritable:
    """An array-like whose bytes cannot be produced: the write fails half-way through."""

    dtype = np.dtype("float32")
    shape = (2,)

    def __array__(self, dtype=None, copy=None):
        raise OSError(28, "No space left on device")


def test_failed_safetensors_write_keeps_the_old_file(tmp_path, monkeypatch):
    path = tmp_path / "model.safetensors"
    write_safetensors(path, {"a": np.ones(3, np.float32)})
    before = path.read_bytes()
    with pytest.raises(OSError):  # fails while preparing the tensors
        write_safetensors(path, {"a": np.zeros(3, np.float32), "b": _Unwritable()})
    assert path.read_bytes() == before

    def full_disk(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full_disk)
    with pytest.raises(OSError, match="No space"):  # fails after every byte was written, before the rename
        write_safetensors(path, {"a": np.zeros(3, np.float32)})
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["model.safetensors"]
    np.testing.assert_array_equal(read_safetensors(path)["a"], np.ones(3))


def test_unsupported_dtype_fails_before_writing(tmp_path):
    path = tmp_path / "model.safetensors"
    with pytest.raises(ValueError, match="Cannot write tensor 'c'"):
        write_safetensors(path, {"c": np.array([1 + 2j])})
    assert not path.exists() and os.listdir(tmp_path) == []


def test_huggingface_export_writes_only_its_three_files(tmp_path):
    directory = tmp_path / "out"
    export_huggingface(tiny_classifier(), directory)
    assert sorted(os.listdir(directory)) == [".keras_vit.json", "config.json", "model.safetensors",
                                             "preprocessor_config.json"]
    assert sorted(os.listdir(tmp_path)) == ["out"]
    (directory / "README.md").write_text("mine")  # a user's file: the folder is no longer keras_vit's alone
    with pytest.raises(ValueError, match="README.md"):
        export_huggingface(tiny_classifier(), directory)
    assert (directory / "README.md").read_text() == "mine"


def test_huggingface_export_into_a_file_is_refused(tmp_path):
    (tmp_path / "taken").write_text("keep")
    with pytest.raises(ValueError, match="is not a directory"):
        export_huggingface(tiny_classifier(), tmp_path / "taken")
    assert (tmp_path / "taken").read_text() == "keep"
