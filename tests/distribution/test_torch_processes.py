"""PyTorch jobs: a bad output or a missing process stops the job.

Each process gets the variables torchrun gives it (RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT; gloo, CPU, 127.0.0.1 and a free port): the two
processes of the bad-output job are started as children, a process whose
peer never comes up runs in the test's own process. That a job under
torchrun itself trains, prints and logs what one process does, and that a
job whose worker (its last rank, not the chief) is killed ends and resumes
to one process's weights, is the differential check's (`test_differential.py`,
configurations drawn by seed, `CI_RESUMED`). Every launch is bounded by a
timeout and its whole process group is killed by the test, pass or fail.
"""

import keras
import pytest

from tests.distribution.jobs import TIMEOUT, finish, free_port, launch
from tests.finetune.helpers import tiny_backbone_file, write_folder

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(keras.backend.backend() != "torch", reason="torchrun and torch.distributed: PyTorch only"),
]


def test_every_process_checks_the_output_before_training(tmp_path):
    # Process 1 writes nothing, yet it must refuse a bad --output too: were only process 0 to check,
    # process 1 would go on alone and wait for a partner at its first collective. The two processes are
    # started with the variables torchrun gives them, without the launcher (which would end the second as
    # soon as the first fails): each one's own output must hold the refusal.
    folder = write_folder(str(tmp_path / "photos"), classes=2, per_class=4, size=(10, 12))
    pretrained = str(tmp_path / "pretrained.keras")
    tiny_backbone_file(pretrained, image_size=8, dropout=0.0)
    arguments = ["-m", "keras_vit", "finetune", folder, "--preset", pretrained, "--epochs", "1",
                 "--output", str(tmp_path / "missing" / "out"), "--distribute", "data"]
    children = launch("torch", arguments, 2, torchrun=False)
    logs = finish(children, TIMEOUT)
    for child, log in zip(children, logs):
        assert child.returncode == 2, log[-4000:]
        assert log.count("does not exist. Create it first") == 1 and "Epoch 1/1" not in log, log[-4000:]


@pytest.mark.parametrize("rank, missing", [(0, 1), (1, 0)])
def test_a_process_that_never_joins_stops_the_job_with_its_name_and_address(tmp_path, rank, missing, monkeypatch,
                                                                            capsys):
    # One process of a job of two, started alone (the other host never comes up): it must stop after
    # KERAS_VIT_JOIN_TIMEOUT seconds, saying which process is missing and where it waited. Process 0 serves the
    # store and waits for process 1's key; process 1 finds no store to reach (two points of `_join_store`).
    # Run in this test's process with the variables torchrun gives (the subject is the join's wait, not a
    # process boundary; a real torchrun job's variables are read by the job above and the differential check).
    import torch.distributed

    from keras_vit.cli import main

    folder = write_folder(str(tmp_path / "photos"), classes=2, per_class=4, size=(10, 12))
    pretrained = tiny_backbone_file(str(tmp_path / "pretrained.keras"), image_size=8, dropout=0.0)
    port = free_port()
    for name, value in {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                        "MASTER_PORT": str(port), "KERAS_VIT_JOIN_TIMEOUT": "3"}.items():
        monkeypatch.setenv(name, value)
    code = main(["finetune", folder, "--preset", pretrained, "--epochs", "1", "--output", str(tmp_path / "out"),
                 "--distribute", "data"])
    captured = capsys.readouterr()
    log = captured.out + captured.err
    assert code == 1, log[-4000:]
    assert f"Process {rank} of 2 waited 3 s for process {missing} of the job at 127.0.0.1:{port}" in log, log[-4000:]
    assert "KERAS_VIT_JOIN_TIMEOUT" in log and "Epoch 1/1" not in log, log[-4000:]
    assert not torch.distributed.is_initialized()  # nothing left joined for the next test in this process
