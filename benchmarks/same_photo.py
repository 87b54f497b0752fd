"""The same photo, the same answer: issue 47's table, rerun.

    KERAS_BACKEND=tensorflow PYTHONPATH=. .venv/bin/python benchmarks/same_photo.py

Each row is a client that reads the nine photographs of tests/convert/photos.py
as files, end to end, against the answer it should give: the top-5 classes in
the same order (how many of 9) and the largest difference in a probability
(over all classes; and on which photo). The model is the random timm ViT-S/16
of tests/fixtures/photos (rebuilt from its seed; timm's own answers are the
committed fixture, so timm is not needed here); the transformers rows use the
small random transformers ViT of the tests, saved with `save_pretrained`.

Rows:
- timm's pipeline (`resolve_data_config` + `create_transform`) vs
  `keras-vit predict` of the timm checkpoint, for timm's pretrained_cfg
  (crop_pct 0.9, bicubic) and for a squash / bilinear one;
- keras_vit -> `keras-vit convert --to huggingface` -> transformers'
  `pipeline("image-classification")`, vs `keras-vit predict` (and whether the
  labels are class names, not LABEL_k);
- transformers `save_pretrained` (with a ViTImageProcessor, or a
  ConvNext-style processor with crop_pct) -> `keras-vit predict`, vs the
  pipeline on the same directory;
- `keras-vit export --format onnx` of the timm checkpoint, run in onnxruntime
  on the pixels a client prepares from what the export tells it (export.json's
  transform where it has one, else a plain resize to the input shape,
  bilinear), vs `keras-vit predict`.

The export runs in a `KERAS_BACKEND=tensorflow` process of its own (Keras
exports ONNX from TensorFlow only); the other rows run on this process's
backend.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
from tests.convert.photos import (  # noqa: E402
    HF_CLASS_NAMES, PHOTO_FILES, as_probabilities, compare, keras_vit_predict, pixel_digest, random_transformers_vit,
    scores_by_class, transformers_pipeline, write_checkpoint, write_photos,
)

FIXTURES = os.path.join(REPO, "tests", "fixtures", "photos")
PHOTOS = tuple(PHOTO_FILES)
TOP = 5


def timm_reference(name):
    with np.load(os.path.join(FIXTURES, name, "reference.npz"), allow_pickle=False) as data:
        assert tuple(data["photos"]) == PHOTOS
        return data["probabilities"].astype(np.float64)


def row(client, clients, references, note=""):
    """One line of the table: same top-5 order n of 9, the largest difference and its photo."""
    same, differences = zip(*(compare(c, r, TOP) for c, r in zip(clients, references)))
    worst = int(np.argmax(differences))
    others = sorted(((d, PHOTOS[i]) for i, d in enumerate(differences) if i != worst), reverse=True)[:1]
    detail = f"{differences[worst]:.3g} ({PHOTOS[worst]})" + "".join(f", {d:.2g} ({p})" for d, p in others)
    return {"client": client, "same_top5": int(sum(same)), "of": len(PHOTOS), "largest_difference": detail,
            "differences": {p: round(d, 6) for p, d in zip(PHOTOS, differences)},
            "failing": [p for p, s, d in zip(PHOTOS, same, differences) if not (s and d <= 1e-2)], "note": note}


def documented_client():
    """docs/deploy.md's own `preprocess(path, export_dir)` (its "Feeding the graph from a client" lines), or None."""
    import re

    with open(os.path.join(REPO, "docs", "deploy.md"), encoding="utf-8") as handle:
        page = handle.read()
    if "### Feeding the graph from a client" not in page:
        return None
    section = page.split("### Feeding the graph from a client", 1)[1].split("\n## ", 1)[0]
    namespace = {}
    for block in re.findall(r"```python\n(.*?)```", section, re.S):
        if "def preprocess" in block:
            exec(compile(block, "docs/deploy.md", "exec"), namespace)  # noqa: S102 - the page's own lines
            return namespace["preprocess"]
    return None


def guessed_client(path, export_dir):
    """A client told only the input shape (export.json before issue 47): the whole image resized to it, bilinear."""
    from PIL import Image

    with open(os.path.join(export_dir, "export.json")) as handle:
        _, height, width, _ = json.load(handle)["input"]["shape"]
    with Image.open(path) as image:
        pixels = np.asarray(image.convert("RGB").resize((width, height), Image.Resampling.BILINEAR), np.float32)
    return pixels[None]


def onnx_answers(checkpoint, directory, paths):
    import onnxruntime

    environment = {**os.environ, "KERAS_BACKEND": "tensorflow", "PYTHONPATH": REPO}
    result = subprocess.run([sys.executable, "-m", "keras_vit", "export", checkpoint, "--format", "onnx",
                             "--out", directory], env=environment, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"keras-vit export failed: {result.stderr[-2000:]}")
    preprocess = documented_client()
    session = onnxruntime.InferenceSession(os.path.join(directory, "model.onnx"), providers=["CPUExecutionProvider"])
    feed = session.get_inputs()[0]
    answers = []
    for path in paths:
        (scores,) = session.run(None, {feed.name: (preprocess or guessed_client)(path, directory)})
        scores = np.asarray(scores, np.float64)[0]
        if abs(scores.sum() - 1.0) > 1e-3 or scores.min() < 0:  # logits
            scores = np.exp(scores - scores.max())
            scores /= scores.sum()
        answers.append(scores)
    return answers, preprocess is not None


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--no-onnx", action="store_true", help="leave out the ONNX row (it needs tensorflow, tf2onnx)")
    parser.add_argument("--json", metavar="FILE", help="also write the rows, per photo, as JSON")
    args = parser.parse_args(argv)
    import keras

    with open(os.path.join(FIXTURES, "MANIFEST.json")) as handle:
        manifest = json.load(handle)
    rows = []
    with tempfile.TemporaryDirectory(prefix="same-photo-") as work:
        photos = write_photos(os.path.join(work, "photos"))
        differing = [n for n, p in photos.items() if pixel_digest(p) != manifest["photos"][n]["pixel_digest"]]
        if differing:
            sys.exit(f"photos {differing} decode to other pixels than timm's fixture: see "
                     "scripts/make_photo_fixtures.py")
        paths = list(photos.values())
        checkpoints, keras_vit_answers = {}, {}
        for name in manifest["fixtures"]:
            with open(os.path.join(FIXTURES, name, "config.json")) as handle:
                config = json.load(handle)
            checkpoints[name] = write_checkpoint(os.path.join(work, name), config, manifest["weights"])
            ranked = keras_vit_predict(checkpoints[name], paths)
            keras_vit_answers[name] = [as_probabilities(r, 1000) for r in ranked]
            cfg = config["pretrained_cfg"]
            rows.append(row(f"timm's pipeline vs `keras-vit predict` (crop_pct {cfg['crop_pct']}, "
                            f"{cfg.get('crop_mode', 'center')}, {cfg['interpolation']})",
                            keras_vit_answers[name], timm_reference(name)))
        for name, checkpoint in checkpoints.items():
            export = os.path.join(work, f"hf_{name}")
            from keras_vit import cli

            if cli.main(["convert", checkpoint, export, "--to", "huggingface"]) != 0:
                raise RuntimeError("keras-vit convert --to huggingface failed")
            with open(os.path.join(export, "config.json")) as handle:
                id2label = {int(i): label for i, label in json.load(handle)["id2label"].items()}
            ranked = transformers_pipeline(export, paths)
            answers = [scores_by_class(r, id2label, k) for r, k in zip(ranked, keras_vit_answers[name])]
            named = not any(label.startswith("LABEL_") for label in id2label.values())
            rows.append(row(f"keras_vit -> `convert --to huggingface` -> transformers `pipeline` ({name})", answers,
                            keras_vit_answers[name], note="labels: class names" if named else "labels: LABEL_k"))
        model = random_transformers_vit(seed=47)
        import transformers

        processors = {
            "ViTImageProcessor": transformers.ViTImageProcessor(),
            "ConvNext-style crop_pct 0.875": transformers.ConvNextImageProcessor(
                size={"shortest_edge": 224}, crop_pct=0.875, resample=3,
                image_mean=[0.485, 0.456, 0.406], image_std=[0.229, 0.224, 0.225]),
        }
        for label, processor in processors.items():
            directory = os.path.join(work, "transformers_" + label.split()[0])
            model.save_pretrained(directory)
            processor.save_pretrained(directory)
            reference = [scores_by_class(r, dict(enumerate(HF_CLASS_NAMES)), np.zeros(len(HF_CLASS_NAMES)))
                         for r in transformers_pipeline(directory, paths)]
            ranked = keras_vit_predict(directory, paths)
            names = all(name in HF_CLASS_NAMES for r in ranked for _, name, _ in r[:TOP])
            rows.append(row(f"transformers `save_pretrained` ({label}) -> `keras-vit predict` vs the pipeline",
                            [as_probabilities(r, len(HF_CLASS_NAMES)) for r in ranked], reference,
                            note="names: id2label" if names else "names: class k"))
        if not args.no_onnx:
            name = "timm_center_crop"
            answers, documented = onnx_answers(checkpoints[name], os.path.join(work, "onnx"), paths)
            how = ("docs/deploy.md's preprocess lines" if documented else
                   "docs/deploy.md gives no client lines: a plain 224x224 bilinear resize")
            rows.append(row(f"exported ONNX fed per docs/deploy.md ({name}) vs `keras-vit predict`",
                            answers, keras_vit_answers[name], note=how))
    print(f"keras_vit backend {keras.backend.backend()}; 9 photos; top-5 in the same order and the largest "
          "difference in a probability (all classes)")
    print("| client against its reference, end to end on the photo files | top-5 in the same order | "
          "largest difference in a probability | notes |")
    print("|---|---|---|---|")
    for entry in rows:
        print(f"| {entry['client']} | {entry['same_top5']} of {entry['of']} | {entry['largest_difference']} | "
              f"{entry['note']} |")
    for entry in rows:
        if entry["failing"]:
            print(f"{entry['client']}: outside top-5 order / 1e-2 on {', '.join(entry['failing'])}")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(rows, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
