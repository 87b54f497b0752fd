"""keras_vit.utils: the pair / per-channel rules and writes that lose nothing."""

import os

import numpy as np
import pytest

from keras_vit.utils import per_channel, to_pair
from keras_vit.writer.files import atomic_write, claim
from keras_vit.writer.ownership import check_writable


@pytest.mark.parametrize(
    "value, expected",
    [(7, (7, 7)), ((3, 5), (3, 5)), ([3, 5], (3, 5)), (np.int64(4), (4, 4)), ((np.int32(2), 6), (2, 6))],
)
def test_to_pair_accepts_ints_and_pairs(value, expected):
    pair = to_pair(value, "image_size")
    assert pair == expected
    assert all(type(v) is int for v in pair)


@pytest.mark.parametrize("value", [0, -1, True, 2.0, (1, 2, 3), (2, 0), "16", None, (2.5, 2)])
def test_to_pair_refuses_with_the_argument_name(value):
    with pytest.raises(ValueError, match="image_size"):
        to_pair(value, "image_size")


def test_per_channel_repeats_a_scalar_and_checks_lengths():
    assert per_channel(0.5, "mean", 3) == (0.5, 0.5, 0.5)
    assert per_channel([0.1, 0.2, 0.3], "mean", 3) == (0.1, 0.2, 0.3)
    assert per_channel((0.1, 0.2), "mean") == (0.1, 0.2)
    with pytest.raises(ValueError, match=r"one per channel \(3\)"):
        per_channel([0.1, 0.2], "mean", 3)
    with pytest.raises(ValueError, match="finite"):
        per_channel(float("nan"), "std", 3)
    with pytest.raises(ValueError, match="std"):
        per_channel("0.5", "std", 3)


def test_atomic_write_replaces_only_on_success(tmp_path):
    target = tmp_path / "weights.bin"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError):
        with atomic_write(target) as file:
            file.write(b"half")
            raise RuntimeError("killed")
    assert target.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["weights.bin"]  # no temporary left behind
    with atomic_write(target) as file:
        file.write(b"new")
    assert target.read_bytes() == b"new"


def test_a_directory_replaced_whole_keeps_the_old_directory_when_the_block_fails(tmp_path):
    target = tmp_path / "preset"
    with claim(target, "output").directory() as staging:
        with open(os.path.join(staging, "config.json"), "w") as file:
            file.write("old")
    with pytest.raises(RuntimeError):
        with claim(target, "output").directory() as staging:
            with open(os.path.join(staging, "config.json"), "w") as file:
                file.write("new, half")
            raise RuntimeError("killed")
    assert (target / "config.json").read_text() == "old"
    with claim(target, "output").directory() as staging:
        with open(os.path.join(staging, "config.json"), "w") as file:
            file.write("new")
    assert (target / "config.json").read_text() == "new"
    assert sorted(os.listdir(tmp_path)) == ["preset"]


def test_check_writable_names_the_problem(tmp_path):
    check_writable(tmp_path / "model.keras")
    with pytest.raises(ValueError, match="does not exist"):
        check_writable(tmp_path / "missing" / "model.keras")
    with pytest.raises(ValueError, match="is a directory"):
        check_writable(tmp_path)


def test_atomic_writes_get_the_permissions_a_plain_write_would(tmp_path):
    umask = os.umask(0o022)
    try:
        with atomic_write(tmp_path / "new.txt", "w") as file:
            file.write("x")
        assert (os.stat(tmp_path / "new.txt").st_mode & 0o777) == 0o644
        os.chmod(tmp_path / "new.txt", 0o600)
        with atomic_write(tmp_path / "new.txt", "w") as file:
            file.write("y")
        assert (os.stat(tmp_path / "new.txt").st_mode & 0o777) == 0o600  # an existing file keeps its mode
        with claim(tmp_path / "preset", "output").directory():
            pass
        assert (os.stat(tmp_path / "preset").st_mode & 0o777) == 0o755
    finally:
        os.umask(umask)


def test_seeding_does_not_start_tensorflow_on_other_backends():
    # keras.utils.set_random_seed imports TensorFlow whenever it is installed, and its CUDA log
    # lines then appeared on jax and torch runs of every training command.
    import random
    import subprocess
    import sys

    import keras
    import numpy as np

    if keras.backend.backend() == "tensorflow":
        # TensorFlow is this backend itself: no process of its own to ask whether it started, only the
        # seeding to check, here (a child cost the TensorFlow pass a TensorFlow start).
        from keras_vit.utils.seeds import set_random_seed

        set_random_seed(3)
        seeded = (random.random(), float(np.random.rand()))
        random.seed(3)
        np.random.seed(3)
        assert seeded == (random.random(), float(np.random.rand()))
        return
    code = ("import sys, random, numpy as np; from keras_vit.utils.seeds import set_random_seed; set_random_seed(3); "
            "a = (random.random(), float(np.random.rand())); random.seed(3); np.random.seed(3); "
            "print('tensorflow' in sys.modules, a == (random.random(), float(np.random.rand())))")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                               env={**os.environ, "PYTHONPATH": root})
    assert completed.returncode == 0, completed.stderr[-2000:]
    assert completed.stdout.split() == ["False", "True"]
