"""LoRA: what trains, what a step changes, what a save writes, and the command line's --lora.

The trainable count is recomputed from the architecture (rank x (in + out)
for each adapted kernel, plus the head), not read from the code under test.
"""

import os

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit.utils.seeds import set_random_seed
from tests.finetune.helpers import tiny_backbone_file, write_folder

D, F, LAYERS, CLASSES, RANK = 32, 64, 2, 3, 4


def tiny_classifier(seed=0):
    set_random_seed(seed)
    return keras_vit.ViTClassifier.from_variant(
        "ViT-Ti/16", image_size=16, patch_size=8, hidden_dim=D, num_layers=LAYERS, num_heads=2, mlp_dim=F,
        num_classes=CLASSES, dropout=0.0)


def images(count=6, seed=0):
    rng = np.random.default_rng(seed)
    return rng.uniform(0, 255, (count, 16, 16, 3)).astype("float32"), rng.integers(0, CLASSES, count)


def values(model):
    return {weight.path: keras.ops.convert_to_numpy(weight.value).copy() for weight in model.weights}


@pytest.fixture(scope="module")
def lora_fit():
    """One LoRA classifier (rank 4, alpha 8) fitted for two epochs of AdamW, with its numbers from before.

    What trains, what a save writes and what an epoch backup keeps are all
    read from this one fit (until issue 50 each test fitted its own
    identical model: four fits, each traced anew on TensorFlow). Nothing
    below changes the model: they predict, save and back it up.
    """
    model = tiny_classifier()
    x, y = images()
    plain_output = keras.ops.convert_to_numpy(model.predict(x, verbose=0))
    model.enable_lora(RANK, alpha=8)
    lora_output = keras.ops.convert_to_numpy(model.predict(x, verbose=0))
    # AdamW: its decoupled weight decay would move any frozen weight the optimizer touched, even with no gradient.
    model.compile(optimizer=keras.optimizers.AdamW(1e-2), loss="sparse_categorical_crossentropy")
    before = values(model)
    # Several steps: the head starts at zero, so the first step's gradient reaches only the head.
    model.fit(x, y, epochs=2, batch_size=3, verbose=0)
    return {"model": model, "x": x, "plain_output": plain_output, "lora_output": lora_output, "before": before,
            "after": values(model)}


def test_only_the_low_rank_updates_and_the_head_train(lora_fit):
    model = lora_fit["model"]
    assert model.lora_enabled
    # Per block: qkv (D -> 3D), proj (D -> D), fc1 (D -> F), fc2 (F -> D); the head is D -> C plus its bias.
    per_block = RANK * ((D + 3 * D) + (D + D) + (D + F) + (F + D))
    expected = LAYERS * per_block + D * CLASSES + CLASSES
    assert sum(int(np.prod(w.shape)) for w in model.trainable_weights) == expected
    # B starts at zero: enabling LoRA changes nothing yet.
    np.testing.assert_allclose(lora_fit["lora_output"], lora_fit["plain_output"], atol=1e-6)

    before, after = lora_fit["before"], lora_fit["after"]
    changed = {path for path in before if not np.array_equal(before[path], after[path])}
    assert all("lora_kernel" in path or path.startswith("head/") for path in changed), sorted(changed)
    assert {"head/kernel", "head/bias"} <= changed and any("lora_kernel_b" in path for path in changed)


@pytest.mark.parametrize("save", ["preset", "keras"])
def test_a_saved_lora_model_is_a_plain_model_with_the_update_merged(save, lora_fit, tmp_path):
    model, x = lora_fit["model"], lora_fit["x"]
    expected = keras.ops.convert_to_numpy(model.predict(x, verbose=0))
    if save == "preset":
        model.save_to_preset(str(tmp_path / "preset"))
        loaded = keras_vit.ViTClassifier.from_preset(str(tmp_path / "preset"))
    else:
        model.save(str(tmp_path / "model.keras"))
        loaded = keras.saving.load_model(str(tmp_path / "model.keras"), compile=False)
    assert not loaded.lora_enabled and not any("lora" in weight.path for weight in loaded.weights)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(loaded.predict(x, verbose=0)), expected, atol=1e-5)
    # The merge by hand, from the definition W + (alpha / rank) A B, for one kernel.
    dense = model.lora_layers()[0]
    merged = (keras.ops.convert_to_numpy(dense._kernel.value)
              + 8 / RANK * keras.ops.convert_to_numpy(dense.lora_kernel_a.value)
              @ keras.ops.convert_to_numpy(dense.lora_kernel_b.value))
    np.testing.assert_allclose(keras.ops.convert_to_numpy(loaded.lora_layers()[0].kernel.value), merged, atol=1e-6)


def test_an_epoch_backup_keeps_the_low_rank_factors(lora_fit, tmp_path):
    from keras_vit.workflows.resuming import EpochCheckpoint, open_run

    trained = lora_fit["model"]
    checkpoint = EpochCheckpoint(open_run(run_dir=str(tmp_path / "run")))
    checkpoint.set_model(trained)
    checkpoint.on_epoch_end(1)

    resumed = tiny_classifier(seed=1)  # other initial weights: everything must come from the backup
    resumed.enable_lora(RANK, alpha=8)
    resumed.compile(optimizer=keras.optimizers.AdamW(1e-2), loss="sparse_categorical_crossentropy")
    assert EpochCheckpoint(open_run(run_dir=str(tmp_path / "run"))).restore(resumed) == 2
    expected, actual = values(trained), values(resumed)
    for path in expected:
        np.testing.assert_allclose(actual[path], expected[path], atol=1e-5, err_msg=path)


def test_bad_ranks_are_refused():
    model = tiny_classifier()
    for rank in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match="`rank` must be a positive int"):
            model.enable_lora(rank)
    with pytest.raises(ValueError, match="at most the smallest side"):
        model.enable_lora(D + 1)
    model.enable_lora(2)
    with pytest.raises(ValueError, match="already enabled"):
        model.enable_lora(2)


@pytest.mark.slow
def test_finetune_with_lora_from_the_command_line(tmp_path, capsys):
    from keras_vit.cli import main

    data = write_folder(str(tmp_path / "photos"), classes=2, per_class=6, size=(8, 8))
    pretrained = tiny_backbone_file(str(tmp_path / "pretrained.keras"), image_size=8, dropout=0.0)
    output = str(tmp_path / "out")
    status = main(["finetune", data, "--preset", pretrained, "--epochs", "2", "--batch-size", "4", "--recipe",
                   "adamw", "--lora", "2", "--remat", "--workers", "1", "--output", output])
    captured = capsys.readouterr()
    assert status == 0, captured.err
    assert "LoRA rank 2:" in captured.out
    loaded = keras_vit.ViTClassifier.from_preset(output)
    assert not loaded.lora_enabled and loaded.class_names == ["class_0", "class_1"]
    assert main(["finetune", data, "--preset", pretrained, "--lora", "0", "--output", str(tmp_path / "o2")]) == 2
    assert "--lora must be a positive integer" in capsys.readouterr().err
    assert os.path.exists(os.path.join(output, "model.weights.h5"))
