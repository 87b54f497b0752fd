"""Two TensorFlow workers on loopback (MultiWorkerMirroredStrategy, TF_CONFIG) against one process.

Two real worker processes, each with one CPU device, form a
`MultiWorkerMirroredStrategy` job over gRPC on 127.0.0.1 and `fit` a small
ViTClassifier on a `tf.data` pipeline of global batches of 8, sharded by
data (each worker computes 4 rows of every batch); one process alone fits the
same model on the same batches. Keras scales each replica's loss by the
number of replicas and the optimizer sums the gradients across workers, so
the averaged gradients are one process's: the losses and the final weights
must agree within 1e-5, and both workers must hold the same weights.

Keras 3.15 needs keras_vit's two workarounds for this (`ViTModel` in
`keras_vit/models/base.py`, `keras_vit/integrations/tf_trainer.py`): its
TensorFlow trainer builds the model from the first batch reduced across
replicas, which the multi-worker strategy cannot do eagerly (Keras issue
20585), and it averages a step's scalar results along an axis 0 they lack.
The check can fail: in a manual run with the optimizer's cross-replica
gradient sum turned off, the same job ended with losses 0.70 / 0.88 instead of
0.74 / 0.99 and weights up to 0.44 away from one process's.
"""

import os
import subprocess
import sys

import keras
import numpy as np
import pytest

from tests.distribution.jobs import ROOT, finish, free_port

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tf_workers_worker.py")
TIMEOUT = 240

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="TensorFlow workers; the tensorflow pass"),
]


def run_workers(ports, out):
    env = {**os.environ, "PYTHONPATH": ROOT, "TF_CPP_MIN_LOG_LEVEL": "3"}
    count = max(1, len(ports))
    children = [subprocess.Popen([sys.executable, WORKER, str(index), ",".join(map(str, ports)), out],
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=ROOT)
                for index in range(count)]
    logs = finish(children, TIMEOUT)
    return [child.returncode for child in children], logs


def test_two_tensorflow_workers_train_what_one_process_trains(tmp_path):
    codes, logs = run_workers([], str(tmp_path / "one.npz"))
    assert codes == [0], logs[0][-3000:]
    codes, logs = run_workers([free_port(), free_port()], str(tmp_path / "two.npz"))
    assert codes == [0, 0], "\n\n".join(log[-3000:] for log in logs)
    one, two, other = (np.load(tmp_path / name) for name in ("one.npz", "two.npz", "two-1.npz"))
    assert sorted(two.files) == sorted(one.files)
    for name in one.files:
        np.testing.assert_allclose(two[name], one[name], atol=1e-5, rtol=0, err_msg=name)
        np.testing.assert_array_equal(other[name], two[name], err_msg=f"worker 1: {name}")
