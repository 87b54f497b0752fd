"""Masked patch prediction: pre-train a backbone, load it for fine-tuning."""

import keras

from keras_vit.data.image_folder import ArrayBatches
from keras_vit.presets import load_model
from keras_vit.utils.seeds import set_random_seed
from keras_vit.workflows.training import build_optimizer, check_training_arguments, run_training


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
    run=None,
    settings=None,
    keep_backup=False,
):
    """Compile and fit a `MaskedPatchPredictor` on unlabeled images.

    Args:
        predictor: `MaskedPatchPredictor`.
        images: array `(n, height, width, channels)` of raw pixels, or a
            `keras.utils.PyDataset` of image batches (e.g. an
            `ImageFolderDataset` without labels).
        validation_images: optional held-out images (an array or a
            `keras.utils.PyDataset`); their masked patch loss and accuracy
            on the whole set are reported. Defaults to `None`.
        epochs: int. Defaults to `60`.
        batch_size: int. Defaults to `64`.
        learning_rate: float. Peak AdamW learning rate (linear warm-up,
            cosine decay). Defaults to `1e-3`.
        weight_decay: float. Defaults to `0.05`.
        seed: int. Seeds Keras, numpy and the backend. Defaults to `0`.
        verbose: int. Keras progress-bar mode. Defaults to `1`.
        run: the `keras_vit.workflows.resuming.Run` made at the start:
            checkpoint every epoch in its run directory and resume from it
            (see `keras_vit.workflows.training.run_training`). Defaults to
            `None`.
        settings: dict. The run's settings, checked when resuming.
        keep_backup: bool. Keep the epoch backup for a caller that saves
            the model afterwards (`run.save_output`) and then calls
            `run.finish()`.

    Returns:
        A dict with the last epoch's `loss` (and `accuracy` for class
        targets), `seconds` of fitting, the Keras `history`, and
        `validation` (a dict of held-out metrics, or `None`).
    """
    check_training_arguments(epochs, batch_size, learning_rate, weight_decay)
    set_random_seed(seed)
    data = images if isinstance(images, keras.utils.PyDataset) else ArrayBatches(images, None, batch_size, seed=seed)
    held_out = validation_images
    if held_out is not None and not isinstance(held_out, keras.utils.PyDataset):
        held_out = ArrayBatches(held_out, None, batch_size=256, shuffle=False)
    optimizer = build_optimizer(learning_rate, weight_decay, total_steps=epochs * len(data))
    fitted = run_training(predictor, data, optimizer, epochs, run=run, settings=settings,
                          held_out=held_out, verbose=verbose, keep_backup=keep_backup)
    result = {name: float(values[-1]) for name, values in fitted["history"].history.items()}
    result.update(seconds=fitted["seconds"], history=fitted["history"], validation=fitted["held_out"],
                  initial_epoch=fitted["initial_epoch"])
    return result


def load_pretrained_backbone(path, purpose="load_pretrained_backbone"):
    """The `ViTBackbone` of a pre-trained model, ready for a classifier.

    Any model handle the one reader reads (`keras_vit.presets.load_model`):
    a `.keras` file (a saved `MaskedPatchPredictor` from `keras-vit
    pretrain`, a `ViTClassifier` or a `ViTBackbone`), a preset directory, a
    converted checkpoint or a preset name.

    Args:
        path: str. The model handle.
        purpose: str. Who asks, named when the handle holds another model
            class.

    Returns:
        A `ViTBackbone` with the saved weights.
    """
    return load_model(path, purpose=purpose, target="backbone")
