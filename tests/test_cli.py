"""The `keras-vit` command line, run in-process."""

import os

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit import cli


def test_help_lists_commands(capsys):
    assert cli.main([]) == 2
    out = capsys.readouterr().out
    for command in ("train", "pretrain", "convert", "presets", "predict"):
        assert command in out


def test_train_runs_on_digits_and_saves(tmp_path, capsys):
    path = str(tmp_path / "digits.keras")
    assert cli.main(["train", "--epochs", "1", "--save", path]) == 0
    out = capsys.readouterr().out
    assert "Held-out accuracy:" in out and "360 held-out digits" in out
    model = keras.saving.load_model(path)
    assert isinstance(model, keras_vit.ViTClassifier)
    assert model.predict(np.zeros((2, 8, 8, 1), "float32"), verbose=0).shape == (2, 10)


def test_train_passes_its_recipe_to_the_optimizer(monkeypatch, capsys):
    """The flags reach the AdamW that fits the model (the demo's defaults, and overrides)."""
    seen = []
    original = keras.optimizers.AdamW

    def spy(*args, **kwargs):
        seen.append(kwargs)
        return original(*args, **kwargs)

    monkeypatch.setattr(keras.optimizers, "AdamW", spy)
    assert cli.main(["train", "--epochs", "1"]) == 0
    assert seen[-1]["weight_decay"] == pytest.approx(0.3)
    assert cli.main(["train", "--epochs", "1", "--weight-decay", "0.05", "--learning-rate", "1e-3"]) == 0
    assert seen[-1]["weight_decay"] == pytest.approx(0.05)
    assert seen[-1]["learning_rate"].warmup_target == pytest.approx(1e-3)


def test_digits_split_is_stratified_and_seeded():
    from keras_vit.data import load_digits_split

    (x_train, y_train), (x_test, y_test) = load_digits_split(seed=0)
    assert x_train.shape == (1437, 8, 8, 1) and x_test.shape == (360, 8, 8, 1)
    assert x_train.max() == 255.0 and x_train.min() == 0.0
    # Every class keeps its share (stratified): 1797 digits, about 10% per class.
    counts = np.bincount(y_test, minlength=10)
    assert counts.min() >= 35 and counts.max() <= 37
    (_, y_again), _ = load_digits_split(seed=0)
    np.testing.assert_array_equal(y_train, y_again)


def test_version_and_error_style(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--version"])
    assert exit_info.value.code == 0 and capsys.readouterr().out.startswith("keras-vit ")
    assert cli.main(["presets", "--with-head", "--backbones"]) == 2
    assert capsys.readouterr().err.startswith("keras-vit presets: error: ")
