"""The image-folder chain on scikit-learn's digits, offline, one backend per process.

    KERAS_BACKEND=jax python benchmarks/finetune_digits.py --epochs 10 --pretrain-epochs 10 --json out.json

Writes the digits as a PNG folder (train/ and test/, the demo's split), then
measures:

- the input pipeline: images/s read from PNG, decoded, crop-augmented and
  batched by `ImageFolderDataset` (one thread, the whole training set once);
- the model: images/s of `fit` steps on the same batches already in memory
  (the second epoch, after compilation);
- held-out accuracy of: the digits model trained from scratch on the folder
  (8x8); the same after masked patch prediction pre-training on the
  training folder's images; and both again at 16x16 (position embeddings
  resampled), so the resolution's effect is seen apart from the pre-training's;
- few-shot linear evaluation (1, 5, 10 shots per class, 3 seeds, big_vision's
  closed-form ridge) of the frozen representations: random init, MPP
  pre-trained, and each fine-tuned model.

`--markdown` prints the rows of docs/finetuning.md's table from the JSON
files of several backends.
"""

import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import common  # noqa: E402


def measure(args):
    import keras
    import numpy as np

    import keras_vit
    from keras_vit.data import AugmentPolicy, image_folder_datasets, write_digits_folder
    from keras_vit.workflows.fewshot import fewshot_evaluate_folder
    from keras_vit.workflows.digits_demo import build_digits_predictor
    from keras_vit.workflows.pretraining import pretrain_predictor
    from keras_vit.data import ImageFolderDataset, index_image_folder

    work = tempfile.mkdtemp(prefix="finetune_digits.")
    train_dir, test_dir = write_digits_folder(os.path.join(work, "digits"), seed=args.seed)
    # Digits are not mirror-symmetric and fill their 8x8 frame: no flip, and a
    # milder crop than big_vision's 5% minimum area.
    augment = AugmentPolicy(crop_scale=(0.6, 1.0), flip=False)
    result = {"backend": keras.backend.backend(), "keras": keras.__version__, "cpu": common.host_info()["cpu"],
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "epochs": args.epochs,
              "pretrain_epochs": args.pretrain_epochs, "batch_size": args.batch_size, "seed": args.seed, "rows": {}}

    # --- Input pipeline throughput, one decoding thread.
    for size in (8, 16):
        data, _ = image_folder_datasets(train_dir, size, num_channels=1, batch_size=args.batch_size,
                                        validation_split=0, augment=augment, workers=1)
        start = time.perf_counter()
        count = sum(len(data[i][0]) for i in range(len(data)))
        result[f"pipeline_images_per_s_{size}px"] = count / (time.perf_counter() - start)

    def fewshot(model):
        scores, _ = fewshot_evaluate_folder(model, train_dir, test_dir=test_dir, shots=(1, 5, 10), seeds=(0, 1, 2))
        return {k: v["mean"] for k, v in scores.items()}

    def model_file(backbone, name):
        path = os.path.join(work, name)
        backbone.save(path)
        return path

    # --- Representations before any labels: random init, MPP pre-trained.
    predictor = build_digits_predictor(seed=args.seed)
    random_file = model_file(predictor.backbone, "random.keras")
    result["rows"]["random init (no training)"] = {"fewshot": fewshot(predictor.backbone)}
    paths, _, _ = index_image_folder(train_dir)
    unlabeled = ImageFolderDataset(paths, None, 8, num_channels=1, batch_size=64, training=True,
                                   augment=AugmentPolicy.none(), seed=args.seed, workers=1)
    start = time.perf_counter()
    pretrain_predictor(predictor, unlabeled, epochs=args.pretrain_epochs, batch_size=64, seed=args.seed,
                       verbose=0)
    result["pretrain_seconds"] = time.perf_counter() - start
    mpp_file = model_file(predictor.backbone, "mpp.keras")
    result["rows"]["MPP pre-trained (frozen)"] = {"fewshot": fewshot(predictor.backbone)}

    # --- Fine-tuning runs on the folder.
    # Scratch at 16x16 separates the resolution's share of the 16x16 gain from the pre-training's.
    runs = [("scratch, 8x8", random_file, None), ("MPP pre-trained, fine-tuned 8x8", mpp_file, None),
            ("scratch, 16x16", random_file, 16), ("MPP pre-trained, fine-tuned 16x16", mpp_file, 16)]
    for name, source, size in runs:
        start = time.perf_counter()
        run = keras_vit.finetune(train_dir, preset=source, image_size=size, recipe="adamw", epochs=args.epochs,
                                 batch_size=args.batch_size, learning_rate=2e-3, weight_decay=0.3,
                                 validation_dir=test_dir, augment=augment, seed=args.seed, workers=2, verbose=0)
        seconds = time.perf_counter() - start
        result["rows"][name] = {"accuracy": run["accuracy"], "seconds": seconds, "fewshot": fewshot(run["model"])}

        # Model throughput on batches already in memory (second epoch, compiled).
        model = run["model"]
        pixels = size or 8
        x = np.random.default_rng(0).uniform(0, 255, (args.batch_size * 20, pixels, pixels, 1)).astype("float32")
        y = np.arange(len(x)) % 10
        model.fit(x, y, batch_size=args.batch_size, epochs=1, verbose=0)
        start = time.perf_counter()
        model.fit(x, y, batch_size=args.batch_size, epochs=1, verbose=0)
        result["rows"][name]["train_images_per_s"] = len(x) / (time.perf_counter() - start)
    return result


def markdown(paths):
    results = []
    for path in paths:
        with open(path) as file:
            results.append(json.load(file))
    names = list(results[0]["rows"])
    seeds = {r.get("seed", 0) for r in results}
    header = "| | " + " | ".join(r["backend"] + (f", seed {r.get('seed', 0)}" if len(seeds) > 1 else "")
                                 for r in results) + " |"
    lines = [header, "|---" * (len(results) + 1) + "|"]
    for name in names:
        cells = []
        for r in results:
            row = r["rows"][name]
            shots = " / ".join(f"{row['fewshot'][str(k)] if str(k) in row['fewshot'] else row['fewshot'][k]:.1%}"
                               for k in (1, 5, 10))
            accuracy = f"**{row['accuracy']:.1%}**, " if "accuracy" in row else ""
            cells.append(f"{accuracy}few-shot {shots}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    for size in (8, 16):
        lines.append(f"| input pipeline, {size}x{size} (images/s, 1 thread) | "
                     + " | ".join(f"{r[f'pipeline_images_per_s_{size}px']:,.0f}" for r in results) + " |")
    for name in names:
        if "train_images_per_s" in results[0]["rows"][name]:
            lines.append(f"| model training, {name} (images/s) | "
                         + " | ".join(f"{r['rows'][name]['train_images_per_s']:,.0f}" for r in results) + " |")
    lines.append("| wall time of the fine-tuning runs (s) | " + " | ".join(
        " / ".join(f"{r['rows'][n]['seconds']:.0f}" for n in names if "seconds" in r["rows"][n]) for r in results)
        + " |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--pretrain-epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None, help="write the measurements here")
    parser.add_argument("--markdown", nargs="+", default=None, help="print the table from these JSON files")
    args = parser.parse_args()
    if args.markdown:
        print(markdown(args.markdown))
        return
    result = measure(args)
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        from keras_vit.writer.files import atomic_write

        with atomic_write(args.json, "w") as file:
            file.write(text)


if __name__ == "__main__":
    main()
