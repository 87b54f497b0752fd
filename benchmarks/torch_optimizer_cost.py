"""What Keras' optimizer costs in a keras_vit training step on the torch backend.

Keras' AdamW on torch updates all weights at once with `torch._foreach_*`
ops; every intermediate list they make is as large as the model. This runs
`train_on_batch` with AdamW and with SGD, each in its own process (peak
memory is per process), and prints the step time and peak RSS of each:

    PYTHONPATH=. .venv/bin/python benchmarks/torch_optimizer_cost.py --variant ViT-B/16 --batch 2

The difference between the two is what the optimizer adds to the step; the
rest (forward, loss, backward) is the same model.
"""

import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402

OPTIMIZERS = ("adamw", "sgd")


def measure(args):
    os.environ["KERAS_BACKEND"] = "torch"
    import keras
    import numpy as np
    import torch

    torch.set_num_threads(args.threads)
    from keras_vit.models import ViTClassifier

    optimizer = {"adamw": keras.optimizers.AdamW, "sgd": keras.optimizers.SGD}[args.optimizer](learning_rate=1e-4)
    model = ViTClassifier.from_variant(args.variant, num_classes=common.NUM_CLASSES, activation=None)
    model.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=[])
    rng = np.random.default_rng(0)
    images = rng.uniform(0, 255, (args.batch, common.IMAGE_SIZE, common.IMAGE_SIZE, 3)).astype("float32")
    labels = rng.integers(0, common.NUM_CLASSES, (args.batch,)).astype("int32")
    wall, _ = common.time_calls(lambda: model.train_on_batch(images, labels), args.warmup, args.repeats)
    print(json.dumps({"optimizer": args.optimizer, "step_seconds": sorted(wall),
                      "peak_rss_mib": round(common.peak_rss_mib())}))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--variant", default="ViT-B/16")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--optimizer", choices=OPTIMIZERS, default=None, help="measure one, in this process")
    args = parser.parse_args(argv)
    if args.optimizer:
        measure(args)
        return 0
    for name in OPTIMIZERS:
        command = [sys.executable, os.path.abspath(__file__), "--optimizer", name, "--variant", args.variant,
                   "--batch", str(args.batch), "--threads", str(args.threads), "--warmup", str(args.warmup),
                   "--repeats", str(args.repeats)]
        result = subprocess.run(command, capture_output=True, text=True, check=True)
        row = json.loads(result.stdout.strip().splitlines()[-1])
        steps = ", ".join(f"{t:.2f}" for t in row["step_seconds"])
        print(f"{args.variant} batch {args.batch}, {name}: train_on_batch {steps} s; peak RSS {row['peak_rss_mib']} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
