"""Whole heads per device: the per-head qkv column order under model parallelism, and its refusals.

The first test looks at layouts only and runs on every backend (fake device
names: nothing is placed on them). The last needs 8 JAX devices, so it runs
a child process with `--xla_force_host_platform_device_count=8` that builds
models under `model_parallel()`.
"""

import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest

from keras_vit import ViTBackbone
from keras_vit.distribution import layout_errors, layout_map
from tests.distribution.jobs import child_xla_flags

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
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


def _run(arguments):
    env = dict(os.environ, KERAS_BACKEND="jax", PYTHONPATH=REPO_ROOT, TF_CPP_MIN_LOG_LEVEL="3")
    env["XLA_FLAGS"] = child_xla_flags()  # not the test's own; the worker adds its devices
    completed = subprocess.run([sys.executable] + arguments, env=env, capture_output=True, text=True, timeout=900,
                               cwd=REPO_ROOT)
    assert completed.returncode == 0, f"exit {completed.returncode}:\n{completed.stdout[-3000:]}\n{completed.stderr[-6000:]}"
    return completed.stdout


@pytest.mark.slow  # a JAX process with 8 devices trains the digits for an epoch
@jax_only
def test_model_parallel_refuses_split_heads_and_splits_whole_heads():
    stdout = _run([os.path.join(REPO_ROOT, "tests", "distribution", "whole_heads_worker.py")])
    report = json.loads([line for line in stdout.splitlines() if line.startswith("RESULT ")][-1][len("RESULT "):])
    assert report["device_count"] == 8
    assert "does not divide the 6 attention heads" in report["heads_refusal"]
    assert "Use a model axis of 1 or 2 " in report["heads_refusal"]
    assert report["heads_accepted"] is None
    assert report["cli"]["exit_code"] == 1
    assert "keras-vit train: error:" in report["cli"]["stderr"]
    assert "does not divide the 4 attention heads" in report["cli"]["stderr"]
    assert "Use a model axis of 1, 2 or 4 " in report["cli"]["stderr"]
    assert "Traceback" not in report["cli"]["stderr"]
    assert "--model-parallelism 4" in report["cli"]["stderr"]
    assert report["cli_model_parallelism_4"] == {"exit_code": 0, "saved": True}
    split = report["split"]  # a converted preset built under model_parallel(2) computes what it computes on one device
    assert split["difference"] < 1e-5
    assert split["qkv_spec"] == [None, "model"] and split["qkv_shard_shape"] == [16, 24]  # (D, 3D / 2)
