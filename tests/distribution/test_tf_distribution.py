"""model.fit under tf.distribute.MirroredStrategy over two logical CPUs, TensorFlow backend.

The training runs in a child process (`tf_worker.py`) because TensorFlow's
logical devices must be configured before TensorFlow initialises; this
process only checks what the child reports. `TPUStrategy` takes the same
code path in Keras (a `tf.distribute.Strategy` scope around build, compile
and fit) and is documented in the README, not tested here.
"""

import json
import os
import subprocess
import sys

import keras
import pytest

pytestmark = [
    pytest.mark.skipif(
        keras.backend.backend() != "tensorflow",
        reason="tf.distribute strategies run on the TensorFlow backend only",
    ),
    pytest.mark.slow,  # one child process trains twice: about 20 s
]

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tf_worker.py")
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def report():
    env = dict(os.environ, KERAS_BACKEND="tensorflow", PYTHONPATH=REPO_ROOT, TF_CPP_MIN_LOG_LEVEL="3")
    completed = subprocess.run(
        [sys.executable, WORKER], env=env, capture_output=True, text=True, timeout=900, cwd=REPO_ROOT
    )
    lines = [line for line in completed.stdout.splitlines() if line.startswith("RESULT ")]
    assert completed.returncode == 0 and lines, (
        f"worker failed (exit {completed.returncode}):\n{completed.stdout[-3000:]}\n{completed.stderr[-6000:]}"
    )
    return json.loads(lines[-1][len("RESULT "):])


def test_two_replicas_on_two_logical_cpus(report):
    assert report["logical_cpus"] == 2
    assert report["num_replicas"] == 2
    assert report["mirrored"]["variable_types"] == ["MirroredVariable"]
    devices = report["mirrored"]["replica_devices"]
    assert len(devices) == 2 and devices[0].endswith("CPU:0") and devices[1].endswith("CPU:1"), devices
    assert len(report["one_device"]["replica_devices"]) == 1


def test_training_moves_the_loss(report):
    losses = report["one_device"]["losses"]
    assert losses[-1] < losses[0] - 0.05, losses


def test_mirrored_losses_match_one_device(report):
    # Equal losses over several epochs also mean the gradients were combined
    # with the right scale: summed over replicas of per-replica mean losses
    # scaled by 1 / num_replicas.
    losses, reference = report["mirrored"]["losses"], report["one_device"]["losses"]
    assert len(losses) == len(reference) == 3
    for loss, expected in zip(losses, reference):
        assert abs(loss - expected) <= 1e-5 * abs(expected), (losses, reference)
