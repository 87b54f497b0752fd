"""The engines' interface on its own: sharding leaves the caller's data whole, the join timeout's setting."""

import keras
import numpy as np
import pytest

from keras_vit.data import ArrayBatches
from keras_vit.distribution import engines
from keras_vit.distribution.engines import joining
from keras_vit.distribution.engines.base import Engine
from keras_vit.distribution.engines.jax_processes import PaddedShare, real_means


class SecondOfThree(Engine):
    """A stand-in job: this is process 1 of 3 (no collective is called)."""

    def process_index(self):
        return 1

    def process_count(self):
        return 3


@pytest.mark.one_backend("numpy batches and the engine's bookkeeping; no model")
def test_shard_returns_this_process_rows_and_leaves_the_callers_data_whole():
    x, y = np.arange(14)[:, None], np.arange(14)
    data = ArrayBatches(x, y, batch_size=6, shuffle=False)
    share = SecondOfThree().shard(data)
    assert data.shard is None and share is not data
    assert [len(data[i][0]) for i in range(len(data))] == [6, 6, 2]
    # Rows [n * 1 // 3, n * 2 // 3) of every global batch of n rows: 2, 2 and (of the last 2) 1.
    assert [share[i][1].tolist() for i in range(len(share))] == [[2, 3], [8, 9], [12]]


@pytest.mark.one_backend("numpy batches and the engine's bookkeeping; no model")
def test_shard_refuses_data_that_cannot_be_shared_out():
    with pytest.raises(ValueError, match="3 processes need data that each process reads a share of"):
        SecondOfThree().shard([np.zeros((4, 8, 8, 3))])


@pytest.mark.one_backend("reads an environment variable")
def test_the_join_timeout_is_the_users_setting():
    assert joining.join_timeout({}) == joining.DEFAULT_JOIN_TIMEOUT == 60
    assert joining.join_timeout({"KERAS_VIT_JOIN_TIMEOUT": "2.5"}) == 2.5
    for bad in ("0", "-1", "soon", "inf", "nan"):
        with pytest.raises(ValueError, match="KERAS_VIT_JOIN_TIMEOUT must be a positive number of seconds"):
            joining.join_timeout({"KERAS_VIT_JOIN_TIMEOUT": bad})


def test_one_process_is_process_0_of_1_and_saves_alone(tmp_path):
    engine = engines.current()
    assert (engine.process_index(), engine.process_count(), engine.is_chief()) == (0, 1, True)
    written = []
    assert engine.save_for_job(written.append, str(tmp_path / "model.keras")) is True
    assert written == [str(tmp_path / "model.keras")]
    assert engine.broadcast_json({"epochs": 3}) == {"epochs": 3}


@pytest.mark.one_backend("sockets on 127.0.0.1; no model")
def test_the_processes_meet_or_the_missing_one_is_named():
    import threading

    from tests.distribution.jobs import free_port

    address = f"127.0.0.1:{free_port()}"
    errors = []

    def process(index):
        try:
            joining.rendezvous(index, 3, address, 30)
        except TimeoutError as error:  # pragma: no cover - a failure is reported below
            errors.append(error)

    threads = [threading.Thread(target=process, args=(index,)) for index in (2, 0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == [] and not any(thread.is_alive() for thread in threads)

    address = f"127.0.0.1:{free_port()}"
    with pytest.raises(TimeoutError, match=f"Process 0 of 2 waited 0.5 s for process 1 of the job at {address}"):
        joining.rendezvous(0, 2, address, 0.5)
    with pytest.raises(TimeoutError, match=f"Process 1 of 2 waited 0.5 s for process 0 of the job at {address}"):
        joining.rendezvous(1, 2, address, 0.5)


@pytest.mark.one_backend("sockets on 127.0.0.1; no model")
def test_a_process_that_dies_stops_the_others_at_once_with_one_line_naming_it():
    # Issue 50: `kill -9` of process 1 of a JAX job left process 0 with gloo's "Connection reset by peer", a
    # 100 s wait for JAX's heartbeat and a C++ stack trace. Three processes (threads here) meet and keep their
    # connections; process 1 dies without a word (its socket closed, as the kernel closes a killed process's).
    import threading
    import time

    from tests.distribution.jobs import free_port

    from keras_vit.distribution.engines import peer_watch

    address = f"127.0.0.1:{free_port()}"
    peers = {}

    def process(index, count=3):
        peers[index] = joining.rendezvous(index, count, address, 30, keep=True)

    threads = [threading.Thread(target=process, args=(index,)) for index in (2, 0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sorted(peers) == [0, 1, 2] and sorted(peers[0]) == [1, 2] and list(peers[2]) == [0]
    found = {}

    def watcher(index):
        found[index] = peer_watch.watch(dict(peers[index]))
        if index == 0 and found[index] is not None:
            peer_watch.tell_the_others(peers[0], found[index])  # process 0 names the lost one to the rest

    watchers = [threading.Thread(target=watcher, args=(index,)) for index in (0, 2)]
    for thread in watchers:
        thread.start()
    began = time.monotonic()
    peers[1][0].close()  # process 1 dies
    for thread in watchers:
        thread.join(10)
    assert found == {0: 1, 2: 1} and time.monotonic() - began < 5, found  # at once, not after a heartbeat
    line = peer_watch.lost_message(1, 3, 2)
    assert line.startswith("keras-vit: error: process 1 of 3 stopped without finishing") and "\n" not in line
    assert "Run the same command again on every process" in line
    opened = [connection for index in peers for connection in peers[index].values()]

    # A process that ends through Python says goodbye first: nobody stops.
    address = f"127.0.0.1:{free_port()}"
    peers = {}
    threads = [threading.Thread(target=process, args=(index, 2)) for index in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    peer_watch.say_goodbye(peers[1])
    peers[1][0].close()
    assert peer_watch.watch(dict(peers[0])) is None
    for connection in [*opened, *peers[0].values()]:
        connection.close()


def test_every_training_command_builds_the_optimizer_that_sums_replicas():
    # `train` and `pretrain` (training.build_optimizer) and `finetune` (its recipes) get keras_vit's optimizers,
    # which on TensorFlow workers sum the replicas' gradients before clipping; Keras' AdamW clips each part.
    from keras_vit.workflows.finetuning import build_recipe_optimizer
    from keras_vit.workflows.optimizers import ReplicaSummedGradients
    from keras_vit.workflows.training import build_optimizer

    built = [build_optimizer(1e-3, 0.05, 20), build_recipe_optimizer("adamw", 20)[0],
             build_recipe_optimizer("paper", 20, batch_size=256)[0]]
    assert all(isinstance(optimizer, ReplicaSummedGradients) for optimizer in built), built
    assert [type(optimizer).__name__ for optimizer in built] == ["AdamW", "AdamW", "SGD"]


@pytest.mark.one_backend("numpy batches and the engine's bookkeeping; no model")
def test_jax_padding_reads_every_row_once_and_weighs_the_padding_zero():
    # 13 rows in batches of 5 over a batch axis of 4 devices in 2 processes: batches of 5, 5 and 3 are padded
    # to 8, 8 and 4, each process feeding half of every padded batch.
    x, y = np.arange(13)[:, None] * 10, np.arange(13)
    data = ArrayBatches(x, y, batch_size=5, shuffle=False)
    shares = [PaddedShare(data, index, 2, 4) for index in range(2)]
    assert data.shard is None and data.batch_multiple == 1  # the caller's data is left whole
    real = []
    for batch in range(3):
        parts = [share[batch] for share in shares]
        assert len({len(part[0]) for part in parts}) == 1  # every process feeds as many rows
        assert sum(len(part[0]) for part in parts) == [8, 8, 4][batch]
        for images, labels, weights in parts:
            assert weights.tolist() == [1.0] * int(weights.sum()) + [0.0] * int(len(weights) - weights.sum())
            kept = weights == 1
            np.testing.assert_array_equal(images[kept, 0], labels[kept] * 10)  # images stay with their labels
            assert (labels[~kept] == -1).all() and (images[~kept] == 0).all()  # no prediction matches -1
            real.extend(labels[kept].tolist())
    assert real == list(range(13))  # every row once, in order
    assert shares[0].epoch_rows() == (20, 13)
    # Keras' means over 20 rows whose padded 7 count 0 (a loss sum of 6.5, 10 rows right): over the 13 real rows.
    means = real_means({"loss": 6.5 / 20, "accuracy": 10 / 20, "other": 0.25}, shares[0])
    assert means == pytest.approx({"loss": 0.5, "accuracy": 10 / 13})


@pytest.mark.one_backend("numpy batches and the engine's bookkeeping; no model")
def test_jax_padding_of_images_without_labels_reads_every_row_once_and_weighs_the_padding_zero():
    # Pre-training images (no labels): 13 rows in batches of 5 over a batch axis of 4 devices in 2 processes
    # are padded like labelled ones, as `(images, None, weights)` batches (Keras' unpacking of x, y, sample weight).
    x = np.arange(13)[:, None] * 10 + 1
    data = ArrayBatches(x, None, batch_size=5, shuffle=False)
    shares = [PaddedShare(data, index, 2, 4) for index in range(2)]
    real = []
    for batch in range(3):
        parts = [share[batch] for share in shares]
        assert len({len(part[0]) for part in parts}) == 1  # every process feeds as many rows
        assert sum(len(part[0]) for part in parts) == [8, 8, 4][batch]
        for part in parts:
            images, labels, weights = keras.utils.unpack_x_y_sample_weight(part)
            assert labels is None
            assert weights.tolist() == [1.0] * int(weights.sum()) + [0.0] * int(len(weights) - weights.sum())
            kept = weights == 1
            assert (images[~kept] == 0).all()
            real.extend(((images[kept, 0] - 1) // 10).tolist())
    assert real == list(range(13))  # every row once, in order
    assert shares[0].epoch_rows() == (20, 13)
