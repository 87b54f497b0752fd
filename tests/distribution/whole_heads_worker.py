"""Child process of test_whole_heads.py: the model-parallel refusals on 8 virtual CPU devices.

XLA reads `--xla_force_host_platform_device_count` once, when JAX starts, so
this runs in its own interpreter and prints one JSON line for the test to
check.
"""

import contextlib
import io
import json
import os
import sys
import tempfile

os.environ["KERAS_BACKEND"] = "jax"
os.environ["XLA_FLAGS"] = " ".join([os.environ.get("XLA_FLAGS", ""), "--xla_force_host_platform_device_count=8"])

import jax  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO_ROOT)
from keras_vit import ViTBackbone, ViTClassifier  # noqa: E402
from keras_vit import distribution as vit_distribution  # noqa: E402

PRESET = os.path.join(REPO_ROOT, "tests", "fixtures", "presets", "timm_cls_token")  # 2 heads, converted from timm


def refusal(build, distribution):
    try:
        with distribution.scope():
            build()
    except ValueError as error:
        return str(error)
    return None


def sharding_spec(variable):
    spec = list(variable.value.sharding.spec)
    return [None if axis is None else str(axis) for axis in spec + [None] * (len(variable.shape) - len(spec))]


def main():
    six_heads = lambda: ViTBackbone(image_size=8, patch_size=4, hidden_dim=48, num_layers=1, num_heads=6,  # noqa: E731
                                    mlp_dim=96)
    report = {
        "device_count": jax.device_count(),
        # 4 does not divide 6 heads; 1 and 2 divide both 6 and the 8 devices.
        "heads_refusal": refusal(six_heads, vit_distribution.model_parallel(model_parallelism=4)),
        "heads_accepted": refusal(six_heads, vit_distribution.model_parallel(model_parallelism=2)),
    }
    # The command line: `--distribute model` puts the 8 devices on the model axis; the digits ViT has 4 heads.
    from keras_vit.cli import main as cli

    errors = io.StringIO()
    with tempfile.TemporaryDirectory() as scratch, contextlib.redirect_stderr(errors), \
            contextlib.redirect_stdout(io.StringIO()):
        code = cli(["train", "--distribute", "model", "--epochs", "1", "--run-dir", os.path.join(scratch, "run")])
    report["cli"] = {"exit_code": code, "stderr": errors.getvalue()}
    # The fix the refusal names: --model-parallelism 4 (mesh batch 2 x model 4) trains.
    with tempfile.TemporaryDirectory() as scratch, contextlib.redirect_stdout(io.StringIO()):
        code = cli(["train", "--distribute", "model", "--model-parallelism", "4", "--epochs", "1",
                    "--save", os.path.join(scratch, "digits.keras"), "--run-dir", os.path.join(scratch, "run")])
        report["cli_model_parallelism_4"] = {"exit_code": code,
                                             "saved": os.path.exists(os.path.join(scratch, "digits.keras"))}
    images = np.random.default_rng(0).uniform(0, 255, size=(8, 16, 16, 3)).astype("float32")
    expected = np.asarray(ViTClassifier.from_preset(PRESET).predict_on_batch(images))  # no distribution
    with vit_distribution.model_parallel(model_parallelism=2).scope():
        split = ViTClassifier.from_preset(PRESET)
        got = np.asarray(split.predict_on_batch(images))
    qkv = next(w for w in split.weights if w.path.endswith("transformer_block_0/attention/qkv/kernel"))
    report["split"] = {
        "difference": float(np.max(np.abs(got - expected))),
        "qkv_spec": sharding_spec(qkv),
        "qkv_shard_shape": list(qkv.value.addressable_shards[0].data.shape),
    }
    print("RESULT " + json.dumps(report))


if __name__ == "__main__":
    main()
