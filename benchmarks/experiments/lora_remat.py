"""LoRA and rematerialisation against plain fine-tuning: trainable parameters, memory, accuracy, speed.

    KERAS_BACKEND=jax python benchmarks/experiments/lora_remat.py [--epochs 10] [--pretrain-epochs 30] [--ranks 4 8]

Two measurements, each run in a fresh process so its peak resident memory
(`ru_maxrss`) is its own:

- digits: the demo's split written as a PNG folder; a backbone pre-trained
  with masked patch prediction on the training images (the self-supervised
  objective, so no label leaks), then fine-tuned on the folder with the AdamW
  recipe for the same epochs, every weight vs LoRA of each rank (at the
  recipe's learning rate 1e-3 and at 1e-2, LoRA's usual larger one);
- ViT-B/16 at 224x224 (random weights, 10 classes): a few AdamW training
  steps of batch 8, every weight vs LoRA of rank 8, each with and without
  rematerialisation (`set_remat`): trainable parameters, peak memory,
  seconds per step after the first, and the losses (equal with and without
  rematerialisation).

Prints a table and the host.
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import common  # noqa: E402


def peak_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def trainable(model):
    import numpy as np

    return int(sum(np.prod(weight.shape) for weight in model.trainable_weights))


def prepare(work, args):
    """The digits folder and an MPP-pre-trained backbone saved as .keras."""
    from keras_vit.data import ImageFolderDataset, index_image_folder, write_digits_folder
    from keras_vit.workflows.digits_demo import build_digits_predictor
    from keras_vit.workflows.pretraining import pretrain_predictor

    train_dir, test_dir = write_digits_folder(os.path.join(work, "digits"), seed=0)
    paths, _, _ = index_image_folder(train_dir)
    images = ImageFolderDataset(paths, None, 8, num_channels=1, batch_size=64, training=True, seed=0, workers=1)
    predictor = build_digits_predictor(seed=0, num_channels=1)
    pretrain_predictor(predictor, images, epochs=args.pretrain_epochs, batch_size=64, seed=0, verbose=0)
    pretrained = os.path.join(work, "pretrained.keras")
    predictor.backbone.save(pretrained)
    return train_dir, test_dir, pretrained


def one_digits_run(args):
    from keras_vit.data import AugmentPolicy
    from keras_vit.workflows.finetuning import finetune

    rank = None if args.rank == 0 else args.rank
    start = time.perf_counter()
    result = finetune(args.train_dir, preset=args.pretrained, validation_dir=args.test_dir, recipe="adamw",
                      epochs=args.epochs, batch_size=64, lora_rank=rank, workers=1, verbose=0,
                      learning_rate=args.learning_rate,
                      augment=AugmentPolicy(crop_scale=(0.6, 1.0), flip=False))
    return {"trainable": trainable(result["model"]), "parameters": int(result["model"].count_params()),
            "accuracy": result["accuracy"], "seconds": time.perf_counter() - start, "peak_mib": peak_mib()}


def one_large_run(args):
    import keras
    import numpy as np

    import keras_vit
    from keras_vit.utils.seeds import set_random_seed

    set_random_seed(0)
    model = keras_vit.ViTClassifier.from_variant("ViT-B/16", num_classes=10, dropout=0.0)
    if args.rank:
        model.enable_lora(args.rank)
    model.set_remat(args.remat)
    model.compile(optimizer=keras.optimizers.AdamW(1e-4), loss="sparse_categorical_crossentropy")
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 255, (8, 224, 224, 3)).astype("float32")
    y = rng.integers(0, 10, 8)
    seconds, losses = [], []
    for _ in range(args.steps):
        start = time.perf_counter()
        losses.append(float(np.ravel(model.train_on_batch(x, y))[0]))  # [loss] or loss
        seconds.append(time.perf_counter() - start)
    return {"trainable": trainable(model), "parameters": int(model.count_params()), "losses": losses,
            "seconds_per_step": float(np.median(seconds[1:])), "first_step": seconds[0], "peak_mib": peak_mib()}


def child(argv):
    out = subprocess.run([sys.executable, os.path.abspath(__file__), *argv], capture_output=True, text=True,
                         timeout=3600)
    line = next((l for l in out.stdout.splitlines() if l.startswith("RESULT ")), None)
    if line is None:
        raise RuntimeError(out.stdout[-2000:] + out.stderr[-4000:])
    return json.loads(line[len("RESULT "):])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--pretrain-epochs", type=int, default=30)
    parser.add_argument("--ranks", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--skip-large", action="store_true")
    parser.add_argument("--skip-digits", action="store_true")
    parser.add_argument("--one", choices=("digits", "large"), help=argparse.SUPPRESS)
    parser.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--remat", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--learning-rate", type=float, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--train-dir", help=argparse.SUPPRESS)
    parser.add_argument("--test-dir", help=argparse.SUPPRESS)
    parser.add_argument("--pretrained", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        result = one_digits_run(args) if args.one == "digits" else one_large_run(args)
        print("RESULT " + json.dumps(result), flush=True)
        return

    import keras

    host = common.host_info()
    print(f"backend {keras.backend.backend()}, keras {keras.__version__}, host: {host['cpu']}")
    if not args.skip_digits:
        digits_table(args)
    if not args.skip_large:
        large_table(args)


def digits_table(args):
    work = tempfile.mkdtemp(prefix="lora_bench.")
    train_dir, test_dir, pretrained = prepare(work, args)
    print(f"\ndigits folder, MPP-pre-trained backbone ({args.pretrain_epochs} epochs), AdamW fine-tuning "
          f"{args.epochs} epochs, batch 64:")
    print("| fine-tuning | learning rate | trainable / all parameters | held-out accuracy | peak RSS MiB | seconds |")
    print("|---|---|---|---|---|---|")
    for rank, rate in [(0, 1e-3), (0, 1e-2), *((r, lr) for r in args.ranks for lr in (1e-3, 1e-2))]:
        row = child(["--one", "digits", "--rank", str(rank), "--epochs", str(args.epochs), "--train-dir", train_dir,
                     "--test-dir", test_dir, "--pretrained", pretrained, "--learning-rate", str(rate)])
        name = "every weight" if rank == 0 else f"LoRA rank {rank}"
        print(f"| {name} | {rate:g} | {row['trainable']:,} / {row['parameters']:,} | {row['accuracy']:.2%} | "
              f"{row['peak_mib']:.0f} | {row['seconds']:.0f} |", flush=True)


def large_table(args):
    print(f"\nViT-B/16, 224x224, batch 8, AdamW, {args.steps} steps (median of all but the first):")
    print("| fine-tuning | remat | trainable parameters | peak RSS MiB | s / step | losses |")
    print("|---|---|---|---|---|---|")
    for rank in (0, 8):
        for remat in (False, True):
            row = child(["--one", "large", "--rank", str(rank), "--steps", str(args.steps)] + ["--remat"] * remat)
            name = "every weight" if rank == 0 else f"LoRA rank {rank}"
            losses = " ".join(f"{loss:.6f}" for loss in row["losses"])
            print(f"| {name} | {'on' if remat else 'off'} | {row['trainable']:,} | {row['peak_mib']:.0f} | "
                  f"{row['seconds_per_step']:.2f} | {losses} |", flush=True)


if __name__ == "__main__":
    main()
