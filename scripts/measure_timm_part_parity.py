"""Print the max abs difference to timm of each issue-48 fixture on the current backend.

    KERAS_BACKEND=jax PYTHONPATH=. .venv/bin/python scripts/measure_timm_part_parity.py

The fixtures are tests/fixtures/timm/parts/ (scripts/make_timm_part_fixtures.py);
the tests assert the same differences stay within 1e-4.
"""

import os

import keras
import numpy as np

from keras_vit import ViTClassifier
from keras_vit.convert import load_checkpoint

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "timm", "parts")


def main():
    for name in sorted(n for n in os.listdir(ROOT) if os.path.isdir(os.path.join(ROOT, n))):
        reference = np.load(os.path.join(ROOT, name, "reference.npz"), allow_pickle=False)
        model = load_checkpoint(os.path.join(ROOT, name), activation=None)
        pooled = model if isinstance(model, ViTClassifier) else model.pooled_model()
        backbone = model.backbone if isinstance(model, ViTClassifier) else model
        images = reference["images"].astype("float32")
        logits = np.abs(keras.ops.convert_to_numpy(pooled(images)) - reference["logits"]).max()
        features = np.abs(keras.ops.convert_to_numpy(backbone(images)) - reference["features"]).max()
        print(f"{keras.backend.backend():10s} {name:30s} output {logits:.1e}  tokens {features:.1e}", flush=True)


if __name__ == "__main__":
    main()
