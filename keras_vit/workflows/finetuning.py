"""Fine-tune a ViT on a class-per-subfolder image folder, as the paper does.

`finetune("photos", preset="vit_b16_in21k", image_size=384)` loads the
pre-trained model, replaces its head by a new zero-initialised one (the
paper removes the pre-training head, appendix B.1.1), resamples the position
embeddings to the new resolution, trains with the chosen recipe while
checkpointing every epoch, reports held-out accuracy and writes a preset
that carries the class names.
"""

import math
import os

import keras
import numpy as np

from keras_vit.data import AugmentPolicy, checked_class_indices, image_folder_datasets
from keras_vit.data.image_folder import check_held_out
from keras_vit.distribution import engines
from keras_vit.models.vit_classifier import ViTClassifier
from keras_vit.presets import load_model
from keras_vit.presets.keras_vit_format import PRESET_KIND
from keras_vit.utils.errors import ArgumentError
from keras_vit.utils.files import check_not_nested, claim, quote
from keras_vit.utils.seeds import set_random_seed
from keras_vit.utils.values import check_count, check_optional_count, to_pair
from keras_vit.workflows import notices, optimizers
from keras_vit.workflows.resuming import check_run_dir, default_run_dir, finish_run
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
    epochs=10,
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
        epochs: int. Defaults to `10`.
        batch_size: int. Images per step. Defaults to `32`.
        learning_rate: float or `None`. Peak learning rate; defaults to the
            recipe's (0.01 paper, 1e-3 adamw).
        weight_decay: float or `None`. Defaults to the recipe's.
        effective_batch_size: int, `None` or `"recipe"`. Images per update
            (gradient accumulation); `None` for no accumulation. Defaults to
            the recipe's (512 paper).
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
        `run_dir`, `accumulation_steps`.

    Example:

    >>> result = keras_vit.finetune("photos", preset="vit_b16_in21k", image_size=384, epochs=5,
    ...                             output="my_vit")
    >>> result["accuracy"], result["class_names"]
    """
    check_training_arguments(epochs, batch_size, learning_rate, weight_decay)
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
    check_run_dir(run_dir)
    # The output is claimed once, here: never what the run reads or its run directory (under any name), and a
    # directory only where it replaces nothing of the user's. The save writes through this claim.
    preset_path = preset if preset is not None and os.path.exists(str(preset)) else None
    reads = {"data directory": data_dir, "validation directory": validation_dir, "pre-trained model": preset_path}
    destination = None if output is None else claim(output, PRESET_KIND, inputs={**reads, "run directory": run_dir},
                                                    argument="output", make_parents=False)
    check_not_nested(run_dir, reads, "run_dir")
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
    )
    checked_class_indices(train.labels, model.num_classes)
    if variant is not None:
        warn_about_training_from_scratch(variant, len(train.paths), len(class_names))

    steps_per_epoch = len(train)
    accumulation = recipe_accumulation(recipe, batch_size, effective_batch_size, steps_per_epoch)
    updates = epochs * steps_per_epoch // accumulation
    warn_about_few_updates(updates, epochs, steps_per_epoch, accumulation, len(train.paths))
    optimizer, _ = build_recipe_optimizer(
        recipe, max(1, updates), learning_rate, weight_decay, batch_size, effective_batch_size, steps_per_epoch)
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
    settings = {
        "data_dir": os.path.abspath(data_dir), "validation_dir": validation_dir and os.path.abspath(validation_dir),
        "preset": preset, "variant": variant, "image_size": list(backbone.image_size), "recipe": recipe,
        "epochs": epochs, "batch_size": batch_size, "learning_rate": learning_rate, "weight_decay": weight_decay,
        "effective_batch_size": effective_batch_size, "validation_split": validation_split, "seed": seed,
        "augment": repr(augment), "class_names": class_names, "lora_rank": lora_rank,
    }
    run = run_training(model, train, optimizer, epochs, run_dir=run_dir, settings=settings, held_out=validation,
                       compile_arguments={"loss": loss, "metrics": ["accuracy"]}, validation_data=validation,
                       callbacks=callbacks, verbose=verbose, keep_backup=True)
    scores = run["held_out"] or {}
    if output is not None:  # one writer in a job of several processes; the preset is swapped into place whole
        engines.current().save_for_job(lambda target: model.save_to_preset(target, class_names=class_names),
                                       destination)
    finish_run(run_dir)  # only now: a kill during the evaluation or the save resumes with every epoch done
    return {
        "accuracy": scores.get("accuracy"), "loss": scores.get("loss"), "model": model, "class_names": class_names,
        "history": run["history"], "seconds": run["seconds"], "initial_epoch": run["initial_epoch"], "output": output,
        "run_dir": run_dir, "accumulation_steps": accumulation,
    }
