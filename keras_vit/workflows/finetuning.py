"""Fine-tune a ViT on a class-per-subfolder image folder, as the paper does.

`finetune("photos", preset="vit_b16_in21k", image_size=384)` loads the
pre-trained model, replaces its head by a new zero-initialised one (the
paper removes the pre-training head, appendix B.1.1), resamples the position
embeddings to the new resolution, trains with the chosen recipe while
checkpointing every epoch, reports held-out accuracy and writes a preset
that carries the class names.
"""

import copy
import math
import os
import time

import keras
import numpy as np

from keras_vit.data import AugmentPolicy, checked_class_indices, image_folder_datasets
from keras_vit.data.image_folder import ImageFolderDataset, check_held_out
from keras_vit.distribution import engines
from keras_vit.models.vit_classifier import ViTClassifier
from keras_vit.presets import load_model
from keras_vit.presets.handles import check_not_killed_save
from keras_vit.presets.keras_vit_format import PRESET_KIND, write_preset
from keras_vit.utils.errors import ArgumentError
from keras_vit.writer.files import quote
from keras_vit.utils.seeds import set_random_seed
from keras_vit.utils.values import check_count, check_optional_count, to_pair
from keras_vit.workflows import notices, optimizers
from keras_vit.workflows.resuming import open_run
from keras_vit.workflows.training import check_training_arguments, run_training

# The paper's fine-tuning (section 4, appendix B.1.1): SGD with momentum 0.9,
# no weight decay, gradient clipping at global norm 1, cosine decay with
# linear warm-up, batch 512. Learning rates were swept over
# {0.001, 0.003, 0.01, 0.03}; 0.01 is the middle of that sweep.
RECIPES = {
    "paper": {"optimizer": "sgd", "learning_rate": 0.01, "weight_decay": 0.0, "global_clipnorm": 1.0,
              "effective_batch_size": 512, "warmup_fraction": 0.05},
    # The usual AdamW schedule of DeiT-style training, for small data or
    # from-scratch runs; no accumulation.
    "adamw": {"optimizer": "adamw", "learning_rate": 1e-3, "weight_decay": 0.05, "global_clipnorm": 1.0,
              "effective_batch_size": None, "warmup_fraction": 0.1},
}


def recipe_accumulation(recipe, batch_size=32, effective_batch_size="recipe", steps_per_epoch=None):
    """Batches accumulated per optimizer update under a fine-tuning recipe.

    Args:
        recipe: str. `"paper"` or `"adamw"` (see `RECIPES`).
        batch_size: int. Images per step fed to the model.
        effective_batch_size: int, `None` or `"recipe"`. Images per update:
            gradients of `ceil(effective / batch_size)` steps are
            accumulated (Keras' `gradient_accumulation_steps`). `"recipe"`
            takes the recipe's (512 for `"paper"`).
        steps_per_epoch: int or `None`. Batches in one epoch. Accumulation
            never spans more steps than an epoch has: on a folder of 20
            images, 512 images per update would otherwise mean one update
            every 16 epochs (Keras' accumulators carry across epochs).

    Returns:
        An int, at least 1.
    """
    if recipe not in RECIPES:
        raise ValueError(f"Unknown recipe {recipe!r}. Choose one of {sorted(RECIPES)}.")
    if effective_batch_size == "recipe":
        effective_batch_size = RECIPES[recipe]["effective_batch_size"]
    accumulation = 1
    if effective_batch_size and effective_batch_size > batch_size:
        accumulation = math.ceil(effective_batch_size / batch_size)
    if steps_per_epoch is not None:
        accumulation = max(1, min(accumulation, steps_per_epoch))
    return accumulation


def build_recipe_optimizer(recipe, total_steps, learning_rate=None, weight_decay=None, batch_size=32,
                           effective_batch_size="recipe", steps_per_epoch=None):
    """The optimizer of a fine-tuning recipe, with its schedule over `total_steps` optimizer steps.

    Args:
        recipe: str. `"paper"` or `"adamw"` (see `RECIPES`).
        total_steps: int. Optimizer updates of the whole run (after
            accumulation).
        learning_rate: float or `None`. Peak learning rate; `None` takes the
            recipe's.
        weight_decay: float or `None`. `None` takes the recipe's.
        batch_size, effective_batch_size, steps_per_epoch: the
            accumulation's, as `recipe_accumulation` takes them.

    Returns:
        `(optimizer, accumulation_steps)`. The optimizer is a
        `keras_vit.optimizers.SGD` or `AdamW`: Keras' own, except that under
        a `tf.distribute` strategy they clip and accumulate the global
        gradient, as one device does.
    """
    accumulation = recipe_accumulation(recipe, batch_size, effective_batch_size, steps_per_epoch)
    settings = RECIPES[recipe]
    learning_rate = settings["learning_rate"] if learning_rate is None else learning_rate
    weight_decay = settings["weight_decay"] if weight_decay is None else weight_decay
    # Warm-up over the first 5% of the updates, cosine decay over the rest, every update at a non-zero rate;
    # keras_vit's optimizers, not Keras': under a tf.distribute strategy Keras' clip each replica's part of
    # the gradient and cannot accumulate.
    optimizer = optimizers.build_optimizer(
        settings["optimizer"], learning_rate, total_steps, weight_decay, settings["warmup_fraction"],
        settings["global_clipnorm"], accumulation)
    return optimizer, accumulation


# Fewer optimizer updates than this in a whole run is almost surely a mistake
# (a small folder under a large accumulated batch): say so before training.
MIN_UPDATES = 10

def warn_about_few_updates(updates, epochs, steps_per_epoch, accumulation, num_images):
    """Warn before training when a run would make fewer than `MIN_UPDATES` optimizer updates."""
    if updates < MIN_UPDATES:
        notices.warn(
            f"This run makes only {updates} optimizer update(s): {num_images} training images are "
            f"{steps_per_epoch} batch(es) per epoch, and {accumulation} batches are accumulated per update, over "
            f"{epochs} epoch(s). The model will barely change. Accumulate less (`effective_batch_size=None`; "
            "`--effective-batch-size 0` on the command line), use the AdamW recipe (`recipe=\"adamw\"`; "
            "`--recipe adamw`), or train for more epochs.",
        )


# Held-out evaluations without improvement after which a fine-tune stops.
# The plan makes about MIN_EVALUATIONS (10) to 20 epochs of a default run on a
# small folder, one evaluation each: 5 is a quarter to half of the run. On
# the small-folder grid's 30-image folder the held-out accuracy peaked at the
# 2nd of 20 evaluations and never came back (docs/finetuning.md), while a
# held-out set of 6 to 24 images moves by one image from one evaluation to
# the next without a trend: a patience of 1 or 2 would stop on that noise.
# Keras' EarlyStopping has no default worth copying (0); Hugging Face's
# examples use 3 to 5.
DEFAULT_PATIENCE = 5


class BestWeights(keras.callbacks.Callback):
    """Keep the weights of the best held-out evaluation, and stop when it has not improved for `patience` of them.

    As Keras' `EarlyStopping(restore_best_weights=True)`, timm's best
    checkpoint and Hugging Face's `load_best_model_at_end`: after every
    epoch, fit's held-out `val_accuracy` (ties broken by the lower
    `val_loss`) is compared with the best so far. A better one is kept in
    memory and, with a run directory, written as a preset to its `best/`
    (`Run.save_best`), before the epoch's backup, so
    the backup never records a best its run directory lacks. The best's
    epoch, update and numbers travel in the backup (`checkpoint_state`),
    so a resumed run knows them; `restore_best(model)` puts the best
    weights back once training ends.

    Args:
        updates_per_epoch: int. Optimizer updates of one epoch (to name
            the update the weights come from).
        patience: int or `None`. Evaluations without improvement before
            stopping; `None` never stops early and keeps the last weights.
        run: the `keras_vit.workflows.resuming.Run` that writes the best
            weights into its run directory's `best/` and loads them on a
            resume; `None` keeps them in memory only.
        class_names: list of str or `None`. Saved with the best weights.
    """

    def __init__(self, updates_per_epoch, patience=DEFAULT_PATIENCE, run=None, class_names=None):
        super().__init__()
        self.updates_per_epoch, self.patience = updates_per_epoch, patience
        self.run, self.class_names = run, class_names
        self.best = None  # {"epoch", "update", "accuracy", "loss"} of the best evaluation
        self.waited = 0
        self.stopped_early = None  # the epochs done when the run stopped early
        self.last_epoch = None  # epochs done
        self._weights = None  # the best weights, when this process saw them

    def checkpoint_state(self):
        return {"best": self.best, "waited": self.waited, "stopped_early": self.stopped_early}

    def restore_checkpoint_state(self, state, epochs):
        state = state or {}
        self.best, self.waited = state.get("best"), int(state.get("waited", 0))
        self.stopped_early, self.last_epoch = state.get("stopped_early"), epochs

    def on_epoch_end(self, epoch, logs=None):
        logs = logs or {}
        self.last_epoch = epoch + 1
        accuracy, loss = logs.get("val_accuracy"), logs.get("val_loss", float("inf"))
        if self.patience is None or accuracy is None or not np.isfinite(accuracy):
            return
        accuracy, loss = float(accuracy), float(loss) if np.isfinite(loss) else float("inf")
        best = self.best
        if best is None or accuracy > best["accuracy"] or (accuracy == best["accuracy"] and loss < best["loss"]):
            self.best = {"epoch": epoch + 1, "update": (epoch + 1) * self.updates_per_epoch, "accuracy": accuracy,
                         "loss": loss}
            self.waited = 0
            self._weights = [np.array(weight) for weight in self.model.get_weights()]
            if self.run is not None:
                self.run.save_best(self.model, self.best, self.class_names)
            return
        self.waited += 1
        if self.waited >= self.patience:
            self.stopped_early = epoch + 1
            self.model.stop_training = True

    def restore_best(self, model):
        """Put the best evaluation's weights into `model` (no-op when the last epoch was the best); True if done."""
        if self.best is None or self.best["epoch"] == self.last_epoch:
            return False
        if self._weights is not None:
            model.set_weights(self._weights)
        else:  # a resumed run whose best came before the kill: only its run directory has them (a backup needs one)
            self.run.load_best(model, self.best)
        return True


# How long a fine-tune runs when neither `epochs` nor `steps` is given: a
# number of optimizer updates, as the paper's table gives its fine-tuning
# runs (500 steps for Pets and Flowers, 2,500 for the 1,000-image VTAB tasks,
# at batch 512), not a number of epochs, which on a small folder means few
# updates (10 epochs of a 96-image folder at 512 images per update: 10).
# Measured on small folders in docs/finetuning.md (benchmarks/small_folder.py).
DEFAULT_UPDATES = 500
# ... and at most this many passes over the training images: the paper's 500
# updates of 512 are 70 passes over Pets (3,680 images) and 125 over Flowers
# (2,040); on an 18-image folder 500 updates of 32 would be 900 passes (13 min
# at 224 px on 2 cores) of images learned by heart long before.
MAX_PASSES = 100
# ... and from scratch on a folder of fewer than SMALL_FOLDER_IMAGES training
# images, at most SMALL_FOLDER_PASSES: each such run measured chose its best
# weights by 37 passes (docs/finetuning.md: the 21-photo first try, ViT-Ti/16
# from scratch on 18 images, at 37; the grid's 30-image folder from scratch
# at 12); scaled from the idle 100-pass run it brings the 21-photo first try
# to about 2 minutes on 2 idle cores (an estimate: not measured idle).
# From a pre-trained model the evidence is mixed (the grid's 30-image folder
# peaked at 35 passes, but tests/finetune/test_small_folder.py's 30 striped
# images scored 58.33% at 60 passes and at least 60% at 100), so it keeps
# MAX_PASSES. 64 is two batches; no folder between 30 and 120 was measured.
SMALL_FOLDER_IMAGES = 64
SMALL_FOLDER_PASSES = 60
# On a folder too small for the recipe's update size, an update holds at
# most this share of the training images (in whole batches, at least one).
MIN_UPDATES_PER_PASS = 10
# Batches an epoch holds at least when the run is counted in updates: on a
# small folder an epoch is several passes over it, so the run's per-epoch
# work (held-out evaluation, checkpoint, log row) stays a small share ...
MIN_BATCHES_PER_EPOCH = 25
# ... unless the run is short: then an epoch is shorter, so that a run
# counted in updates has about this many epochs, each ending with a held-out
# evaluation the best weights are chosen from (`BestWeights`).
MIN_EVALUATIONS = 10


def check_run_length(epochs, steps):
    """Refuse `epochs` and `steps` together, or either not a positive int."""
    check_optional_count(epochs, "epochs")
    check_optional_count(steps, "steps")
    if epochs is not None and steps is not None:
        raise ArgumentError("Give `epochs` or `steps` (optimizer updates), not both: each sets how long the run "
                            f"is. Received: epochs={epochs!r}, steps={steps!r}")


def plan_updates(num_images, recipe="paper", batch_size=32, effective_batch_size="recipe", epochs=None, steps=None,
                 from_scratch=False):
    """How long a fine-tune runs, how large its updates and its epochs are.

    The rule (docs/finetuning.md has the measurements behind it):

    - Images per update: the recipe's (512 for `"paper"`, one batch for
      `"adamw"`), or `effective_batch_size` when given, in whole batches
      (rounded up). When it is the recipe's, at most a tenth of the
      training images (in whole batches, at least one batch): a 96-image
      folder makes updates of one batch of 32, not one update per epoch.
      An update never spans two epochs: an epoch shorter than the update
      makes the update the epoch (`smaller_update` says so).
    - Every update is whole: an epoch whose batches are not a multiple of
      the update's leaves out its last few batches (fewer than one
      update's; each epoch reads its own shuffled order, so other images
      each time) rather than shrinking the update to a divisor (an epoch
      of 1,009 batches, a prime, made updates of one batch).
    - Length: `epochs` passes when given. Otherwise `steps` updates, or
      without either `DEFAULT_UPDATES` but no more than `MAX_PASSES`
      passes over the folder (`SMALL_FOLDER_PASSES` from scratch on a
      folder of fewer than `SMALL_FOLDER_IMAGES`); an epoch is as many passes over a small
      folder as make `MIN_BATCHES_PER_EPOCH` batches (fewer in a short run,
      so it has about `MIN_EVALUATIONS` epochs), and the epochs are
      rounded up to whole ones (the run evaluates, checkpoints and resumes
      by epoch).

    The plan depends on the global batch and the whole folder only, so a
    job of N processes makes the updates of one process.

    Args:
        num_images: int. Training images (after the held-out split).
        recipe: str. `"paper"` or `"adamw"`.
        batch_size: int. Images per step (the global batch).
        effective_batch_size: int, `None` or `"recipe"`. See `finetune`.
        epochs: int or `None`. Fixed number of passes.
        steps: int or `None`. Optimizer updates wanted (not with `epochs`).
        from_scratch: bool. The model starts from random weights (a
            variant, not a preset).

    Returns:
        A dict: `epochs`, `passes` (over the training images per epoch),
        `steps_per_epoch` (batches per epoch, after `dropped_batches` are
        left out of each), `accumulation` (batches per update),
        `images_per_update`, `updates` (of the whole run), `capped` (the
        default length was cut to `max_passes` passes), `max_passes` (the
        bound of a default length: `MAX_PASSES` or `SMALL_FOLDER_PASSES`;
        `None` with `steps` or `epochs`), `asked_images_per_update`
        (the recipe's or `effective_batch_size`; `None` without
        accumulation) and `smaller_update` (why the update holds fewer
        images than that, or `None`; `update_cut_by` names the cause,
        `"small folder"` or `"short epoch"`).
    """
    check_run_length(epochs, steps)
    batches_per_pass = max(1, math.ceil(num_images / batch_size))
    asked = RECIPES[recipe]["effective_batch_size"] if effective_batch_size == "recipe" else effective_batch_size
    accumulation = recipe_accumulation(recipe, batch_size, effective_batch_size)
    smaller, cut_by = None, None
    if effective_batch_size == "recipe" and accumulation > max(1, batches_per_pass // MIN_UPDATES_PER_PASS):
        accumulation = max(1, batches_per_pass // MIN_UPDATES_PER_PASS)
        cut_by = "small folder"
        smaller = (f"the recipe's {asked}-image update cut to a tenth of the {num_images} training images, in whole "
                   "batches")
    passes, capped, max_passes = 1, False, None
    if epochs is None:
        wanted = DEFAULT_UPDATES if steps is None else steps
        if steps is None:  # the default length: no more than MAX_PASSES passes over the folder
            small = from_scratch and num_images < SMALL_FOLDER_IMAGES
            max_passes = SMALL_FOLDER_PASSES if small else MAX_PASSES
            affordable = max(1, max_passes * num_images // (accumulation * batch_size))
            wanted, capped = min(wanted, affordable), affordable < wanted
        epoch_batches = min(MIN_BATCHES_PER_EPOCH, max(1, math.ceil(wanted * accumulation / MIN_EVALUATIONS)))
        epoch_batches = max(epoch_batches, accumulation)  # an epoch of passes holds a whole update at least
        passes = max(1, math.ceil(epoch_batches * batch_size / num_images))
    batches = max(1, math.ceil(passes * num_images / batch_size))
    if accumulation > batches:  # an update never spans epochs (Keras' accumulators would carry across them)
        cut_by = "short epoch"
        smaller = (f"an update of {asked} images would span {math.ceil(asked / batch_size)} batches and an epoch "
                   f"has {batches}: an update does not span epochs")
        accumulation = batches
    steps_per_epoch = batches - batches % accumulation  # whole updates: the last few batches are left out
    if epochs is None:
        epochs = max(1, math.ceil(wanted * accumulation / steps_per_epoch))
    updates = epochs * steps_per_epoch // accumulation
    return {"epochs": epochs, "passes": passes, "steps_per_epoch": steps_per_epoch, "accumulation": accumulation,
            "dropped_batches": batches - steps_per_epoch,
            "images_per_update": min(num_images * passes, accumulation * batch_size), "updates": updates,
            "capped": capped, "max_passes": max_passes, "asked_images_per_update": asked if accumulation > 1 or smaller else None,
            "smaller_update": smaller, "update_cut_by": cut_by}


class RepeatedFolder(ImageFolderDataset):
    """An `ImageFolderDataset` whose epoch is `passes` passes over the images, each in its own order.

    Pass `r` of epoch `e` follows the permutation of `(seed, e * passes + r)`,
    the order a one-pass dataset reads in its epoch `e * passes + r`; batches
    run on across passes. With `passes=1` it reads what its base reads.
    `batches` (when set) ends the epoch after that many batches: the plan
    leaves out the last few so that every optimizer update is whole.
    """

    passes = 1
    batches = None

    def _num_rows(self):
        return len(self.paths) * self.passes

    def __len__(self):
        full = super().__len__()
        return full if self.batches is None else min(full, self.batches)

    def order(self, epoch=None):
        epoch = self.epoch if epoch is None else epoch
        if not self.training:
            return np.tile(np.arange(len(self.paths)), self.passes)
        return np.concatenate([super(RepeatedFolder, self).order(epoch * self.passes + r)
                               for r in range(self.passes)])


def describe_plan(plan, num_images, batch_size, epochs=None, steps=None):
    """The line `finetune` prints before training: updates, images per update, epochs, and what chose them."""
    if epochs is not None:
        why = f"{epochs} epochs as asked"
    elif steps is not None:
        why = f"{steps} updates as asked, rounded up to whole epochs"
    elif plan["capped"]:
        why = (f"the default {DEFAULT_UPDATES} updates would be {DEFAULT_UPDATES * plan['images_per_update'] // num_images}"
               f" passes over the folder: at most {plan['max_passes']} passes"
               + (f" from scratch on a folder of fewer than {SMALL_FOLDER_IMAGES} images"
                  if plan["max_passes"] != MAX_PASSES
                  else "") + ", rounded up to whole epochs; `steps` or `epochs` sets another")
    else:
        why = f"the default {DEFAULT_UPDATES} updates, rounded up to whole epochs; `steps` or `epochs` sets another"
    per_update = (f"{plan['accumulation']} batches of {batch_size} accumulated" if plan["accumulation"] > 1
                  else f"one batch of up to {batch_size}")
    if plan["smaller_update"]:
        per_update += f"; {plan['smaller_update']}"
    epoch = f"{plan['passes']} passes over" if plan["passes"] > 1 else "one pass over"
    dropped = ""
    if plan["dropped_batches"]:
        dropped = (f" Each epoch leaves out its last {plan['dropped_batches']} batch(es) of its shuffled order, so "
                   "that every update is whole.")
    return (f"Plan: {plan['updates']} optimizer updates of {plan['images_per_update']} images each ({per_update}) "
            f"in {plan['epochs']} epochs, each {epoch} the {num_images} training images ({why}).{dropped}")


def describe_stopping(patience, held_out):
    """The line `finetune` prints before training on how the run ends and which weights it keeps."""
    if not held_out:
        return "Stop: after the planned updates (no held-out images to choose weights by); the last weights are kept."
    if patience is None:
        return ("Stop: after the planned updates, keeping the last weights (early stopping off; without "
                "`--no-early-stop` the best held-out evaluation's weights are kept).")
    return (f"Stop: after the planned updates, or earlier when the held-out accuracy (ties: the loss) has not improved "
            f"for {patience} evaluations (one after each epoch); the output is the best evaluation's weights. The held-"
            "out images choose them, so the held-out accuracy printed at the end is optimistic. `--no-early-stop` "
            "trains every update and keeps the last weights.")


def warn_about_update_size(plan, recipe, learning_rate):
    """Warn when the updates hold 4x or more fewer images than asked, at a learning rate chosen for the larger ones.

    The small-folder cut of the recipe's update (a tenth of the folder) is
    said in the plan line and measured (docs/finetuning.md), so it is not
    warned about; an update cut because an epoch is shorter than it is.
    """
    asked = plan["asked_images_per_update"]
    if not asked or plan["images_per_update"] * 4 > asked or plan["update_cut_by"] != "short epoch":
        return
    rate = RECIPES[recipe]["learning_rate"] if learning_rate is None else learning_rate
    notices.warn(
        f"Updates of {plan['images_per_update']} images instead of {asked}: {plan['smaller_update']}. The learning "
        f"rate {rate:g} was {'chosen' if learning_rate is not None else 'tuned by the recipe'} for updates of {asked} "
        f"images, {asked / plan['images_per_update']:.1f}x more: lower it (`--learning-rate`), count the run in "
        "updates instead of epochs (`--steps`), or ask for the update size an epoch holds "
        "(`--effective-batch-size`).",
    )


# The estimate before training (`TimeEstimate`) times the model on the
# first held-out batch (an evaluation, whose compilation the first epoch's
# held-out evaluation reuses) and counts the rest from it:
# - a training step as this many forward passes per image: the backward pass
#   is about twice the forward's arithmetic (Kaplan et al. 2020, "Scaling
#   laws": 6N against 2N operations per token);
TRAIN_STEP_FORWARDS = 3
# - compiling the training step as this many times compiling the evaluation
#   (jax, a one-block ViT-Ti/16 at 32 px on the shared 2-core host,
#   2026-11-28, `JAX_LOG_COMPILES=1`: XLA compiled the training step in
#   24.7 s and the evaluation step in 5.9 s, 4.2x; torch compiles nothing
#   and measures about no compilation);
TRAIN_COMPILE_EVALUATIONS = 4
# - writing weights and optimizer state at this many bytes a second (each
#   epoch's backup, each new best, the output).
SAVE_BYTES_PER_SECOND = 100e6


def estimate_run_seconds(timing, plan, batch_size, num_images, held_out_images, first_epoch=0, state_bytes=0,
                         keeps_best=False):
    """Seconds the rest of a fine-tune takes, counted from one timed held-out batch.

    Args:
        timing: dict of the timed held-out batch (`time_held_out_batch`):
            `first` (seconds of its first evaluation, compilation
            included), `second` (of its second), `load` (of reading and
            decoding it) and `images` (in it).
        plan: dict from `plan_updates`.
        batch_size: int. Images per step.
        num_images: int. Training images (one pass).
        held_out_images: int. Images of each held-out evaluation.
        first_epoch: int. Epochs already done (a resumed run).
        state_bytes: int. Bytes of the weights (each save) and, twice as
            many with the optimizer's, of each epoch's backup.
        keeps_best: bool. Whether each epoch may also save the best weights.

    Returns:
        A dict of seconds: `total`, and its parts `compile`, `training`,
        `evaluation`, `saving`.
    """
    images = max(1, timing["images"])
    load = timing["load"] / images
    forward = max(0.0, timing["second"] - timing["load"]) / images
    evaluation_compile = max(0.0, timing["first"] - timing["second"])
    epochs = max(0, plan["epochs"] - first_epoch)
    steps = plan["steps_per_epoch"]
    step = batch_size * (TRAIN_STEP_FORWARDS * forward + load)
    # A last batch smaller than the others is another shape: compiled again (jax, XLA), once.
    partial_batch = steps * batch_size > plan["passes"] * num_images
    partial_held_out = held_out_images > images and held_out_images % images
    compiling = evaluation_compile * (TRAIN_COMPILE_EVALUATIONS * (2 if partial_batch else 1)
                                      + (1 if partial_held_out else 0)) if epochs else 0.0
    saves_per_epoch = 2 + (1 if keeps_best else 0)  # the backup (weights and optimizer state), a new best
    parts = {"compile": compiling, "training": epochs * steps * step,
             "evaluation": epochs * held_out_images * (forward + load),
             "saving": (epochs * saves_per_epoch + 1) * state_bytes / SAVE_BYTES_PER_SECOND}
    return {"total": sum(parts.values()), **parts}


def time_held_out_batch(model, probe, clock=time.perf_counter):
    """Evaluate `model` on `probe` (a one-batch dataset) twice and read it once, each timed.

    The first evaluation compiles the evaluation step (which the run's own
    held-out evaluations then reuse); the second times the step alone. The
    model's metrics are reset after, so the epoch that follows counts only
    its own batches.

    Returns:
        A dict: `first`, `second`, `load` (seconds) and `images`.
    """
    start = clock()
    images = len(probe[0][1])
    load = clock() - start
    start = clock()
    model.evaluate(probe, verbose=0)
    first = clock() - start
    start = clock()
    model.evaluate(probe, verbose=0)
    second = clock() - start
    # Keras resets the metrics before `on_epoch_begin`, where this runs: without this reset the held-out
    # batch's accuracy would be counted into the first epoch's training accuracy.
    model.reset_metrics()
    return {"first": first, "second": second, "load": load, "images": images}


def describe_estimate(seconds):
    """The line `finetune` prints before training: the whole run's time and what the estimate assumes."""
    return (f"Time: about {format_duration(seconds['total'])} for the planned updates on this machine, evaluations "
            f"and saves included (timed on one held-out batch: {format_duration(seconds['training'])} training, "
            f"{format_duration(seconds['evaluation'])} held-out evaluations, {format_duration(seconds['compile'])} "
            f"compiling, {format_duration(seconds['saving'])} saving; a training step counted as "
            f"{TRAIN_STEP_FORWARDS} forward passes); less if it stops early.")


class TimeEstimate(keras.callbacks.Callback):
    """Prints how long the run will take: before its first update, then once the first updates are timed.

    Before the first update (with `estimate`, a callable `(model,
    first_epoch)` returning `estimate_run_seconds`' dict): the whole run,
    counted from a timed held-out batch. Then, from the updates
    themselves: the first batch (which compiles the step) and the first
    epoch's end (which compiles the evaluation) are left out of the
    timing. On a folder of many batches the running estimate comes after
    `window` batches of the first epoch; on a small one, after whole
    epochs of at least `window` batches in all, so each epoch's evaluation
    and checkpoint are counted.
    """

    def __init__(self, epochs, steps_per_epoch, window=10, printer=print, may_stop_early=False, estimate=None):
        super().__init__()
        self.epochs, self.steps_per_epoch, self.window, self.printer = epochs, steps_per_epoch, window, printer
        self.may_stop_early, self.estimate = may_stop_early, estimate
        self.first_epoch = self.start = None
        self.batches = 0
        self.done = False
        self.before = None  # the estimate made before the first update, `estimate_run_seconds`' dict

    def on_epoch_begin(self, epoch, logs=None):
        if self.first_epoch is None:
            self.first_epoch = epoch
            if self.estimate is not None and epoch < self.epochs:
                self.before = self.estimate(self.model, epoch)
                self.printer(describe_estimate(self.before))
        elif self.start is None and not self.done:  # small folder: time from the second epoch's start
            self.start, self.batches = time.perf_counter(), 0
        self.epoch = epoch

    def on_epoch_end(self, epoch, logs=None):
        if self.done or self.start is None or self.steps_per_epoch > self.window + 1:
            return
        if self.batches >= self.window or epoch + 1 == self.epochs:
            seconds_per_epoch = (time.perf_counter() - self.start) / (epoch - self.first_epoch)
            self._report(seconds_per_epoch * (self.epochs - epoch - 1))

    def on_train_batch_end(self, batch, logs=None):
        if self.done:
            return
        self.batches += 1
        if self.steps_per_epoch <= self.window + 1 or self.epoch != self.first_epoch:
            return
        if self.start is None:
            self.start, self.batches = time.perf_counter(), 0
        elif self.batches == self.window:
            per_batch = (time.perf_counter() - self.start) / self.window
            left = self.steps_per_epoch - batch - 1 + (self.epochs - self.epoch - 1) * self.steps_per_epoch
            self._report(per_batch * left)

    def _report(self, seconds):
        self.done = True
        # A new line first: Keras' progress bar is mid-line when a callback runs.
        early = ", less if it stops early" if self.may_stop_early else ""
        self.printer(f"\nTime: about {format_duration(seconds)} more on this machine (timed on the first updates"
                     f"{early}).")


def format_duration(seconds):
    """`42 s`, `3 min`, `1 h 20 min`: a rounded duration for an estimate."""
    if seconds < 90:
        return f"{max(1, round(seconds))} s"
    minutes = round(seconds / 60)
    return f"{minutes} min" if minutes < 60 else f"{minutes // 60} h {minutes % 60} min"


# ImageNet-1k's training images, the smallest data set the paper pre-trains
# on (section 4.2, figure 3): trained on it alone, ViTs trail ResNets of the
# same cost and the larger ViTs do worse than the smaller ones; they overtake
# from ImageNet-21k (14M) and JFT (300M). Training from scratch on fewer
# images than this goes against the paper's own finding, so it is said once.
MIN_IMAGES_FROM_SCRATCH = 1_281_167


def warn_about_training_from_scratch(variant, num_images, num_classes):
    """Warn, once per run, that a ViT trained from scratch on fewer than `MIN_IMAGES_FROM_SCRATCH` images learns little."""
    if num_images >= MIN_IMAGES_FROM_SCRATCH:
        return
    notices.warn(
        f"Training {variant} from scratch on {num_images:,} images of {num_classes} classes. ViTs need large data "
        f"or pre-training: the paper pre-trains on 1.3M to 300M images, and below ImageNet-1k's "
        f"{MIN_IMAGES_FROM_SCRATCH:,} they trail ResNets. On a 120-image, 3-class folder, ViT-Ti/16 from scratch "
        "reached 54% held-out accuracy, ViT-Ti/8 with AdamW for 30 epochs 75%. What helps: start from pre-trained "
        "weights (`preset=...` / `--preset`, e.g. vit_ti16_augreg_in21k), a hybrid variant whose ResNet stem "
        "learns from less data (`variant=\"R26+ViT-S/32\"`), or pre-train on the folder first "
        "(`keras-vit pretrain`) and fine-tune that model (`--preset model.keras`)."
    )


def check_finetunable(model):
    """Refuse a model whose fine-tuning would silently train almost nothing: one with int8 weights.

    Keras' int8 kernels are not trainable: fine-tuning a model from
    `keras-vit quantize` would train the head, norms and biases and leave
    every quantized kernel frozen. Refused rather than warned: the result
    would be a model that looks fine-tuned and is not, and the fix (train
    the float model, quantize after) loses nothing. LoRA on int8 kernels is
    refused too: keras_vit does not test it.
    """
    quantized = getattr(model, "quantized_layers", dict)()
    if quantized:
        raise ArgumentError(
            f"{{name}} holds an int8-quantized model ({len(quantized)} quantized layers, e.g. "
            f"{sorted(quantized)[0]!r}); int8 kernels do not train, so fine-tuning would leave the backbone "
            "frozen. Fine-tune the float model, then quantize the result (`keras-vit quantize`).", "preset",
        )


def backbone_at_size(backbone, image_size):
    """`backbone` at `image_size` (position embeddings resampled); itself when the size already matches.

    Args:
        backbone: a `ViTBackbone`.
        image_size: int, `(height, width)` or `None` (keep the backbone's).

    Returns:
        A `ViTBackbone`.
    """
    if image_size is None or tuple(backbone.image_size) == to_pair(image_size, "image_size"):
        return backbone
    return backbone.with_image_size(image_size)


def load_for_finetuning(num_classes, preset=None, variant=None, image_size=None, num_channels=3, seed=0):
    """The model to fine-tune: a pre-trained (or new) backbone with a new zero-initialised head.

    Args:
        num_classes: int. Classes of the new head.
        preset: str or `None`. A preset name, `hf://` handle, preset
            directory, converted checkpoint (timm `.safetensors`, Google
            `.npz`, Hugging Face directory), or a `.keras` file holding a
            `ViTClassifier`, `ViTBackbone` or `MaskedPatchPredictor` (e.g.
            from `keras-vit pretrain`).
        variant: str or `None`. A variant name (e.g. `"ViT-S/16"`) to train
            from scratch instead.
        image_size: int, pair or `None`. Fine-tuning resolution; another
            size than the pre-training one resamples the position
            embeddings. Defaults to the preset's (224 for a variant).
        num_channels: int. Channels of a model built from `variant`.
        seed: int. Seeds the new weights.

    Returns:
        A `ViTClassifier` with `num_classes` outputs (softmax).
    """
    if (preset is None) == (variant is None):
        raise ValueError("Give exactly one of `preset` (pre-trained weights) or `variant` (from scratch).")
    set_random_seed(seed)
    if variant is not None:
        return ViTClassifier.from_variant(variant, image_size=image_size or 224, num_channels=num_channels,
                                          num_classes=num_classes)
    # One read of any handle; a stored classifier keeps its configuration (resized) under a new head.
    model = load_model(preset, purpose="finetune", target="classifier", image_size=image_size,
                       num_classes=num_classes)
    return model.with_head(num_classes)


def finetune(
    data_dir,
    preset=None,
    variant=None,
    image_size=None,
    recipe="paper",
    epochs=None,
    steps=None,
    batch_size=32,
    learning_rate=None,
    weight_decay=None,
    effective_batch_size="recipe",
    validation_dir=None,
    validation_split=0.2,
    augment=None,
    output=None,
    run_dir="auto",
    seed=0,
    on_bad_file="error",
    workers=2,
    callbacks=(),
    verbose=1,
    lora_rank=None,
    remat=False,
    early_stop=True,
    patience=DEFAULT_PATIENCE,
):
    """Fine-tune a ViT on a class-per-subfolder image folder.

    Args:
        data_dir: str. One subfolder per class (JPEG, PNG, BMP, GIF, any
            size; converted to the model's channels and size).
        preset: str or `None`. Where the pre-trained weights come from (see
            `load_for_finetuning`).
        variant: str or `None`. Train this variant from scratch instead.
        image_size: int, pair or `None`. Fine-tuning resolution. Defaults to
            the model's.
        recipe: str. `"paper"` (SGD momentum 0.9, no weight decay, global
            norm clipping 1, cosine decay with linear warm-up, batch 512 by
            gradient accumulation) or `"adamw"`. Defaults to `"paper"`.
        epochs: int or `None`. Passes over the training images. Defaults
            to `None`: the run's length is `steps` updates.
        steps: int or `None`. Optimizer updates of the run (rounded up to
            whole epochs); not with `epochs`. Defaults to `None`: with
            neither, `DEFAULT_UPDATES` (500, the paper's count for its
            smallest fine-tuning sets), and on a small folder updates of
            fewer images than the recipe's (see `plan_updates`).
        batch_size: int. Images per step. Defaults to `32`.
        learning_rate: float or `None`. Peak learning rate; defaults to the
            recipe's (0.01 paper, 1e-3 adamw).
        weight_decay: float or `None`. Defaults to the recipe's.
        effective_batch_size: int, `None` or `"recipe"`. Images per update
            (gradient accumulation); `None` for no accumulation. Defaults to
            the recipe's (512 paper), lowered on a folder of fewer than ten
            updates' worth of images so each epoch makes at least ten
            updates (`plan_updates`).
        validation_dir: str or `None`. A held-out folder with the same class
            subfolders; otherwise `validation_split` of each class is held
            out by `seed`.
        validation_split: float. Defaults to `0.2`.
        augment: `keras_vit.data.AugmentPolicy` or `None`. Defaults to a
            random resized crop and flip.
        output: str or `None`. Directory to write the fine-tuned model to as
            a preset with the class names (checked before training).
        run_dir: str, `None` or `"auto"`. Checkpoint directory; `"auto"` is
            `OUTPUT.run` beside `output` (none without `output`). Running
            the same call again after an interruption resumes.
        seed: int. Defaults to `0`.
        on_bad_file: `"error"` or `"skip"`. Defaults to `"error"`.
        workers: int. Image-decoding threads. Defaults to `2`.
        callbacks: extra Keras callbacks for `fit`. Defaults to none.
        verbose: int. Keras progress-bar mode. Defaults to `1`.
        lora_rank: int or `None`. Train rank-`lora_rank` LoRA updates of
            every block's attention and MLP and the head, the rest frozen
            (`ViTModel.enable_lora`); the saved preset has them merged and
            loads without LoRA. Defaults to `None` (every weight trains).
        remat: bool. Recompute each block's activations in the backward
            pass (`ViTModel.set_remat`): less memory, one more forward
            pass per step. Defaults to `False`.
        early_stop: bool. With held-out images: keep the weights of the
            best held-out evaluation (one after each epoch; accuracy, ties
            broken by the loss), in the run directory's `best/` so a
            resumed run keeps them, stop when `patience` evaluations in a
            row did not improve on it, and return and save those weights.
            The held-out accuracy returned is then that of the images that
            chose the weights: optimistic. `False` trains every planned
            update and keeps the last weights. Defaults to `True`.
        patience: int. Evaluations without improvement before stopping.
            Defaults to `DEFAULT_PATIENCE` (5).

    Returns:
        A dict: `accuracy` and `loss` on the held-out images (`None`
        without any), `model`, `class_names`, `history`, `seconds`,
        `initial_epoch` (epochs restored from a checkpoint), `output`,
        `run_dir`, `accumulation_steps`, `updates` (planned),
        `images_per_update`, `epochs` (planned), `best` (`{"epoch",
        "update", "accuracy", "loss"}` of the evaluation whose weights were
        kept; `None` when the last weights were kept) and `stopped_early`
        (the epochs done when the run stopped early, or `None`).

    Example:

    >>> result = keras_vit.finetune("photos", preset="vit_b16_in21k", image_size=384, output="my_vit")
    >>> result["accuracy"], result["class_names"]
    """
    _check_arguments(data_dir, validation_dir, recipe, epochs, steps, batch_size, learning_rate, weight_decay,
                     effective_batch_size, variant, lora_rank, patience)
    if isinstance(preset, (str, os.PathLike)) and not os.path.exists(preset):
        check_not_killed_save(preset)  # an input a killed save left aside: named with its `mv`, before any claim
    preset_path = preset if preset is not None and os.path.exists(str(preset)) else None
    reads = {"data directory": data_dir, "validation directory": validation_dir, "pre-trained model": preset_path}
    # The output and the run directory are claimed once, here, by the run: never what the run reads (under any
    # name), the output never in the run directory, and a directory only where it replaces nothing of the
    # user's. Every later write (the epoch backup, the log, best/, the output's save) is a method of the run.
    run = open_run(output, run_dir, inputs=reads, output_kind=PRESET_KIND, make_parents=False)
    augment = augment or AugmentPolicy()
    if run.output is None and verbose:  # said after the checks, so a refused run prints only its error
        print("No output (--output): the fine-tuned model will not be saved"
              + (", and no checkpoints are written." if run.directory is None else "."))

    model, class_names = _model_to_finetune(data_dir, preset, variant, image_size, seed, lora_rank, remat)
    backbone = model.backbone
    train, validation = image_folder_datasets(
        data_dir, tuple(backbone.image_size), num_channels=backbone.num_channels, batch_size=batch_size,
        validation_split=validation_split if validation_dir is None else 0, validation_dir=validation_dir,
        seed=seed, augment=augment, class_names=class_names, on_bad_file=on_bad_file, workers=workers,
        transform=backbone,  # the held-out images as the model is evaluated (its source's transform)
    )
    checked_class_indices(train.labels, model.num_classes)
    if variant is not None:
        warn_about_training_from_scratch(variant, len(train.paths), len(class_names))

    # The plan counts the whole folder and the global batch: a job of N processes makes one process's updates.
    plan = plan_updates(len(train.paths), recipe, batch_size, effective_batch_size, epochs, steps,
                        from_scratch=variant is not None)
    steps_per_epoch, accumulation, updates = plan["steps_per_epoch"], plan["accumulation"], plan["updates"]
    asked_epochs, epochs = epochs, plan["epochs"]
    if plan["passes"] > 1 or plan["dropped_batches"]:
        # An epoch of several passes over a small folder, or of whole updates only (a copy: `train` is not changed).
        train = copy.copy(train)
        train.__class__, train.passes, train.batches = RepeatedFolder, plan["passes"], steps_per_epoch
    warn_about_few_updates(updates, epochs, steps_per_epoch, accumulation, len(train.paths))
    warn_about_update_size(plan, recipe, learning_rate)
    optimizer, _ = build_recipe_optimizer(
        recipe, max(1, updates), learning_rate, weight_decay, batch_size,
        accumulation * batch_size if accumulation > 1 else None, steps_per_epoch)
    keeper = None
    if early_stop and validation is not None:
        keeper = BestWeights(steps_per_epoch // accumulation, patience, run, class_names)
        callbacks = [*callbacks, keeper]
    loss = "auto"
    if augment.mixes_labels:
        loss = keras.losses.CategoricalCrossentropy(from_logits=model.activation is None)
    if verbose:
        callbacks = _announce(model, train, validation, plan, recipe, batch_size, asked_epochs, steps, lora_rank,
                              patience if early_stop else None, keeper) + list(callbacks)
    settings = _run_settings(data_dir, validation_dir, preset, variant, model, recipe, steps, plan, batch_size,
                             learning_rate, weight_decay, effective_batch_size, validation_split, seed, augment,
                             class_names, lora_rank, patience if keeper is not None else None)
    fitted = run_training(model, train, optimizer, epochs, run=run, settings=settings, held_out=None,
                          compile_arguments={"loss": loss, "metrics": ["accuracy"]}, validation_data=validation,
                          callbacks=callbacks, verbose=verbose, keep_backup=True)
    best = None if keeper is None else keeper.best
    if keeper is not None:
        keeper.restore_best(model)
    scores = {}
    if validation is not None:  # the weights kept, scored again (a check of the evaluation that chose them)
        scores = {name: float(value) for name, value in engines.current().evaluate(model, validation).items()}
    if verbose and keeper is not None:
        print(describe_outcome(keeper, epochs, steps_per_epoch // accumulation))
    # The job's engine picks the writer; the preset is swapped into place whole.
    run.save_output(lambda claimed: write_preset(model, claimed, class_names=class_names))
    run.finish()  # only now: a kill during the evaluation or the save resumes with every epoch done
    return {
        "accuracy": scores.get("accuracy"), "loss": scores.get("loss"), "model": model, "class_names": class_names,
        "history": fitted["history"], "seconds": fitted["seconds"], "initial_epoch": fitted["initial_epoch"],
        "output": output,
        "run_dir": run.run_dir, "accumulation_steps": accumulation, "updates": updates,
        "images_per_update": plan["images_per_update"], "epochs": epochs, "best": best,
        "stopped_early": None if keeper is None else keeper.stopped_early,
    }


def _announce(model, train, validation, plan, recipe, batch_size, asked_epochs, steps, lora_rank, patience, keeper):
    """Print the run `finetune` is about to make; return the callbacks that report its progress (process 0's)."""
    backbone, accumulation = model.backbone, plan["accumulation"]
    trained = sum(int(np.prod(weight.shape)) for weight in model.trainable_weights)
    lora = f" (LoRA rank {lora_rank}: {trained:,} trainable)" if lora_rank else ""
    print(f"Backend: {keras.backend.backend()}; fine-tuning {model.count_params():,} parameters{lora} at "
          f"{backbone.image_size[0]}x{backbone.image_size[1]} on {len(train.paths)} images of "
          f"{model.num_classes} classes ({len(validation.paths) if validation else 0} held out); recipe "
          f"{recipe}, batch {batch_size}" + (f" x {accumulation} accumulated" if accumulation > 1 else "") + ".")
    print(describe_plan(plan, len(train.paths), batch_size, asked_epochs, steps))
    print(describe_stopping(patience, validation is not None), flush=True)
    if not engines.current().is_chief():
        return []
    estimate = None
    if validation is not None and engines.current().process_count() == 1:
        estimate = _estimate_before_training(validation, plan, batch_size, len(train.paths),
                                             keeps_best=keeper is not None)
    return [TimeEstimate(plan["epochs"], plan["steps_per_epoch"], may_stop_early=keeper is not None,
                         estimate=estimate)]


def _check_arguments(data_dir, validation_dir, recipe, epochs, steps, batch_size, learning_rate, weight_decay,
                     effective_batch_size, variant, lora_rank, patience):
    """`finetune`'s checks of its arguments, before any claim or work."""
    check_training_arguments(epochs, batch_size, learning_rate, weight_decay)
    check_run_length(epochs, steps)
    check_optional_count(lora_rank, "lora_rank")
    check_count(patience, "patience")
    if lora_rank is not None and variant is not None:
        raise ArgumentError(
            "{name} trains low-rank updates of frozen pre-trained weights; with `variant` (from scratch) the "
            "frozen weights would be random and stay so. Give pre-trained weights (`preset`), or leave out "
            "{name} to train every weight.", "lora_rank", lora_rank)
    if recipe not in RECIPES:
        raise ArgumentError(f"Unknown recipe {recipe!r}. Choose one of {sorted(RECIPES)}.")
    if effective_batch_size not in ("recipe", None):
        check_count(effective_batch_size, "effective_batch_size")
    if not os.path.isdir(data_dir):
        raise ArgumentError(f"No such image folder: {quote(data_dir)}. Give a directory with one subfolder per class.")
    if validation_dir is not None and not os.path.isdir(validation_dir):
        raise ArgumentError(f"No such validation folder: {quote(validation_dir)}.")
    check_held_out(data_dir, validation_dir, "validation_dir")


def _model_to_finetune(data_dir, preset, variant, image_size, seed, lora_rank, remat):
    """`(model, class_names)`: the class names first (a cheap directory listing), so the head has the right size."""
    class_names = sorted(name for name in os.listdir(data_dir)
                         if os.path.isdir(os.path.join(data_dir, name)) and not name.startswith("."))
    if len(class_names) < 2:
        raise ValueError(f"{quote(data_dir)} needs at least two class subfolders; found {class_names}.")
    model = load_for_finetuning(len(class_names), preset=preset, variant=variant, image_size=image_size,
                                seed=seed)
    check_finetunable(model)
    if lora_rank is not None:
        model.enable_lora(lora_rank)
    if remat:
        model.set_remat(True)
    return model, class_names


def _run_settings(data_dir, validation_dir, preset, variant, model, recipe, steps, plan, batch_size, learning_rate,
                  weight_decay, effective_batch_size, validation_split, seed, augment, class_names, lora_rank,
                  patience):
    """The run's settings, recorded in its backup's pointer: a resume with others is refused."""
    return {
        "data_dir": os.path.abspath(data_dir), "validation_dir": validation_dir and os.path.abspath(validation_dir),
        "preset": preset, "variant": variant, "image_size": list(model.backbone.image_size), "recipe": recipe,
        "epochs": plan["epochs"], "steps": steps, "passes": plan["passes"], "updates": plan["updates"],
        "batch_size": batch_size, "learning_rate": learning_rate, "weight_decay": weight_decay,
        "effective_batch_size": effective_batch_size, "validation_split": validation_split, "seed": seed,
        "augment": repr(augment), "class_names": class_names, "lora_rank": lora_rank,
        "steps_per_epoch": plan["steps_per_epoch"], "patience": patience,
    }


def _estimate_before_training(validation, plan, batch_size, num_images, keeps_best):
    """`TimeEstimate`'s `estimate`: the run's seconds from its first held-out batch, evaluated and timed."""
    # Its first batch only: a copy (`validation` is not changed) of its own class (one-hot labels under MixUp),
    # one batch long.
    probe = copy.copy(validation)
    probe.__class__ = type("FirstBatch", (type(validation),), {"__len__": lambda self: 1})

    def estimate(model, first_epoch):
        state_bytes = sum(int(np.prod(weight.shape)) * 4 for weight in model.weights)
        return estimate_run_seconds(time_held_out_batch(model, probe), plan, batch_size, num_images,
                                    len(validation.paths), first_epoch, state_bytes, keeps_best)

    return estimate


def describe_outcome(keeper, epochs, updates_per_epoch):
    """The line `finetune` prints after training: which update the output comes from, and why the run ended."""
    done = keeper.last_epoch or 0
    ended = (f"stopped early after epoch {keeper.stopped_early} of {epochs}: {keeper.patience} evaluations without "
             "improvement" if keeper.stopped_early else f"all {epochs} epochs trained")
    if keeper.best is None:
        return f"Kept the last weights (update {done * updates_per_epoch}; {ended})."
    best = keeper.best
    which = "the last epoch's, also" if best["epoch"] == done else "those of"
    return (f"Kept the weights of update {best['update']} (epoch {best['epoch']}), {which} the best held-out "
            f"evaluation of the run: held-out "
            f"accuracy {best['accuracy']:.2%}, loss {best['loss']:.4f}; {ended}.")
