"""Make tests/fixtures/presets/standins/: tiny timm checkpoints in the shape of two registry entries.

Run with the reference environment (timm is never imported by the tests):

    /work/main/.venv-ref/bin/python scripts/make_preset_standins.py

Each stand-in is the timm architecture *and pretrained tag* a registry entry
downloads (`timm/<architecture>.<tag>` on the hub), created with
`pretrained=False` so that timm's own `pretrained_cfg` for that tag (mean,
std, crop, interpolation) goes into `config.json`, but shrunk to 2 blocks of
width 24 on 32 px images with 8 px patches, randomly initialised, and written
with `save_for_hf` as timm writes its hub repositories. The tests serve it
from a local mirror at the entry's hub address, so `from_preset(NAME)` and
`keras-vit ... --preset NAME` go the registry's whole way without a network.
`reference.npz` holds uint8 images and timm's outputs: `pooled` (the feature
before any head, `forward_head(pre_logits=True)`: the MAP embedding for SigLIP,
the class token for DINOv2 and CLIP) and `features` (`forward_features`), and, for the SigLIP stand-in, the
MAP probe's attention over the patches (`probe_attention`, heads averaged).
"""

import json
import os
import shutil

import numpy as np
import timm
import torch
from timm.models._hub import save_for_hf

from make_timm_fixtures import make_images, randomize, to_input, versions, write_reference

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "presets", "standins")
SMALL = dict(patch_size=8, embed_dim=24, depth=2, num_heads=2, mlp_ratio=2.0, num_classes=0, img_size=32)

# stand-in name (the registry entry it stands in for) -> timm `architecture.tag`, overrides beside SMALL
STANDINS = {
    "siglip_b16_webli": ("vit_base_patch16_siglip_224.webli", {}),
    "dinov2_s14_reg4_lvd142m": ("vit_small_patch14_reg4_dinov2.lvd142m", {}),
    # OpenAI's weights were trained with quick-GELU, but timm's hub copy names the exact-GELU architecture
    # and records no `act_layer`: the stand-in computes with quick-GELU and its config says as little as
    # the real one (the act_layer is removed from model_args). Its 8-wide head stands in for CLIP's
    # 512-wide projection, which timm keeps as `head` and the registry leaves out.
    "clip_b16_openai": ("vit_base_patch16_clip_224.openai", {"act_layer": "quick_gelu", "num_classes": 8}),
}


def probe_attention(model, x):
    """The MAP head's attention probabilities (heads averaged), computed from timm's own modules."""
    pool = model.attn_pool
    tokens = model.forward_features(x)
    batch, count, width = tokens.shape
    query = pool.q(pool.latent.expand(batch, -1, -1)).reshape(batch, 1, pool.num_heads, pool.head_dim).transpose(1, 2)
    key, _ = pool.kv(tokens).reshape(batch, count, 2, pool.num_heads, pool.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
    query, key = pool.q_norm(query), pool.k_norm(key)
    weights = (query * pool.scale) @ key.transpose(-2, -1)  # (B, heads, 1, patches)
    return weights.softmax(-1)[:, :, 0].mean(1)


def main():
    if os.path.isdir(ROOT):
        shutil.rmtree(ROOT)
    os.makedirs(ROOT)
    torch.set_num_threads(1)
    manifest = {**versions(), "script": "scripts/make_preset_standins.py", "standins": {}}
    for seed, (name, (timm_name, kwargs)) in enumerate(STANDINS.items(), start=90):
        torch.manual_seed(seed)
        model = timm.create_model(timm_name, pretrained=False, **{**SMALL, **kwargs}).eval().float()
        randomize(model, seed)
        directory = os.path.join(ROOT, name)
        save_for_hf(model, directory, safe_serialization=True)
        config_path = os.path.join(directory, "config.json")
        with open(config_path) as handle:
            config = json.load(handle)
        config.get("model_args", {}).pop("act_layer", None)
        with open(config_path, "w") as handle:
            json.dump(config, handle, indent=2)
        mean, std = model.pretrained_cfg["mean"], model.pretrained_cfg["std"]
        images = make_images(500 + seed, tuple(model.patch_embed.img_size), count=3)
        x = to_input(images, mean, std)
        with torch.no_grad():
            features = model.forward_features(x)
            result = {"pooled": model.forward_head(features, pre_logits=True).numpy(), "features": features.numpy()}
            if getattr(model, "attn_pool", None) is not None:
                result["probe_attention"] = probe_attention(model, x).numpy()
        write_reference(os.path.join(directory, "reference.npz"), images, result)
        manifest["standins"][name] = {
            "timm_name": timm_name, "model_args": {**SMALL, **kwargs}, "mean": list(mean), "std": list(std),
            "num_params": sum(p.numel() for p in model.parameters()),
        }
    with open(os.path.join(ROOT, "MANIFEST.json"), "w") as handle:
        json.dump(manifest, handle, indent=2)
    total = sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(ROOT) for f in files)
    print(f"wrote {ROOT} ({total / 1024:.0f} KB) with timm {timm.__version__}")


if __name__ == "__main__":
    main()
