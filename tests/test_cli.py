"""The `keras-vit` command line, run in-process."""

import os

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit import cli


@pytest.mark.one_backend("argument parsing: the help text")
def test_help_lists_commands(capsys):
    assert cli.main([]) == 2
    out = capsys.readouterr().out
    for command in ("train", "pretrain", "convert", "presets", "predict"):
        assert command in out


# Before: `train --help` and `pretrain --help` imported Keras and the backend (the digits demo's settings were
# read at import); `predict --help` still does (its --max-pixels default comes from keras_vit.data).
@pytest.mark.slow  # one Python process per command
@pytest.mark.one_backend("what a command's --help imports, before any backend starts")
@pytest.mark.parametrize("command", ["train", "pretrain", "finetune", "fewshot", "export", "quantize", "convert"])
def test_command_help_starts_no_backend(command):
    import subprocess
    import sys

    code = (
        "import contextlib, io, sys\n"
        f"sys.argv = ['keras-vit', {command!r}, '--help']\n"
        "import keras_vit.cli\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        f"    status = keras_vit.cli.main([{command!r}, '--help'])\n"
        "print(status, sorted(m for m in ('keras', 'jax', 'torch', 'tensorflow') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.stdout.split() == ["0", "[]"], (done.stdout, done.stderr)


@pytest.mark.slow  # trains a digits model for an epoch
def test_train_runs_on_digits_and_saves(tmp_path, capsys, monkeypatch):
    from keras_vit.workflows import digits_demo

    # The command's run on all the digits, with the demo's ViT cut to one narrow block: what is checked here is
    # the command (the split, the fit, the held-out score, the saved file), not the demo's model, whose
    # four blocks cost most of this test's time in tracing and steps.
    for key, value in dict(num_layers=1, hidden_dim=16, num_heads=2, mlp_dim=16).items():
        monkeypatch.setitem(digits_demo.DIGITS_MODEL, key, value)
    path = str(tmp_path / "digits.keras")
    assert cli.main(["train", "--epochs", "1", "--save", path]) == 0
    out = capsys.readouterr().out
    assert "Held-out accuracy:" in out and "360 held-out digits" in out
    model = keras.saving.load_model(path)
    assert isinstance(model, keras_vit.ViTClassifier) and model.backbone.num_layers == 1
    assert model.predict(np.zeros((2, 8, 8, 1), "float32"), verbose=0).shape == (2, 10)


def test_train_passes_its_recipe_to_the_optimizer(monkeypatch, capsys):
    """The flags reach the AdamW that fits the model (the demo's defaults, and overrides)."""

    class Built(BaseException):  # not an Exception: the CLI's error handler lets it through
        pass

    seen = []

    def spy(*args, **kwargs):
        # The arguments are what this test is about; stopping here skips the epoch that would follow.
        seen.append(kwargs)
        raise Built

    from keras_vit.workflows import optimizers

    monkeypatch.setattr(optimizers, "AdamW", spy)  # the one builder's AdamW (keras_vit's, Keras' on one process)
    with pytest.raises(Built):
        cli.main(["train", "--epochs", "1"])
    assert seen[-1]["weight_decay"] == pytest.approx(0.3)
    with pytest.raises(Built):
        cli.main(["train", "--epochs", "1", "--weight-decay", "0.05", "--learning-rate", "1e-3"])
    assert seen[-1]["weight_decay"] == pytest.approx(0.05)
    assert seen[-1]["learning_rate"].warmup_target == pytest.approx(1e-3)


@pytest.mark.one_backend("numpy data split")
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


@pytest.mark.one_backend("argument parsing: --version and a usage error, before any Keras op")
def test_version_and_error_style(capsys):
    # main returns the exit status for --version and --help too, as for every error, instead of exiting.
    assert cli.main(["--version"]) == 0 and capsys.readouterr().out.startswith("keras-vit ")
    assert cli.main(["presets", "--with-head", "--backbones"]) == 2
    assert capsys.readouterr().err.startswith("keras-vit presets: error: ")


@pytest.mark.parametrize("flags, message", [
    (["--epochs", "0"], "--epochs must be a positive integer. Received: --epochs 0"),
    (["--batch-size", "0"], "--batch-size must be a positive integer. Received: --batch-size 0"),
    (["--learning-rate", "nan"], "--learning-rate must be a finite number > 0. Received: --learning-rate nan"),
    (["--save", "/nonexistent-dir/model.keras"], "does not exist. Create it first"),
    (["--save", "model.h5"], "--save must name a .keras file. Received: --save model.h5"),
])
@pytest.mark.parametrize("command", ["train", "pretrain"])
@pytest.mark.one_backend("argument checks that exit before any Keras op")
def test_training_commands_check_arguments_before_training(command, flags, message, capsys):
    # The user's input: exit 2, and the message speaks of the flag typed, not a Python keyword.
    assert cli.main([command, *flags]) == 2
    err = capsys.readouterr().err
    assert message in err and "=" not in err.split("Received:")[-1]


# The resume of a `train_classifier` run (`keras-vit train`) is checked in tests/workflows/test_training_run.py
# (test_a_diverged_run_keeps_its_last_good_epoch_and_resumes_to_the_uninterrupted_weights), whose straight
# run serves that module's other test too.


def test_save_is_atomic(tmp_path):
    from keras_vit.workflows.digits_demo import build_digits_classifier
    from keras_vit.workflows.training import save_model

    path = str(tmp_path / "m.keras")
    model = build_digits_classifier(seed=0, num_layers=1, hidden_dim=16, num_heads=2, mlp_dim=16)
    save_model(model, path)
    assert os.listdir(tmp_path) == ["m.keras"]  # no temporary left behind
    assert isinstance(keras.saving.load_model(path), keras_vit.ViTClassifier)


# One rule for every subcommand: 2 when the user's input is wrong (a flag, a path, a folder), 1 when
# the work fails (a damaged file). Each row failed with the other code on 2026-11-23's main.
EXIT_CODES = [
    (["train", "--batch-size", "0"], 2, "--batch-size must be a positive integer. Received: --batch-size 0"),
    (["train", "--variant", "ViT-Q/16"], 2, "--variant must be a known variant: ViT-Ti/8"),
    (["train", "--distribute", "data", "--model-parallelism", "2"], 2,
     "--model-parallelism goes with --distribute model"),
    (["train", "--init-from", "{bad_keras}", "--epochs", "1"], 1, "bad.keras"),
    (["pretrain", "--save", "/nonexistent-dir/m.keras"], 2, "does not exist. Create it first"),
    (["finetune", "{missing}", "--variant", "ViT-Ti/16"], 2, "No such image folder"),
    (["finetune", "{folder}", "--variant", "ViT-Ti/16", "--epochs", "0"], 2, "--epochs must be a positive integer"),
    (["finetune", "{folder}", "--variant", "ViT-Ti/16", "--output", "/nonexistent-dir/out"], 2,
     "does not exist. Create it first"),
    (["finetune", "{folder}", "--variant", "ViT-Ti/16", "--effective-batch-size", "-3"], 2,
     "--effective-batch-size must be an integer >= 0 (0 turns it off). Received: --effective-batch-size -3"),
    (["finetune", "{folder}", "--preset", "{bad_keras}", "--epochs", "1"], 1, "bad.keras"),
    (["fewshot", "{missing}", "--preset", "{bad_keras}"], 2, "No such image folder"),
    (["fewshot", "{folder}", "--preset", "{bad_keras}"], 1, "bad.keras"),
    (["predict", "{missing}.png", "--preset", "vit_b16_augreg_in21k"], 2, "no such image file"),
    (["explain", "{missing}.png", "--preset", "vit_b16_augreg_in21k", "--out", "{tmp}/o"], 2, "no such image file"),
    (["explain", "{text_png}", "--model", "{bad_keras}", "--out", "{tmp}/o"], 1, "bad.keras"),
    (["convert", "{missing}.safetensors", "{tmp}/out.keras"], 2, "no such checkpoint"),
    (["convert", "{bad_safetensors}", "{tmp}/out.keras"], 1, "not a valid safetensors file"),
    (["presets", "--with-head", "--backbones"], 2, "exclude each other"),
    (["export", "{missing}.keras", "--format", "saved_model", "--out", "{tmp}/g"], 2, "No such file or directory"),
    (["export", "{bad_keras}", "--format", "saved_model", "--out", "{tmp}/g"], 1, "bad.keras"),
    (["quantize", "{missing}.keras", "--out", "{tmp}/q.keras"], 2, "No such file or directory"),
    (["quantize", "{bad_keras}", "--out", "{tmp}/q.keras"], 1, "bad.keras"),
]


@pytest.mark.parametrize("argv, code, message", EXIT_CODES, ids=[" ".join(row[0][:3]) for row in EXIT_CODES])
def test_exit_codes_follow_one_rule(argv, code, message, tmp_path, capsys):
    from tests.finetune.helpers import write_folder

    paths = {"tmp": str(tmp_path), "missing": str(tmp_path / "missing"), "bad_keras": str(tmp_path / "bad.keras"),
             "bad_safetensors": str(tmp_path / "bad.safetensors"), "text_png": str(tmp_path / "text.png"),
             "folder": str(tmp_path / "photos")}
    (tmp_path / "bad.keras").write_bytes(b"not a zip archive")
    (tmp_path / "bad.safetensors").write_bytes(b"x" * 16)
    (tmp_path / "text.png").write_text("not an image")
    write_folder(paths["folder"], classes=2, per_class=3)
    assert cli.main([arg.format(**paths) for arg in argv]) == code
    err = capsys.readouterr().err
    assert err.startswith(f"keras-vit {argv[0]}: error: ") and message in err, err
    assert "Traceback" not in err

