"""Whole heads per device: the per-head qkv column order, its refusals and the collectives it saves.

The first tests look at layouts, configs and outputs only and run on every
backend (fake device names: nothing is placed on them). The last two need
8 JAX devices, so they run child processes with
`--xla_force_host_platform_device_count=8`: one builds models under
`model_parallel()` (the refusals and the conversion of an old model), the
other is benchmarks/count_collectives.py on a 1-block model.
"""

import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest

from keras_vit import ViTBackbone, ViTClassifier
from keras_vit.distribution import head_aligned, layout_errors, layout_map
from keras_vit.layers import MultiHeadSelfAttention

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURES = os.path.join(REPO_ROOT, "tests", "fixtures")
OLD_PRESET = os.path.join(FIXTURES, "presets", "timm_cls_token")  # saved before qkv_layout: timm's order, 2 heads
jax_only = pytest.mark.skipif(keras.backend.backend() != "jax", reason="needs 8 JAX devices (keras.distribution)")


def _mesh(model_parallelism, data_parallelism=2):
    count = model_parallelism * data_parallelism
    return keras.distribution.DeviceMesh((data_parallelism, model_parallelism), ("batch", "model"),
                                         devices=[f"cpu:{i}" for i in range(count)])


def _backbone(**overrides):
    return ViTBackbone(**{"image_size": 8, "patch_size": 4, "hidden_dim": 48, "num_layers": 2, "num_heads": 6,
                          "mlp_dim": 96, **overrides})


def test_layout_errors_name_a_model_axis_that_cuts_heads():
    model = _backbone()
    assert layout_errors(model, layout_map(_mesh(2))) == []
    assert layout_errors(model, layout_map(_mesh(3))) == []
    errors = layout_errors(model, layout_map(_mesh(4)))  # 8 devices, model axis 4; 6 heads
    assert len(errors) == 2, errors  # one per block
    assert "transformer_block_0/attention" in errors[0] and "transformer_block_1/attention" in errors[1]
    # The valid sizes divide both the 6 heads and the 8 devices.
    assert "does not divide the 6 attention heads" in errors[0] and "Use a model axis of 1 or 2 " in errors[0]
    three_heads = layout_errors(_backbone(hidden_dim=24, num_heads=3, num_layers=1), layout_map(_mesh(2)))
    assert len(three_heads) == 1 and "Use a model axis of 1 " in three_heads[0]
    assert "data_parallel()" in three_heads[0]
    # Paths and shapes alone carry no head count: only the weight checks run.
    assert layout_errors([(w.path, w.shape) for w in model.weights], layout_map(_mesh(4))) == []


def test_layout_errors_refuse_timm_order_and_name_the_conversion():
    model = _backbone(qkv_layout="timm")
    errors = layout_errors(model, layout_map(_mesh(2)))
    assert len(errors) == 2 and all("head_aligned" in error and "qkv_layout='timm'" in error for error in errors)
    unsplit = keras.distribution.LayoutMap(_mesh(2))  # nothing split: any order is fine
    assert layout_errors(model, unsplit) == []
    assert MultiHeadSelfAttention(2).model_parallel_error(None) is None


def test_old_configs_rebuild_in_timm_order():
    backbone = _backbone()
    assert backbone.qkv_layout == "heads" and backbone.get_config()["qkv_layout"] == "heads"
    old = {key: value for key, value in backbone.get_config().items() if key != "qkv_layout"}
    rebuilt = ViTBackbone.from_config(old)
    assert rebuilt.qkv_layout == "timm"
    assert {block.attention.qkv_layout for block in rebuilt.layers if hasattr(block, "attention")} == {"timm"}
    assert ViTClassifier.from_preset(OLD_PRESET).backbone.qkv_layout == "timm"


def _timm_reference():
    reference = np.load(os.path.join(FIXTURES, "timm", "cls_token", "reference.npz"), allow_pickle=False)
    logits = reference["logits"]
    probabilities = np.exp(logits - logits.max(-1, keepdims=True))
    return reference["images"].astype("float32"), probabilities / probabilities.sum(-1, keepdims=True)


def test_head_aligned_keeps_the_outputs_of_an_old_model(tmp_path):
    images, expected = _timm_reference()  # timm's own outputs for the fixture's weights
    old = ViTClassifier.from_preset(OLD_PRESET)
    converted = head_aligned(old)
    assert converted.backbone.qkv_layout == "heads"
    np.testing.assert_allclose(keras.ops.convert_to_numpy(converted(images)), expected, atol=1e-5)
    # The columns really moved (2 heads: the orders differ) ...
    old_kernel = keras.ops.convert_to_numpy(old.backbone.get_layer("transformer_block_0").attention.qkv.kernel)
    new_kernel = keras.ops.convert_to_numpy(converted.backbone.get_layer("transformer_block_0").attention.qkv.kernel)
    assert not np.allclose(old_kernel, new_kernel)
    # ... and the conversion survives a save and load.
    path = str(tmp_path / "converted.keras")
    converted.save(path)
    reloaded = keras.saving.load_model(path)
    assert reloaded.backbone.qkv_layout == "heads"
    np.testing.assert_allclose(keras.ops.convert_to_numpy(reloaded(images)), expected, atol=1e-5)
    assert head_aligned(converted) is converted


def test_head_aligned_refuses_lora():
    old = ViTClassifier.from_preset(OLD_PRESET)
    old.enable_lora(2)
    with pytest.raises(ValueError, match="LoRA"):
        head_aligned(old)


def _run(arguments):
    env = dict(os.environ, KERAS_BACKEND="jax", PYTHONPATH=REPO_ROOT, TF_CPP_MIN_LOG_LEVEL="3")
    env.pop("XLA_FLAGS", None)
    completed = subprocess.run([sys.executable] + arguments, env=env, capture_output=True, text=True, timeout=900,
                               cwd=REPO_ROOT)
    assert completed.returncode == 0, f"exit {completed.returncode}:\n{completed.stdout[-3000:]}\n{completed.stderr[-6000:]}"
    return completed.stdout


@pytest.mark.slow  # a JAX process with 8 devices trains the digits for an epoch
@jax_only
def test_model_parallel_refuses_split_heads_and_converts_old_models():
    stdout = _run([os.path.join(REPO_ROOT, "tests", "distribution", "head_alignment_worker.py")])
    report = json.loads([line for line in stdout.splitlines() if line.startswith("RESULT ")][-1][len("RESULT "):])
    assert report["device_count"] == 8
    assert "does not divide the 6 attention heads" in report["heads_refusal"]
    assert "Use a model axis of 1 or 2 " in report["heads_refusal"]
    assert report["heads_accepted"] is None
    assert "head_aligned" in report["old_order_refusal"] and "qkv_layout='timm'" in report["old_order_refusal"]
    assert report["cli"]["exit_code"] == 1
    assert "keras-vit train: error:" in report["cli"]["stderr"]
    assert "does not divide the 4 attention heads" in report["cli"]["stderr"]
    assert "Use a model axis of 1, 2 or 4 " in report["cli"]["stderr"]
    assert "Traceback" not in report["cli"]["stderr"]
    assert "--model-parallelism 4" in report["cli"]["stderr"]
    assert report["cli_model_parallelism_4"] == {"exit_code": 0, "saved": True}
    converted = report["converted"]
    assert converted["qkv_layout"] == "heads" and converted["difference"] < 1e-5
    assert converted["qkv_spec"] == [None, "model"] and converted["qkv_shard_shape"] == [16, 24]  # (D, 3D / 2)


@pytest.mark.slow  # compiles a training step in both orders in a JAX process
@jax_only
def test_head_aligned_layout_compiles_to_fewer_collectives():
    stdout = _run([os.path.join(REPO_ROOT, "benchmarks", "count_collectives.py"),
                   "--model-axis", "2", "--blocks", "1", "--json"])
    rows = {row["qkv_layout"]: row for row in json.loads(stdout.strip().splitlines()[-1])}

    def total(row, index):
        return sum(value[index] for value in row["collectives"].values())

    heads, timm = rows["heads"], rows["timm"]
    assert total(heads, 0) < total(timm, 0), rows  # operations
    assert total(heads, 1) < total(timm, 1), rows  # elements they produce
    # The same weights in both orders compute the same function.
    assert heads["output_difference"] < 1e-5
    assert abs(heads["loss"] - timm["loss"]) <= 1e-6
