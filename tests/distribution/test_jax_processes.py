"""Two real JAX processes on loopback train what one process trains model parallel.

The job has 4 CPU devices: two processes with 2 each joined by
`keras.distribution.initialize` over 127.0.0.1 (a free port, gloo
collectives), training model parallel (data parallel jobs are the
differential check's, `test_differential.py`). Every process reads only its
share of every batch of an image folder (`ImageFolderDataset(shard=...)`).
Losses and final weights of the job must equal, within 1e-5, those of the
same training in the test's own process on one device without a
distribution (that one process with 4 devices model parallel trains what
one device trains is test_jax_distribution.py's). (A killed job resumes in
the differential check's sample, `differential.CI_RESUMED`.) Every child is
bounded by a timeout and killed by the test, pass or fail.
"""

import os
import subprocess
import sys

import keras
import numpy as np
import pytest

from keras_vit.data import ImageFolderDataset
from tests.distribution import jax_processes_worker
from tests.distribution.jobs import ROOT, environment, finish, free_port, launch
from tests.finetune.helpers import write_folder

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "jax_processes_worker.py")
# Data parallel through the command line is the differential check's (test_differential.py); model parallel is here.
MODES = ("model",)


def run_job(count, folder, out, meanwhile=lambda: None):
    """Start `count` worker processes that train once per mode, call `meanwhile()`, wait for all (bounded), kill
    any left; return process 0's results, `{mode: {name: array}}`, and what `meanwhile` returned."""
    # The worker joins the job from its arguments (and sets its own devices), not from a launcher's variables.
    port = free_port()
    children = [subprocess.Popen([sys.executable, WORKER, ",".join(MODES), str(index), str(count), str(port), folder,
                                  out], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                 env=environment("jax"), cwd=ROOT, start_new_session=True)
                for index in range(count)]
    try:
        done_meanwhile = meanwhile()
    finally:
        logs = finish(children)
    for child, log in zip(children, logs):
        assert child.returncode == 0, log[-4000:]
    results = {}
    for mode in MODES:
        with np.load(f"{out}-{mode}.npz") as arrays:
            results[mode] = {key: arrays[key] for key in arrays.files}
    return results, done_meanwhile


def test_shards_read_every_image_of_a_batch_once(tmp_path):
    folder = write_folder(str(tmp_path / "photos"), classes=2, per_class=7, size=(8, 8))
    paths = sorted(os.path.join(folder, c, n) for c in os.listdir(folder) for n in os.listdir(os.path.join(folder, c)))
    labels = [0 if "class_0" in path else 1 for path in paths]
    whole = ImageFolderDataset(paths, labels, 8, batch_size=6, training=True, seed=3, workers=1)
    shards = [ImageFolderDataset(paths, labels, 8, batch_size=6, training=True, seed=3, workers=1, shard=(i, 2))
              for i in range(2)]
    for epoch in (0, 1):
        for dataset in (whole, *shards):
            dataset.set_epoch(epoch)
        seen = []
        for index in range(len(whole)):
            images, batch_labels = whole[index]
            parts = [shard[index] for shard in shards]
            # Together the shards are the global batch, row for row, pixel for pixel (augmentation included).
            np.testing.assert_array_equal(np.concatenate([part[0] for part in parts]), images)
            np.testing.assert_array_equal(np.concatenate([part[1] for part in parts]), batch_labels)
            order = whole.order(epoch)[index * 6:(index + 1) * 6]
            rows = [range(*shard.rows(index)) for shard in shards]
            assert sorted(r for part in rows for r in part) == list(range(len(order)))  # no row twice, none skipped
            seen.extend(order)
        assert sorted(seen) == list(range(len(paths)))  # every image once per epoch
    # A last batch of 2 images over 4 processes: two of them have no row of it, and no row is read twice.
    last = [ImageFolderDataset(paths, labels, 8, batch_size=6, shard=(index, 4)).rows(2) for index in range(4)]
    assert sorted(r for first, stop in last for r in range(first, stop)) == [0, 1]
    assert sum(first == stop for first, stop in last) == 2


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    """One device in this process (the same training once per mode) and the job of 2 processes."""
    directory = tmp_path_factory.mktemp("jax_jobs")
    folder = write_folder(str(directory / "photos"), classes=2, per_class=8, size=(10, 12))
    # The reference in this process (one device, no distribution), while the job runs: a JAX start less than
    # the job of 1 process with 4 devices it replaced.
    two, (losses, weights) = run_job(2, folder, str(directory / "two"), lambda: jax_processes_worker.train(folder))
    return {mode: {"losses": losses, **weights} for mode in MODES}, two


@pytest.mark.slow  # a job of 2 processes, model parallel, beside one device here
@pytest.mark.skipif(keras.backend.backend() != "jax", reason="keras.distribution across processes runs on JAX")
@pytest.mark.parametrize("mode", MODES)
def test_two_processes_train_what_one_process_trains(mode, jobs):
    one, two = (job[mode] for job in jobs)
    assert set(one) == set(two) and len(one["losses"]) == 2
    print(f"{mode}: losses {np.max(np.abs(two['losses'] - one['losses'])):.2g} apart, weights "
          f"{max(float(np.max(np.abs(two[k] - one[k]))) for k in one if k != 'losses'):.2g}")  # `pytest -rP`
    np.testing.assert_allclose(two["losses"], one["losses"], atol=1e-5, rtol=0)
    for name in one:
        np.testing.assert_allclose(two[name], one[name], atol=1e-5, rtol=0, err_msg=name)
    assert not np.allclose(one["losses"][0], one["losses"][1])  # it trained


@pytest.mark.slow
@pytest.mark.skipif(keras.backend.backend() != "jax", reason="keras.distribution across processes runs on JAX")
def test_a_process_that_never_joins_stops_the_job_with_its_name_and_address(tmp_path):
    folder = write_folder(str(tmp_path / "photos"), classes=2, per_class=4, size=(10, 12))
    # Process 0 of a job of two, started alone (the other host never comes up).
    port = free_port()
    (child,) = launch("jax", ["-m", "keras_vit", "finetune", folder, "--variant", "ViT-Ti/16", "--image-size", "8",
                              "--epochs", "1", "--distribute", "data"], 2, port=port, only=0,
                      KERAS_VIT_JOIN_TIMEOUT="3")
    (log,) = finish([child])
    assert child.returncode == 1, log[-4000:]
    assert f"Process 0 of 2 waited 3 s for process 1 of the job at 127.0.0.1:{port}" in log, log[-4000:]
    assert "KERAS_VIT_JOIN_TIMEOUT" in log and "Epoch 1/1" not in log, log[-4000:]


@pytest.mark.slow  # two short pre-training runs: about 10 s on 2 cores
@pytest.mark.skipif(keras.backend.backend() != "jax", reason="PaddedRows wraps JAX's train_step(state, data)")
def test_padded_pretraining_images_train_and_log_what_one_process_does():
    # 13 images in batches of 5 (5, 5, 3) and 7 held-out images in batches of 3 (3, 3, 1) over a batch axis of
    # 4: padded to 8, 8, 4 and 4, 4, 4 rows of sample weight 0, with the same corruption of the real rows.
    import keras_vit
    from keras_vit.data import ArrayBatches
    from keras_vit.distribution.engines.jax_processes import JaxProcesses, PaddedRows, PaddedShare

    rng = np.random.default_rng(0)
    images, held_out = (rng.uniform(0, 255, (rows, 8, 8, 3)).astype("float32") for rows in (13, 7))
    runs = {}
    for padded in (False, True):
        train = ArrayBatches(images, None, batch_size=5, shuffle=False)
        validation = ArrayBatches(held_out, None, batch_size=3, shuffle=False)
        engine, callbacks = JaxProcesses(), []
        keras.utils.set_random_seed(0)
        backbone = keras_vit.ViTBackbone(image_size=8, patch_size=2, hidden_dim=16, num_layers=1, num_heads=2,
                                         mlp_dim=32)
        predictor = keras_vit.MaskedPatchPredictor(backbone, seed=3)
        predictor.compile(optimizer=keras.optimizers.SGD(0.1))  # plain steps: Adam magnifies float-order noise
        if padded:
            train, validation = PaddedShare(train, 0, 1, 4), PaddedShare(validation, 0, 1, 4)
            engine.last_held_out = validation
            callbacks = [PaddedRows(predictor, train, engine)]
            assert len(train[2][0]) == 4 and train[2][2].tolist() == [1.0, 1.0, 1.0, 0.0]
        history = predictor.fit(train, validation_data=validation, epochs=2, verbose=0, shuffle=False,
                                callbacks=callbacks).history
        scores = engine.evaluate(predictor, validation) if padded else predictor.evaluate(validation, verbose=0,
                                                                                          return_dict=True)
        runs[padded] = history, scores, predictor.get_weights()
    (one, one_scores, one_weights), (job, job_scores, job_weights) = runs[False], runs[True]
    for name in ("loss", "val_loss"):  # the step losses weighed by real rows, as one process weighs them
        np.testing.assert_allclose(job[name], one[name], rtol=0, atol=1e-6)
    assert job_scores["loss"] == pytest.approx(one_scores["loss"], abs=1e-6)
    for expected, actual in zip(one_weights, job_weights):
        np.testing.assert_allclose(actual, expected, rtol=0, atol=1e-6)
