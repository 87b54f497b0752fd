"""Write tests/fixtures/presets/timm_cls_token: a keras_vit preset saved on one backend.

The preset is timm's tiny ViT from tests/fixtures/timm/cls_token (made by
timm 1.0.31) converted with keras_vit.convert and saved with
`save_to_preset`, so every backend can check that it loads a preset written
elsewhere and reproduces timm's logits. Run from the repository root:

    KERAS_BACKEND=tensorflow .venv/bin/python tests/presets/make_preset_fixture.py
"""

import os
import sys

sys.path.insert(0, os.getcwd())

import keras  # noqa: E402

from keras_vit.convert import load_checkpoint  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures")


def main():
    model = load_checkpoint(os.path.join(ROOT, "timm", "cls_token"), activation="softmax")
    target = os.path.join(ROOT, "presets", "timm_cls_token")
    model.save_to_preset(target, source="tests/fixtures/timm/cls_token (timm 1.0.31)")
    print(f"wrote {target} with KERAS_BACKEND={keras.backend.backend()}")


if __name__ == "__main__":
    main()
