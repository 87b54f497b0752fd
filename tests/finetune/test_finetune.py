"""keras_vit.finetune and `keras-vit finetune`: checks before work, recipes, the written preset."""

import math
import os

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit import cli
from keras_vit.finetuning import build_recipe_optimizer
from tests.finetune.helpers import tiny_backbone_file, write_folder


@pytest.fixture
def folder(tmp_path):
    return write_folder(str(tmp_path / "photos"), classes=3, per_class=6)


@pytest.mark.parametrize("kwargs, message", [
    ({"epochs": 0}, "`epochs` must be a positive integer"),
    ({"batch_size": 0}, "`batch_size` must be a positive integer"),
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
    with pytest.raises(ValueError, match="is a file"):
        keras_vit.finetune(folder, variant="ViT-Ti/16", output=str(tmp_path / "file"))
    with pytest.raises(ValueError, match="not a keras_vit preset"):
        keras_vit.finetune(folder, variant="ViT-Ti/16", output=folder)


def test_paper_recipe_is_sgd_with_clipping_and_accumulation_to_512():
    optimizer, accumulation = build_recipe_optimizer("paper", total_steps=100, batch_size=8)
    assert isinstance(optimizer, keras.optimizers.SGD) and accumulation == 64
    config = optimizer.get_config()
    assert config["momentum"] == 0.9 and config["global_clipnorm"] == 1.0
    assert config["weight_decay"] is None and config["gradient_accumulation_steps"] == 64
    schedule = optimizer.learning_rate
    assert float(schedule(0)) == 0.0 and math.isclose(float(schedule(schedule.warmup_steps)), 0.01, rel_tol=1e-6)
    assert float(schedule(100)) < 1e-6  # cosine decays to zero at the end
    adamw, accumulation = build_recipe_optimizer("adamw", total_steps=10, batch_size=8)
    assert isinstance(adamw, keras.optimizers.AdamW) and accumulation == 1
    assert adamw.get_config()["weight_decay"] == 0.05
    _, accumulation = build_recipe_optimizer("paper", total_steps=10, batch_size=8, effective_batch_size=None)
    assert accumulation == 1


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
    fresh = keras_vit.finetuning.load_for_finetuning(3, preset=source, image_size=16)
    probabilities = np.asarray(fresh.predict(np.zeros((1, 16, 16, 3)), verbose=0))
    np.testing.assert_allclose(probabilities, 1 / 3, atol=1e-6)


def test_finetune_command_with_mixup(folder, tmp_path, capsys):
    source = tiny_backbone_file(str(tmp_path / "pretrained.keras"), image_size=8)
    output = str(tmp_path / "out")
    code = cli.main(["finetune", folder, "--preset", source, "--epochs", "1", "--batch-size", "4", "--recipe",
                     "adamw", "--mixup", "0.2", "--cutmix", "1.0", "--output", output, "--workers", "1"])
    assert code == 0
    out = capsys.readouterr().out
    assert "Held-out accuracy:" in out and "3 class names" in out
    assert os.path.exists(os.path.join(output, "config.json"))


def test_a_backup_from_other_settings_is_not_resumed(folder, tmp_path):
    source = tiny_backbone_file(str(tmp_path / "pretrained.keras"), image_size=8)
    run_dir = str(tmp_path / "run")

    class Stop(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            if epoch == 1:
                raise KeyboardInterrupt  # as if killed after the first epoch's checkpoint

    common = dict(preset=source, batch_size=4, recipe="adamw", run_dir=run_dir, verbose=0, workers=1)
    with pytest.raises(KeyboardInterrupt):
        keras_vit.finetune(folder, epochs=2, callbacks=[Stop()], **common)
    with pytest.raises(ValueError, match="other settings.*epochs"):
        keras_vit.finetune(folder, epochs=3, **common)
    result = keras_vit.finetune(folder, epochs=2, **common)
    assert result["initial_epoch"] == 1
