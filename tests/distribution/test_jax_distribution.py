"""DataParallel and ModelParallel (2x4 mesh) on 8 virtual CPU devices, JAX backend; whole heads per device.

The training runs in a child process (`jax_worker.py`) because the number
of virtual devices is fixed when JAX starts; this process only checks what
the child reports. The same child makes the 8-device checks of whole heads
(test_whole_heads.py's subject, `test_model_parallel_refuses_split_heads_and_splits_whole_heads`
here): one JAX start with 8 devices serves both, instead of one each.
"""

import json
import os
import subprocess
import sys

import keras
import pytest

from tests.distribution.jobs import child_xla_flags

pytestmark = [
    pytest.mark.skipif(
        keras.backend.backend() != "jax",
        reason="keras.distribution (DataParallel / ModelParallel) runs on the JAX backend only",
    ),
    pytest.mark.slow,  # one child process trains three times and runs the command line twice
]

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "jax_worker.py")
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# The Megatron-style contract, written out independently of
# keras_vit/distribution/layout.py: the dimension of each weight that is
# split over the model axis. Every other weight must be whole on each device.
SPLIT_DIMENSION = {
    "attention/qkv/kernel": 1,  # output columns
    "attention/qkv/bias": 0,
    "attention/proj/kernel": 0,  # input rows
    "mlp/fc1/kernel": 1,
    "mlp/fc1/bias": 0,
    "mlp/fc2/kernel": 0,
    "patch_encoder/projection/kernel": 1,  # token width D
    "patch_encoder/projection/bias": 0,
    "patch_encoder/position_embedding": 2,
    "patch_encoder/class_token": 2,
    "pre_logits/kernel": 1,
    "pre_logits/bias": 0,
    "head/kernel": 0,
    "stem_conv/kernel": 3,  # output channels
    "stem_conv/bias": 0,
}
MODEL_AXIS_SIZE = 4


def _expected_split(path):
    matches = [dim for suffix, dim in SPLIT_DIMENSION.items() if path.endswith(suffix)]
    return matches[0] if matches else None


@pytest.fixture(scope="module")
def report():
    env = dict(os.environ, KERAS_BACKEND="jax", PYTHONPATH=REPO_ROOT, TF_CPP_MIN_LOG_LEVEL="3")
    env["XLA_FLAGS"] = child_xla_flags()  # not the test's own; the worker adds its devices
    completed = subprocess.run(
        [sys.executable, WORKER], env=env, capture_output=True, text=True, timeout=900, cwd=REPO_ROOT
    )
    lines = [line for line in completed.stdout.splitlines() if line.startswith("RESULT ")]
    assert completed.returncode == 0 and lines, (
        f"worker failed (exit {completed.returncode}):\n{completed.stdout[-3000:]}\n{completed.stderr[-6000:]}"
    )
    return json.loads(lines[-1][len("RESULT "):])


def _assert_close(losses, reference):
    assert len(losses) == len(reference)
    for loss, expected in zip(losses, reference):
        assert abs(loss - expected) <= 1e-5 * abs(expected), (losses, reference)


def test_eight_virtual_devices(report):
    assert report["device_count"] == 8


def test_training_moves_the_loss(report):
    # Otherwise equal losses would prove nothing about the updates.
    losses = report["one_device"]["losses"]
    assert losses[-1] < losses[0] - 0.05, losses


def test_data_parallel_losses_match_one_device(report):
    _assert_close(report["data_parallel"]["losses"], report["one_device"]["losses"])


def test_model_parallel_losses_match_one_device(report):
    _assert_close(report["model_parallel"]["losses"], report["one_device"]["losses"])


def test_data_parallel_replicates_every_weight(report):
    weights = report["data_parallel"]["weights"]
    assert len(weights) == len(report["one_device"]["weights"])
    for path, info in weights.items():
        assert info["num_devices"] == 8, path
        assert info["shard_shape"] == info["shape"], path
        assert all(axis is None for axis in info["spec"]), (path, info)


def test_model_parallel_mesh_is_two_by_four(report):
    assert report["model_parallel"]["mesh"] == {"shape": [2, 4], "axis_names": ["batch", "model"]}


def test_model_parallel_weight_shardings(report):
    weights = report["model_parallel"]["weights"]
    seen = set()
    for path, info in weights.items():
        assert info["num_devices"] == 8, path
        dim = _expected_split(path)
        expected_spec = [None] * len(info["shape"])
        expected_shard = list(info["shape"])
        if dim is not None:
            seen.add(next(suffix for suffix in SPLIT_DIMENSION if path.endswith(suffix)))
            expected_spec[dim] = "model"
            expected_shard[dim] //= MODEL_AXIS_SIZE
        assert info["spec"] == expected_spec, (path, info)
        # Each device really holds a quarter (or all) of the weight.
        assert info["shard_shape"] == expected_shard, (path, info)
    assert seen == set(SPLIT_DIMENSION), f"weights missing from the model: {set(SPLIT_DIMENSION) - seen}"


def test_model_parallel_optimizer_state_follows_weights(report):
    # AdamW's two moments per weight are most of the training memory: they
    # must be split like their weight, or model parallelism saves little.
    result = report["model_parallel"]
    optimizer = result["optimizer"]
    for path, info in result["weights"].items():
        flat = path.replace("/", "_")
        moments = [name for name in optimizer if name.endswith(f"/{flat}_momentum") or name.endswith(f"/{flat}_velocity")]
        assert len(moments) == 2, (path, moments)
        for name in moments:
            assert optimizer[name]["spec"] == info["spec"], (name, optimizer[name], info)
            assert optimizer[name]["shard_shape"] == info["shard_shape"], name


def test_model_parallel_refuses_split_heads_and_splits_whole_heads(report):
    # Moved from test_whole_heads.py (its layout-only test stays there): the refusals on real devices.
    heads = report["whole_heads"]
    assert report["device_count"] == 8
    assert "does not divide the 6 attention heads" in heads["heads_refusal"]
    assert "Use a model axis of 1 or 2 " in heads["heads_refusal"]
    assert heads["heads_accepted"] is None
    assert heads["cli"]["exit_code"] == 1
    assert "keras-vit train: error:" in heads["cli"]["stderr"]
    assert "does not divide the 4 attention heads" in heads["cli"]["stderr"]
    assert "Use a model axis of 1, 2 or 4 " in heads["cli"]["stderr"]
    assert "Traceback" not in heads["cli"]["stderr"]
    assert "--model-parallelism 4" in heads["cli"]["stderr"]
    assert heads["cli_model_parallelism_4"] == {"exit_code": 0, "saved": True}
    split = heads["split"]  # a converted preset built under model_parallel(2) computes what it computes on one device
    assert split["difference"] < 1e-5
    assert split["qkv_spec"] == [None, "model"] and split["qkv_shard_shape"] == [16, 24]  # (D, 3D / 2)
