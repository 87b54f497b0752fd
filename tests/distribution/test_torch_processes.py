"""Real PyTorch processes under torchrun: a killed worker resumes; a bad output or a missing process stops the job.

`torchrun --nproc_per_node=2` (gloo, CPU, 127.0.0.1 and a free port) starts
two processes. That a job trains, prints and logs what one process does is
the differential check's (`test_differential.py`, configurations drawn by
seed). Through the command line, `keras-vit finetune --distribute data` is
killed in a worker (rank 1, not the chief) after its second epoch checkpoint;
the same command then resumes both processes from process 0's checkpoint and
ends with the weights of an uninterrupted two-process run. Every launch is
bounded by a timeout and its whole process group is killed by the test, pass
or fail.
"""

import os
import signal
import sys
import time

import keras
import pytest

from tests.distribution.jobs import TIMEOUT, assert_same_preset_weights, epochs_done, finish, free_port, launch, stop
from tests.finetune.helpers import tiny_backbone_file, write_folder

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(keras.backend.backend() != "torch", reason="torchrun and torch.distributed: PyTorch only"),
]


def finetune(arguments, processes=2):
    """`keras-vit finetune ARGUMENTS` as `processes` processes under torchrun, started now."""
    return launch("torch", ["-m", "keras_vit", "finetune", *arguments], processes)[0]


def run(arguments):
    child = finetune(arguments)
    (log,) = finish([child], TIMEOUT)
    assert child.returncode == 0, log[-4000:]
    return log


def _workers(torchrun_pid):
    """`{rank: pid}` of the processes torchrun started (read from their environment)."""
    found = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as file:
                parent = int(file.read().rsplit(")", 1)[1].split()[1])
            if parent != torchrun_pid:
                continue
            with open(f"/proc/{name}/environ", "rb") as file:
                variables = dict(item.split(b"=", 1) for item in file.read().split(b"\0") if b"=" in item)
        except (OSError, ValueError, IndexError):
            continue
        if b"RANK" in variables:
            found[int(variables[b"RANK"])] = int(name)
    return found


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds the workers through /proc")
def test_a_killed_worker_resumes_from_the_chiefs_checkpoint(tmp_path):
    folder = write_folder(str(tmp_path / "photos"), classes=2, per_class=12, size=(10, 12))
    pretrained = str(tmp_path / "pretrained.keras")
    tiny_backbone_file(pretrained, image_size=8, dropout=0.0)

    def arguments(output):
        return [folder, "--preset", pretrained, "--epochs", "6", "--batch-size", "6", "--recipe", "adamw",
                "--validation-split", "0.25", "--workers", "1", "--output", output, "--distribute", "data"]

    log = run(arguments(str(tmp_path / "whole")))
    assert log.count("Epoch 6/6") == 1  # only process 0 prints

    output, run_dir = str(tmp_path / "killed"), str(tmp_path / "killed.run")
    child = finetune(arguments(output))
    try:
        deadline = time.monotonic() + TIMEOUT
        while epochs_done(run_dir) < 2 and child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        workers = _workers(child.pid)
        assert set(workers) == {0, 1}, child.communicate(timeout=30)[0][-4000:]
        os.kill(workers[1], signal.SIGKILL)  # a worker, not the chief
        log = child.communicate(timeout=TIMEOUT)[0]
    finally:
        stop([child])
    done = epochs_done(run_dir)
    assert child.returncode != 0 and not os.path.exists(output), log[-4000:]
    assert 2 <= done < 6  # killed mid-run: some epochs are in the checkpoint, not all

    log = run(arguments(output))
    assert f"Resuming from the checkpoint in {run_dir}: {done} of 6 epochs done." in log, log[-4000:]
    assert_same_preset_weights(str(tmp_path / "whole"), output)
    with open(os.path.join(run_dir, "log.csv")) as file:
        assert [row.split(",")[0] for row in file.read().split()[1:]] == [str(e) for e in range(6)]


def test_every_process_checks_the_output_before_training(tmp_path):
    # Process 1 writes nothing, yet it must refuse a bad --output too: were only process 0 to check,
    # process 1 would go on alone and wait for a partner at its first collective.
    folder = write_folder(str(tmp_path / "photos"), classes=2, per_class=4, size=(10, 12))
    pretrained = str(tmp_path / "pretrained.keras")
    tiny_backbone_file(pretrained, image_size=8, dropout=0.0)
    child = finetune([folder, "--preset", pretrained, "--epochs", "1", "--output", str(tmp_path / "missing" / "out"),
                      "--distribute", "data"])
    (log,) = finish([child], TIMEOUT)
    assert child.returncode != 0, log[-4000:]
    assert log.count("does not exist. Create it first") == 2 and "Epoch 1/1" not in log, log[-4000:]


@pytest.mark.parametrize("rank, missing", [(0, 1), (1, 0)])
def test_a_process_that_never_joins_stops_the_job_with_its_name_and_address(tmp_path, rank, missing):
    # One process of a job of two, started alone (the other host never comes up): it must stop after
    # KERAS_VIT_JOIN_TIMEOUT seconds, saying which process is missing and where it waited.
    folder = write_folder(str(tmp_path / "photos"), classes=2, per_class=4, size=(10, 12))
    pretrained = tiny_backbone_file(str(tmp_path / "pretrained.keras"), image_size=8, dropout=0.0)
    port = free_port()
    (child,) = launch("torch", ["-m", "keras_vit", "finetune", folder, "--preset", pretrained, "--epochs", "1",
                                "--distribute", "data"], 2, port=port, only=rank, KERAS_VIT_JOIN_TIMEOUT="3")
    (log,) = finish([child], TIMEOUT)
    assert child.returncode == 1, log[-4000:]
    assert f"Process {rank} of 2 waited 3 s for process {missing} of the job at 127.0.0.1:{port}" in log, log[-4000:]
    assert "KERAS_VIT_JOIN_TIMEOUT" in log and "Epoch 1/1" not in log, log[-4000:]
