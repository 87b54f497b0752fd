"""Child process of test_jax_distribution.py: fit on 1 and on 8 virtual CPU devices.

XLA reads `--xla_force_host_platform_device_count` once, when JAX starts, so
this runs in its own interpreter. It trains the same small hybrid ViT (a conv
stem, one Transformer block, a pre-logits layer and a head) from the same
initial weights three times -- on one device, under DataParallel over 8
devices, and under ModelParallel on a 2x4 mesh -- and prints one JSON line
with the losses and, for every model and optimizer variable, its global
shape, partition spec and the shape of the shard on one device. In the same
process (one JAX start serves both test files' 8-device checks) it makes
test_whole_heads.py's: the model-parallel refusals of a head count the model
axis cuts, the command line's refusal and the fix it names, and a converted
preset split over whole heads (`whole_heads`).
"""

import contextlib
import io
import json
import os
import sys
import tempfile

os.environ["KERAS_BACKEND"] = "jax"
# The 8 virtual devices are threads of this process; on a loaded machine one
# can reach a collective much later than the others, and XLA's CPU runtime
# aborts a collective after 40 s by default. Allow far more.
os.environ["XLA_FLAGS"] = " ".join([
    os.environ.get("XLA_FLAGS", ""),
    "--xla_force_host_platform_device_count=8",
    "--xla_cpu_collective_timeout_seconds=900",
    "--xla_cpu_collective_call_terminate_timeout_seconds=900",
]).strip()

import jax  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO_ROOT)
from keras_vit import ViTBackbone, ViTClassifier  # noqa: E402
from keras_vit import distribution as vit_distribution  # noqa: E402

PRESET = os.path.join(REPO_ROOT, "tests", "fixtures", "presets", "timm_cls_token")  # 2 heads, converted from timm
EPOCHS = 3
BATCH_SIZE = 16  # divisible by the 8 data shards of DataParallel and the 2 of the 2x4 mesh


def build_model():
    # A conv stem stands in for a hybrid's ResNet: its kernel must be split too.
    stem = keras.Sequential([keras.layers.Conv2D(8, 3, padding="same", name="stem_conv")], name="stem")
    backbone = ViTBackbone(
        image_size=8, patch_size=2, num_channels=1, hidden_dim=32, num_layers=1, num_heads=4, mlp_dim=64,
        stem=stem,
    )
    return ViTClassifier(backbone, num_classes=10, representation_size=16)


def describe(variable):
    value = variable.value
    spec = list(value.sharding.spec) if hasattr(value.sharding, "spec") else []
    spec = spec + [None] * (len(value.shape) - len(spec))
    return {
        "shape": list(value.shape),
        "spec": [None if axis is None else str(axis) for axis in spec],
        "shard_shape": list(value.addressable_shards[0].data.shape),
        "num_devices": len(value.sharding.device_set),
    }


def train(initial_weights, images, labels, distribution):
    scope = distribution.scope() if distribution is not None else contextlib.nullcontext()
    with scope:
        model = build_model()
        model.set_weights(initial_weights)
        model.compile(optimizer=keras.optimizers.AdamW(learning_rate=1e-2))
        history = model.fit(images, labels, batch_size=BATCH_SIZE, epochs=EPOCHS, shuffle=False, verbose=0)
    result = {
        "losses": [float(loss) for loss in history.history["loss"]],
        "weights": {variable.path: describe(variable) for variable in model.weights},
        "optimizer": {variable.path: describe(variable) for variable in model.optimizer.variables},
    }
    if distribution is not None:
        result["mesh"] = {"shape": list(distribution.device_mesh.shape),
                          "axis_names": list(distribution.device_mesh.axis_names)}
    return result


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


def whole_heads():
    """test_whole_heads.py's checks on 8 devices: refusals of a model axis that cuts heads, and a split preset."""
    six_heads = lambda: ViTBackbone(image_size=8, patch_size=4, hidden_dim=48, num_layers=1, num_heads=6,  # noqa: E731
                                    mlp_dim=96)
    report = {
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
    # The fix the refusal names: --model-parallelism 4 (mesh batch 2 x model 4) trains. An epoch of the digits
    # in batches of 256 (6 steps, not 45): that it trains and saves is the check, not what it learns.
    with tempfile.TemporaryDirectory() as scratch, contextlib.redirect_stdout(io.StringIO()):
        code = cli(["train", "--distribute", "model", "--model-parallelism", "4", "--epochs", "1", "--batch-size",
                    "256", "--save", os.path.join(scratch, "digits.keras"), "--run-dir", os.path.join(scratch, "run")])
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
    return report


def main():
    rng = np.random.default_rng(0)
    images = rng.uniform(0.0, 255.0, size=(32, 8, 8, 1)).astype("float32")
    labels = rng.integers(0, 10, size=32)
    keras.utils.set_random_seed(0)
    initial_weights = [np.asarray(weight) for weight in build_model().get_weights()]
    report = {
        "device_count": jax.device_count(),
        "one_device": train(initial_weights, images, labels, None),
        "data_parallel": train(initial_weights, images, labels, vit_distribution.data_parallel()),
        "model_parallel": train(
            initial_weights, images, labels, vit_distribution.model_parallel(model_parallelism=4)
        ),
        "whole_heads": whole_heads(),
    }
    print("RESULT " + json.dumps(report))


if __name__ == "__main__":
    main()
