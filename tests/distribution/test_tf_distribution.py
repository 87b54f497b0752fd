"""model.fit under tf.distribute.MirroredStrategy over two logical CPUs, TensorFlow backend.

The training runs in one child process (`tf_worker.py`) because TensorFlow's
logical devices must be configured before TensorFlow initialises; this process
only checks what the child reports. With
gradient clipping or accumulation, keras_vit's SGD and AdamW must train
what one device trains, and Keras' own must not (they clip each replica's
part of the gradient, and cannot accumulate under a strategy). `TPUStrategy` takes the same
code path in Keras (a `tf.distribute.Strategy` scope around build, compile
and fit) and is documented in the README, not tested here.
"""

import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest

pytestmark = [
    pytest.mark.skipif(
        keras.backend.backend() != "tensorflow",
        reason="tf.distribute strategies run on the TensorFlow backend only",
    ),
    pytest.mark.slow,  # a child process, 14 trainings
]

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(os.path.dirname(HERE))


def _run_child(name):
    env = dict(os.environ, KERAS_BACKEND="tensorflow", PYTHONPATH=REPO_ROOT, TF_CPP_MIN_LOG_LEVEL="3")
    completed = subprocess.run(
        [sys.executable, os.path.join(HERE, name)], env=env, capture_output=True, text=True, timeout=900,
        cwd=REPO_ROOT
    )
    lines = [line for line in completed.stdout.splitlines() if line.startswith("RESULT ")]
    assert completed.returncode == 0 and lines, (
        f"{name} failed (exit {completed.returncode}):\n{completed.stdout[-3000:]}\n{completed.stderr[-6000:]}"
    )
    return json.loads(lines[-1][len("RESULT "):])


@pytest.fixture(scope="module")
def report():
    # One child for all the runs (the plain ones and the clipped ones, under "clipping"): each TensorFlow
    # process start costs several CPU seconds of imports.
    return _run_child("tf_worker.py")


@pytest.fixture(scope="module")
def clipping(report):
    return report["clipping"]


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


def test_mirrored_pretraining_reports_and_trains_what_one_device_does(report):
    # MaskedPatchPredictor computes its own loss. Keras' TensorFlow trainer multiplies the reported loss by
    # the number of replicas (undoing the 1 / replicas its own losses carry) and sums the replicas'
    # gradients, so a loss without that factor was reported, and stepped, twice over on two replicas.
    one, mirrored = report["pretraining_one_device"], report["pretraining_mirrored"]
    np.testing.assert_allclose(mirrored["losses"], one["losses"], rtol=1e-5)
    np.testing.assert_allclose(mirrored["held_out_loss"], one["held_out_loss"], rtol=1e-5)
    for got, expected in zip(mirrored["weights"], one["weights"]):
        np.testing.assert_allclose(got, expected, atol=1e-5)


CLIPPED_RUNS = ["sgd_global_clipnorm_accumulated", "adamw_global_clipnorm", "sgd_clipnorm", "sgd_clipvalue"]


def test_clipping_bites(clipping):
    # Thresholds well below the first gradient, so every run clips and the
    # comparisons below are about clipping.
    gradient, thresholds = clipping["gradient"], clipping["thresholds"]
    assert clipping["num_replicas"] == 2
    assert gradient["global_norm"] > 5 * thresholds["global_clipnorm"], clipping
    assert gradient["largest_norm"] > 5 * thresholds["clipnorm"], clipping
    assert gradient["largest_value"] > 5 * thresholds["clipvalue"], clipping


@pytest.mark.parametrize("name", CLIPPED_RUNS)
def test_keras_vit_optimizers_clip_and_accumulate_as_one_device(clipping, name):
    run = clipping[name]
    assert len(run["mirrored"]) == len(run["one_device"]) >= 1
    for loss, expected in zip(run["mirrored"], run["one_device"]):
        assert abs(loss - expected) <= 1e-5 * abs(expected), run
    assert run["distance"] <= 1e-5, run


@pytest.mark.parametrize("name", ["sgd_global_clipnorm_accumulated", "adamw_global_clipnorm"])
def test_keras_optimizers_do_not(clipping, name):
    # The same settings with Keras' optimizer: this is what the test above
    # would see without keras_vit's cross-replica sum, so it can fail.
    keras_run = clipping[name]["keras"]
    if name.endswith("_accumulated"):
        assert "merge_call" in keras_run.get("error", ""), keras_run  # Keras issue 20582
    else:
        assert keras_run["distance"] > 1e-3, keras_run
