"""Make the timm parity fixtures of issue 48's architectures in tests/fixtures/timm/parts/.

Run with the reference environment (timm is never imported by the tests):

    /work/main/.venv-ref/bin/python scripts/make_timm_part_fixtures.py

The same way as scripts/make_timm_fixtures.py (whose helpers it uses): each
fixture is a tiny, randomly initialised model of a timm architecture that
adds a part to the paper's ViT (SigLIP's attention pooling without a class
token, CLIP's pre-norm and quick-GELU, qk-norm, DeiT's distillation token and
second head), shrunk to 2 blocks of width 16 and 12-16 px images, written
with `save_for_hf` (`config.json` + `model.safetensors`), plus
`reference.npz` with uint8 images and timm's outputs: `logits` from
`model(x)` (the pooled embedding when the model has no head) and `features`
from `model.forward_features(x)`. Versions are recorded in every reference
file and in parts/MANIFEST.json.
"""

import json
import os
import shutil

import timm
import torch
from timm.models._hub import save_for_hf

from make_timm_fixtures import ROOT, TINY, make_images, outputs, randomize, versions, write_reference

PARTS = os.path.join(ROOT, "parts")

# name -> (timm architecture, create_model overrides beside TINY, description)
MODELS = {
    "siglip_map": ("vit_base_patch16_siglip_224", dict(img_size=16),
                   "SigLIP: no class token, attention pooling (global_pool='map'), 5-class head"),
    "siglip_map_nonsquare_no_head": ("vit_base_patch16_siglip_224", dict(img_size=(12, 20), num_classes=0),
                                     "SigLIP image tower without a head (pooled embedding out), 12x20 image"),
    "clip_quickgelu": ("vit_base_patch16_clip_quickgelu_224", dict(img_size=16),
                       "CLIP: pre_norm (norm_pre, no patch bias), quick-GELU, LayerNorm eps 1e-5"),
    "qk_norm": ("vit_small_patch16_224", dict(img_size=16, qk_norm=True), "qk_norm=True (LayerNorm on q and k)"),
    "deit_distilled_nonsquare": ("deit_small_distilled_patch16_224", dict(img_size=(12, 20)),
                                 "DeiT distilled: dist_token + head_dist averaged at inference, 12x20 image"),
}


def main():
    if os.path.isdir(PARTS):
        shutil.rmtree(PARTS)
    os.makedirs(PARTS)
    torch.set_num_threads(1)
    manifest = {**versions(), "script": "scripts/make_timm_part_fixtures.py", "fixtures": {}}
    for seed, (name, (architecture, kwargs, description)) in enumerate(MODELS.items(), start=70):
        torch.manual_seed(seed)
        model = timm.create_model(architecture, pretrained=False, **{**TINY, **kwargs}).eval().float()
        randomize(model, seed)
        directory = os.path.join(PARTS, name)
        save_for_hf(model, directory, safe_serialization=True)
        mean, std = model.pretrained_cfg["mean"], model.pretrained_cfg["std"]
        size = tuple(model.patch_embed.img_size)
        images = make_images(400 + seed, size)
        write_reference(os.path.join(directory, "reference.npz"), images, outputs(model, images, mean, std))
        manifest["fixtures"][name] = {
            "architecture": architecture, "description": description, "model_args": {**TINY, **kwargs},
            "image_size": list(size), "mean": list(mean), "std": list(std),
            "num_params": sum(p.numel() for p in model.parameters()),
        }
    with open(os.path.join(PARTS, "MANIFEST.json"), "w") as handle:
        json.dump(manifest, handle, indent=2)
    total = sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(PARTS) for f in files)
    print(f"wrote {PARTS} ({total / 1024:.0f} KB) with timm {timm.__version__}")


if __name__ == "__main__":
    main()
