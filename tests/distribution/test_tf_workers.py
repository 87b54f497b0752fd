"""Two TensorFlow workers on loopback (MultiWorkerMirroredStrategy, TF_CONFIG) against one process.

Keras 3.15 cannot `fit` under MultiWorkerMirroredStrategy on this CPU build:
before the first step its TensorFlow trainer builds the model from the first
distributed batch with `strategy.reduce("MEAN", batch, axis=None)`
(`keras/src/backend/tensorflow/trainer.py`, `_maybe_symbolic_build`), and the
multi-worker strategy's eager collective cannot convert the per-replica batch:
"ValueError: Attempt to convert a value (PerReplica:{...}) with an unsupported
type (PerReplica) to a Tensor", with numpy input and with a `tf.data` pipeline
sharded by data alike. The test runs the real two-worker job and is expected to
fail with exactly that error (strict: the day Keras fixes it, the test reports
the pass, and the equality below becomes the check).
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


@pytest.mark.xfail(strict=True, raises=pytest.fail.Exception, reason="Keras 3.15's TF trainer reduces a PerReplica batch that "
                                       "MultiWorkerMirroredStrategy cannot convert (see the module docstring)")
def test_two_tensorflow_workers_train_what_one_process_trains(tmp_path):
    codes, logs = run_workers([], str(tmp_path / "one.npz"))
    assert codes == [0], logs[0][-3000:]
    codes, logs = run_workers([free_port(), free_port()], str(tmp_path / "two.npz"))
    if codes != [0, 0]:
        assert "unsupported type (<class 'tensorflow.python.distribute.values.PerReplica'>)" in logs[0], logs[0][-3000:]
        pytest.fail("MultiWorkerMirroredStrategy: " + logs[0].strip().splitlines()[-1][-300:])
    one, two = np.load(tmp_path / "one.npz"), np.load(tmp_path / "two.npz")
    for name in one.files:
        np.testing.assert_allclose(two[name], one[name], atol=1e-5, rtol=0, err_msg=name)
