"""Promise: no valid file is refused. The format sniffing never mistakes a safetensors file for a pickle.

A safetensors file starts with its header length as a little-endian u64, so
its first byte is the low byte of that length: any value 0..255 can appear,
including 0x80 (a pickle's PROTO opcode), and its first four bytes can spell
the zip signature `PK\\x03\\x04` (a header of 0x04034B50 bytes). These tests
write real files with the `safetensors` package (which pads the header to a
multiple of 8) and, for the other low bytes, by hand exactly as the format
specifies, check that the `safetensors` package itself reads each one, and
that keras_vit reads the same arrays.
"""

import json
import struct

import numpy as np
import pytest

from keras_vit.convert.io import read_safetensors, read_safetensors_with_metadata, sniff

safetensors_numpy = pytest.importorskip("safetensors.numpy")
pytestmark = pytest.mark.one_backend("numpy-only safetensors reader")

TENSORS = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.array([1, -2], np.int64)}


def _header_length(path):
    with open(path, "rb") as handle:
        return struct.unpack("<Q", handle.read(8))[0]


def write_with_package(path, header_length):
    """A file written by the `safetensors` package whose header is exactly `header_length` bytes."""
    assert header_length % 8 == 0, "the package pads its header to a multiple of 8"
    safetensors_numpy.save_file(TENSORS, str(path), metadata={"pad": ""})
    base = _header_length(path)
    safetensors_numpy.save_file(TENSORS, str(path), metadata={"pad": "x" * (header_length - base)})
    assert _header_length(path) == header_length
    return path


def write_by_hand(path, header_length):
    """A file laid out as the format specifies, with an unpadded header of `header_length` bytes."""
    header = {"w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
              "b": {"dtype": "I64", "shape": [2], "data_offsets": [24, 40]}}
    data = TENSORS["w"].tobytes() + TENSORS["b"].tobytes()
    if header_length < 160:  # too short for both entries: one tensor
        header.pop("b")
        data = data[:24]
    encode = lambda pad: json.dumps({"__metadata__": {"pad": pad}, **header}, separators=(",", ":")).encode()  # noqa: E731
    encoded = encode("x" * (header_length - len(encode(""))))
    assert len(encoded) == header_length
    path.write_bytes(struct.pack("<Q", header_length) + encoded + data)
    return path


def assert_read_like_the_package(path):
    expected = safetensors_numpy.load_file(str(path))  # the reference accepts it: the file is valid
    tensors, metadata = read_safetensors_with_metadata(path)
    assert sorted(tensors) == sorted(expected)
    for name in expected:
        np.testing.assert_array_equal(tensors[name], expected[name])
        assert tensors[name].dtype == expected[name].dtype
    assert set(metadata) == {"pad"}


@pytest.mark.parametrize("low_byte", range(256))
def test_every_low_byte_of_the_header_length(tmp_path, low_byte):
    # 0x1000 | low: a header of 4096..4351 bytes; 0x1080 is the length of a real
    # save_pretrained header that the old first-byte rule refused.
    length = 0x1000 | low_byte
    path = write_by_hand(tmp_path / "hand.safetensors", length)
    assert path.read_bytes()[0] == low_byte
    assert_read_like_the_package(path)
    if low_byte % 8 == 0:
        assert_read_like_the_package(write_with_package(tmp_path / "package.safetensors", length))


@pytest.mark.parametrize("length", [0x80, 0x180, 0x8080, 0x10080, 0x800080, 0x80808080 % 0x1000000])
def test_representative_high_bytes(tmp_path, length):
    # First byte 0x80 followed by different second bytes, including 0x80 0x80 ...
    path = write_by_hand(tmp_path / "hand.safetensors", length)
    assert_read_like_the_package(path)
    if length % 8 == 0 and length >= 160:
        assert_read_like_the_package(write_with_package(tmp_path / "package.safetensors", length))


def test_header_length_that_spells_the_zip_signature(tmp_path):
    # 0x04034B50 little-endian is b"PK\x03\x04": a 67 MB header starts like a zip archive.
    path = write_with_package(tmp_path / "zip_like.safetensors", 0x04034B50)
    assert path.read_bytes()[:4] == b"PK\x03\x04"
    assert_read_like_the_package(path)


def test_sniff_rules_accept_every_safetensors_frame():
    """The rule itself, exhaustively over the first two bytes: a frame that opens with `{` is safetensors."""
    for first in range(256):
        for second in range(256):
            length = first | second << 8
            if length < 2:
                continue
            head = struct.pack("<Q", length) + b"{"
            assert sniff(head, 8 + length) == "safetensors", (first, second)


def test_a_valid_file_with_a_pickle_suffix_is_read(tmp_path):
    """The name does not decide: safetensors bytes under a `.bin` name are safetensors."""
    path = write_with_package(tmp_path / "model.bin", 0x1080)
    np.testing.assert_array_equal(read_safetensors(path)["w"], TENSORS["w"])


def test_zero_size_tensors_and_bfloat16_are_valid(tmp_path):
    torch_free = {"empty": np.zeros((0, 3), np.float32), "w": np.ones((2,), np.float16)}
    safetensors_numpy.save_file(torch_free, str(tmp_path / "z.safetensors"))
    tensors = read_safetensors(tmp_path / "z.safetensors")
    assert tensors["empty"].shape == (0, 3) and tensors["w"].dtype == np.float16
