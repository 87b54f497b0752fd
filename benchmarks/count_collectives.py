"""Collectives in a compiled JAX training step: qkv in timm's order vs grouped per head.

    PYTHONPATH=. .venv/bin/python benchmarks/count_collectives.py
    PYTHONPATH=. .venv/bin/python benchmarks/count_collectives.py --model-axis 2 --blocks 2 --json

A small ViT (32x32 images, 8x8 patches, D=64, 4 heads, MLP 128, 10 classes)
is built twice with the same weights: once with `qkv_layout="timm"` (the
column order of models saved before keras_vit grouped the qkv columns per
head) and once with `qkv_layout="heads"` (the default). Each model's
variables are placed on a `(batch, model)` mesh of 8 virtual CPU devices
exactly where `keras.distribution.ModelParallel(layout_map=layout_map(mesh))`
puts them (its `get_variable_layout`), and one SGD step (forward,
cross-entropy, backward, update) is jitted and compiled. The script counts
the collective operations in XLA's compiled HLO (all-reduce, all-gather,
all-to-all, collective-permute, reduce-scatter) and the elements they
produce, with 1 and with `--blocks` blocks, so the difference divided by
the extra blocks is the count per block. It also reports the step's loss
for both orders, which must agree (same function, same weights).

The placement is done by hand, not by building the model inside
`ModelParallel.scope()`, because keras_vit refuses to build a timm-order
model under model parallelism (that refusal is what this measures the
reason for). The layouts are the same ones.

Runs itself in a child process with
`XLA_FLAGS=--xla_force_host_platform_device_count=8` (the device count is
fixed when JAX starts) and prints a Markdown table, or one JSON line.
"""

import argparse
import json
import os
import re
import subprocess
import sys

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEVICE_COUNT = 8
COLLECTIVES = ("all-reduce", "all-gather", "all-to-all", "collective-permute", "reduce-scatter")
MODEL = dict(image_size=32, patch_size=8, num_channels=3, hidden_dim=64, num_heads=4, mlp_dim=128)
NUM_CLASSES = 10
BATCH_SIZE = 8
# One HLO instruction: `%name = TYPE op(` where TYPE is one shape or a tuple of shapes.
_INSTRUCTION = re.compile(r"=\s*(\([^=]*?\)|\S+)\s+(" + "|".join(COLLECTIVES) + r")(?:-start)?\(")
_SHAPE = re.compile(r"[a-z]+\d*\[([\d,]*)\]")


def count_collectives(hlo_text):
    """`{op: (count, elements)}` of the collectives in compiled HLO text (async pairs counted once)."""
    counts = {op: [0, 0] for op in COLLECTIVES}
    for match in _INSTRUCTION.finditer(hlo_text):
        result_type, op = match.groups()
        elements = 0
        for dims in _SHAPE.findall(result_type):
            size = 1
            for dim in filter(None, dims.split(",")):
                size *= int(dim)
            elements += size
        counts[op][0] += 1
        counts[op][1] += elements
    return {op: tuple(value) for op, value in counts.items()}


def _worker(model_axes, blocks):
    os.environ["KERAS_BACKEND"] = "jax"
    import jax
    import keras
    import numpy as np

    from keras_vit import ViTBackbone, ViTClassifier
    from keras_vit.distribution import head_aligned, layout_map

    assert jax.device_count() == DEVICE_COUNT, jax.device_count()
    rng = np.random.default_rng(0)
    images = rng.uniform(0, 255, size=(BATCH_SIZE, MODEL["image_size"], MODEL["image_size"], 3)).astype("float32")
    labels = rng.integers(0, NUM_CLASSES, size=BATCH_SIZE).astype("int32")

    def step_of(model, distribution):
        trainable = [v.value for v in model.trainable_variables]
        non_trainable = [v.value for v in model.non_trainable_variables]
        shard = lambda values, variables: [  # noqa: E731
            jax.device_put(value, distribution.get_variable_layout(variable).backend_layout)
            for value, variable in zip(values, variables)]
        trainable = shard(trainable, model.trainable_variables)
        non_trainable = shard(non_trainable, model.non_trainable_variables)
        data = distribution.get_data_layout((BATCH_SIZE,)).backend_layout
        x = jax.device_put(images, distribution.get_data_layout(images.shape).backend_layout)
        y = jax.device_put(labels, data)

        def loss_fn(trainable, non_trainable, x, y):
            logits, _ = model.stateless_call(trainable, non_trainable, x, training=True)
            losses = keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True)
            return keras.ops.mean(losses)

        @jax.jit
        def train_step(trainable, non_trainable, x, y):
            loss, grads = jax.value_and_grad(loss_fn)(trainable, non_trainable, x, y)
            return loss, [w - 0.1 * g for w, g in zip(trainable, grads)]

        compiled = train_step.lower(trainable, non_trainable, x, y).compile()
        loss, _ = compiled(trainable, non_trainable, x, y)
        return count_collectives(compiled.as_text()), float(loss)

    results = []
    for model_axis in model_axes:
        mesh = keras.distribution.DeviceMesh((DEVICE_COUNT // model_axis, model_axis), ("batch", "model"),
                                             keras.distribution.list_devices())
        distribution = keras.distribution.ModelParallel(layout_map=layout_map(mesh), batch_dim_name="batch")
        for num_layers in sorted({1, blocks}):
            keras.utils.set_random_seed(0)
            old = ViTClassifier(ViTBackbone(num_layers=num_layers, qkv_layout="timm", **MODEL),
                                num_classes=NUM_CLASSES)
            for variable in old.weights:  # the zero-initialised head too, so the loss depends on every weight
                variable.assign(np.random.default_rng(1).normal(scale=0.2, size=variable.shape).astype("float32"))
            new = head_aligned(old)  # the same weights, columns regrouped per head
            outputs = [np.asarray(model.predict_on_batch(images)) for model in (old, new)]
            for qkv_layout, model in (("timm", old), ("heads", new)):
                counts, loss = step_of(model, distribution)
                results.append({"model_axis": model_axis, "blocks": num_layers, "qkv_layout": qkv_layout,
                                "collectives": counts, "loss": loss,
                                "output_difference": float(np.max(np.abs(outputs[0] - outputs[1])))})
            keras.utils.clear_session()
    print("RESULT " + json.dumps(results))


def run(model_axes=(2, 4), blocks=2):
    """Measure in a child process with 8 virtual devices; return the list of result rows."""
    env = dict(os.environ, KERAS_BACKEND="jax", TF_CPP_MIN_LOG_LEVEL="3",
               PYTHONPATH=os.pathsep.join(filter(None, [REPO_ROOT, os.environ.get("PYTHONPATH")])))
    env["XLA_FLAGS"] = " ".join([env.get("XLA_FLAGS", ""),
                                 f"--xla_force_host_platform_device_count={DEVICE_COUNT}"]).strip()
    completed = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--worker", ",".join(map(str, model_axes)), str(blocks)],
        env=env, capture_output=True, text=True, timeout=1800,
    )
    lines = [line for line in completed.stdout.splitlines() if line.startswith("RESULT ")]
    if completed.returncode or not lines:
        raise RuntimeError(f"the worker failed (exit {completed.returncode}):\n{completed.stderr[-4000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def total(row):
    return sum(count for count, _ in row["collectives"].values())


def markdown(results, blocks):
    rows = {(r["model_axis"], r["blocks"], r["qkv_layout"]): r for r in results}
    lines = ["| model axis | qkv order | blocks | " + " | ".join(COLLECTIVES) + " | total | elements | per block | loss |",
             "|---|---|---|" + "---|" * len(COLLECTIVES) + "---|---|---|---|"]
    for (model_axis, num_layers, qkv_layout), row in sorted(rows.items()):
        elements = sum(e for _, e in row["collectives"].values())
        one = rows.get((model_axis, 1, qkv_layout))
        per_block = ""
        if num_layers > 1 and one is not None:
            per_block = f"{(total(row) - total(one)) / (num_layers - 1):g}"
        cells = " | ".join(str(row["collectives"][op][0]) for op in COLLECTIVES)
        lines.append(f"| {model_axis} | {qkv_layout} | {num_layers} | {cells} | {total(row)} | {elements:,} | "
                     f"{per_block} | {row['loss']:.7f} |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-axis", type=int, nargs="+", default=[2, 4],
                        help="model-axis sizes to measure (each must divide 8 and the 4 heads). Default: 2 4")
    parser.add_argument("--blocks", type=int, default=2, help="Transformer blocks (also measured with 1). Default: 2")
    parser.add_argument("--json", action="store_true", help="print the result rows as one JSON line")
    parser.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        _worker([int(size) for size in args.worker[0].split(",")], int(args.worker[1]))
        return
    for size in args.model_axis:
        if DEVICE_COUNT % size or MODEL["num_heads"] % size:
            parser.error(f"--model-axis must divide {DEVICE_COUNT} devices and {MODEL['num_heads']} heads. "
                         f"Received: --model-axis {size}")
    if args.blocks < 1:
        parser.error(f"--blocks must be at least 1. Received: --blocks {args.blocks}")
    results = run(tuple(args.model_axis), args.blocks)
    print(json.dumps(results) if args.json else markdown(results, args.blocks))


if __name__ == "__main__":
    main()
