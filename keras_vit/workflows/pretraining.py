"""Masked patch prediction recipes: pre-train a backbone, load it for fine-tuning."""

import time

import keras

from keras_vit.models.masked_patch_predictor import MaskedPatchPredictor
from keras_vit.models.vit_backbone import ViTBackbone
from keras_vit.utils.seeds import set_random_seed
from keras_vit.workflows.training import DIGITS_MODEL, build_optimizer, check_training_arguments, fit_resumable


def build_digits_predictor(seed=0, target="mean_color", corruption_rate=0.5, mask_rate=0.8,
                           random_rate=0.1, color_bits=3, **overrides):
    """A `MaskedPatchPredictor` around the digits demo's backbone (`DIGITS_MODEL`).

    Args:
        seed: int. Seeds the weights and the corruption. Defaults to `0`.
        target, corruption_rate, mask_rate, random_rate, color_bits: see
            `MaskedPatchPredictor`.
        **overrides: Replace `DIGITS_MODEL` entries (backbone arguments).

    Returns:
        A `MaskedPatchPredictor`.
    """
    set_random_seed(seed)
    config = {**DIGITS_MODEL, **overrides}
    backbone = ViTBackbone.from_variant(config.pop("variant"), **config)
    return MaskedPatchPredictor(
        backbone, corruption_rate=corruption_rate, mask_rate=mask_rate, random_rate=random_rate,
        target=target, color_bits=color_bits, seed=seed,
    )


def pretrain_predictor(
    predictor,
    images,
    validation_images=None,
    epochs=60,
    batch_size=64,
    learning_rate=1e-3,
    weight_decay=0.05,
    seed=0,
    verbose=1,
    run_dir=None,
    settings=None,
    keep_backup=False,
):
    """Compile and fit a `MaskedPatchPredictor` on unlabeled images.

    Args:
        predictor: `MaskedPatchPredictor`.
        images: array `(n, height, width, channels)` of raw pixels, or a
            `keras.utils.PyDataset` of image batches (e.g. an
            `ImageFolderDataset` without labels).
        validation_images: optional held-out images; their masked patch loss
            and accuracy are reported. Defaults to `None`.
        epochs: int. Defaults to `60`.
        batch_size: int. Defaults to `64`.
        learning_rate: float. Peak AdamW learning rate (linear warm-up,
            cosine decay). Defaults to `1e-3`.
        weight_decay: float. Defaults to `0.05`.
        seed: int. Seeds Keras, numpy and the backend. Defaults to `0`.
        verbose: int. Keras progress-bar mode. Defaults to `1`.
        run_dir: str or `None`. Checkpoint every epoch here and resume from
            it (see `keras_vit.workflows.training.fit_resumable`). Defaults to `None`.
        settings: dict. The run's settings, checked when resuming.
        keep_backup: bool. Keep the epoch backup for a caller that saves
            the model afterwards and then calls `finish_run(run_dir)`.

    Returns:
        A dict with the last epoch's `loss` (and `accuracy` for class
        targets), `seconds` of fitting, the Keras `history`, and
        `validation` (a dict of held-out metrics, or `None`).
    """
    from keras_vit.data.image_folder import ArrayBatches

    check_training_arguments(epochs, batch_size, learning_rate, weight_decay)
    set_random_seed(seed)
    data = images if isinstance(images, keras.utils.PyDataset) else ArrayBatches(images, None, batch_size, seed=seed)
    steps = epochs * len(data)
    predictor.compile(optimizer=build_optimizer(learning_rate, weight_decay, steps))
    start = time.perf_counter()
    history, initial_epoch = fit_resumable(predictor, data, epochs, run_dir=run_dir, settings=settings,
                                           keep_backup=keep_backup,
                                           verbose=verbose)
    seconds = time.perf_counter() - start
    result = {name: float(values[-1]) for name, values in history.history.items()}
    result.update(seconds=seconds, history=history, validation=None, initial_epoch=initial_epoch)
    if validation_images is not None:
        result["validation"] = {
            name: float(value)
            for name, value in predictor.evaluate(validation_images, batch_size=256, verbose=0, return_dict=True).items()
        }
    return result


def load_pretrained_backbone(path, purpose="load_pretrained_backbone"):
    """The `ViTBackbone` of a pre-trained model, ready for a classifier.

    Any model handle the one reader reads (`keras_vit.presets.load_model`):
    a `.keras` file (a saved `MaskedPatchPredictor` from `keras-vit
    pretrain`, a `ViTClassifier` or a `ViTBackbone`), a preset directory, a
    converted checkpoint or a preset name.

    Args:
        path: str. The model handle.
        purpose: str. Who asks, named when the handle holds another kind of
            model.

    Returns:
        A `ViTBackbone` with the saved weights.
    """
    from keras_vit.presets import load_model

    return load_model(path, purpose=purpose, target="backbone")
