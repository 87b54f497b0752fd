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
file and in parts/MANIFEST.json. The DINOv2 fixture has a non-square image.
`big_vision_siglip*.npz` are big_vision SigLIP archives (bare and two-tower),
each with `*_reference.npz` from timm's own `.npz` loader.
"""

import json
import os
import shutil

import timm
import torch
import numpy as np
from timm.models._hub import save_for_hf
from timm.models.vision_transformer import _load_weights

from make_timm_fixtures import (ROOT, TINY, google_npz_from_timm, make_images, outputs, randomize, versions,
                                write_reference)

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
    "dinov2_reg_nonsquare": ("vit_small_patch14_reg4_dinov2", dict(img_size=(12, 20), num_classes=0),
                             "DINOv2 with 4 registers (no_embed_class, LayerScale), no head, 12x20 image"),
}

# big_vision SigLIP `.npz` archives: name -> (prefix, scanned, text tower beside it, create_model overrides,
# description). The arrays are the inverse of timm's `_load_weights` (big_vision/models/vit.py names: `MAPHead_0/`
# with `probe`, `MultiHeadDotProductAttention_0/{query,key,value,out}`, `LayerNorm_0`, `MlpBlock_0`); the
# reference outputs come from a fresh timm model filled by `_load_weights` from the archive. big_vision's MLPs
# use Flax's `nn.gelu`, the tanh approximation, where timm's SigLIP architectures use the exact GELU: the timm
# models here are built with `act_layer="gelu_tanh"` so that they compute what big_vision does.
SIGLIP_NPZ = {
    "big_vision_siglip": ("params/", False, False, dict(img_size=16),
                          "big_vision ViT with pool_type='map' (MAPHead_0), params/ prefix, 5-class head"),
    "big_vision_siglip_two_tower": ("params/img/", True, True, dict(img_size=16, num_classes=0),
                                    "SigLIP two-tower archive: the image tower under params/img/ (scanned "
                                    "encoderblock, no head) beside text-tower arrays under params/txt/, params/t, "
                                    "params/b"),
}


def map_head_arrays(model):
    """big_vision's `MAPHead_0/` arrays of timm's `attn_pool` (AttentionPoolLatent)."""
    sd = {k: v.detach().numpy().astype(np.float32) for k, v in model.state_dict().items() if k.startswith("attn_pool.")}
    dim = sd["attn_pool.q.weight"].shape[0]
    heads = model.attn_pool.num_heads
    key, value = np.split(sd["attn_pool.kv.weight"], 2, axis=0)
    key_bias, value_bias = np.split(sd["attn_pool.kv.bias"], 2)
    mha = "MAPHead_0/MultiHeadDotProductAttention_0/"
    out = {
        "MAPHead_0/probe": sd["attn_pool.latent"],
        mha + "out/kernel": sd["attn_pool.proj.weight"].T.reshape(heads, -1, dim),
        mha + "out/bias": sd["attn_pool.proj.bias"],
        "MAPHead_0/LayerNorm_0/scale": sd["attn_pool.norm.weight"],
        "MAPHead_0/LayerNorm_0/bias": sd["attn_pool.norm.bias"],
    }
    for part, kernel, bias in (("query", sd["attn_pool.q.weight"], sd["attn_pool.q.bias"]),
                               ("key", key, key_bias), ("value", value, value_bias)):
        out[mha + f"{part}/kernel"] = kernel.T.reshape(dim, heads, -1)
        out[mha + f"{part}/bias"] = bias.reshape(heads, -1)
    for r in range(2):
        out[f"MAPHead_0/MlpBlock_0/Dense_{r}/kernel"] = sd[f"attn_pool.mlp.fc{r + 1}.weight"].T
        out[f"MAPHead_0/MlpBlock_0/Dense_{r}/bias"] = sd[f"attn_pool.mlp.fc{r + 1}.bias"]
    return out


def make_siglip_npz_fixtures(manifest):
    for seed, (name, (prefix, scanned, text_tower, kwargs, description)) in enumerate(SIGLIP_NPZ.items(), start=90):
        torch.manual_seed(seed)
        create = lambda: timm.create_model("vit_base_patch16_siglip_224", pretrained=False,  # noqa: E731
                                           act_layer="gelu_tanh", **{**TINY, **kwargs}).eval().float()
        source = create()
        randomize(source, seed)
        arrays = google_npz_from_timm(source, prefix, big_vision=True, scanned=scanned)
        arrays.update({prefix + k: np.ascontiguousarray(v) for k, v in map_head_arrays(source).items()})
        if text_tower:  # a few of the text tower's arrays and the two scalars of the sigmoid loss
            rng = np.random.default_rng(seed)
            arrays["params/txt/Embed_0/embedding"] = rng.normal(size=(11, 16)).astype(np.float32)
            arrays["params/txt/Encoder_0/encoder_norm/scale"] = rng.normal(size=(16,)).astype(np.float32)
            arrays["params/txt/head/kernel"] = rng.normal(size=(16, 16)).astype(np.float32)
            arrays["params/t"] = np.array([2.3], np.float32)
            arrays["params/b"] = np.array([-10.0], np.float32)
        path = os.path.join(PARTS, f"{name}.npz")
        np.savez(path, **arrays)
        loaded = create()  # a fresh model, filled by timm's own npz loader
        with torch.no_grad():
            _load_weights(loaded, path)
        images = make_images(500 + seed, (16, 16))
        mean, std = loaded.pretrained_cfg["mean"], loaded.pretrained_cfg["std"]
        write_reference(os.path.join(PARTS, f"{name}_reference.npz"), images, outputs(loaded, images, mean, std))
        manifest["fixtures"][name] = {
            "architecture": "vit_base_patch16_siglip_224", "description": description,
            "model_args": {**TINY, **kwargs, "act_layer": "gelu_tanh"}, "file": f"{name}.npz",
            "mean": list(mean), "std": list(std),
            "num_params": sum(p.numel() for p in loaded.parameters()),
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
    make_siglip_npz_fixtures(manifest)
    with open(os.path.join(PARTS, "MANIFEST.json"), "w") as handle:
        json.dump(manifest, handle, indent=2)
    total = sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(PARTS) for f in files)
    print(f"wrote {PARTS} ({total / 1024:.0f} KB) with timm {timm.__version__}")


if __name__ == "__main__":
    main()
