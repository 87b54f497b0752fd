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
from keras_vit.presets.keras_vit_format import PRESET_KIND
from keras_vit.utils.errors import ArgumentError
from keras_vit.utils.files import claim, quote
from keras_vit.utils.seeds import set_random_seed
from keras_vit.utils.values import check_count, check_optional_count, to_pair
from keras_vit.workflows import notices, optimizers
from keras_vit.workflows.resuming import claim_run, default_run_dir, finish_run
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
    """Warn before training when a run would make fewer than `MIN_UPDATES` optimizer updates.

    Also says when accumulation does not divide an epoch: the last
    `steps_per_epoch % accumulation` batches of an epoch are added to the
    next epoch's first update (Keras' accumulators carry across epochs).
    """
    if updates < MIN_UPDATES:
        notices.warn(
            f"This run makes only {updates} optimizer update(s): {num_images} training images are "
            f"{steps_per_epoch} batch(es) per epoch, and {accumulation} batches are accumulated per update, over "
            f"{epochs} epoch(s). The model will barely change. Accumulate less (`effective_batch_size=None`; "
            "`--effective-batch-size 0` on the command line), use the AdamW recipe (`recipe=\"adamw\"`; "
            "`--recipe adamw`), or train for more epochs.",
        )
    elif steps_per_epoch % accumulation:
        notices.warn(
            f"Gradient accumulation of {accumulation} batches does not divide the {steps_per_epoch} batches of an "
            f"epoch: the last {steps_per_epoch % accumulation} batch(es) of each epoch are carried into the next "
            "epoch's first update.",
        )


# How long a fine-tune runs when neither `epochs` nor `steps` is given: a
# number of optimizer updates, as the paper's table gives its fine-tuning
# runs (500 steps for Pets and Flowers, 2,500 for the 1,000-image VTAB tasks,
# at batch 512), not a number of epochs, which on a small folder means few
# updates (10 epochs of a 96-image folder at 512 images per update: 10).
# Measured on small folders in docs/finetuning.md (benchmarks/small_folder.py).
DEFAULT_UPDATES = 500
# On a folder too small for the recipe's update size, an update holds at
# most this share of the training images (in whole batches, at least one).
MIN_UPDATES_PER_PASS = 10
# Batches an epoch holds at least when the run is counted in updates: on a
# small folder an epoch is several passes over it, so the run's per-epoch
# work (held-out evaluation, checkpoint, log row) stays a small share.
MIN_BATCHES_PER_EPOCH = 25


def check_run_length(epochs, steps):
    """Refuse `epochs` and `steps` together, or either not a positive int."""
    check_optional_count(epochs, "epochs")
    check_optional_count(steps, "steps")
    if epochs is not None and steps is not None:
        raise ArgumentError("Give `epochs` or `steps` (optimizer updates), not both: each sets how long the run "
                            f"is. Received: epochs={epochs!r}, steps={steps!r}")


def plan_updates(num_images, recipe="paper", batch_size=32, effective_batch_size="recipe", epochs=None, steps=None):
    """How long a fine-tune runs, how large its updates and its epochs are.

    The rule (docs/finetuning.md has the measurements behind it):

    - Images per update: the recipe's (512 for `"paper"`, one batch for
      `"adamw"`), or `effective_batch_size` when given. When it is the
      recipe's, at most a tenth of the training images (in whole batches,
      at least one batch): a 96-image folder makes updates of one batch of
      32, not one update per epoch.
    - Length: `epochs` passes when given. Otherwise `steps` updates, or
      `DEFAULT_UPDATES` without either, and an epoch is as many passes over
      a small folder as make `MIN_BATCHES_PER_EPOCH` batches, so the run
      checkpoints, logs and evaluates every few dozen batches, not every
      batch; the epochs are rounded up to whole ones (the run checkpoints
      and resumes by epoch).
    - Accumulated batches divide the epoch's, so no update spans two epochs.

    The plan depends on the global batch and the whole folder only, so a
    job of N processes makes the updates of one process.

    Args:
        num_images: int. Training images (after the held-out split).
        recipe: str. `"paper"` or `"adamw"`.
        batch_size: int. Images per step (the global batch).
        effective_batch_size: int, `None` or `"recipe"`. See `finetune`.
        epochs: int or `None`. Fixed number of passes.
        steps: int or `None`. Optimizer updates wanted (not with `epochs`).

    Returns:
        A dict: `epochs`, `passes` (over the training images per epoch),
        `steps_per_epoch` (batches per epoch), `accumulation` (batches per
        update), `images_per_update`, `updates` (of the whole run).
    """
    check_run_length(epochs, steps)
    batches_per_pass = max(1, math.ceil(num_images / batch_size))
    passes = 1
    if epochs is None:  # a run shorter than an epoch of MIN_BATCHES_PER_EPOCH is one epoch of about its length
        wanted = DEFAULT_UPDATES if steps is None else steps
        passes = max(1, math.ceil(min(MIN_BATCHES_PER_EPOCH, wanted) * batch_size / num_images))
    steps_per_epoch = max(1, math.ceil(passes * num_images / batch_size))
    accumulation = recipe_accumulation(recipe, batch_size, effective_batch_size, steps_per_epoch)
    if effective_batch_size == "recipe":
        accumulation = min(accumulation, max(1, batches_per_pass // MIN_UPDATES_PER_PASS))
    # The largest count up to that which divides the epoch's batches.
    accumulation = max(k for k in range(1, accumulation + 1) if steps_per_epoch % k == 0)
    if epochs is None:
        epochs = max(1, math.ceil(wanted * accumulation / steps_per_epoch))
    updates = epochs * steps_per_epoch // accumulation
    return {"epochs": epochs, "passes": passes, "steps_per_epoch": steps_per_epoch, "accumulation": accumulation,
            "images_per_update": min(num_images * passes, accumulation * batch_size), "updates": updates}


class RepeatedFolder(ImageFolderDataset):
    """An `ImageFolderDataset` whose epoch is `passes` passes over the images, each in its own order.

    Pass `r` of epoch `e` follows the permutation of `(seed, e * passes + r)`,
    the order a one-pass dataset reads in its epoch `e * passes + r`; batches
    run on across passes. With `passes=1` it reads what its base reads.
    """

    passes = 1

    def _num_rows(self):
        return len(self.paths) * self.passes

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
    else:
        why = f"the default {DEFAULT_UPDATES} updates, rounded up to whole epochs; `steps` or `epochs` sets another"
    per_update = (f"{plan['accumulation']} batches of {batch_size} accumulated" if plan["accumulation"] > 1
                  else f"one batch of up to {batch_size}")
    epoch = f"{plan['passes']} passes over" if plan["passes"] > 1 else "one pass over"
    return (f"Plan: {plan['updates']} optimizer updates of {plan['images_per_update']} images each ({per_update}) "
            f"in {plan['epochs']} epochs, each {epoch} the {num_images} training images ({why}).")


class TimeEstimate(keras.callbacks.Callback):
    """Prints, once the first updates are timed, about how long the rest of the run will take.

    The first batch (which compiles the step) and the first epoch's end
    (which compiles the evaluation) are left out of the timing. On a folder
    of many batches the estimate comes after `window` batches of the first
    epoch; on a small one, after whole epochs of at least `window` batches
    in all, so each epoch's evaluation and checkpoint are counted.
    """

    def __init__(self, epochs, steps_per_epoch, window=10, printer=print):
        super().__init__()
        self.epochs, self.steps_per_epoch, self.window, self.printer = epochs, steps_per_epoch, window, printer
        self.first_epoch = self.start = None
        self.batches = 0
        self.done = False

    def on_epoch_begin(self, epoch, logs=None):
        if self.first_epoch is None:
            self.first_epoch = epoch
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
        self.printer(f"\nTime: about {format_duration(seconds)} more on this machine (timed on the first updates).")


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

    Returns:
        A dict: `accuracy` and `loss` on the held-out images (`None`
        without any), `model`, `class_names`, `history`, `seconds`,
        `initial_epoch` (epochs restored from a checkpoint), `output`,
        `run_dir`, `accumulation_steps`, `updates`, `images_per_update`,
        `epochs`.

    Example:

    >>> result = keras_vit.finetune("photos", preset="vit_b16_in21k", image_size=384, output="my_vit")
    >>> result["accuracy"], result["class_names"]
    """
    check_training_arguments(epochs, batch_size, learning_rate, weight_decay)
    check_run_length(epochs, steps)
    check_optional_count(lora_rank, "lora_rank")
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
    if run_dir == "auto":
        run_dir = default_run_dir(output)
    # The output and the run directory are claimed once, here: never what the run reads (under any name), the
    # output never in the run directory, and a directory only where it replaces nothing of the user's. The save,
    # the epoch backup and the log write through these claims.
    preset_path = preset if preset is not None and os.path.exists(str(preset)) else None
    reads = {"data directory": data_dir, "validation directory": validation_dir, "pre-trained model": preset_path}
    destination = None if output is None else claim(output, PRESET_KIND, inputs={**reads, "run directory": run_dir},
                                                    argument="output", make_parents=False)
    run = claim_run(run_dir, inputs=reads)
    augment = augment or AugmentPolicy()
    if output is None and verbose:  # said after the checks, so a refused run prints only its error
        print("No output (--output): the fine-tuned model will not be saved"
              + (", and no checkpoints are written." if run_dir is None else "."))

    # Class names first (a cheap directory listing), so the head has the right size.
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
    plan = plan_updates(len(train.paths), recipe, batch_size, effective_batch_size, epochs, steps)
    steps_per_epoch, accumulation, updates = plan["steps_per_epoch"], plan["accumulation"], plan["updates"]
    asked_epochs, epochs = epochs, plan["epochs"]
    if plan["passes"] > 1:  # an epoch of several passes over a small folder (a copy: `train` is not changed)
        train = copy.copy(train)
        train.__class__, train.passes = RepeatedFolder, plan["passes"]
    warn_about_few_updates(updates, epochs, steps_per_epoch, accumulation, len(train.paths))
    optimizer, _ = build_recipe_optimizer(
        recipe, max(1, updates), learning_rate, weight_decay, batch_size,
        accumulation * batch_size if accumulation > 1 else None, steps_per_epoch)
    loss = "auto"
    if augment.mixes_labels:
        loss = keras.losses.CategoricalCrossentropy(from_logits=model.activation is None)
    if verbose:
        trained = sum(int(np.prod(weight.shape)) for weight in model.trainable_weights)
        lora = f" (LoRA rank {lora_rank}: {trained:,} trainable)" if lora_rank else ""
        print(f"Backend: {keras.backend.backend()}; fine-tuning {model.count_params():,} parameters{lora} at "
              f"{backbone.image_size[0]}x{backbone.image_size[1]} on {len(train.paths)} images of "
              f"{len(class_names)} classes ({len(validation.paths) if validation else 0} held out); recipe "
              f"{recipe}, batch {batch_size}" + (f" x {accumulation} accumulated" if accumulation > 1 else "") + ".")
        print(describe_plan(plan, len(train.paths), batch_size, asked_epochs, steps), flush=True)
        if engines.current().is_chief():
            callbacks = [TimeEstimate(epochs, steps_per_epoch), *callbacks]
    settings = {
        "data_dir": os.path.abspath(data_dir), "validation_dir": validation_dir and os.path.abspath(validation_dir),
        "preset": preset, "variant": variant, "image_size": list(backbone.image_size), "recipe": recipe,
        "epochs": epochs, "steps": steps, "passes": plan["passes"], "updates": updates, "batch_size": batch_size, "learning_rate": learning_rate, "weight_decay": weight_decay,
        "effective_batch_size": effective_batch_size, "validation_split": validation_split, "seed": seed,
        "augment": repr(augment), "class_names": class_names, "lora_rank": lora_rank,
    }
    fitted = run_training(model, train, optimizer, epochs, run=run, settings=settings, held_out=validation,
                          compile_arguments={"loss": loss, "metrics": ["accuracy"]}, validation_data=validation,
                          callbacks=callbacks, verbose=verbose, keep_backup=True)
    scores = fitted["held_out"] or {}
    if output is not None:  # one writer in a job of several processes; the preset is swapped into place whole
        engines.current().save_for_job(lambda target: model.save_to_preset(target, class_names=class_names),
                                       destination)
    finish_run(run)  # only now: a kill during the evaluation or the save resumes with every epoch done
    return {
        "accuracy": scores.get("accuracy"), "loss": scores.get("loss"), "model": model, "class_names": class_names,
        "history": fitted["history"], "seconds": fitted["seconds"], "initial_epoch": fitted["initial_epoch"],
        "output": output,
        "run_dir": run_dir, "accumulation_steps": accumulation, "updates": updates,
        "images_per_update": plan["images_per_update"], "epochs": epochs,
    }
