"""One training run for every command, and the recipe that makes a small ViT learn small data.

`run_training` is the run `keras-vit train`, `pretrain` and `finetune` share
(`train_classifier`, `keras_vit.workflows.pretraining.pretrain_predictor`,
`keras_vit.finetune`): compile with the one optimizer builder's optimizer,
fit with a checkpoint every epoch (`keras_vit.workflows.resuming`), and
score the held-out data as the job's engine does. Each caller checks its
arguments, seeds, makes its batches and counts its optimizer updates first.
"""

import time

import numpy as np

from keras_vit.data.image_folder import ArrayBatches, checked_class_indices
from keras_vit.distribution import engines
from keras_vit.presets.keras_vit_format import optimizer_set_aside
from keras_vit.writer import files
from keras_vit.writer.files import quote
from keras_vit.utils.seeds import set_random_seed
from keras_vit.utils.values import check_count, check_number, check_positive_number
from keras_vit.workflows import optimizers
from keras_vit.workflows.resuming import fit_resumable


def check_training_arguments(epochs=None, batch_size=None, learning_rate=None, weight_decay=None):
    """Refuse training arguments that would fail late or train nothing; `None` skips a check.

    Args:
        epochs: int or `None`. Must be a positive int.
        batch_size: int or `None`. Must be a positive int.
        learning_rate: float or `None`. Must be finite and > 0.
        weight_decay: float or `None`. Must be finite and >= 0.

    Raises:
        ValueError: naming the argument and the value received.
    """
    for name, value in (("epochs", epochs), ("batch_size", batch_size)):
        if value is not None:
            check_count(value, name)
    if learning_rate is not None:
        check_positive_number(learning_rate, "learning_rate")
    if weight_decay is not None:
        check_number(weight_decay, "weight_decay", minimum=0)


def build_optimizer(learning_rate, weight_decay, total_steps, warmup_fraction=0.1):
    """AdamW with linear warm-up and cosine decay, the usual ViT schedule (`keras-vit train` and `pretrain`).

    The one builder of every command (`keras_vit.workflows.optimizers.build_optimizer`), with these settings.
    """
    return optimizers.build_optimizer("adamw", learning_rate, total_steps, weight_decay, warmup_fraction)


def run_training(model, data, optimizer, epochs, run=None, settings=None, held_out=None,
                 compile_arguments=None, validation_data=None, callbacks=(), verbose=1, keep_backup=False):
    """Compile, fit resumably and score held-out data: the run every training command makes.

    The caller has checked its arguments, seeded, made `data` and built
    `optimizer` for the run's updates; this compiles `model` with it, fits
    for `epochs` with a checkpoint every epoch in the run directory `run`
    (`keras_vit.workflows.resuming.fit_resumable`: a rerun resumes), times
    the fit, refuses a run whose loss became NaN or infinite (its backup
    keeps the last good epoch), and evaluates `held_out` with the job's engine
    (`keras_vit.distribution.engines.current().evaluate`: the numbers of
    the whole held-out set, the same on every process).

    Args:
        model: the `keras.Model` to train.
        data: a `keras.utils.PyDataset` of training batches.
        optimizer: a `keras.optimizers.Optimizer`, e.g. from
            `keras_vit.workflows.optimizers.build_optimizer`.
        epochs: int. Total epochs of the run.
        run: the `keras_vit.workflows.resuming.Run` the command made at
            its start (`open_run(output, run_dir)`: the claims of its output and
            run directory): checkpoint every epoch in its run directory and
            resume from it; `None` trains without checkpoints. Defaults to
            `None`.
        settings: dict. The run's settings, checked when resuming.
        held_out: a `keras.utils.PyDataset` or `None`. Scored once after
            training. Defaults to `None`.
        compile_arguments: dict or `None`. Other arguments of
            `model.compile` (loss, metrics). Defaults to `None`.
        validation_data: a `keras.utils.PyDataset` or `None`. Scored by
            `fit` after every epoch (in the history and `log.csv`).
        callbacks: extra Keras callbacks for `fit`.
        verbose: int. Keras progress-bar mode. Defaults to `1`.
        keep_backup: bool. Keep the epoch backup for a caller that saves
            the model afterwards (`run.save_output`) and then calls
            `run.finish()`.

    Raises:
        ValueError: the loss became NaN or infinite (`TerminateOnNaN`
            stopped the fit).

    Returns:
        A dict with the Keras `history`, `initial_epoch` (epochs restored
        from a checkpoint), `seconds` (wall time of the fit) and `held_out`
        (a dict of the held-out loss and metrics, or `None`).
    """
    model.compile(optimizer=optimizer, **(compile_arguments or {}))
    start = time.perf_counter()
    history, initial_epoch = fit_resumable(
        model, data, epochs, run=run, settings=settings, validation_data=validation_data,
        callbacks=callbacks, verbose=verbose, keep_backup=keep_backup,
    )
    seconds = time.perf_counter() - start
    losses = history.history.get("loss", [])
    if losses and not np.isfinite(losses[-1]):  # TerminateOnNaN stopped it; the backup holds the last good epoch
        kept = "no run directory" if run is None or run.directory is None else quote(run.directory.given)
        raise ValueError(
            f"Training stopped: the loss became NaN or infinite in epoch {initial_epoch + len(losses)}. Lower "
            "the learning rate (--learning-rate) and run again; the last good checkpoint is kept in "
            f"{kept}."
        )
    scores = None
    if held_out is not None:
        scores = {name: float(value) for name, value in engines.current().evaluate(model, held_out).items()}
    return {"history": history, "initial_epoch": initial_epoch, "seconds": seconds, "held_out": scores}


def train_classifier(
    model,
    train_data,
    test_data,
    epochs=80,
    batch_size=32,
    learning_rate=2e-3,
    weight_decay=0.3,
    seed=0,
    verbose=1,
    run=None,
    settings=None,
    keep_backup=False,
):
    """Compile and fit a `ViTClassifier`, then score it on held-out data.

    Args:
        model: `ViTClassifier` to train.
        train_data: tuple `(images, labels)`.
        test_data: tuple `(images, labels)` held out from training.
        epochs: int. Passes over the training data. Defaults to `80`.
        batch_size: int. Defaults to `32`.
        learning_rate: float. Peak AdamW learning rate. Defaults to `2e-3`.
        weight_decay: float. Decoupled (AdamW) weight decay; on 1,437 digits
            0.3 held out steadier than ViT's usual 0.05 (seeds 0-3 on JAX:
            98.06% mean, 97.22% lowest, against 97.64% / 96.94%). Defaults
            to `0.3`.
        seed: int. Seeds Keras, numpy and the backend. Defaults to `0`.
        verbose: int. Keras progress-bar mode. Defaults to `1`.
        run: the `keras_vit.workflows.resuming.Run` made at the start:
            checkpoint every epoch in its run directory and resume from it
            (see `run_training`). Defaults to `None`.
        settings: dict. The run's settings, checked when resuming.
        keep_backup: bool. Keep the epoch backup for a caller that saves
            the model afterwards (`run.save_output`) and then calls
            `run.finish()`.

    Returns:
        A dict with `accuracy` (held-out), `loss`, `seconds` (wall time of
        the fit), the Keras `history` and `initial_epoch` (epochs restored
        from a checkpoint).
    """
    check_training_arguments(epochs, batch_size, learning_rate, weight_decay)
    set_random_seed(seed)
    x_train, y_train = train_data
    train = ArrayBatches(x_train, checked_class_indices(y_train, model.num_classes), batch_size, seed=seed)
    test_labels = checked_class_indices(test_data[1], model.num_classes)
    test = ArrayBatches(test_data[0], test_labels, batch_size=256, shuffle=False)
    optimizer = build_optimizer(learning_rate, weight_decay, total_steps=epochs * len(train))
    result = run_training(model, train, optimizer, epochs, run=run, settings=settings, held_out=test,
                          verbose=verbose, keep_backup=keep_backup)
    return {"accuracy": result["held_out"]["accuracy"], "loss": result["held_out"]["loss"],
            "seconds": result["seconds"], "history": result["history"], "initial_epoch": result["initial_epoch"]}


def save_model(model, path):
    """`model.save(path)` for use, through keras_vit's writer: without the optimizer's state.

    The file holds the model (its config and weights) but not the state of
    the optimizer it was trained with, which would triple the size of an
    AdamW-trained model; the run directory's checkpoint keeps that state to
    resume. A kill leaves the old file or the new one. In a job of several
    processes only process 0 writes (the others take part in a collective
    save and discard it).

    Args:
        model: a `keras.Model`.
        path: str or path-like. The `.keras` file to write; claimed here,
            before anything is written.
    """
    write_model(model, files.claim(path, files.FILE))


def write_model(model, destination):
    """`save_model` through a claim made before (`keras-vit quantize`): the job's engine picks who writes.

    Args:
        model: a `keras.Model`.
        destination: the `keras_vit.writer.files.Destination` of the file
            (`claim(path, FILE)`), made by the command at its start.
    """
    engines.current().save_for_job(lambda claimed: save_without_optimizer(model, claimed), destination)


def save_without_optimizer(model, claimed):
    """Write `model` into the claimed `.keras` file without its optimizer's state, on this process.

    The `write` a run's `save_output` and `write_model` hand the job's
    engine (`keras-vit train` and `pretrain`: `run.save_output(lambda
    claimed: save_without_optimizer(model, claimed))`).
    """
    with optimizer_set_aside(model):
        files.save_model(model, claimed)
