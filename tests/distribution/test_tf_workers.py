"""TensorFlow workers (MultiWorkerMirroredStrategy, TF_CONFIG): how a job is read, and a worker left alone.

That two workers train what one process trains is the differential
check's (`test_differential.py`: the TensorFlow pass runs two drawn
configurations through `keras-vit finetune --distribute data`, both
recipes, a job of 3, one killed and resumed; weights within 1e-5 of one
process). It replaced a two-worker test of three optimizers
here (issue 50): keras_vit's optimizers summing the replicas' gradients
before they clip or accumulate is checked with clipping that bites on two
replicas in `test_tf_distribution.py`, and with that sum turned off the
differential sample's TensorFlow configurations fail. Keras 3.15 needs
keras_vit's two workarounds under this strategy, applied by the TensorFlow
engine (`keras_vit/distribution/engines/tf_workers.py`, with
`keras_vit/integrations/tf_trainer.py`): its trainer builds the model from
the first batch reduced across replicas, which the multi-worker strategy
cannot do eagerly (Keras issue 20585), and it averages a step's scalar
results along an axis 0 they lack. Every worker is bounded by a timeout
and killed by the test, pass or fail.
"""

import json

import keras
import pytest

from tests.distribution.jobs import TIMEOUT, finish, free_port, launch

pytestmark = pytest.mark.skipif(keras.backend.backend() != "tensorflow",
                                reason="TensorFlow workers; the tensorflow pass")


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
def test_a_worker_that_never_starts_stops_the_job_with_its_name_and_address(tmp_path):
    # One worker of a job of two, started alone (the other host never comes up): it must stop after
    # KERAS_VIT_JOIN_TIMEOUT seconds, naming the missing worker and process 0's address. Worker 1, whose
    # process 0 never comes: the engine's wait is `joining.rendezvous` for either index, and its other side
    # (process 0 waiting for process 1, the side the JAX pass launches) is checked in-process on both
    # indices by test_engines.py's `test_the_processes_meet_or_the_missing_one_is_named`; this checks the
    # TensorFlow command line's exit status and line around it (a second launch cost 12 s).
    index, missing = 1, 0
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
