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
from tests.finetune.helpers import tiny_backbone_file, write_folder

WORKER = os.path.join(os.path.dirname(__file__), "resume_worker.py")
EPOCHS = 4


def _run(args, env_extra=None, wait=True):
    env = dict(os.environ, **(env_extra or {}))
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    command = [sys.executable, WORKER, *args]
    if not wait:
        return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def _weights(directory):
    model = keras_vit.ViTClassifier.from_preset(directory)
    return [np.asarray(w) for w in model.get_weights()]


@pytest.mark.slow
def test_killed_finetune_resumes_to_the_uninterrupted_weights(tmp_path):
    data = write_folder(str(tmp_path / "data"), classes=3, per_class=10)
    preset = tiny_backbone_file(str(tmp_path / "tiny.keras"))

    reference = str(tmp_path / "reference")
    out = _run([data, preset, reference, str(EPOCHS)])
    assert f"initial_epoch 0 epochs_run {EPOCHS}" in out

    killed = str(tmp_path / "killed")
    process = _run([data, preset, killed, str(EPOCHS)], {"SLOW_EPOCHS": "2"}, wait=False)
    state = os.path.join(killed + ".run", "backup", "state.json")
    deadline = time.time() + 300
    epochs_done = 0
    while time.time() < deadline and process.poll() is None:
        if os.path.exists(state):
            try:
                with open(state) as file:
                    epochs_done = json.load(file)["epoch"]
            except (OSError, ValueError):  # the directory is being swapped
                epochs_done = 0
            if epochs_done >= 1:
                break
        time.sleep(0.05)
    assert process.poll() is None, "the run finished before it could be killed:\n" + process.stdout.read()
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert 1 <= epochs_done < EPOCHS
    assert not os.path.exists(killed), "a killed run must not leave an output preset"

    out = _run([data, preset, killed, str(EPOCHS)])
    resumed_from = int(out.split("initial_epoch ")[1].split()[0])
    epochs_run = int(out.split("epochs_run ")[1].split()[0])
    assert resumed_from >= 1 and resumed_from + epochs_run == EPOCHS
    assert not os.path.exists(os.path.join(killed + ".run", "backup")), "the backup is removed after the run"
    with open(os.path.join(killed + ".run", "log.csv")) as file:
        rows = file.read().splitlines()
    assert [int(row.split(",")[0]) for row in rows[1:]] == list(range(EPOCHS))

    diffs = [float(np.max(np.abs(a - b))) for a, b in zip(_weights(reference), _weights(killed))]
    print(f"{keras.backend.backend()}: max abs weight difference after kill + resume: {max(diffs):.3g}")
    assert max(diffs) <= 1e-5
