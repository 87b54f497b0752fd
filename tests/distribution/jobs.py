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
