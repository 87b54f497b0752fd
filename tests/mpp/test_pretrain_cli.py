"""`keras-vit pretrain` then `keras-vit train --init-from`, on a few digits with a tiny backbone."""

import keras
import numpy as np
import pytest
from keras import ops

import keras_vit
import keras_vit.data
import keras_vit.workflows.digits_demo
import keras_vit.workflows.pretraining
from keras_vit import cli

TINY = {"variant": "ViT-Ti/16", "image_size": 8, "num_channels": 1, "patch_size": 2,
        "hidden_dim": 16, "num_layers": 1, "num_heads": 2, "mlp_dim": 32, "dropout": 0.0}


@pytest.fixture
def few_digits(monkeypatch):
    load = keras_vit.data.load_digits_split

    def small_split(seed=0, **kwargs):
        (x_train, y_train), (x_test, y_test) = load(seed=seed, **kwargs)
        return (x_train[:48], y_train[:48]), (x_test[:16], y_test[:16])

    monkeypatch.setattr(keras_vit.data, "load_digits_split", small_split)
    monkeypatch.setattr(keras_vit.workflows.digits_demo, "DIGITS_MODEL", TINY)


@pytest.mark.slow
def test_pretrain_then_fine_tune_from_it(tmp_path, few_digits, capsys):
    path = str(tmp_path / "pretrained.keras")
    assert cli.main(["pretrain", "--epochs", "1", "--batch-size", "16", "--save", path]) == 0
    output = capsys.readouterr().out
    assert "Held-out masked patches: accuracy" in output and "loss" in output

    predictor = keras.saving.load_model(path)
    assert isinstance(predictor, keras_vit.MaskedPatchPredictor)
    assert predictor.backbone.hidden_dim == 16 and predictor.num_classes == 8  # grayscale, 3 bits
    # The saved file holds the model, not the optimizer's state (the epoch backup keeps that for resuming).
    assert getattr(predictor, "optimizer", None) is None and not predictor.compiled
    # `fit(images)` trained the backbone: it left the seed-0 initialisation.
    untrained = keras_vit.workflows.digits_demo.build_digits_predictor(seed=0)
    moved = [
        np.abs(ops.convert_to_numpy(a) - ops.convert_to_numpy(b)).max()
        for a, b in zip(untrained.backbone.trainable_weights, predictor.backbone.trainable_weights)
    ]
    assert min(moved) > 0

    saved_model = str(tmp_path / "classifier.keras")
    assert cli.main(["train", "--init-from", path, "--epochs", "1", "--batch-size", "16", "--save", saved_model]) == 0
    output = capsys.readouterr().out
    assert "Fine-tuning the pre-trained backbone" in output and "Held-out accuracy" in output
    classifier = keras.saving.load_model(saved_model)
    assert isinstance(classifier, keras_vit.ViTClassifier)
    assert classifier.backbone.hidden_dim == 16  # the architecture came from the file
    # Fine-tuning started from the pre-trained weights, not from a new draw:
    # one short epoch moves the position embedding only a little.
    before = ops.convert_to_numpy(predictor.backbone.get_layer("patch_encoder").position_embedding_table)
    after = ops.convert_to_numpy(classifier.backbone.get_layer("patch_encoder").position_embedding_table)
    assert np.abs(after - before).max() < 0.2 * np.abs(before).max()


def test_init_from_rejects_what_it_cannot_use(tmp_path, capsys):
    with pytest.raises(ValueError, match=r"\.keras"):
        keras_vit.workflows.pretraining.load_pretrained_backbone(str(tmp_path / "weights.npz"))
    rgb = keras_vit.ViTBackbone(image_size=8, patch_size=2, num_channels=3, hidden_dim=16, num_layers=1,
                                num_heads=2, mlp_dim=32)
    path = str(tmp_path / "rgb.keras")
    rgb.save(path)
    assert keras_vit.workflows.pretraining.load_pretrained_backbone(path).input_shape == (None, 8, 8, 3)
    assert cli.main(["train", "--init-from", path, "--epochs", "1"]) == 2
    assert "takes 8x8x3 images" in capsys.readouterr().err
