"""Print the max abs difference of each issue-48 source to its own library, on the current backend.

    KERAS_BACKEND=jax PYTHONPATH=. .venv/bin/python scripts/measure_timm_part_parity.py

timm: the fixtures of tests/fixtures/timm/parts/ (scripts/make_timm_part_fixtures.py),
hub directories and big_vision SigLIP `.npz` archives (whose reference is timm's
`.npz` loader). Hugging Face: the tests' tiny random transformers towers
(tests/convert/test_convert_huggingface_families.py), imported at 16 px and at
12x20 px (transformers interpolating its positions), and exported back and
reloaded by `transformers.AutoModel`. The tests assert the same differences
stay within 1e-4.
"""

import os
import sys
import tempfile

import keras
import numpy as np

from keras_vit import ViTClassifier
from keras_vit.convert import export_huggingface, load_checkpoint

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "timm", "parts")


def run(model, images):
    return keras.ops.convert_to_numpy(model(np.asarray(images, "float32")))


def diff(a, b):
    return float(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)).max())


def report(source, name, output, tokens):
    print(f"{keras.backend.backend():10s} {source:12s} {name:32s} output {output:.1e}  tokens {tokens:.1e}",
          flush=True)


def timm_fixtures():
    names = sorted(n for n in os.listdir(ROOT) if os.path.isdir(os.path.join(ROOT, n)))
    names += sorted(n[:-4] for n in os.listdir(ROOT) if n.endswith(".npz") and not n.endswith("_reference.npz"))
    for name in names:
        directory = os.path.isdir(os.path.join(ROOT, name))
        reference = np.load(os.path.join(ROOT, name, "reference.npz") if directory else
                            os.path.join(ROOT, f"{name}_reference.npz"), allow_pickle=False)
        model = load_checkpoint(os.path.join(ROOT, name if directory else f"{name}.npz"), activation=None)
        backbone = model.backbone if isinstance(model, ViTClassifier) else model
        tokens = run(backbone, reference["images"])
        if isinstance(model, ViTClassifier):
            output = run(model, reference["images"])
        elif backbone.attention_pooling:
            output = run(backbone.pooled_model(), reference["images"])
        else:
            output = tokens[:, 0]  # timm's token pooling of a head-less model
        report("timm", name, diff(output, reference["logits"]), diff(tokens, reference["features"]))


def huggingface_families():
    import torch
    import transformers

    from tests.convert.test_convert_huggingface_families import CLIP_MEAN, CLIP_STD, IMAGES, WIDE, _build, _convert

    families = {
        "siglip": (transformers.SiglipVisionConfig, transformers.SiglipVisionModel, dict(intermediate_size=32)),
        "clip": (transformers.CLIPVisionConfig, transformers.CLIPVisionModel, dict(intermediate_size=32)),
        "dinov2": (transformers.Dinov2Config, transformers.Dinov2Model, dict(mlp_ratio=2)),
        "dinov2_registers": (transformers.Dinov2WithRegistersConfig, transformers.Dinov2WithRegistersModel,
                             dict(mlp_ratio=2, num_register_tokens=2)),
    }

    def compare(family, backbone, images, result):
        """(pooled output, tokens) differences; CLIP's last_hidden_state is the last block's, before its norm."""
        tokens = run(backbone, images)
        if family == "clip":
            before_norm = keras.ops.convert_to_numpy(
                backbone.feature_extractor(blocks=[-1])(images.astype("float32"))["block_1"])
            return diff(tokens[:, 0], result.pooler_output), diff(before_norm, result.last_hidden_state)
        pooled = run(backbone.pooled_model(), images) if family == "siglip" else tokens[:, 0]
        return diff(pooled, result.pooler_output), diff(tokens, result.last_hidden_state)

    for seed, (family, (config_class, model_class, kwargs)) in enumerate(families.items(), start=30):
        mean, std = (CLIP_MEAN, CLIP_STD) if family == "clip" else ((0.5,) * 3, (0.5,) * 3)
        source = _build(config_class, model_class, seed, **kwargs)
        for images in (IMAGES, WIDE):
            x = (images.astype(np.float32) / 255.0 - np.asarray(mean, np.float32)) / np.asarray(std, np.float32)
            pixels = torch.from_numpy(x.transpose(0, 3, 1, 2).copy())
            extra = {} if family.startswith("dinov2") or images is IMAGES else {"interpolate_pos_encoding": True}
            with torch.no_grad():
                result = source(pixel_values=pixels, **extra)
            backbone = _convert(source, mean, std, image_size=images.shape[1:3], interpolation="bicubic",
                                antialias=family == "dinov2_registers")
            size = "x".join(str(v) for v in images.shape[1:3])
            report("transformers", f"{family} import {size}", *compare(family, backbone, images, result))
        backbone = _convert(source, mean, std)
        with tempfile.TemporaryDirectory() as directory:
            export_huggingface(backbone, os.path.join(directory, "exported"))
            reloaded = transformers.AutoModel.from_pretrained(os.path.join(directory, "exported")).eval()
        x = (IMAGES.astype(np.float32) / 255.0 - np.asarray(mean, np.float32)) / np.asarray(std, np.float32)
        with torch.no_grad():
            result = reloaded(pixel_values=torch.from_numpy(x.transpose(0, 3, 1, 2).copy()))
        report("transformers", f"{family} export 16x16", *compare(family, backbone, IMAGES, result))


def main():
    timm_fixtures()
    if "--no-huggingface" not in sys.argv:
        huggingface_families()


if __name__ == "__main__":
    main()
