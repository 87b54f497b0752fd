"""One training run (`keras_vit.workflows.training.run_training`) behind `train`, `pretrain` and `finetune`.

The three workflows differ in their model, data and optimizer; what happens after is the same run: the
same run directory (`log.csv` and an epoch backup, deleted when the run ends), the held-out numbers of the
job's engine, and a diverged loss refused with the last good epoch kept, from which a rerun resumes to the
uninterrupted run's weights.

One straight two-epoch `train_classifier` run (the `straight_run` module fixture) serves both the
three workflows' comparison and the resume's reference weights: on TensorFlow each new model's fit costs
its tracing, so every run saved is seconds of CI.
"""

import json
import os

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit.data import load_digits_split
from keras_vit.distribution import engines
from keras_vit.workflows.digits_demo import build_digits_classifier, build_digits_predictor
from keras_vit.workflows.pretraining import pretrain_predictor
from keras_vit.workflows.resuming import LOG_FILE, POINTER_FILE, SLOTS, open_run
from keras_vit.workflows import training
from keras_vit.workflows.training import train_classifier
from tests.finetune.helpers import tiny_backbone_file, write_folder

SMALL = dict(num_layers=1, hidden_dim=16, num_heads=2, mlp_dim=16)
SETTINGS = {"case": "resume"}  # checked when a run resumes: the straight run and the resumed one agree


def _digits():
    (x_train, y_train), (x_test, y_test) = load_digits_split(seed=0)
    return (x_train[:64], y_train[:64]), (x_test[:32], y_test[:32])


@pytest.fixture
def digits():
    return _digits()


def _record_evaluations(monkeypatch):
    """The models whose held-out numbers the job's engine computes from now on, in order."""
    engine = engines.current()
    evaluate = engine.evaluate
    seen = []

    def recording(model, dataset):
        seen.append(type(model).__name__)
        return evaluate(model, dataset)

    monkeypatch.setattr(engine, "evaluate", recording)
    return seen


@pytest.fixture
def evaluations(monkeypatch):
    return _record_evaluations(monkeypatch)


@pytest.fixture(scope="module")
def straight_run(tmp_path_factory):
    """An uninterrupted two-epoch `train_classifier` run: its result, model, run directory and evaluations."""
    train, test = _digits()
    run_dir = str(tmp_path_factory.mktemp("straight") / "train")
    model = build_digits_classifier(seed=0, **SMALL)
    with pytest.MonkeyPatch.context() as monkeypatch:
        seen = _record_evaluations(monkeypatch)
        result = train_classifier(model, train, test, epochs=2, batch_size=32, seed=0, verbose=0,
                                  run=open_run(run_dir=run_dir), settings=SETTINGS)
    return {"result": result, "model": model, "run_dir": run_dir, "evaluations": seen}


def _log_rows(run_dir):
    with open(os.path.join(run_dir, LOG_FILE)) as file:
        return [row.split(",") for row in file.read().splitlines()]


@pytest.mark.slow
def test_train_pretrain_and_finetune_make_the_same_run(tmp_path, digits, straight_run, evaluations):
    # Before: pretrain scored its held-out images with its own `predictor.evaluate` (each process's share
    # in a job of several), not the job's engine: `evaluations` lacked "MaskedPatchPredictor".
    train, test = digits
    runs = {name: str(tmp_path / name) for name in ("pretrain", "finetune")}
    runs["train"] = straight_run["run_dir"]
    trained = straight_run["result"]
    pretrained = pretrain_predictor(build_digits_predictor(seed=0, **SMALL), train[0], validation_images=test[0],
                                    epochs=2, batch_size=32, verbose=0, run=open_run(run_dir=runs["pretrain"]))
    folder = write_folder(str(tmp_path / "photos"), classes=2, per_class=6, size=(8, 8))
    finetuned = keras_vit.finetune(folder, preset=tiny_backbone_file(str(tmp_path / "backbone.keras")),
                                   recipe="adamw", epochs=2, batch_size=4, validation_split=0.5,
                                   output=str(tmp_path / "out"), run_dir=runs["finetune"], verbose=0, workers=1)

    evaluated = straight_run["evaluations"] + evaluations  # the train run's, then pretrain's and finetune's
    assert evaluated == ["ViTClassifier", "MaskedPatchPredictor", "ViTClassifier"]
    assert 0.0 <= trained["accuracy"] <= 1.0 and 0.0 <= finetuned["accuracy"] <= 1.0
    assert set(pretrained["validation"]) >= {"loss"}
    layouts = {name: sorted(os.listdir(run_dir)) for name, run_dir in runs.items()}
    assert layouts["train"] == layouts["pretrain"] == layouts["finetune"], layouts
    assert LOG_FILE in layouts["train"] and not {POINTER_FILE, *SLOTS} & set(layouts["train"])  # the backup goes at the end
    for name, run_dir in runs.items():
        rows = _log_rows(run_dir)
        assert rows[0][0] == "epoch" and [row[0] for row in rows[1:]] == ["0", "1"], (name, rows)
        assert "loss" in rows[0], (name, rows[0])
    for result in (trained, pretrained, finetuned):
        assert result["initial_epoch"] == 0 and len(result["history"].history["loss"]) == 2


def _diverged(model):
    """`model` with every trainable weight NaN: its first epoch's loss is NaN, as with a far too high rate."""
    for variable in model.trainable_variables:
        variable.assign(keras.ops.full(variable.shape, float("nan"), variable.dtype))
    return model


def test_a_loss_that_becomes_nan_is_refused(tmp_path, digits):
    """Pre-training's door: a masked patch predictor computes its own loss, and a NaN one is refused too.

    The classifier's door (`train_classifier`, `keras-vit train`) is
    `test_a_diverged_run_keeps_its_last_good_epoch_and_resumes_to_the_uninterrupted_weights`
    below, which diverges in
    epoch 2 of a `train_classifier` run: the same refusal (it is
    `run_training`'s), so a second classifier run diverging in its first
    epoch (this test's `train` case until issue 50) trained it again.
    """
    # Before: train and pretrain returned their numbers (NaN loss) and the commands then saved the diverged
    # model and deleted the run's backup; only finetune refused.
    train, _ = digits
    run_dir = str(tmp_path / "run")
    with pytest.raises(ValueError, match="the loss became NaN or infinite in epoch 1. Lower the learning rate"):
        pretrain_predictor(_diverged(build_digits_predictor(seed=0, **SMALL)), train[0], epochs=2,
                           batch_size=32, verbose=0, run=open_run(run_dir=run_dir))
    assert not os.path.exists(os.path.join(run_dir, POINTER_FILE))  # no diverged epoch saved


def test_a_diverged_run_keeps_its_last_good_epoch_and_resumes_to_the_uninterrupted_weights(
        tmp_path, digits, straight_run, monkeypatch):
    """A classifier's loss turning NaN in epoch 2 of `train_classifier`: refused, epoch 1's checkpoint kept,
    and a rerun from it continues to the uninterrupted run's weights.

    Also the classifier's door of `test_a_loss_that_becomes_nan_is_refused`
    (its `train` case until issue 50): the same refusal, and the diverged
    epoch not saved (the pointer stays at the last good one).

    And the resume of a `train_classifier` run (`keras-vit train`; until
    issue 50 `tests/test_cli.py::test_train_resumes_from_its_checkpoint`,
    which trained its own straight run and stopped a second one with a
    `KeyboardInterrupt` at epoch 2's start): the refused run leaves the
    same state, epoch 1's backup with its optimizer and shuffling, and the
    straight run is `straight_run`'s. A kill with no Python clean-up at all
    is `tests/finetune/test_resume.py`'s subject (the same `fit_resumable`).
    """
    train, test = digits

    class Diverge(keras.callbacks.Callback):
        """Turns the weights to NaN as the second epoch begins, as a learning rate far too high would."""

        def on_epoch_begin(self, epoch, logs=None):
            if epoch == 1:
                _diverged(self.model)

    fit_resumable = training.fit_resumable

    def with_diverge(*args, **kwargs):  # `train_classifier` takes no callbacks: the run's fit gets this one
        return fit_resumable(*args, **{**kwargs, "callbacks": [Diverge()]})

    run_dir = str(tmp_path / "run")
    refused = r"the loss became NaN or infinite in epoch 2\. Lower the learning rate.* kept in "
    with monkeypatch.context() as diverging, pytest.raises(ValueError, match=refused):
        diverging.setattr(training, "fit_resumable", with_diverge)
        train_classifier(build_digits_classifier(seed=0, **SMALL), train, test, epochs=2, batch_size=32, seed=0,
                         verbose=0, run=open_run(run_dir=run_dir), settings=SETTINGS)
    with open(os.path.join(run_dir, POINTER_FILE)) as file:
        assert json.load(file)["epoch"] == 1  # the last good epoch, to resume from with a lower learning rate

    resumed = build_digits_classifier(seed=0, **SMALL)  # a new process would build the model again
    result = train_classifier(resumed, train, test, epochs=2, batch_size=32, seed=0, verbose=0,
                              run=open_run(run_dir=run_dir), settings=SETTINGS)
    assert result["initial_epoch"] == 1
    for a, b in zip(straight_run["model"].get_weights(), resumed.get_weights()):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)
