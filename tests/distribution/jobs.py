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

    `train_per_class` and `held_out_per_class` are an int or one count per class. With `--batch-size 5`,
    14 training images are batches of 5, 5 and 4 and 7 held-out images batches of 5 and 2: two processes
    read 2 and 3 rows of a batch of 5, so any average weighted by the wrong rows (or taken over one
    process's rows) differs from one process. The first held-out image of each class is swapped with the
    other class's (the colour says one class, the folder the other): a model that learned the colours
    gets those wrong, one that did not gets others wrong, so held-out accuracy lies strictly between 0
    and 1 and a wrong weighting of it shows.
    """
    from tests.finetune.helpers import write_folder

    def folder(path, per_class, seed):
        per_class = (per_class, per_class) if isinstance(per_class, int) else tuple(per_class)
        write_folder(path, classes=2, per_class=max(per_class), size=(10, 12), seed=seed)
        for label, count in enumerate(per_class):
            for index in range(count, max(per_class)):
                os.remove(os.path.join(path, f"class_{label}", f"{index}.png"))
        return path

    train = folder(os.path.join(root, "photos"), train_per_class, seed=0)
    held_out = folder(os.path.join(root, "held_out"), held_out_per_class, seed=1)
    first, second = (os.path.join(held_out, f"class_{label}", "0.png") for label in (0, 1))
    os.replace(first, first + ".swap")
    os.replace(second, first)
    os.replace(first + ".swap", second)
    return train, held_out


# The uneven cases every engine's job is compared with one process on (`uneven_folders` arguments and the
# batch size). Two processes: "uneven" reads 2 and 3 rows of the batches of 5 (the last training batch
# 1 and 2 of 3, the last held-out one 1 and 1 of 2); "last batch of one" has training and held-out
# batches of 11 (5 and 6 rows) and 1 (0 and 1 rows: one process has no row of it).
UNEVEN_CASES = {
    "uneven": dict(train_per_class=(7, 6), held_out_per_class=(4, 3), batch_size=5),
    "last batch of one": dict(train_per_class=6, held_out_per_class=(6, 6), batch_size=11),
}


def held_out_accuracy(log):
    """The held-out accuracy (a fraction) in the `Held-out accuracy: ...%` line a command printed."""
    return float(held_out_line(log).split(":", 1)[1].split("%")[0]) / 100


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
    # A weighting of accuracy that is wrong shows only where some held-out images are right and some wrong.
    assert 0 < held_out_accuracy(one_log) < 1, held_out_line(one_log)
    assert held_out_line(job_log) == held_out_line(one_log), (held_out_line(job_log), held_out_line(one_log))
    one, job = read_log(one_csv), read_log(job_csv)
    assert all(0 < value < 1 for value in one.get("val_accuracy", [])), one
    assert sorted(job) == sorted(one) and any(name.startswith("val_") for name in one), (sorted(job), sorted(one))
    differences = {name: float(np.max(np.abs(np.subtract(job[name], one[name])))) for name in one}
    print(f"printed: {held_out_line(one_log)!r} (one process) {held_out_line(job_log)!r} (the job); log.csv "
          "largest differences: " + ", ".join(f"{name} {value:.3g}" for name, value in differences.items()))
    for name in one:
        np.testing.assert_allclose(job[name], one[name], atol=atol, rtol=0, err_msg=f"log.csv column {name}")
