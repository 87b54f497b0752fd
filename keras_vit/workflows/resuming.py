"""The resume engine: every training run checkpoints each epoch and continues where it stopped.

`fit_resumable` is `model.fit` with a run directory: `backup/` (an
`EpochCheckpoint`: weights, optimizer state, random states and the run's
settings, swapped into place whole after every epoch) and `log.csv` (an
`EpochLog`). Running the same call again after a kill restores all of it
and continues at the next epoch, with the batches and random draws of the
uninterrupted run. `finish_run` deletes the backup once the run's outputs
are written.
"""

import json
import os

import keras
import numpy as np

from keras_vit.data.image_folder import EpochSync
from keras_vit.distribution import engines
from keras_vit.integrations.torch_random import global_rng_state, set_global_rng_state
from keras_vit.utils import files
from keras_vit.utils.files import claim, mark_directory, quote, read_marker
from keras_vit.workflows.agreement import training_fingerprint

CHECKPOINT_WEIGHTS = "checkpoint.weights.h5"
CHECKPOINT_STATE = "state.json"
# Keras saves a LoRA Dense's kernel merged with its update and drops A and B: a resumed LoRA run
# needs them, so the backup keeps them beside the weights (numpy arrays, never pickles).
CHECKPOINT_LORA = "lora.npz"
# A run directory holds these, and only these, of ours; each kind is recorded in the
# directory's ownership marker (keras_vit.utils.files), so a user's directory is never taken.
RUN_KIND, CHECKPOINT_KIND = "run", "checkpoint"
BACKUP_DIR, LOG_FILE = "backup", "log.csv"
# The best held-out evaluation's weights of a run that keeps them (`finetune`): a preset, written by the
# writer's preset save whenever an epoch's evaluation is better than any before.
BEST_DIR = "best"


def claim_run(run_dir, inputs=None, argument="run_dir"):
    """Claim a run directory, once, at the command's start: the `Destination` its backup and log write through.

    The command hands the claim down (`run_training(run=...)`,
    `fit_resumable(run=...)`), so the directory is checked once, before any
    work. Other files in the directory are left alone; a new directory is
    fine.

    Args:
        run_dir: str, path-like or `None` (no checkpoints: returns `None`).
        inputs: dict `{what: path or list of paths}` the command reads; a
            run directory that is, holds or lies inside one (under any name)
            is refused.
        argument: str. The argument that named it (`--run-dir` on the
            command line). Defaults to `"run_dir"`.

    Returns:
        A `keras_vit.utils.files.Destination` for `backup/` and `log.csv`,
        or `None`.

    Raises:
        ArgumentError: naming the directory, the problem and the argument:
            its `backup/` or `log.csv` is not keras_vit's, or it overlaps
            an input.
    """
    if run_dir is None:
        return None
    return claim(run_dir, RUN_KIND, names=[BACKUP_DIR, LOG_FILE, BEST_DIR], inputs=inputs, argument=argument)


def finish_run(run_dir):
    """Delete the run's epoch backup and best weights (what keras_vit wrote of them), keeping the log and any file of the user's.

    Call it once the run's outputs are written. Until then the backup stays,
    so a kill during the final evaluation or the saving of the model resumes
    with every epoch done instead of training again from the start.
    """
    run_dir = None if run_dir is None else os.fspath(run_dir)  # a path, or the run's claim
    if run_dir is not None and engines.current().is_chief() and read_marker(run_dir)[0] == RUN_KIND:
        for name in (BACKUP_DIR, BEST_DIR):
            if os.path.isdir(os.path.join(run_dir, name)):
                files.remove_owned(os.path.join(run_dir, name))


def _seed_states(model):
    """The model's random-number states (dropout, drop path, corruption), not part of its weights."""
    weights = {id(variable) for variable in model.weights}
    return [variable for variable in model.variables if id(variable) not in weights]


class EpochCheckpoint(keras.callbacks.Callback):
    """Save everything a run needs to resume, atomically, after every epoch.

    Like `keras.callbacks.BackupAndRestore`, the backup holds the weights
    and the optimizer's state (moments, iteration count, gradient
    accumulators) plus the number of epochs done; unlike it, it also holds
    the random-number states of dropout and stochastic depth, it is written
    as one directory swapped into place (a kill during the save leaves the
    previous epoch's backup whole), and it records the run's settings so a
    different command is not resumed by mistake, and the state of the
    callbacks that keep some across a resume (`keepers`: `BestWeights`'
    best evaluation so far).

    Call `restore()` before `fit` and pass its result as `initial_epoch`.

    Args:
        directory: str. The backup directory (replaced every epoch).
        settings: dict of JSON values describing the run (data, model,
            recipe, seed); a backup made with other settings is refused.
        run: the run directory's `Destination` (`claim_run(run_dir)`),
            claimed once by the command at its start and handed down: its marker records the backup before
            each swap. `None`: the directory above `directory` is recorded
            when its marker says it is a run directory.
        keepers: callbacks with `checkpoint_state()` (a JSON value, saved
            in the backup) and `restore_checkpoint_state(state, epochs)`
            (given it back, and the epochs done, on a resume; `None`
            without a backup), keyed by their class name.
    """

    def __init__(self, directory, settings=None, run=None, keepers=()):
        super().__init__()
        self.keepers = {type(keeper).__name__: keeper for keeper in keepers}
        self.directory = os.path.abspath(os.fspath(directory))
        self.settings = json.loads(json.dumps(settings or {}, default=str))
        self.run = run
        self._destination = None  # the backup's claim, made once, at the first save

    def restore(self, model):
        """Load the backup into `model` (compiled); return the epochs it had done (0 without one)."""
        if engines.current().is_chief():  # a swap of this run killed between its renames (systems without an exchange)
            files.recover_abandoned(self.directory)
        state_path = os.path.join(self.directory, CHECKPOINT_STATE)
        if not os.path.exists(state_path):
            self.restore_keepers({}, 0)
            return 0
        with open(state_path) as file:
            state = json.load(file)
        if state.get("settings") != self.settings:
            changed = sorted(key for key in set(state.get("settings", {})) | set(self.settings)
                             if state.get("settings", {}).get(key) != self.settings.get(key))
            raise ValueError(
                f"{quote(self.directory)} holds the checkpoint of a run with other settings (changed: "
                f"{', '.join(changed)}). Run the same command again to resume it, or delete that directory "
                "(or choose another output) to start a new run."
            )
        if model.optimizer is not None and not model.optimizer.built:
            model.optimizer.build(model.trainable_variables)
        model.load_weights(os.path.join(self.directory, CHECKPOINT_WEIGHTS))
        lora_path = os.path.join(self.directory, CHECKPOINT_LORA)
        if getattr(model, "lora_enabled", False) and os.path.exists(lora_path):
            # The weights file holds each adapted kernel with its update merged in (Keras' Dense saves it so):
            # take the update back out and put the low-rank factors back.
            model.load_lora_weights(lora_path, kernels_merged=True)
        seeds = _seed_states(model)
        saved = state.get("seed_states", [])
        if len(saved) == len(seeds):
            for variable, value in zip(seeds, saved):
                variable.assign(np.asarray(value, dtype=keras.backend.standardize_dtype(variable.dtype)))
        # Set when the first epoch begins: `fit` itself draws from the global
        # generator before that (building, creating the data iterator).
        self._pending_global_rng = state.get("global_rng")
        self.restore_keepers(state.get("keepers", {}), int(state["epoch"]))
        return int(state["epoch"])

    def kept_state(self):
        """The keepers' states, as the backup records them."""
        return {name: keeper.checkpoint_state() for name, keeper in self.keepers.items()}

    def restore_keepers(self, states, epochs):
        """Give each keeper its state from a backup of `epochs` epochs (a job's other processes get process 0's)."""
        for name, keeper in self.keepers.items():
            keeper.restore_checkpoint_state(states.get(name), epochs)
        self.restored_keepers = states

    def on_epoch_begin(self, epoch, logs=None):
        if getattr(self, "_pending_global_rng", None) is not None:
            set_global_rng_state(self._pending_global_rng)
            self._pending_global_rng = None

    def on_epoch_end(self, epoch, logs=None):
        # First, on every process alike (the logs are the job's): a save that is collective must be skipped by all.
        if self.model.stop_training and any(not np.isfinite(v) for v in (logs or {}).values() if np.ndim(v) == 0):
            return  # TerminateOnNaN stopped a diverged epoch: keep the last good backup
        if not engines.current().is_chief():  # process 0 writes the job's checkpoint
            if engines.current().saving_is_collective():  # Keras needs every process in the save; discarded
                files.discarded_copy(lambda path: files.write_model_file(self.model, path, True), CHECKPOINT_WEIGHTS)
            return
        state = {
            "epoch": epoch + 1,
            "settings": self.settings,
            "seed_states": [keras.ops.convert_to_numpy(v.value).tolist() for v in _seed_states(self.model)],
            "global_rng": global_rng_state(),
            "logs": {key: float(value) for key, value in (logs or {}).items() if np.ndim(value) == 0},
            "keepers": self.kept_state(),
        }
        # A file of the user's in backup/ (notes) is carried into each new backup, never deleted.
        if self._destination is None:
            self._destination = claim(self.directory, CHECKPOINT_KIND,
                                      reserved=(CHECKPOINT_WEIGHTS, CHECKPOINT_STATE, CHECKPOINT_LORA))
        run_dir = os.path.dirname(self.directory) if self.run is None else self.run.path
        if self.run is not None or read_marker(run_dir)[0] == RUN_KIND:
            # Recorded before the swap: a kill right after it leaves a backup the next run knows as its own.
            with files.errors_named(self.directory):
                mark_directory(run_dir, RUN_KIND, [], coming=[os.path.basename(self.directory)])
        with self._destination.directory() as staging:
            files.write_model_file(self.model, os.path.join(staging, CHECKPOINT_WEIGHTS), weights_only=True)
            if getattr(self.model, "lora_enabled", False):
                files.write_arrays(os.path.join(staging, CHECKPOINT_LORA), self.model.lora_weights())
            files.write_json_file(os.path.join(staging, CHECKPOINT_STATE), state)


def _trim_log(run, epochs_done):
    """Keep only the CSV log's rows of epochs the checkpoint holds (a kill may leave one more), through the run's claim."""
    path = os.path.join(run.path, LOG_FILE)
    if not os.path.exists(path):
        return
    with open(path) as file:
        rows = file.read().splitlines()
    kept = rows[:1] + [row for row in rows[1:] if row and int(row.split(",", 1)[0]) < epochs_done]
    run.save_text(LOG_FILE, "".join(row + "\n" for row in kept))


class EpochLog(keras.callbacks.Callback):
    """`log.csv`: one row per epoch, the columns of `keras.callbacks.CSVLogger`, written through the writer.

    The file is rewritten whole after each epoch (it is small), so it is
    recorded as keras_vit's by its content: a log the user edited is theirs.

    Args:
        run_dir: str, or the run directory's `Destination` (claimed by the
            command for `backup/` and `log.csv`); a path is claimed here
            for `log.csv`.
        append: bool. Continue the rows already in the file (a resumed run).
    """

    def __init__(self, run_dir, append=False):
        super().__init__()
        if isinstance(run_dir, files.Destination):
            self.destination = run_dir
        else:
            self.destination = claim(run_dir, RUN_KIND, names=[LOG_FILE], argument="run_dir")
        self.rows = []
        path = os.path.join(self.destination.path, LOG_FILE)
        if append and os.path.exists(path):
            with open(path) as file:
                self.rows = file.read().splitlines()

    def on_epoch_end(self, epoch, logs=None):
        logs = logs or {}
        if not self.rows:
            keys = sorted(logs)
            if keys and not any(key.startswith("val_") for key in keys):
                keys += [f"val_{key}" for key in keys]  # as CSVLogger: columns for validation too
            self.rows.append(",".join(["epoch", *keys]))
        keys = self.rows[0].split(",")[1:]
        self.rows.append(",".join([str(epoch), *(str(logs.get(key, "NA")) for key in keys)]))
        self.destination.save_text(LOG_FILE, "".join(row + "\n" for row in self.rows))


def fit_resumable(model, data, epochs, run_dir=None, settings=None, validation_data=None, callbacks=(),
                  verbose=1, keep_backup=False, run=None):
    """`model.fit` that checkpoints every epoch into `run_dir` and resumes from it.

    With `run_dir`, the run directory holds `backup/` (an `EpochCheckpoint`)
    and `log.csv` (`EpochLog`: the columns of `keras.callbacks.CSVLogger`, one row per epoch), and a
    marker that says keras_vit wrote them: a directory whose `backup/` or
    `log.csv` is someone else's is refused before training. Running the same
    call again after a kill restores the weights, optimizer and random
    states and continues at the next epoch; the backup is deleted when
    training finishes (or, with `keep_backup=True`, when the caller calls
    `finish_run` after writing its outputs). The log is kept. `TerminateOnNaN` stops a run
    whose loss becomes NaN. Datasets with `set_epoch` (`ImageFolderDataset`,
    `ArrayBatches`) are told each epoch, so the resumed batches equal the
    uninterrupted run's.

    In a job of several processes the job's engine
    (`keras_vit.distribution.engines.current()`) does what differs: each
    process trains on its share of every global batch (a sharded copy of
    `data`), the gradients are averaged across processes, the held-out
    numbers are those of the whole `validation_data`, and process 0 alone
    prints progress and writes the backup and the log. A rerun after any
    process was killed resumes every process from process 0's backup.
    Before any of it the processes compare their data, model, settings and
    versions (`keras_vit.workflows.agreement.training_fingerprint`) and
    stop, every one, with one line naming a difference (`Engine.agree`).

    Args:
        model: a compiled `keras.Model`.
        data: a `keras.utils.PyDataset` (or anything `fit` takes as `x`).
        epochs: int. Total epochs of the run.
        run_dir: str or `None`. Where to checkpoint; `None` trains without
            checkpoints. Claimed here (`claim_run`) when no `run` is given.
        settings: dict. The run's settings, checked on resume.
        validation_data: passed to `fit`.
        callbacks: extra callbacks.
        verbose: Keras progress-bar mode.
        keep_backup: bool. Keep the backup after the last epoch, for a
            caller that still evaluates or saves. Defaults to `False`.
        run: the run directory's `Destination`, claimed by the command at
            its start (`claim_run`); the backup and the log write through
            it and the directory is not checked again. Give it or
            `run_dir`, not both. Defaults to `None`.

    Returns:
        `(history, initial_epoch)`.
    """
    if run is not None and run_dir is not None:
        raise ValueError("Give the run directory once: `run` (a claim made with `claim_run`) or `run_dir` (a "
                         f"path, claimed here), not both. Received: run_dir={run_dir!r}, run={run.path!r}")
    if run is not None and not isinstance(run, files.Destination):
        raise ValueError("`run` is the run directory's claim, made by `keras_vit.workflows.resuming.claim_run`; "
                         f"for a path, pass `run_dir`. Received: run={run!r}")
    if run is None:
        # Claimed once, here, for a direct caller (before the job's processes agree: a refusal costs nothing).
        run = claim_run(run_dir)
    engine = engines.current()
    # Before anything else of the job: processes that differ would wait for each other at a step, forever.
    if engine.process_count() > 1:
        engine.agree(training_fingerprint(model, data, validation_data, settings))
    chief = engine.is_chief()
    data = engine.shard(data)
    if hasattr(validation_data, "shard"):
        validation_data = engine.held_out(validation_data)
    verbose = verbose if chief else 0
    all_callbacks = [EpochSync(data), keras.callbacks.TerminateOnNaN(), *callbacks]
    initial_epoch = 0
    if run is not None:
        # The one claim, handed down to the backup and the log.
        if chief:
            files.make_directory(run.path)
            mark_directory(run.path, RUN_KIND, [BACKUP_DIR, LOG_FILE])
        keepers = [callback for callback in callbacks if hasattr(callback, "checkpoint_state")]
        checkpoint = EpochCheckpoint(os.path.join(run.path, BACKUP_DIR), settings, run=run, keepers=keepers)
        initial_epoch = engine.restore(checkpoint, model)
        if initial_epoch and chief:
            _trim_log(run, initial_epoch)
            if verbose:
                print(f"Resuming from the checkpoint in {quote(run.given)}: {initial_epoch} of {epochs} epochs done.")
        # The log's row first, then the backup: a kill between leaves the log one row ahead, which the
        # rerun trims (`_trim_log`); the other way round it would lose the row of an epoch the backup holds.
        if chief:
            all_callbacks.append(EpochLog(run, append=initial_epoch > 0))
        all_callbacks.append(checkpoint)
    # First: the checkpoint and the log then hold the job's numbers.
    all_callbacks[:0] = engine.prepare(model, data)
    stopped = [callback.stopped_early for callback in callbacks if getattr(callback, "stopped_early", None)]
    if stopped:  # a run that stopped early and was killed before its output was written: nothing to train
        if verbose:
            print(f"The run stopped early after epoch {stopped[0]}; writing its output.")
        history = keras.callbacks.History()
        history.history, history.epoch = {}, []
        return history, initial_epoch
    # shuffle=False: the datasets shuffle themselves by (seed, epoch); Keras'
    # own shuffling of batch order draws from Python's global `random`, whose
    # state a checkpoint does not hold.
    history = model.fit(engine.fit_input(data), validation_data=engine.fit_input(validation_data),
                        epochs=epochs, initial_epoch=initial_epoch, callbacks=all_callbacks, shuffle=False,
                        verbose=verbose)
    if not keep_backup and not model.stop_training:
        finish_run(run)
    return history, initial_epoch


def default_run_dir(output):
    """The run directory beside an output path: `OUTPUT.run`."""
    return None if output is None else os.path.abspath(os.fspath(output)).rstrip(os.sep) + ".run"
