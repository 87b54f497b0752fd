"""Helpers for the tests that start real processes: a free loopback port, bounded waits, checkpoints.

Every child is bounded by a timeout and killed by the test, pass or fail.
"""

import json
import os
import socket
import time

import keras
import numpy as np

import keras_vit

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TIMEOUT = 240


def free_port():
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def finish(children, timeout=TIMEOUT):
    """Wait for every child (at most `timeout` seconds each), kill any left; return their outputs."""
    try:
        return [child.communicate(timeout=timeout)[0] for child in children]
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()


def epochs_done(run_dir):
    """Epochs in the run directory's epoch backup (0 without one, or while it is being replaced)."""
    try:
        with open(os.path.join(run_dir, "backup", "state.json")) as file:
            return json.load(file)["epoch"]
    except (OSError, ValueError, KeyError):
        return 0


def kill_worker_then_chief(children, run_dir, epochs, timeout=TIMEOUT):
    """Once `run_dir` holds `epochs` epochs, kill process 1 (a worker), then process 0; return the epochs done.

    The worker goes first, as a failing host would; the chief follows a second later, as the job's
    launcher would end it. Stops waiting early if a process exits or `timeout` seconds pass.
    """
    try:
        deadline = time.monotonic() + timeout
        while epochs_done(run_dir) < epochs and all(c.poll() is None for c in children) and time.monotonic() < deadline:
            time.sleep(0.02)
        children[1].kill()
        time.sleep(1)
        children[0].kill()
    finally:
        finish(children, timeout=30)
    return epochs_done(run_dir)


def assert_same_preset_weights(expected_preset, actual_preset, atol=1e-5):
    """Two classifier presets hold the same weights, weight by weight, within `atol`."""
    expected = keras_vit.ViTClassifier.from_preset(expected_preset)
    actual = keras_vit.ViTClassifier.from_preset(actual_preset)
    assert [w.path for w in actual.weights] == [w.path for w in expected.weights]
    largest = max(float(np.max(np.abs(keras.ops.convert_to_numpy(got.value) - keras.ops.convert_to_numpy(want.value))))
                  for want, got in zip(expected.weights, actual.weights))
    print(f"weights: largest difference {largest:.3g}")  # shown by `pytest -rP`
    for want, got in zip(expected.weights, actual.weights):
        np.testing.assert_allclose(keras.ops.convert_to_numpy(got.value), keras.ops.convert_to_numpy(want.value),
                                   atol=atol, rtol=0, err_msg=want.path)


def uneven_folders(root, train_per_class=7, held_out_per_class=(4, 3)):
    """A training folder of 2 classes and a held-out folder whose classes differ in size; their paths.

    With `--batch-size 5`, 14 training images are batches of 5, 5 and 4 and 7 held-out images batches of
    5 and 2: two processes read 2 and 3 rows of a batch of 5, so any average weighted by the wrong rows
    (or taken over one process's rows) differs from one process.
    """
    from tests.finetune.helpers import write_folder

    train = write_folder(os.path.join(root, "photos"), classes=2, per_class=train_per_class, size=(10, 12))
    held_out = write_folder(os.path.join(root, "held_out"), classes=2, per_class=max(held_out_per_class),
                            size=(10, 12), seed=1)
    for label, count in enumerate(held_out_per_class):
        for index in range(count, max(held_out_per_class)):
            os.remove(os.path.join(held_out, f"class_{label}", f"{index}.png"))
    return train, held_out


def held_out_line(log):
    """The `Held-out accuracy: ...% (loss ...` line a training command printed (the last one), without its timing."""
    lines = [line for line in log.splitlines() if line.startswith("Held-out accuracy:")]
    assert lines, log[-4000:]
    return lines[-1].split(";")[0].split(" (trained")[0]


def read_log(path):
    """The rows of a run's log.csv as `{column: [float per epoch]}`."""
    import csv

    with open(path) as file:
        rows = list(csv.DictReader(file))
    return {name: [float(row[name]) for row in rows] for name in rows[0]}


def assert_same_numbers(one_process, many_processes, atol=1e-6):
    """The job's printed held-out line and every log.csv column equal one process's (`(log, csv path)` pairs).

    The printed line must be equal character for character; every logged number within `atol`.
    """
    (one_log, one_csv), (job_log, job_csv) = one_process, many_processes
    assert held_out_line(job_log) == held_out_line(one_log), (held_out_line(job_log), held_out_line(one_log))
    one, job = read_log(one_csv), read_log(job_csv)
    assert sorted(job) == sorted(one) and any(name.startswith("val_") for name in one), (sorted(job), sorted(one))
    differences = {name: float(np.max(np.abs(np.subtract(job[name], one[name])))) for name in one}
    print(f"printed: {held_out_line(one_log)!r} (one process) {held_out_line(job_log)!r} (the job); log.csv "
          "largest differences: " + ", ".join(f"{name} {value:.3g}" for name, value in differences.items()))
    for name in one:
        np.testing.assert_allclose(job[name], one[name], atol=atol, rtol=0, err_msg=f"log.csv column {name}")
