"""Masked patch prediction vs training from scratch, in miniature (ViT paper §4.6).

The paper pre-trains ViT-B/16 on JFT with masked patch prediction and
fine-tunes on ImageNet (79.9%, +2% over scratch, 4% below supervised
pre-training). Here the same comparison runs on scikit-learn's 8x8 digits:

1. split the digits into training (80%) and held-out (20%) images;
2. keep the labels of a stratified 10% of the training images;
3. arm "mpp": pre-train the digits ViT with masked patch prediction on all
   training images *without labels*, then fine-tune it on the labelled 10%;
4. arm "scratch": train the same ViT from random weights on the labelled 10%
   with the same fine-tuning recipe;
5. score both on the held-out images; repeat for several seeds (the seed
   picks the labelled subset, the weights and the corruption).

Held-out images are never seen, not even unlabeled. Run from the repository
root:

    KERAS_BACKEND=jax PYTHONPATH=. python benchmarks/mpp_digits.py
"""

import argparse
import json
import os
import time

os.environ.setdefault("KERAS_BACKEND", "jax")

import keras  # noqa: E402
import numpy as np  # noqa: E402

from keras_vit.data import load_digits_split  # noqa: E402
from keras_vit.models.vit_classifier import ViTClassifier  # noqa: E402
from keras_vit.workflows.digits_demo import build_digits_classifier, build_digits_predictor  # noqa: E402
from keras_vit.workflows.pretraining import pretrain_predictor  # noqa: E402
from keras_vit.workflows.training import train_classifier  # noqa: E402


def labelled_subset(labels, fraction, seed):
    """Indices of a stratified `fraction` of `labels` (at least one per class)."""
    rng = np.random.default_rng(seed)
    chosen = []
    for label in np.unique(labels):
        members = np.flatnonzero(labels == label)
        count = max(1, int(round(fraction * len(members))))
        chosen.extend(rng.choice(members, size=count, replace=False))
    return np.sort(np.asarray(chosen))


def run_seed(seed, args):
    (x_train, y_train), (x_test, y_test) = load_digits_split(seed=0)
    subset = labelled_subset(y_train, args.label_fraction, seed)
    labelled = (x_train[subset], y_train[subset])
    finetune = dict(epochs=args.finetune_epochs, batch_size=args.batch_size,
                    learning_rate=args.learning_rate, weight_decay=args.weight_decay, seed=seed, verbose=0)

    start = time.perf_counter()
    scratch = train_classifier(build_digits_classifier(seed=seed), labelled, (x_test, y_test), **finetune)
    scratch_seconds = time.perf_counter() - start

    start = time.perf_counter()
    predictor = build_digits_predictor(seed=seed, target=args.target)
    pretrained = pretrain_predictor(
        predictor, x_train, validation_images=x_test, epochs=args.pretrain_epochs,
        batch_size=args.pretrain_batch_size, learning_rate=args.pretrain_learning_rate, seed=seed, verbose=0,
    )
    keras.utils.set_random_seed(seed)
    classifier = ViTClassifier(backbone=predictor.backbone, num_classes=10)
    mpp = train_classifier(classifier, labelled, (x_test, y_test), **finetune)
    mpp_seconds = time.perf_counter() - start
    return {
        "seed": seed,
        "labelled": int(len(subset)),
        "scratch_accuracy": scratch["accuracy"],
        "mpp_accuracy": mpp["accuracy"],
        "pretext_accuracy_held_out": pretrained["validation"].get("accuracy"),
        "scratch_seconds": scratch_seconds,
        "mpp_seconds": mpp_seconds,
    }


def summarise(values):
    values = np.asarray(values, dtype=np.float64)
    spread = values.std(ddof=1) if len(values) > 1 else 0.0
    return f"{100 * values.mean():.1f}% ± {100 * spread:.1f} (min {100 * values.min():.1f}, max {100 * values.max():.1f})"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=3, help="number of seeds (default: 3)")
    parser.add_argument("--label-fraction", type=float, default=0.1, help="share of labelled training images (default: 0.1)")
    parser.add_argument("--target", default="mean_color", help="masked patch prediction target (default: mean_color)")
    parser.add_argument("--pretrain-epochs", type=int, default=60, help="default: 60")
    parser.add_argument("--pretrain-batch-size", type=int, default=64, help="default: 64")
    parser.add_argument("--pretrain-learning-rate", type=float, default=1e-3, help="default: 1e-3")
    parser.add_argument("--finetune-epochs", type=int, default=100, help="both arms (default: 100)")
    parser.add_argument("--batch-size", type=int, default=32, help="fine-tuning batch size (default: 32)")
    parser.add_argument("--learning-rate", type=float, default=2e-3, help="fine-tuning peak AdamW rate (default: 2e-3)")
    # The README's numbers were measured with 0.05 (the demo now uses 0.3).
    parser.add_argument("--weight-decay", type=float, default=0.05, help="fine-tuning AdamW weight decay (default: 0.05)")
    parser.add_argument("--json", default=None, help="also write the per-seed results to this file")
    args = parser.parse_args()

    print(f"Backend: {keras.backend.backend()}; {args.seeds} seeds; {args.label_fraction:.0%} of the labels; "
          f"target {args.target}")
    start = time.perf_counter()
    rows = []
    for seed in range(args.seeds):
        row = run_seed(seed, args)
        rows.append(row)
        print(f"seed {seed}: {row['labelled']} labelled digits; scratch {row['scratch_accuracy']:.2%}, "
              f"mpp {row['mpp_accuracy']:.2%} (pretext accuracy on held-out patches "
              f"{row['pretext_accuracy_held_out']:.2%})")
    scratch = [row["scratch_accuracy"] for row in rows]
    mpp = [row["mpp_accuracy"] for row in rows]
    gains = np.subtract(mpp, scratch)
    print(f"scratch: {summarise(scratch)}")
    print(f"mpp:     {summarise(mpp)}")
    print(f"gain (mpp - scratch, paired by seed): {100 * gains.mean():+.1f} points ± {100 * gains.std(ddof=1):.1f}; "
          f"mpp better in {int((gains > 0).sum())} of {len(gains)} seeds")
    print(f"total {time.perf_counter() - start:.0f} s")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"args": vars(args), "backend": keras.backend.backend(), "rows": rows}, handle, indent=2)


if __name__ == "__main__":
    main()
