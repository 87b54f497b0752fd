"""The usage errors a new user met in the first hour (issue 32): each is the user's input, so each exits with 2,
prints `keras-vit <command>: error: ...` on stderr naming the flag as typed, prints nothing on stdout, and
stops before any data is read or any model is built.

Each case failed on the code before the fix (exit 1, a Python keyword, an error on stdout, a note before the
error, or the data read first); the comment on each says how.
"""

import types

import pytest

from keras_vit import cli


class Started(BaseException):
    """Raised by a stand-in for the work: not an Exception, so the command line's error handler lets it through."""


@pytest.fixture()
def no_work(monkeypatch):
    """Replaces everything that reads data or builds a model with a stand-in that fails the test."""
    import keras_vit.data
    import keras_vit.workflows.finetuning
    import keras_vit.workflows.pretraining

    def refuse(*args, **kwargs):
        raise Started("the command started work before refusing its arguments")

    monkeypatch.setattr(keras_vit.data, "load_digits_split", refuse)
    monkeypatch.setattr(keras_vit.workflows.finetuning, "finetune", refuse)
    monkeypatch.setattr(keras_vit.workflows.pretraining, "load_pretrained_backbone", refuse)


@pytest.fixture()
def photos(tmp_path):
    from tests.finetune.helpers import write_folder

    return write_folder(str(tmp_path / "photos"), classes=2, per_class=3)


def refused(argv, capsys, command, flag):
    """Runs the command line in-process and checks the one style of a usage error; returns stderr."""
    code = cli.main([str(arg) for arg in argv])
    captured = capsys.readouterr()
    assert code == 2, captured
    assert captured.out == "", captured.out  # the error, and nothing else, and not on stdout
    assert captured.err.startswith(f"keras-vit {command}: error: "), captured.err
    assert flag in captured.err, captured.err
    assert "Traceback" not in captured.err
    return captured.err


# Before: exit 1 ("--validation-split must be in (0, 1)", "--workers must be at least 1"), exit 1 naming
# `image_size=-8` after printing the "No --output" note, exit 1 naming `mixup=-1.0`.
@pytest.mark.parametrize("flag, value, keyword", [
    ("--validation-split", "1.5", "validation_split"),
    ("--workers", "0", "workers="),
    ("--image-size", "-8", "image_size"),
    ("--mixup", "-1", "mixup="),
])
@pytest.mark.one_backend("argument checks that exit before any Keras op")
def test_finetune_numbers_out_of_range_exit_2_naming_the_flag(flag, value, keyword, photos, capsys, no_work):
    err = refused(["finetune", photos, "--variant", "ViT-Ti/16", flag, value], capsys, "finetune", flag)
    assert f"Received: {flag} {value}" in err and keyword not in err


# Before: "error: --init-from takes its architecture from the file; drop --variant." on stdout, no prefix,
# after the digits were loaded.
@pytest.mark.one_backend("argument checks that exit before any Keras op")
def test_train_init_from_with_variant_is_refused_before_the_data(tmp_path, capsys, no_work):
    refused(["train", "--init-from", tmp_path / "m.keras", "--variant", "ViT-Ti/16"], capsys, "train", "--variant")


# Before: exit 2 with "takes 8x8x3 images" on stdout without the prefix, after the digits were loaded.
@pytest.mark.one_backend("argument checks on a saved model file, before the data")
def test_train_init_from_a_backbone_that_cannot_take_digits_is_refused_before_the_data(tmp_path, capsys,
                                                                                        monkeypatch):
    import keras_vit.data
    from keras_vit.models import ViTBackbone

    path = tmp_path / "rgb.keras"
    ViTBackbone(image_size=8, patch_size=2, num_channels=3, hidden_dim=8, num_layers=1, num_heads=2,
                mlp_dim=8).save(path)

    def refuse(*args, **kwargs):
        raise Started("the digits were loaded before the backbone was checked")

    monkeypatch.setattr(keras_vit.data, "load_digits_split", refuse)
    err = refused(["train", "--init-from", path, "--epochs", "1"], capsys, "train", "8x8x3")
    assert "--init-from" in err


# Before: `--output ''` trained first (on a data folder outside the working directory) and was refused after.
@pytest.mark.parametrize("flag", ["--output", "--run-dir", "--validation-dir"])
@pytest.mark.one_backend("argument checks that exit before any Keras op")
def test_finetune_empty_paths_are_refused_before_training(flag, photos, capsys, no_work):
    err = refused(["finetune", photos, "--variant", "ViT-Ti/16", flag, ""], capsys, "finetune", flag)
    assert f"Received: {flag} ''" in err


# Before: exit 0 after training an epoch on one device; the flag was ignored without a word.
@pytest.mark.parametrize("command", ["train", "pretrain", "finetune"])
@pytest.mark.one_backend("argument checks that exit before any Keras op")
def test_model_parallelism_without_distribute_model_is_refused(command, photos, capsys, no_work):
    extra = [photos, "--variant", "ViT-Ti/16"] if command == "finetune" else []
    err = refused([command, *extra, "--model-parallelism", "2"], capsys, command, "--model-parallelism")
    assert "--distribute model" in err


# Before: "No --output: the fine-tuned model will not be saved ..." on stdout, then the error.
@pytest.mark.parametrize("command", ["train", "finetune"])
@pytest.mark.one_backend("argument checks that exit before any Keras op")
def test_unknown_variant_is_refused_before_any_note(command, photos, capsys, no_work):
    extra = [photos] if command == "finetune" else []
    err = refused([command, *extra, "--variant", "ViT-Q/16"], capsys, command, "--variant")
    assert "ViT-Q/16" in err and "ViT-B/16" in err  # what was typed, and what is known


# Before: "seq.keras holds a Sequential; export takes a ViTClassifier or ViTBackbone."
@pytest.mark.one_backend("the refusal of a .keras file of another model, by its config")
def test_quantize_names_itself_when_refusing_another_model(tmp_path, capsys):
    import keras

    path = tmp_path / "seq.keras"
    keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)]).save(path)
    err = refused(["quantize", path, "--out", tmp_path / "q.keras"], capsys, "quantize", "seq.keras")
    assert "quantize takes a ViTClassifier or ViTBackbone" in err and "export takes" not in err
    assert not (tmp_path / "q.keras").exists()


# Before: "--batch-size must be divisible by ..." printed by the command itself, after the digits were loaded.
@pytest.mark.one_backend("argument checks against a stand-in device mesh, before any Keras op")
def test_batch_size_that_does_not_split_over_the_mesh_is_refused_before_the_data(capsys, monkeypatch, no_work):
    import contextlib

    import keras_vit.distribution
    from keras_vit.commands import train

    # Two batch shards, as JAX's DataParallel on two devices has: this host may have one device.
    mesh = types.SimpleNamespace(shape=(2,), axis_names=("batch",))
    two_shards = types.SimpleNamespace(device_mesh=mesh, batch_dim_name="batch", scope=contextlib.nullcontext)
    monkeypatch.setattr(keras_vit.distribution, "distribution_for_backend", lambda *args, **kwargs: two_shards)
    # The job's engine says how many ways each batch is split; this one splits it over the stand-in's two devices.
    two_way_engine = types.SimpleNamespace(is_chief=lambda: True, batch_multiple=lambda: 2,
                                           agree=lambda fingerprint: None)  # a job of one process agrees
    monkeypatch.setattr(keras_vit.distribution.engines, "current", lambda: two_way_engine)
    monkeypatch.setattr(train, "describe_distribution", lambda distribution: "a stand-in mesh of two devices")
    err = refused(["train", "--distribute", "data", "--batch-size", "3"], capsys, "train", "--batch-size")
    assert "Received: --batch-size 3" in err


# Issue 49: flags that contradict each other in `pretrain` are refused as finetune's `--crop-min-area` with
# `--no-crop` is. Before: exit 0 after pre-training on the 8x8 grayscale digits, the flag ignored without a word
# (--image-size and --channels size and convert the images of DATA_DIR only; --color-bits quantises the colour
# classes of the mean_color targets, and --target pixels regresses the pixels instead).
@pytest.mark.parametrize("flags, flag, words", [
    (["--image-size", "16"], "--image-size", "DATA_DIR"),
    (["--channels", "3"], "--channels", "DATA_DIR"),
    (["--target", "pixels", "--color-bits", "4"], "--color-bits", "--target pixels"),
])
@pytest.mark.one_backend("argument checks that exit before any Keras op")
def test_pretrain_contradictory_flags_exit_2_before_any_work(flags, flag, words, tmp_path, capsys, no_work):
    err = refused(["pretrain", *flags, "--save", tmp_path / "mpp.keras"], capsys, "pretrain", flag)
    assert words in err and "Received: " in err
    assert not (tmp_path / "mpp.keras").exists()


# The same flags where they do something are not refused: --image-size and --channels with DATA_DIR, --color-bits
# with a colour target.
@pytest.mark.one_backend("argument checks that exit before any Keras op")
def test_pretrain_flags_that_go_together_are_not_refused(photos, tmp_path, monkeypatch):
    from keras_vit.commands import pretrain

    def started(*args, **kwargs):
        raise Started("the checks passed")

    monkeypatch.setattr(pretrain, "run_distributed", started)
    for flags in (["--image-size", "16", "--channels", "3"], ["--target", "mean_color_4x4", "--color-bits", "2"]):
        with pytest.raises(Started):
            cli.main(["pretrain", photos, *flags, "--save", str(tmp_path / "mpp.keras")])
