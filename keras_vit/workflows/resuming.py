"""The resume engine: every training run checkpoints each epoch and continues where it stopped.

`fit_resumable` is `model.fit` with a run directory, claimed once by the
command (`claim_run`): two backup slots `backup.a/` and `backup.b/` (an
`EpochCheckpoint`: weights, optimizer state, random states), the pointer
`backup.json` naming the slot that holds the last whole epoch (with its
epoch and the run's settings), and `log.csv` (an `EpochLog`). Each epoch
writes the slot the pointer does not name, then replaces the pointer in one
step, so a kill at any instruction leaves the pointer naming a whole slot;
nothing is replaced in place and nothing of the user's is carried. Running
the same call again after a kill reads the pointer and continues at the
next epoch, with the batches and random draws of the uninterrupted run.
`finish_run` deletes the slots and the pointer once the run's outputs are
written.
"""

import json
import os

import keras
import numpy as np

from keras_vit.data.image_folder import EpochSync
from keras_vit.distribution import engines
from keras_vit.integrations.torch_random import global_rng_state, set_global_rng_state
from keras_vit.presets.keras_vit_format import PRESET_KIND
from keras_vit.writer import files
from keras_vit.writer.files import claim, quote
from keras_vit.workflows.agreement import training_fingerprint

# A slot's files.
CHECKPOINT_WEIGHTS = "checkpoint.weights.h5"
CHECKPOINT_STATE = "state.json"
# Keras saves a LoRA Dense's kernel merged with its update and drops A and B: a resumed LoRA run
# needs them, so the backup keeps them beside the weights (numpy arrays, never pickles).
CHECKPOINT_LORA = "lora.npz"
# A run directory holds these, and only these, of ours: the log and the pointer are ours by the digests its
# marker records, the slots and `best/` by their own markers (keras_vit.writer.files); a user's file among them
# is refused by name before any work.
RUN_KIND, SLOT_KIND = "run", "epoch-backup"
SLOTS = ("backup.a", "backup.b")
POINTER_FILE, LOG_FILE = "backup.json", "log.csv"
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
        A `keras_vit.writer.files.Destination` for the slots, the pointer,
        `best/` and `log.csv`, or `None`.

    Raises:
        ArgumentError: naming the directory, the problem and the argument:
            one of those names holds something keras_vit did not write (a
            user's file inside a slot is named), or it overlaps an input.
    """
    if run_dir is None:
        return None
    return claim(run_dir, RUN_KIND, names=[LOG_FILE, POINTER_FILE], inputs=inputs, argument=argument,
                 directories={**{slot: SLOT_KIND for slot in SLOTS}, BEST_DIR: PRESET_KIND})


def finish_run(run):
    """Delete the run's backup slots, pointer and best weights (what keras_vit wrote of them), keeping the log and any file of the user's.

    Call it once the run's outputs are written. Until then the backup stays,
    so a kill during the final evaluation or the saving of the model resumes
    with every epoch done instead of training again from the start.

    Args:
        run: the run directory's claim (`claim_run`), or `None`.
    """
    if run is None:
        return

    def remove(claimed):
        for name in (POINTER_FILE, *SLOTS, BEST_DIR):  # the pointer first: never one naming a removed slot
            claimed.remove(name)

    engines.current().save_for_job(remove, run)


def _seed_states(model):
    """The model's random-number states (dropout, drop path, corruption), not part of its weights."""
    weights = {id(variable) for variable in model.weights}
    return [variable for variable in model.variables if id(variable) not in weights]


class EpochCheckpoint(keras.callbacks.Callback):
    """Save everything a run needs to resume after every epoch: a whole slot, then the pointer to it.

    Like `keras.callbacks.BackupAndRestore`, the backup holds the weights
    and the optimizer's state (moments, iteration count, gradient
    accumulators) plus the number of epochs done; unlike it, it also holds
    the random-number states of dropout and stochastic depth, it is written
    into the slot the pointer does not name and the pointer replaced after
    (a kill during the save leaves the previous epoch's slot named, whole),
    and it records the run's settings so a different command is not resumed
    by mistake, and the state of the callbacks that keep some across a
    resume (`keepers`: `BestWeights`' best evaluation so far).

    Call `restore()` before `fit` and pass its result as `initial_epoch`.

    Args:
        run: the run directory's claim (`claim_run(run_dir)`), made once by
            the command at its start and handed down.
        settings: dict of JSON values describing the run (data, model,
            recipe, seed); a backup made with other settings is refused.
        keepers: callbacks with `checkpoint_state()` (a JSON value, saved
            in the backup) and `restore_checkpoint_state(state, epochs)`
            (given it back, and the epochs done, on a resume; `None`
            without a backup), keyed by their class name.
    """

    def __init__(self, run, settings=None, keepers=()):
        super().__init__()
        self.keepers = {type(keeper).__name__: keeper for keeper in keepers}
        self.run = run
        self.settings = json.loads(json.dumps(settings or {}, default=str))
        self.slot = None  # the slot the pointer names

    def restore(self, model):
        """Load the backup the pointer names into `model` (compiled); return the epochs it had done (0 without one)."""
        pointer_path = os.path.join(self.run.path, POINTER_FILE)
        if not os.path.exists(pointer_path):
            self.restore_keepers({}, 0)
            return 0
        with open(pointer_path) as file:
            pointer = json.load(file)
        if pointer.get("settings") != self.settings:
            saved = pointer.get("settings") or {}
            changed = sorted(key for key in set(saved) | set(self.settings) if saved.get(key) != self.settings.get(key))
            raise ValueError(
                f"{quote(self.run.path)} holds the checkpoint of a run with other settings (changed: "
                f"{', '.join(changed)}). Run the same command again to resume it, or delete that directory "
                "(or choose another output) to start a new run."
            )
        directory = os.path.join(self.run.path, str(pointer.get("slot")))
        if pointer.get("slot") not in SLOTS or not os.path.isfile(os.path.join(directory, CHECKPOINT_STATE)):
            raise ValueError(f"{quote(pointer_path)} names the backup {pointer.get('slot')!r}, which is not there "
                             f"whole. Delete {quote(self.run.path)} (or choose another output) to start a new run.")
        self.slot = pointer["slot"]
        with open(os.path.join(directory, CHECKPOINT_STATE)) as file:
            state = json.load(file)
        if model.optimizer is not None and not model.optimizer.built:
            model.optimizer.build(model.trainable_variables)
        model.load_weights(os.path.join(directory, CHECKPOINT_WEIGHTS))
        lora_path = os.path.join(directory, CHECKPOINT_LORA)
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
        self.restore_keepers(state.get("keepers", {}), int(pointer["epoch"]))
        return int(pointer["epoch"])

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
        slot = SLOTS[1] if self.slot == SLOTS[0] else SLOTS[0]  # the one the pointer does not name

        def write(run):
            with run.new_directory(slot) as staging:
                files.write_model_file(self.model, os.path.join(staging, CHECKPOINT_WEIGHTS), weights_only=True)
                if getattr(self.model, "lora_enabled", False):
                    np.savez(os.path.join(staging, CHECKPOINT_LORA), **self.model.lora_weights())
                files.write_json_file(os.path.join(staging, CHECKPOINT_STATE), {
                    "seed_states": [keras.ops.convert_to_numpy(v.value).tolist() for v in _seed_states(self.model)],
                    "global_rng": global_rng_state(),
                    "logs": {key: float(value) for key, value in (logs or {}).items() if np.ndim(value) == 0},
                    "keepers": self.kept_state(),
                })
            # The slot is whole on disk: only now does the pointer name it (replaced in one step).
            run.save_json(POINTER_FILE, {"slot": slot, "epoch": epoch + 1, "settings": self.settings})

        engines.current().save_for_job(write, self.run)
        self.slot = slot


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
        run: the run directory's claim (`claim_run`).
        append: bool. Continue the rows already in the file (a resumed run).
    """

    def __init__(self, run, append=False):
        super().__init__()
        self.run = run
        self.rows = []
        path = os.path.join(run.path, LOG_FILE)
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
        text = "".join(row + "\n" for row in self.rows)
        engines.current().save_for_job(lambda run: run.save_text(LOG_FILE, text), self.run)


def fit_resumable(model, data, epochs, run=None, settings=None, validation_data=None, callbacks=(), verbose=1,
                  keep_backup=False):
    """`model.fit` that checkpoints every epoch into the run directory `run` and resumes from it.

    With `run`, each epoch writes a backup slot and the pointer to it (an
    `EpochCheckpoint`) and a row of `log.csv` (`EpochLog`). Running the
    same call again after a kill restores the weights, optimizer and random
    states and continues at the next epoch, with the same batches
    (datasets with `set_epoch` are told each epoch); the backup is deleted
    when training finishes (with `keep_backup=True`, when the caller calls
    `finish_run`), the log kept. `TerminateOnNaN` stops a diverged run.

    In a job of several processes the job's engine (`engines.current()`)
    does what differs: each process trains on its share of every global
    batch, the held-out numbers are the whole `validation_data`'s, the
    engine picks who writes (`save_for_job`), and the processes first
    compare their data, model, settings and versions, stopping with one
    line naming a difference (`Engine.agree`).

    Args:
        model: a compiled `keras.Model`.
        data: a `keras.utils.PyDataset` (or anything `fit` takes as `x`).
        epochs: int. Total epochs of the run.
        run: the run directory's claim, made by the command at its start
            (`claim_run(path)`), or `None` to train without checkpoints.
        settings: dict. The run's settings, checked on resume.
        validation_data: passed to `fit`.
        callbacks: extra callbacks.
        verbose: Keras progress-bar mode.
        keep_backup: bool. Keep the backup after the last epoch, for a
            caller that still evaluates or saves. Defaults to `False`.

    Returns:
        `(history, initial_epoch)`.
    """
    if run is not None and not isinstance(run, files.Destination):
        raise ValueError("`run` is the run directory's claim: `keras_vit.workflows.resuming.claim_run(path)`. "
                         f"Received: run={run!r}")
    engine = engines.current()
    # Before anything else of the job: processes that differ would wait for each other at a step, forever.
    if engine.process_count() > 1:
        engine.agree(training_fingerprint(model, data, validation_data, settings))
    data = engine.shard(data)
    if hasattr(validation_data, "shard"):
        validation_data = engine.held_out(validation_data)
    verbose = verbose if engine.is_chief() else 0  # what a job prints is the job's: one process's progress
    all_callbacks = [EpochSync(data), keras.callbacks.TerminateOnNaN(), *callbacks]
    initial_epoch = 0
    if run is not None:
        keepers = [callback for callback in callbacks if hasattr(callback, "checkpoint_state")]
        checkpoint = EpochCheckpoint(run, settings, keepers=keepers)
        initial_epoch = engine.restore(checkpoint, model)
        if initial_epoch:
            engine.save_for_job(lambda claimed: _trim_log(claimed, initial_epoch), run)
            if verbose:
                print(f"Resuming from the checkpoint in {quote(run.given)}: {initial_epoch} of {epochs} epochs done.")
        # The log's row first, then the backup: a kill between leaves the log one row ahead, which the
        # rerun trims (`_trim_log`); the other way round it would lose the row of an epoch the backup holds.
        all_callbacks += [EpochLog(run, append=initial_epoch > 0), checkpoint]
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
