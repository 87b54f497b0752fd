"""keras-hub's `Task.save_to_preset` of a task built on a keras_vit backbone: refused with what to do (issue 47).

keras-hub 0.32 writes the task's `task.json` and `task.weights.h5` into the
preset directory, then calls `task.backbone.save_to_preset(directory,
max_shard_size=...)`: keras_vit's own preset would land beside keras-hub's
files, which keras-hub could not load back (its loader reads only its own
backbones). keras_vit refuses, naming the way that works: a `.keras` file.
"""

import json

import numpy as np
import pytest

from keras_vit import ViTBackbone

# What keras-hub 0.32's `PresetSaver.save_task` writes first (`_save_serialized_object(task, "task.json")`).
KERAS_HUB_TASK = {"module": "keras_hub.src.models.vit.vit_image_classifier", "class_name": "ViTImageClassifier",
                  "config": {"name": "vi_t_image_classifier", "num_classes": 10},
                  "registered_name": "keras_hub>ViTImageClassifier"}


def _backbone():
    return ViTBackbone(image_size=16, patch_size=8, hidden_dim=16, num_layers=1, num_heads=2, mlp_dim=32)


@pytest.mark.one_backend("the refusal is made before any weight is written; it does not depend on the backend")
def test_keras_hub_task_files_get_a_message_that_says_what_to_do(tmp_path):
    preset = tmp_path / "task_preset"
    preset.mkdir()
    (preset / "task.json").write_text(json.dumps(KERAS_HUB_TASK))
    (preset / "task.weights.h5").write_bytes(b"\x89HDF\r\n\x1a\n")
    with pytest.raises(ValueError, match=r"keras-hub.*task\.save\(.*\.keras") as raised:
        _backbone().save_to_preset(str(preset), max_shard_size=10)
    assert "Choose a new or empty directory" not in str(raised.value)  # keras-hub picked the directory, not the user
    assert sorted(p.name for p in preset.iterdir()) == ["task.json", "task.weights.h5"]  # nothing written


@pytest.mark.one_backend("the refusal is made before any weight is written; it does not depend on the backend")
def test_a_users_own_task_json_keeps_the_plain_message(tmp_path):
    (tmp_path / "task.json").write_text(json.dumps({"my": "notes"}))
    with pytest.raises(ValueError, match="Choose a new or empty directory"):
        _backbone().save_to_preset(str(tmp_path))


def test_keras_hub_task_on_a_keras_vit_backbone(tmp_path):
    keras_hub = pytest.importorskip("keras_hub")
    import keras

    backbone = _backbone()
    task = keras_hub.models.ViTImageClassifier(backbone=backbone, num_classes=3)
    with pytest.raises(ValueError, match=r"keras-hub.*task\.save"):
        task.save_to_preset(str(tmp_path / "preset"))
    # What the message says works: the whole task as a .keras file.
    images = np.random.default_rng(0).uniform(0, 255, (2, 16, 16, 3)).astype("float32")
    task.save(tmp_path / "task.keras")
    reloaded = keras.saving.load_model(tmp_path / "task.keras")
    np.testing.assert_allclose(keras.ops.convert_to_numpy(reloaded.predict(images, verbose=0)),
                               keras.ops.convert_to_numpy(task.predict(images, verbose=0)), atol=1e-6)
