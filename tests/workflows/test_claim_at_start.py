"""A command's claims check at its start what the probes of issue 50 found only after the training.

- `finetune --output` on a read-only folder (an existing output directory on a read-only mount: only its
  parent's writability tells) was accepted and failed after training;
- `train --save OUT/m.keras --run-dir OUT/m.keras` trained, then failed naming a private temporary name.
"""

import os
import subprocess

import keras
import pytest

from tests.finetune.helpers import tiny_backbone_file, write_folder
from tests.reliability.helpers import run_cli

pytestmark = pytest.mark.one_backend("what a claim checks before the work does not depend on the backend")


class Trained(BaseException):
    """Raised by `fit`: the command got past its checks (not an Exception: no handler of ours catches it)."""


@pytest.fixture
def no_training(monkeypatch):
    def fit(*args, **kwargs):
        raise Trained

    monkeypatch.setattr(keras.Model, "fit", fit)


@pytest.fixture
def read_only_folder(tmp_path):
    """A folder on a read-only mount holding an empty directory `model` (made while it was writable)."""
    folder = tmp_path / "readonly"
    folder.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(folder)], capture_output=True).returncode != 0:
        pytest.skip("mounting a file system needs privileges this test run lacks")
    try:
        (folder / "model").mkdir()
        subprocess.run(["mount", "-o", "remount,ro", str(folder)], check=True, capture_output=True)
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], capture_output=True)


def test_finetune_output_on_a_read_only_folder_fails_before_training(tmp_path, read_only_folder, no_training,
                                                                     capsys):
    data = write_folder(str(tmp_path / "data"), classes=2, per_class=2)
    output = read_only_folder / "model"
    code, err = run_cli(["finetune", data, "--preset", tiny_backbone_file(str(tmp_path / "b.keras")), "--epochs",
                         "1", "--output", output, "--run-dir", tmp_path / "run"], capsys)
    assert code == 2, err
    assert f"--output {output}" in err and "not writable" in err, err


def test_train_save_inside_its_own_run_directory_is_refused_at_start_naming_both_flags(tmp_path, no_training,
                                                                                       capsys):
    same = str(tmp_path / "m.keras")
    code, err = run_cli(["train", "--epochs", "1", "--save", same, "--run-dir", same], capsys)
    assert code == 2, err
    assert "--save" in err and "--run-dir" in err, err
    assert not os.path.exists(same)
