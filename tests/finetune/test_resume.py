"""Kill a fine-tuning run mid-training, run it again, and get the uninterrupted run's weights."""

import json
import os
import signal
import subprocess
import sys
import time

import keras
import numpy as np
import pytest

import keras_vit
from tests.finetune import resume_worker
from tests.finetune.helpers import tiny_backbone_file, write_folder, write_misleading_held_out

WORKER = os.path.join(os.path.dirname(__file__), "resume_worker.py")
EPOCHS = 4


def _start(args, env_extra):
    env = dict(os.environ, **env_extra)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    command = [sys.executable, WORKER, *args]
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _weights(directory):
    model = keras_vit.ViTClassifier.from_preset(directory)
    return [np.asarray(w) for w in model.get_weights()]


@pytest.mark.slow
def test_killed_finetune_resumes_to_the_uninterrupted_weights(tmp_path):
    data = write_folder(str(tmp_path / "data"), classes=3, per_class=10)
    preset = tiny_backbone_file(str(tmp_path / "tiny.keras"))
    # The held-out score is best after the first epoch (its images have the next class's colour), so the run
    # resumed after a kill must know that best and write its weights, not the last ones.
    held_out = write_misleading_held_out(str(tmp_path / "held_out"))

    # The uninterrupted run in this process (the same function the worker runs; finetune seeds it); only the
    # killed run needs a child process.
    reference = str(tmp_path / "reference")
    out = resume_worker.run(data, preset, reference, EPOCHS, held_out)
    assert f"initial_epoch 0 epochs_run {EPOCHS} best_epoch 1" in out, out

    killed = str(tmp_path / "killed")
    process = _start([data, preset, killed, str(EPOCHS), held_out], {"SLOW_EPOCHS": "2"})
    state = os.path.join(killed + ".run", "backup.json")  # the pointer: its epoch is the last whole slot's
    deadline = time.time() + 300
    epochs_done = 0
    while time.time() < deadline and process.poll() is None:
        if os.path.exists(state):
            try:
                with open(state) as file:
                    epochs_done = json.load(file)["epoch"]
            except (OSError, ValueError):  # not written yet
                epochs_done = 0
            if epochs_done >= 1:
                break
        time.sleep(0.05)
    assert process.poll() is None, "the run finished before it could be killed:\n" + process.stdout.read()
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert 1 <= epochs_done < EPOCHS
    assert not os.path.exists(killed), "a killed run must not leave an output preset"
    assert os.path.exists(os.path.join(killed + ".run", "best", "model.weights.h5")), "the best so far is kept"

    # The resumed run reads everything it needs from the run directory: in this process too.
    out = resume_worker.run(data, preset, killed, EPOCHS, held_out)
    assert "best_epoch 1" in out, out
    resumed_from = int(out.split("initial_epoch ")[1].split()[0])
    epochs_run = int(out.split("epochs_run ")[1].split()[0])
    assert resumed_from >= 1 and resumed_from + epochs_run == EPOCHS
    for name in ("backup.a", "backup.b", "backup.json", "best"):
        assert not os.path.exists(os.path.join(killed + ".run", name)), f"{name} is removed after the run"
    with open(os.path.join(killed + ".run", "log.csv")) as file:
        rows = file.read().splitlines()
    assert [int(row.split(",")[0]) for row in rows[1:]] == list(range(EPOCHS))

    # The last epoch's weights: the resumed training is the uninterrupted one.
    last = [np.load(path + ".last.npz") for path in (reference, killed)]
    diffs = [float(np.max(np.abs(last[0][name] - last[1][name]))) for name in last[0].files]
    print(f"{keras.backend.backend()}: max abs weight difference after kill + resume: {max(diffs):.3g}")
    assert max(diffs) <= 1e-5
    # The output: the best evaluation's (the first epoch's) weights, read back from best/ by the resumed run.
    kept = [float(np.max(np.abs(a - b))) for a, b in zip(_weights(reference), _weights(killed))]
    assert max(kept) <= 1e-5
    assert any(not np.allclose(a, b) for a, b in zip(_weights(killed), (last[1][name] for name in last[1].files)))
