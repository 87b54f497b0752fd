"""Readers refuse damaged files and pickles; the mapping is strict and says what is wrong."""

import shutil
import struct

import numpy as np
import pytest

from keras_vit.convert import from_timm, load_checkpoint, read_npz, read_safetensors, write_safetensors
from tests.convert.helpers import fixture_path

SOURCE = fixture_path("cls_token", "model.safetensors")
# The readers are numpy code and refuse these files before any model is built: one pass of the suite runs them.
numpy_reader = pytest.mark.one_backend("numpy-only checkpoint reading, refused before any model is built")


@pytest.fixture(scope="module")
def state_dict():
    return read_safetensors(SOURCE)


@numpy_reader
def test_safetensors_round_trip_including_bfloat16(tmp_path):
    arrays = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.array([1, 2], np.int64)}
    write_safetensors(tmp_path / "x.safetensors", arrays, metadata={"k": "v"})
    loaded = read_safetensors(tmp_path / "x.safetensors")
    assert sorted(loaded) == ["a", "b"]
    np.testing.assert_array_equal(loaded["a"], arrays["a"])
    assert loaded["b"].dtype == np.int64
    # bfloat16 (no numpy dtype) is widened exactly: 1.5 and -2.0 are bf16-exact.
    raw = (np.array([1.5, -2.0], np.float32).view(np.uint32) >> 16).astype("<u2").tobytes()
    header = b'{"w":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]}}'
    (tmp_path / "bf16.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + raw)
    np.testing.assert_array_equal(read_safetensors(tmp_path / "bf16.safetensors")["w"], [1.5, -2.0])


@numpy_reader
def test_safetensors_readable_by_the_safetensors_library(tmp_path):
    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    arrays = {"w": np.random.default_rng(0).normal(size=(3, 5)).astype(np.float32)}
    write_safetensors(tmp_path / "x.safetensors", arrays)
    np.testing.assert_array_equal(safetensors_numpy.load_file(str(tmp_path / "x.safetensors"))["w"], arrays["w"])


@numpy_reader
def test_truncated_safetensors(tmp_path):
    data = open(SOURCE, "rb").read()
    (tmp_path / "cut.safetensors").write_bytes(data[: len(data) - 1000])
    with pytest.raises(ValueError, match="truncated"):
        load_checkpoint(tmp_path / "cut.safetensors")
    (tmp_path / "header.safetensors").write_bytes(data[:100])
    with pytest.raises(ValueError, match="truncated"):
        read_safetensors(tmp_path / "header.safetensors")
    (tmp_path / "tiny.safetensors").write_bytes(b"\x01\x02")
    with pytest.raises(ValueError, match="truncated or empty"):
        read_safetensors(tmp_path / "tiny.safetensors")


@numpy_reader
def test_corrupt_safetensors(tmp_path):
    data = bytearray(open(SOURCE, "rb").read())
    data[10:20] = b"\xff" * 10  # break the JSON header
    (tmp_path / "bad.safetensors").write_bytes(bytes(data))
    with pytest.raises(ValueError, match="not a valid safetensors file"):
        read_safetensors(tmp_path / "bad.safetensors")
    (tmp_path / "noise.safetensors").write_bytes(np.random.default_rng(0).bytes(4096))
    with pytest.raises(ValueError, match="not a valid safetensors file|truncated"):
        read_safetensors(tmp_path / "noise.safetensors")


@numpy_reader
def test_pickles_are_refused(tmp_path):
    for name in ("pytorch_model.bin", "model.pth", "model.pt", "model.ckpt"):
        (tmp_path / name).write_bytes(b"\x80\x04K\x01.")
        with pytest.raises(ValueError, match="never unpickles.*safetensors"):
            load_checkpoint(tmp_path / name)
    # A pickle under a .safetensors name is recognised by its bytes.
    (tmp_path / "disguised.safetensors").write_bytes(b"PK\x03\x04" + b"\x00" * 64)
    with pytest.raises(ValueError, match="pickled PyTorch checkpoint"):
        read_safetensors(tmp_path / "disguised.safetensors")
    # A hub directory that only has the pickle.
    directory = tmp_path / "hub"
    directory.mkdir()
    (directory / "config.json").write_text('{"model_type": "vit"}')
    (directory / "pytorch_model.bin").write_bytes(b"\x80\x04K\x01.")
    with pytest.raises(ValueError, match="save_file"):
        load_checkpoint(directory)


@numpy_reader
def test_npz_pickle_and_truncation(tmp_path):
    np.savez(tmp_path / "objects.npz", a=np.array([{"x": 1}], dtype=object))
    with pytest.raises(ValueError, match="allow_pickle=False"):
        read_npz(tmp_path / "objects.npz")
    data = open(fixture_path("google_vit.npz"), "rb").read()
    (tmp_path / "cut.npz").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="truncated or corrupt"):
        load_checkpoint(tmp_path / "cut.npz")


def test_mismatched_shape(state_dict):
    broken = dict(state_dict)
    broken["blocks.1.mlp.fc1.weight"] = np.zeros((31, 16), np.float32)
    with pytest.raises(ValueError, match=r"blocks\.1\.mlp\.fc1\.weight: checkpoint \(31, 16\)"):
        from_timm(broken, num_heads=2)


def test_unknown_key(state_dict):
    extra = dict(state_dict, **{"blocks.0.attn.extra.weight": np.zeros((2,), np.float32)})
    with pytest.raises(ValueError, match=r"cannot use: \['blocks\.0\.attn\.extra\.weight'\]"):
        from_timm(extra, num_heads=2)
    # A part keras_vit's ViT does not implement is named (pre-norm, qk-norm, MAP are implemented: issue 48).
    scaled = dict(state_dict, **{"blocks.0.attn.norm.weight": np.ones((16,), np.float32)})
    with pytest.raises(ValueError, match="attention output normalisation"):
        from_timm(scaled, num_heads=2)
    # An implemented part whose tensors are incomplete is a missing tensor.
    clip = dict(state_dict, **{"norm_pre.weight": np.ones((16,), np.float32)})
    with pytest.raises(ValueError, match=r"lacks tensors the model needs: \['norm_pre\.bias'\]"):
        from_timm(clip, num_heads=2)


def test_missing_key(state_dict):
    partial = {k: v for k, v in state_dict.items() if k != "blocks.1.norm2.bias"}
    with pytest.raises(ValueError, match=r"lacks tensors the model needs: \['blocks\.1\.norm2\.bias'\]"):
        from_timm(partial, num_heads=2)


def test_npz_unknown_array(tmp_path):
    arrays = dict(np.load(fixture_path("google_vit.npz"), allow_pickle=False))
    arrays["opt/target/MAPHead_0/probe"] = np.zeros((1, 1, 16), np.float32)
    np.savez(tmp_path / "map.npz", **arrays)
    with pytest.raises(ValueError, match=r"incomplete MAP head.*opt/target/MAPHead_0/LayerNorm_0/scale"):
        load_checkpoint(tmp_path / "map.npz")


def test_bad_image_size_and_missing_file(tmp_path):
    with pytest.raises(ValueError, match="not a multiple of the checkpoint's patch size 4"):
        load_checkpoint(fixture_path("cls_token"), image_size=18)
    with pytest.raises(ValueError, match="No such file or directory"):
        load_checkpoint(tmp_path / "nothing.safetensors")
    shutil.copy(SOURCE, tmp_path / "weights.bin.txt")
    with pytest.raises(ValueError, match="Unrecognised checkpoint"):
        load_checkpoint(tmp_path / "weights.bin.txt")


def test_build_model_hook_for_hybrids(state_dict):
    # Hybrid converters reuse the strict ViT mapping and hand in the stem's
    # weights; the position embedding is resampled to the stem's grid.
    import keras

    from keras_vit.convert.model_map import build_model
    from keras_vit.utils.resample import resample_position_embedding

    def config():
        stem = keras.layers.Conv2D(3, 1, strides=2, name="stem")
        return dict(image_size=32, patch_size=4, hidden_dim=16, num_layers=2, num_heads=2, mlp_dim=32, stem=stem)

    kernel = np.random.default_rng(0).normal(size=(1, 1, 3, 3)).astype(np.float32)
    heads = [k for k in state_dict if k.startswith("head.")]
    model = build_model(config(), None, state_dict, source_grid=(4, 4), image_size=64, ignored=heads,
                        extra_weights={"stem/kernel": kernel, "stem/bias": np.zeros(3, np.float32)})
    assert model.grid_size == (8, 8)
    np.testing.assert_array_equal(model.get_layer("stem").kernel.numpy(), kernel)
    expected = resample_position_embedding(state_dict["pos_embed"], 1, (4, 4), (8, 8))
    table = model.get_layer("patch_encoder").position_embedding_table.numpy()
    np.testing.assert_allclose(table, expected, atol=1e-6)
    with pytest.raises(ValueError, match=r"does not set these model weights: \['stem/bias', 'stem/kernel'\]"):
        build_model(config(), None, state_dict, source_grid=(4, 4), ignored=heads)
