"""keras_vit.finetune and `keras-vit finetune`: checks before work, recipes, the written preset."""

import math
import os

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit import cli
from keras_vit.workflows.finetuning import build_recipe_optimizer
from tests.finetune.helpers import tiny_backbone_file, write_folder


@pytest.fixture
def folder(tmp_path):
    return write_folder(str(tmp_path / "photos"), classes=3, per_class=6)


@pytest.mark.parametrize("kwargs, message", [
    ({"epochs": 0}, "`epochs` must be a positive int"),
    ({"batch_size": 0}, "`batch_size` must be a positive int"),
    ({"learning_rate": float("nan")}, "`learning_rate` must be a finite number > 0"),
    ({"recipe": "lamb"}, "Unknown recipe 'lamb'"),
])
def test_arguments_are_checked_before_any_work(folder, kwargs, message):
    with pytest.raises(ValueError, match=message):
        keras_vit.finetune(folder, variant="ViT-Ti/16", **kwargs)


def test_paths_are_checked_before_any_work(folder, tmp_path):
    with pytest.raises(ValueError, match="No such image folder"):
        keras_vit.finetune(str(tmp_path / "missing"), variant="ViT-Ti/16")
    with pytest.raises(ValueError, match="does not exist. Create it first"):
        keras_vit.finetune(folder, variant="ViT-Ti/16", output=str(tmp_path / "no" / "such" / "dir"))
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="exists and is not a directory"):
        keras_vit.finetune(folder, variant="ViT-Ti/16", output=str(tmp_path / "file"))
    with pytest.raises(ValueError, match="is the data directory"):  # the output's one claim names the overlap first
        keras_vit.finetune(folder, variant="ViT-Ti/16", output=folder)
    (tmp_path / "project").mkdir()
    (tmp_path / "project" / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="holds files keras_vit did not write there"):
        keras_vit.finetune(folder, variant="ViT-Ti/16", output=str(tmp_path / "project"))


class _LearningRatesOfUpdates(keras.callbacks.Callback):
    """The learning rate of each batch that applies an optimizer update (its `iterations` goes up)."""

    def on_train_begin(self, logs=None):
        self.used = []

    def on_train_batch_begin(self, batch, logs=None):
        optimizer = self.model.optimizer
        self.before = (int(keras.ops.convert_to_numpy(optimizer.iterations)),
                       float(keras.ops.convert_to_numpy(optimizer.learning_rate)))

    def on_train_batch_end(self, batch, logs=None):
        if int(keras.ops.convert_to_numpy(self.model.optimizer.iterations)) > self.before[0]:
            self.used.append(self.before[1])


def _warmup_cosine(peak, warmup, updates):
    """The learning rate of update u (from 0), by hand: linear warm-up from peak / warmup, cosine after."""
    return [peak * (u + 1) / warmup if u < warmup
            else peak * 0.5 * (1 + math.cos(math.pi * (u + 1 - warmup) / (updates - warmup + 1)))
            for u in range(updates)]


@pytest.mark.parametrize("recipe, updates, accumulation", [
    ("paper", 40, 1), ("paper", 40, 3), ("adamw", 20, 1), ("adamw", 20, 2)])
def test_every_update_of_a_fit_runs_at_a_nonzero_learning_rate(recipe, updates, accumulation):
    """The rate each actual update uses during `fit`, against the warm-up/cosine formula by hand.

    The first update used to run at 0 (a warm-up from zero): on a small
    folder, one update in ten changed nothing. With accumulation (`paper`, 3
    batches per update) this is also the schedule laid out over the run's
    updates, not its batches: Keras evaluates a schedule at every batch, so
    one laid out in updates would reach zero after 1/k of a run accumulating
    k batches. (That was once a test of its own, 80 eager optimizer updates
    read one by one: 8 CPU seconds of the jax pass for what this fit checks;
    the accumulation derived from the batch size is
    `test_paper_recipe_is_sgd_with_clipping_and_accumulation_to_512`'s.)
    """
    batch_size = 2
    optimizer, got_accumulation = build_recipe_optimizer(
        recipe, total_steps=updates, batch_size=batch_size, effective_batch_size=batch_size * accumulation)
    assert got_accumulation == accumulation
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(optimizer=optimizer, loss="mse")
    x = np.random.default_rng(0).normal(size=(updates * accumulation * batch_size, 3)).astype("float32")
    record = _LearningRatesOfUpdates()
    model.fit(x, np.zeros((len(x), 2), "float32"), batch_size=batch_size, epochs=1, shuffle=False, verbose=0,
              callbacks=[record])
    peak = {"paper": 0.01, "adamw": 1e-3}[recipe]
    warmup = 2  # 5% of 40 updates (paper), 10% of 20 (adamw)
    np.testing.assert_allclose(record.used, _warmup_cosine(peak, warmup, updates), rtol=1e-5)


def test_build_optimizer_starts_its_warmup_above_zero():
    from keras_vit.workflows.training import build_optimizer

    optimizer = build_optimizer(1e-3, 0.05, total_steps=30)
    weight = keras.Variable(np.zeros(()), dtype="float32")
    optimizer.build([weight])
    used = []
    for _ in range(30):
        used.append(float(keras.ops.convert_to_numpy(optimizer.learning_rate)))
        optimizer.apply_gradients([(keras.ops.ones(()), weight)])
    np.testing.assert_allclose(used, _warmup_cosine(1e-3, 3, 30), rtol=1e-5)


def test_paper_recipe_is_sgd_with_clipping_and_accumulation_to_512():
    optimizer, accumulation = build_recipe_optimizer("paper", total_steps=100, batch_size=8)
    assert isinstance(optimizer, keras.optimizers.SGD) and accumulation == 64
    config = optimizer.get_config()
    assert config["momentum"] == 0.9 and config["global_clipnorm"] == 1.0
    assert config["weight_decay"] is None and config["gradient_accumulation_steps"] == 64
    schedule = keras.optimizers.schedules.deserialize(config["learning_rate"])
    assert math.isclose(float(schedule(schedule.warmup_steps)), 0.01, rel_tol=1e-6)
    adamw, accumulation = build_recipe_optimizer("adamw", total_steps=10, batch_size=8)
    assert isinstance(adamw, keras.optimizers.AdamW) and accumulation == 1
    assert adamw.get_config()["weight_decay"] == 0.05
    _, accumulation = build_recipe_optimizer("paper", total_steps=10, batch_size=8, effective_batch_size=None)
    assert accumulation == 1


def test_accumulation_never_spans_more_than_an_epoch():
    # 512 images per update on 3 batches per epoch: at most 3 batches are accumulated.
    _, accumulation = build_recipe_optimizer("paper", total_steps=10, batch_size=8, steps_per_epoch=3)
    assert accumulation == 3
    _, accumulation = build_recipe_optimizer("paper", total_steps=10, batch_size=8, steps_per_epoch=100)
    assert accumulation == 64


@pytest.mark.slow
def test_default_recipe_learns_on_a_folder_of_twenty_images(tmp_path):
    # 24 images, 20% held out: 20 training images are one batch of 32 per epoch. The paper recipe's
    # 512-image updates once accumulated 16 such batches, so 5 epochs made no update at all and the
    # loss of the zero-initialised head stayed ln(2) throughout.
    folder = write_folder(str(tmp_path / "small"), classes=2, per_class=12)
    source = tiny_backbone_file(str(tmp_path / "pretrained.keras"), image_size=8, dropout=0.0)
    with pytest.warns(UserWarning, match=r"only 5 optimizer update\(s\).*--recipe adamw"):
        result = keras_vit.finetune(folder, preset=source, epochs=5, verbose=0, workers=1)
    losses = result["history"].history["loss"]
    assert result["accumulation_steps"] == 1
    assert math.isclose(losses[0], math.log(2), rel_tol=1e-4)  # the zero head's first step
    assert losses[-1] < losses[0] - 0.01, losses


@pytest.mark.slow
def test_finetune_at_a_higher_resolution_writes_a_preset_with_class_names(folder, tmp_path):
    source = tiny_backbone_file(str(tmp_path / "pretrained.keras"), image_size=8)
    output = str(tmp_path / "mine")
    result = keras_vit.finetune(folder, preset=source, image_size=16, epochs=2, batch_size=4, recipe="paper",
                                effective_batch_size=8, output=output, verbose=0, workers=1)
    assert result["class_names"] == ["class_0", "class_1", "class_2"]
    assert 0.0 <= result["accuracy"] <= 1.0 and result["accumulation_steps"] == 2
    model = keras_vit.ViTClassifier.from_preset(output)
    assert tuple(model.backbone.image_size) == (16, 16) and model.num_classes == 3
    assert list(model.class_names) == ["class_0", "class_1", "class_2"]
    with open(os.path.join(output + ".run", "log.csv")) as file:
        assert len(file.read().splitlines()) == 3  # header + one row per epoch
    # The head is the paper's new zero-initialised layer: before any step, every class is equally likely.
    fresh = keras_vit.workflows.finetuning.load_for_finetuning(3, preset=source, image_size=16)
    probabilities = np.asarray(fresh.predict(np.zeros((1, 16, 16, 3)), verbose=0))
    np.testing.assert_allclose(probabilities, 1 / 3, atol=1e-6)


@pytest.mark.slow
def test_finetune_command_with_mixup(folder, tmp_path, capsys):
    source = tiny_backbone_file(str(tmp_path / "pretrained.keras"), image_size=8)
    output = str(tmp_path / "out")
    # Batches of 5: the 15 training images make three whole batches. Mixup and CutMix run as Keras layers on
    # each batch, eagerly: on JAX a last batch of another size (3, with batches of 4) compiled all of their
    # ops again, a third of this test's time there.
    code = cli.main(["finetune", folder, "--preset", source, "--epochs", "1", "--batch-size", "5", "--recipe",
                     "adamw", "--mixup", "0.2", "--cutmix", "1.0", "--output", output, "--workers", "1"])
    assert code == 0
    out = capsys.readouterr().out
    assert "Held-out accuracy:" in out and "3 class names" in out
    assert os.path.exists(os.path.join(output, "config.json"))


def test_a_backup_from_other_settings_is_not_resumed(tmp_path):
    from keras_vit.workflows.resuming import POINTER_FILE, SLOTS, EpochCheckpoint, open_run

    model = keras_vit.ViTClassifier.from_variant("ViT-Ti/16", image_size=8, patch_size=4, hidden_dim=16,
                                                 num_layers=1, num_heads=2, mlp_dim=16, num_classes=2)
    model.compile(optimizer="adamw")
    model.optimizer.build(model.trainable_variables)  # as after a first training step
    run_dir = str(tmp_path / "run")
    backup = open_run(run_dir=run_dir)
    checkpoint = EpochCheckpoint(backup, {"epochs": 2, "seed": 0})
    checkpoint.set_model(model)
    checkpoint.on_epoch_end(0, {"loss": 1.0})
    assert sorted(os.listdir(run_dir)) == sorted([".keras_vit.json", POINTER_FILE, SLOTS[0]])
    assert sorted(os.listdir(os.path.join(run_dir, SLOTS[0]))) == [".keras_vit.json", "checkpoint.weights.h5",
                                                                   "state.json"]
    assert EpochCheckpoint(backup, {"epochs": 2, "seed": 0}).restore(model) == 1
    with pytest.raises(ValueError, match="other settings.*changed: epochs"):
        EpochCheckpoint(backup, {"epochs": 3, "seed": 0}).restore(model)
    # A diverged epoch (TerminateOnNaN) does not replace the last good backup.
    model.stop_training = True
    checkpoint.on_epoch_end(1, {"loss": float("nan")})
    assert EpochCheckpoint(backup, {"epochs": 2, "seed": 0}).restore(model) == 1


@pytest.mark.one_backend("an argument check before any work")
def test_lora_with_a_variant_is_refused_before_any_work(folder, monkeypatch, capsys):
    from keras_vit.utils.errors import ArgumentError
    from keras_vit.workflows import finetuning

    monkeypatch.setattr(finetuning, "load_for_finetuning", lambda *a, **k: pytest.fail("model built"))
    with pytest.raises(ArgumentError, match="`lora_rank` trains low-rank updates of frozen pre-trained weights"):
        keras_vit.finetune(folder, variant="ViT-Ti/16", lora_rank=4)
    assert cli.main(["finetune", folder, "--variant", "ViT-Ti/16", "--lora", "4"]) == 2
    assert "--lora" in capsys.readouterr().err


def test_finetuning_an_int8_model_is_refused_with_the_fix(folder, tmp_path, monkeypatch):
    from keras_vit.data import image_folder
    from keras_vit.utils.errors import ArgumentError
    from keras_vit.workflows.quantization import quantize_model

    model = keras_vit.ViTClassifier.from_variant("ViT-Ti/16", image_size=8, patch_size=4, hidden_dim=16,
                                                 num_layers=1, num_heads=2, mlp_dim=32, num_classes=3)
    quantize_model(model).save(str(tmp_path / "int8.keras"))
    monkeypatch.setattr(image_folder, "image_folder_datasets", lambda *a, **k: pytest.fail("images decoded"))
    monkeypatch.setattr(keras_vit.data, "image_folder_datasets", lambda *a, **k: pytest.fail("images decoded"))
    with pytest.raises(ArgumentError, match="`preset` holds an int8-quantized model.*Fine-tune the float model"):
        keras_vit.finetune(folder, preset=str(tmp_path / "int8.keras"), image_size=8)


@pytest.mark.slow
@pytest.mark.one_backend("the warning's words come from the folder and the variant, not the backend")
def test_training_from_scratch_on_a_small_folder_warns_once_with_what_helps(folder):
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        keras_vit.finetune(folder, variant="ViT-Ti/16", image_size=32, epochs=1, batch_size=8, recipe="adamw",
                           run_dir=None, verbose=0, validation_split=0.2)
    scratch = [w for w in caught if "from scratch" in str(w.message)]
    said = [str(w.message) for w in scratch]
    assert len(said) == 1, said
    # 3 classes of 6 images, 20% held out: 15 training images.
    for words in ("ViT-Ti/16 from scratch on 15 images of 3 classes", "54%", "75%", "--preset", "R26+ViT-S/32",
                  "keras-vit pretrain"):
        assert words in said[0], (words, said[0])
    printed = warnings.formatwarning(scratch[0].message, scratch[0].category, "x.py", 1)
    assert printed.count("\n") == 1 and "x.py" not in printed
