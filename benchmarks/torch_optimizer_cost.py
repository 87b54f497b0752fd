"""What the optimizer costs in a keras_vit training step on the torch backend.

Keras' AdamW on torch updates all weights at once with `torch._foreach_*`
ops; every intermediate list they make is as large as the model.
`keras_vit.workflows.optimizers.AdamW` calls torch's fused Adam kernel instead. This
runs the same ViT's training step with each optimizer, each in its own
process (peak memory is per process), and prints the step time and peak RSS:

- `keras_adamw`, `keras_vit_adamw`, `sgd`: `model.train_on_batch` with
  `keras.optimizers.AdamW`, `keras_vit.workflows.optimizers.AdamW`, `keras.optimizers.SGD`;
- `torch_adamw`: a hand-written loop over the same Keras model (forward,
  cross-entropy, backward) with `torch.optim.AdamW` (torch's default for CPU
  tensors) on the model's torch parameters: what timm users run.

    PYTHONPATH=. .venv/bin/python benchmarks/torch_optimizer_cost.py --variant ViT-B/16 --batch 2

SGD's step is the floor: forward, loss and backward are the same model.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402

OPTIMIZERS = ("keras_adamw", "keras_vit_adamw", "torch_adamw", "sgd")


def measure(args):
    os.environ["KERAS_BACKEND"] = "torch"
    import keras
    import numpy as np
    import torch

    torch.set_num_threads(args.threads)
    from keras_vit.models import ViTClassifier
    from keras_vit.workflows.optimizers import AdamW

    model = ViTClassifier.from_variant(args.variant, num_classes=common.NUM_CLASSES, activation=None)
    rng = np.random.default_rng(0)
    images = rng.uniform(0, 255, (args.batch, common.IMAGE_SIZE, common.IMAGE_SIZE, 3)).astype("float32")
    labels = rng.integers(0, common.NUM_CLASSES, (args.batch,)).astype("int32")
    if args.optimizer == "torch_adamw":
        params = [v.value for v in model.trainable_variables]
        optimizer = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.004)
        x, y = torch.from_numpy(images), torch.from_numpy(labels).long()

        def step():
            optimizer.zero_grad(set_to_none=True)
            loss = torch.nn.functional.cross_entropy(model(x, training=True), y)
            loss.backward()
            optimizer.step()
            return loss.item()
    else:
        optimizer = {"keras_adamw": keras.optimizers.AdamW, "keras_vit_adamw": AdamW,
                     "sgd": keras.optimizers.SGD}[args.optimizer](learning_rate=1e-4)
        model.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=[])

        def step():
            return model.train_on_batch(images, labels)

    wall, cpu = common.time_calls(step, args.warmup, args.repeats)
    print(json.dumps({"optimizer": args.optimizer, "step_seconds": sorted(wall), "cpu_seconds": sorted(cpu),
                      "peak_rss_mib": round(common.peak_rss_mib()), "load": common.load_average()}))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--variant", default="ViT-B/16")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=1, help="interleaved rounds (each optimizer once per round)")
    parser.add_argument("--optimizers", default=",".join(OPTIMIZERS))
    parser.add_argument("--optimizer", choices=OPTIMIZERS, default=None, help="measure one, in this process")
    args = parser.parse_args(argv)
    if args.optimizer:
        measure(args)
        return 0
    names = args.optimizers.split(",")
    rows = {name: [] for name in names}
    for round_index in range(args.rounds):
        for name in names if round_index % 2 == 0 else reversed(names):
            command = [sys.executable, os.path.abspath(__file__), "--optimizer", name, "--variant", args.variant,
                       "--batch", str(args.batch), "--threads", str(args.threads), "--warmup", str(args.warmup),
                       "--repeats", str(args.repeats)]
            result = subprocess.run(command, capture_output=True, text=True, check=True)
            row = json.loads(result.stdout.strip().splitlines()[-1])
            rows[name].append(row)
            steps = ", ".join(f"{t:.2f}" for t in row["step_seconds"])
            print(f"{args.variant} batch {args.batch}, {name}: {steps} s (CPU median "
                  f"{statistics.median(row['cpu_seconds']):.2f} s); peak RSS {row['peak_rss_mib']} MiB; "
                  f"load {row['load']:.1f}", flush=True)
    print("medians over rounds:")
    for name, runs in rows.items():
        wall = statistics.median(t for r in runs for t in r["step_seconds"])
        cpu = statistics.median(t for r in runs for t in r["cpu_seconds"])
        rss = statistics.median(r["peak_rss_mib"] for r in runs)
        print(f"  {name:16} step {wall:.2f} s, CPU {cpu:.2f} s, peak RSS {rss:.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
