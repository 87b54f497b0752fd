"""Where the time goes: torch.profiler over keras_vit (torch backend) or timm.

    KERAS_BACKEND=torch PYTHONPATH=. .venv/bin/python benchmarks/profile_torch.py --impl keras
    KERAS_BACKEND=torch PYTHONPATH=. .venv/bin/python benchmarks/profile_torch.py --impl keras --optimizer keras
    .venv-ref/bin/python benchmarks/profile_torch.py --impl timm

Prints the operators with the most self CPU time for a forward pass and a
training step, so the two implementations can be compared op by op.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--impl", choices=("keras", "timm", "hf"), required=True)
    parser.add_argument("--variant", default="ViT-S/16")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--mode", choices=("forward", "train", "both"), default="both")
    parser.add_argument("--rows", type=int, default=25)
    parser.add_argument("--optimizer", choices=("keras_vit", "keras"), default="keras_vit",
                        help="keras_vit: keras_vit.workflows.optimizers.AdamW (fused on torch); keras: keras.optimizers.AdamW")
    args = parser.parse_args(argv)

    import numpy as np
    import torch

    torch.set_num_threads(args.threads)
    if args.impl == "keras":
        os.environ.setdefault("KERAS_BACKEND", "torch")
        import keras

        from keras_vit.models import ViTClassifier
        from keras_vit.workflows.optimizers import AdamW

        model = ViTClassifier.from_variant(args.variant, activation=None)
        optimizer = AdamW(1e-4) if args.optimizer == "keras_vit" else keras.optimizers.AdamW(1e-4)
        model.compile(optimizer=optimizer,
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=[])
        images = np.random.default_rng(0).uniform(0, 255, (args.batch, 224, 224, 3)).astype("float32")
        labels = np.zeros((args.batch,), "int32")
        forward = lambda: model.predict_on_batch(images)  # noqa: E731
        train = lambda: model.train_on_batch(images, labels)  # noqa: E731
    else:
        from reference_worker import build

        model = build(args.impl, args.variant)
        images = torch.randn(args.batch, 3, 224, 224)
        labels = torch.zeros(args.batch, dtype=torch.long)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        call = (lambda x: model(pixel_values=x).logits) if args.impl == "hf" else model

        def forward():
            model.eval()
            with torch.inference_mode():
                return call(images)

        def train():
            model.train()
            optimizer.zero_grad(set_to_none=True)
            loss = torch.nn.functional.cross_entropy(call(images), labels)
            loss.backward()
            optimizer.step()

    modes = ("forward", "train") if args.mode == "both" else (args.mode,)
    for mode in modes:
        fn = forward if mode == "forward" else train
        fn()
        fn()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            fn()
        print(f"==== {args.impl} {args.variant} {mode} batch={args.batch} threads={args.threads}")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.rows))


if __name__ == "__main__":
    main()
