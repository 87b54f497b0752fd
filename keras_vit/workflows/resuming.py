"""The resume engine: every training run checkpoints each epoch and continues where it stopped.

`fit_resumable` is `model.fit` with a run directory, claimed once by the
command with its output (`Run`): two backup slots `backup.a/` and `backup.b/` (an
`EpochCheckpoint`: weights, optimizer state, random states), the pointer
`backup.json` naming the slot that holds the last whole epoch (with its
epoch and the run's settings), and `log.csv` (an `EpochLog`). Each epoch
writes the slot the pointer does not name, then replaces the pointer in one
step, so a kill at any instruction leaves the pointer naming a whole slot;
nothing is replaced in place and nothing of the user's is carried. Running
the same call again after a kill reads the pointer and continues at the
next epoch, with the batches and random draws of the uninterrupted run.
`Run.finish` deletes the slots and the pointer once the run's output is
written.
"""

import json
import os

import keras
import numpy as np

from keras_vit.data.image_folder import EpochSync
from keras_vit.distribution import engines
from keras_vit.integrations.torch_random import global_rng_state, set_global_rng_state
from keras_vit.presets.keras_vit_format import METADATA_FILE, PRESET_KIND, WEIGHTS_FILE, write_preset
from keras_vit.writer import files
from keras_vit.writer.files import FILE, claim, quote
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


class Run:
    """One training run's outputs, claimed once at the command's start (`open_run`); every later write is a method.

    The output (the model the run saves at its end) is claimed first, so an
    output inside what the run reads is refused naming its own argument;
    then the run directory (`OUTPUT.run` beside it by default): its backup
    slots, pointer and `log.csv` (`fit_resumable`), and `best/` (the best
    held-out evaluation's weights, `save_best`, a claim of its own). Each
    method writes through these claims, and the job's engine decides who writes
    (`save_for_job`), so nothing is checked again but where time passed
    (the writer says where).

    Args:
        output: str, path-like or `None`. The model the run saves at its
            end (`save_output`); `None` saves nothing.
        run_dir: str, path-like, `None` or `"auto"`. The run directory:
            checkpoints every epoch and a rerun resumes from it. `"auto"`
            is `OUTPUT.run` beside `output` (none without `output`);
            `None` trains without checkpoints. Defaults to `"auto"`.
        inputs: dict `{what: path or list of paths}` the run reads; an
            output or run directory that is, holds or lies inside one
            (under any name) is refused.
        output_kind: str. `keras_vit.writer.files.FILE` (a `.keras` file)
            or the directory's kind (`"preset"`). Defaults to `FILE`.
        output_argument: str. The argument that named the output, for
            errors (the command line shows its flag). Defaults to `"output"`.
        make_parents: bool. `False` refuses an output whose parent
            directory is missing. Defaults to `True`.

    Raises:
        ArgumentError: naming the path, the problem and the argument: an
            output or run directory that overlaps an input or the other,
            or one holding something keras_vit did not write where it
            writes (a user's file inside a slot is named).
    """

    def __init__(self, output=None, run_dir="auto", inputs=None, output_kind=FILE, output_argument="output",
                 make_parents=True):
        if run_dir == "auto":
            run_dir = default_run_dir(output)
        self.run_dir = run_dir
        self.output = self.directory = self.best_directory = None
        if output is not None:
            # The output never in the run directory (nor the run directory in it): one would replace the other.
            self.output = claim(output, output_kind, inputs={**(inputs or {}), "run directory (--run-dir)": run_dir},
                                argument=output_argument, make_parents=make_parents)
        if run_dir is not None:
            self.directory = claim(run_dir, RUN_KIND, names=[LOG_FILE, POINTER_FILE], inputs=inputs,
                                   argument="run_dir", directories={slot: SLOT_KIND for slot in SLOTS})
            # best/ is a preset replaced whole (the old best stays until the new one is in place): its own claim.
            self.best_directory = claim(os.path.join(run_dir, BEST_DIR), PRESET_KIND, inputs=inputs,
                                        argument="run_dir")

    def save_backup(self, write):
        """Write the epoch's backup: `write(claim)` with the run directory's claim, where the job's engine says."""
        engines.current().save_for_job(write, self.directory)

    def save_log(self, text):
        """Replace `log.csv` with `text`."""
        engines.current().save_for_job(lambda directory: directory.save_text(LOG_FILE, text), self.directory)

    def save_best(self, model, best, class_names=None):
        """Write `model`'s weights as the run's best evaluation `best`: a preset in `best/`, replaced whole."""
        if self.best_directory is not None:
            # best/ is checked again when written (`Destination.directory`): an epoch passed since the claim.
            engines.current().save_for_job(lambda claimed: write_preset(
                model, claimed, class_names=class_names, best=best), self.best_directory)

    def load_best(self, model, best):
        """Load the weights `save_best` wrote of evaluation `best` (by an earlier process of this run: a resume)."""
        if self.best_directory is None:
            raise ValueError("The best weights of this run were neither kept nor written; run again with "
                             "`--no-early-stop` or a fresh run directory.")
        path = self.best_directory.path
        with open(os.path.join(path, METADATA_FILE)) as file:
            written = json.load(file).get("best")
        if written != best:
            raise ValueError(
                f"{quote(path)} holds the weights of another evaluation ({written}) than the run's backup records "
                f"as its best ({best}). Delete {quote(self.directory.given)} and run again, or run with "
                "`--no-early-stop`.")
        # A preset holds no optimizer state (the resumed optimizer's comes from the backup): skip the optimizer,
        # or Keras warns on every resume that it skipped loading it.
        skipped = [model.optimizer] if model.optimizer is not None else None
        model.load_weights(os.path.join(path, WEIGHTS_FILE), objects_to_skip=skipped)

    def save_output(self, write):
        """Save the run's output: `write(claim)` on the process the job's engine picks (a no-op without an output)."""
        if self.output is not None:
            engines.current().save_for_job(write, self.output)

    def finish(self):
        """Delete the run's backup slots, pointer and `best/` (what keras_vit wrote), keeping the log and the user's files.

        Call it once the run's output is saved. Until then the backup stays,
        so a kill during the final evaluation or the save resumes with every
        epoch done instead of training again from the start.
        """
        if self.directory is None:
            return

        def remove(directory):
            for name in (POINTER_FILE, *SLOTS):  # the pointer first: never one naming a removed slot
                directory.remove(name)

        engines.current().save_for_job(remove, self.directory)
        engines.current().save_for_job(lambda claimed: claimed.remove(), self.best_directory)


def open_run(output=None, run_dir="auto", inputs=None, output_kind=FILE, output_argument="output", make_parents=True):
    """The `Run` a command makes at its start: its output and run directory claimed, once (see `Run` for the arguments).

    `finetune`, `keras-vit train` and `pretrain` open their run so, before
    any work, and hand it down: `run_training(run=...)`,
    `fit_resumable(run=...)`, then `run.save_output(write)` and
    `run.finish()`.
    """
    return Run(output, run_dir, inputs=inputs, output_kind=output_kind, output_argument=output_argument,
               make_parents=make_parents)


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
        run: the `Run`, made once by the command at its start and handed
            down; it has a run directory.
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
        run_dir = self.run.directory.path
        pointer_path = os.path.join(run_dir, POINTER_FILE)
        if not os.path.exists(pointer_path):
            self.restore_keepers({}, 0)
            return 0
        with open(pointer_path) as file:
            pointer = json.load(file)
        if pointer.get("settings") != self.settings:
            saved = pointer.get("settings") or {}
            changed = sorted(key for key in set(saved) | set(self.settings) if saved.get(key) != self.settings.get(key))
            raise ValueError(
                f"{quote(run_dir)} holds the checkpoint of a run with other settings (changed: "
                f"{', '.join(changed)}). Run the same command again to resume it, or delete that directory "
                "(or choose another output) to start a new run."
            )
        directory = os.path.join(run_dir, str(pointer.get("slot")))
        if pointer.get("slot") not in SLOTS or not os.path.isfile(os.path.join(directory, CHECKPOINT_STATE)):
            raise ValueError(f"{quote(pointer_path)} names the backup {pointer.get('slot')!r}, which is not there "
                             f"whole. Delete {quote(run_dir)} (or choose another output) to start a new run.")
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

        def write(directory):
            with directory.new_directory(slot) as staging:
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
            directory.save_json(POINTER_FILE, {"slot": slot, "epoch": epoch + 1, "settings": self.settings})

        self.run.save_backup(write)
        self.slot = slot


def _trim_log(run, epochs_done):
    """Keep only the CSV log's rows of epochs the checkpoint holds (a kill may leave one more)."""
    path = os.path.join(run.directory.path, LOG_FILE)
    if not os.path.exists(path):
        return
    with open(path) as file:
        rows = file.read().splitlines()
    kept = rows[:1] + [row for row in rows[1:] if row and int(row.split(",", 1)[0]) < epochs_done]
    run.save_log("".join(row + "\n" for row in kept))


class EpochLog(keras.callbacks.Callback):
    """`log.csv`: one row per epoch, the columns of `keras.callbacks.CSVLogger`, written through the writer.

    The file is rewritten whole after each epoch (it is small), so it is
    recorded as keras_vit's by its content: a log the user edited is theirs.

    Args:
        run: the `Run`; it has a run directory.
        append: bool. Continue the rows already in the file (a resumed run).
    """

    def __init__(self, run, append=False):
        super().__init__()
        self.run = run
        self.rows = []
        path = os.path.join(run.directory.path, LOG_FILE)
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
        self.run.save_log(text)


def fit_resumable(model, data, epochs, run=None, settings=None, validation_data=None, callbacks=(), verbose=1,
                  keep_backup=False):
    """`model.fit` that checkpoints every epoch into the run directory `run` and resumes from it.

    With `run`, each epoch writes a backup slot and the pointer to it (an
    `EpochCheckpoint`) and a row of `log.csv` (`EpochLog`), through the
    run's methods. Running the
    same call again after a kill restores the weights, optimizer and random
    states and continues at the next epoch, with the same batches
    (datasets with `set_epoch` are told each epoch); the backup is deleted
    when training finishes (with `keep_backup=True`, when the caller calls
    `run.finish()` after saving the output), the log kept. `TerminateOnNaN` stops a diverged run.

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
        run: the `Run` the command made at its start
            (`open_run(output, run_dir)`), or `None` (or a `Run` without a
            run directory) to train without checkpoints.
        settings: dict. The run's settings, checked on resume.
        validation_data: passed to `fit`.
        callbacks: extra callbacks.
        verbose: Keras progress-bar mode.
        keep_backup: bool. Keep the backup after the last epoch, for a
            caller that still evaluates or saves. Defaults to `False`.

    Returns:
        `(history, initial_epoch)`.
    """
    if run is not None and not isinstance(run, Run):
        raise ValueError("`run` is the run the command opened at its start: `keras_vit.workflows.resuming.open_run("
                         f"output, run_dir)`. Received: run={run!r}")
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
    if run is not None and run.directory is not None:
        keepers = [callback for callback in callbacks if hasattr(callback, "checkpoint_state")]
        checkpoint = EpochCheckpoint(run, settings, keepers=keepers)
        initial_epoch = engine.restore(checkpoint, model)
        if initial_epoch:
            _trim_log(run, initial_epoch)
            if verbose:
                print(f"Resuming from the checkpoint in {quote(run.directory.given)}: {initial_epoch} of {epochs} "
                      "epochs done.")
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
    if not keep_backup and not model.stop_training and run is not None:
        run.finish()
    return history, initial_epoch


def default_run_dir(output):
    """The run directory beside an output path: `OUTPUT.run` (none without an output)."""
    if output is None:
        return None
    return os.path.abspath(os.fspath(output)).rstrip(os.sep) + ".run"
