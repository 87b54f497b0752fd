"""Two TensorFlow workers on loopback (MultiWorkerMirroredStrategy, TF_CONFIG) against one process.

Two real worker processes, each with one CPU device, form a
`MultiWorkerMirroredStrategy` job over gRPC on 127.0.0.1 and `fit` a small
ViTClassifier on a `tf.data` pipeline of global batches of 8, sharded by
data (each worker computes 4 rows of every batch); one process alone fits the
same model on the same batches. Keras scales each replica's loss by the
number of replicas and the optimizer sums the gradients across workers, so
the averaged gradients are one process's: the losses and the final weights
must agree within 1e-5, and both workers must hold the same weights. That
holds for Keras' SGD, and, with global-norm clipping that bites and gradient
accumulation (the fine-tuning recipes' settings), for keras_vit's SGD and
AdamW, which sum the workers' gradients before they clip or accumulate.
Keras' AdamW with the same clipping clips each worker's part of the gradient
and ended 0.086 away in a manual run (keras_vit's: 1.2e-6), and Keras' SGD
cannot accumulate under a strategy at all (Keras issue 20582);
test_tf_distribution.py checks both on one process's two replicas.

Keras 3.15 needs keras_vit's two workarounds for this, applied by the
TensorFlow engine (`keras_vit/distribution/engines/tf_workers.py`, with
`keras_vit/integrations/tf_trainer.py`): its
TensorFlow trainer builds the model from the first batch reduced across
replicas, which the multi-worker strategy cannot do eagerly (Keras issue
20585), and it averages a step's scalar results along an axis 0 they lack.
The check can fail: in a manual run with the optimizer's cross-replica
gradient sum turned off, the same job ended with losses 0.70 / 0.88 instead of
0.74 / 0.99 and weights up to 0.44 away from one process's.

Through the command line, `keras-vit finetune --distribute data` runs as
workers in the differential check's sample (`test_differential.py`), which
also kills one job after its first epoch and resumes it. Every worker is bounded by a timeout and
killed by the test, pass or fail.
"""

import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest

from tests.distribution.jobs import ROOT, TIMEOUT, environment, finish, free_port, launch

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tf_workers_worker.py")

pytestmark = pytest.mark.skipif(keras.backend.backend() != "tensorflow",
                                reason="TensorFlow workers; the tensorflow pass")


def run_workers(ports, out):
    count = max(1, len(ports))
    children = [subprocess.Popen([sys.executable, WORKER, str(index), ",".join(map(str, ports)), out],
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                 env=environment("tensorflow"), cwd=ROOT, start_new_session=True)
                for index in range(count)]
    logs = finish(children, TIMEOUT)
    return [child.returncode for child in children], logs


@pytest.mark.slow  # two jobs of 1 and 2 processes, 3 fits each: about 35 s on 2 cores
def test_two_tensorflow_workers_train_what_one_process_trains(tmp_path):
    codes, logs = run_workers([], str(tmp_path / "one.npz"))
    assert codes == [0], logs[0][-3000:]
    codes, logs = run_workers([free_port(), free_port()], str(tmp_path / "two.npz"))
    assert codes == [0, 0], "\n\n".join(log[-3000:] for log in logs)
    one, two, other = (np.load(tmp_path / name) for name in ("one.npz", "two.npz", "two-1.npz"))
    runs = {name.split("/")[0] for name in one.files}
    assert runs == {"sgd", "sgd_clipped_accumulated", "adamw_clipped"}, runs
    assert sorted(two.files) == sorted(one.files)
    for name in one.files:
        np.testing.assert_allclose(two[name], one[name], atol=1e-5, rtol=0, err_msg=name)
        np.testing.assert_array_equal(other[name], two[name], err_msg=f"worker 1: {name}")


def test_tf_config_names_this_worker_and_the_job():
    from keras_vit.distribution.engines import tf_workers
    from keras_vit.distribution.engines.tf_workers import tf_config_job

    def job(cluster, kind, index):
        return tf_config_job({"TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": kind, "index": index}})})

    workers = ["h0:1", "h1:1", "h2:1"]
    assert job({"worker": workers}, "worker", 2) == (2, 3)
    assert job({"chief": ["c:1"], "worker": workers}, "chief", 0) == (0, 4)  # the chief is process 0
    assert job({"chief": ["c:1"], "worker": workers}, "worker", 0) == (1, 4)
    assert job({"worker": workers, "evaluator": ["e:1"]}, "worker", 1) == (1, 3)  # an evaluator beside: not counted
    with pytest.raises(ValueError, match="^TF_CONFIG gives this process the task type 'evaluator'"):
        job({"worker": workers, "evaluator": ["e:1"]}, "evaluator", 0)  # it would train alone (issue 50)
    assert job({"worker": ["h0:1"]}, "worker", 0) is None  # one process: no job
    assert tf_config_job({}) is None
    # The workers first meet at process 0's address: the chief's when there is one, else worker 0's.
    address = tf_workers.first_worker_address
    assert address({"TF_CONFIG": json.dumps({"cluster": {"worker": workers},
                                             "task": {"type": "worker", "index": 1}})}) == "h0:1"
    assert address({"TF_CONFIG": json.dumps({"cluster": {"chief": ["c:1"], "worker": workers},
                                             "task": {"type": "worker", "index": 0}})}) == "c:1"
    assert address({}) is None
    with pytest.raises(ValueError, match="TF_CONFIG must be JSON like"):
        tf_config_job({"TF_CONFIG": "worker 0"})


def test_without_tf_config_data_parallel_stays_one_process(monkeypatch):
    import tensorflow as tf

    from keras_vit.distribution import distribution_for_backend, engines
    from keras_vit.distribution.engines import tf_workers

    monkeypatch.delenv("TF_CONFIG", raising=False)
    with pytest.raises(ValueError, match="described by TF_CONFIG, which names every worker"):
        tf_workers.strategy()
    strategy = distribution_for_backend("data")
    assert isinstance(strategy, tf.distribute.MirroredStrategy)
    with strategy.scope():
        engine = engines.current()
        assert (engine.process_index(), engine.process_count(), engine.saving_is_collective()) == (0, 1, False)


@pytest.mark.slow
@pytest.mark.parametrize("index, missing", [(0, 1), (1, 0)])
def test_a_worker_that_never_starts_stops_the_job_with_its_name_and_address(tmp_path, index, missing):
    # One worker of a job of two, started alone (the other host never comes up): it must stop after
    # KERAS_VIT_JOIN_TIMEOUT seconds, naming the missing worker and process 0's address.
    from tests.finetune.helpers import tiny_backbone_file, write_folder

    folder = write_folder(str(tmp_path / "photos"), classes=2, per_class=4, size=(10, 12))
    pretrained = tiny_backbone_file(str(tmp_path / "pretrained.keras"), image_size=8, dropout=0.0)
    port = free_port()
    (child,) = launch("tensorflow", ["-m", "keras_vit", "finetune", folder, "--preset", pretrained, "--epochs", "1",
                                     "--workers", "1", "--output", str(tmp_path / "out"), "--distribute", "data"],
                      2, port=port, only=index, KERAS_VIT_JOIN_TIMEOUT="5")
    (log,) = finish([child], TIMEOUT)
    assert child.returncode == 1, log[-4000:]
    assert f"Process {index} of 2 waited 5 s for process {missing} of the job at 127.0.0.1:{port}" in log, \
        log[-4000:]
    assert "KERAS_VIT_JOIN_TIMEOUT" in log and "Epoch 1/1" not in log, log[-4000:]
