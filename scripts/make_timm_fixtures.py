"""Make the timm parity fixtures in tests/fixtures/timm/.

Run with the reference environment (timm is never imported by the tests):

    /work/main/.venv-ref/bin/python scripts/make_timm_fixtures.py

Each fixture is a tiny, randomly initialised timm ViT written the way timm
publishes models on the Hugging Face hub (`config.json` + `model.safetensors`
via `timm.models._hub.save_for_hf`), plus `reference.npz` with uint8 input
images and timm's own outputs on them (`logits` from `model(x)`, `features`
from `model.forward_features(x)`), where `x` is the images scaled to [0, 1]
and normalised with the fixture's pretrained-cfg mean/std. Resampling
fixtures hold timm's outputs after `checkpoint_filter_fn` (timm's state-dict
loading path, which resamples the position embedding bicubic + antialias) at
other image sizes. The `.npz` fixtures are Google-layout archives built from
a timm model, and their reference outputs come from a fresh timm model loaded
with timm's own `_load_weights` npz loader.

Everything is float32 on the CPU; the timm and torch versions are recorded in
every reference file and in MANIFEST.json.
"""

import json
import os
import shutil

import numpy as np
import timm
from timm.layers import resample_abs_pos_embed
import torch
from timm.models._hub import save_for_hf
from timm.models.vision_transformer import _load_weights, checkpoint_filter_fn

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "timm")
TINY = dict(patch_size=4, embed_dim=16, depth=2, num_heads=2, mlp_ratio=2.0, num_classes=5)
IMAGENET = dict(mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))

# name -> (model kwargs, pretrained-cfg overlay, description)
MODELS = {
    "cls_token": (dict(img_size=16), {}, "class token, token pooling, 4x4 grid"),
    "gap_fc_norm": (dict(img_size=16, global_pool="avg"), IMAGENET,
                    "class token kept, GAP over patches + fc_norm (no final norm), ImageNet mean/std"),
    "registers_no_embed_class": (dict(img_size=16, reg_tokens=3, no_embed_class=True), {},
                                 "3 register tokens, no_embed_class=True (pos_embed covers patches only)"),
    "layerscale_no_qkv_bias": (dict(img_size=16, init_values=0.1, qkv_bias=False), {},
                               "LayerScale (random gammas), qkv without bias"),
    "nonsquare": (dict(img_size=(12, 20)), IMAGENET, "non-square 12x20 image (3x5 grid)"),
    "no_class_token_gap": (dict(img_size=16, class_token=False, global_pool="avg", fc_norm=False), {},
                           "no class token, final norm then GAP"),
}
# source fixture -> list of target image sizes, resampled by timm's checkpoint_filter_fn
RESAMPLES = {
    "cls_token": [(24, 24), (8, 8), (12, 20)],
    "registers_no_embed_class": [(24, 24)],
    "nonsquare": [(16, 24)],
}


def versions():
    return {"timm_version": timm.__version__, "torch_version": torch.__version__}


def make_images(seed, size, count=2):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, size=(count, size[0], size[1], 3), dtype=np.uint8)


def to_input(images, mean, std):
    x = torch.from_numpy(images.astype(np.float32) / 255.0).permute(0, 3, 1, 2)
    mean = torch.tensor(mean, dtype=torch.float32).view(1, 3, 1, 1)
    std = torch.tensor(std, dtype=torch.float32).view(1, 3, 1, 1)
    return (x - mean) / std


def randomize(model, seed):
    # timm initialises biases, norms and heads to constants; random values make
    # every tensor matter for parity.
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            noise = torch.randn(parameter.shape, generator=generator)
            if name.endswith(("norm1.weight", "norm2.weight", "norm.weight")) or ".ls" in name:
                parameter.copy_(parameter + 0.1 * noise)
            elif name in ("cls_token", "reg_token", "pos_embed"):
                parameter.copy_(0.5 * noise)
            else:
                parameter.copy_(parameter + 0.05 * noise)


def create(kwargs, overlay):
    model = timm.create_model(
        "vit_tiny_patch16_224", pretrained=False, **{**TINY, **kwargs},
        pretrained_cfg_overlay=dict(**overlay) if overlay else None,
    )
    return model.eval().float()


def outputs(model, images, mean, std):
    x = to_input(images, mean, std)
    with torch.no_grad():
        return {"logits": model(x).numpy(), "features": model.forward_features(x).numpy()}


def write_reference(path, images, result, **extra):
    np.savez(path, images=images, **result, **{k: np.array(v) for k, v in {**versions(), **extra}.items()})


def make_model_fixtures(manifest):
    for seed, (name, (kwargs, overlay, description)) in enumerate(MODELS.items()):
        torch.manual_seed(seed)
        model = create(kwargs, overlay)
        randomize(model, seed)
        directory = os.path.join(ROOT, name)
        save_for_hf(model, directory, safe_serialization=True)
        mean, std = model.pretrained_cfg["mean"], model.pretrained_cfg["std"]
        size = model.patch_embed.img_size
        images = make_images(100 + seed, size)
        write_reference(os.path.join(directory, "reference.npz"), images, outputs(model, images, mean, std))
        entry = {"description": description, "model_args": {**TINY, **kwargs}, "image_size": list(size),
                 "mean": list(mean), "std": list(std), "resampled": []}
        for target in RESAMPLES.get(name, []):
            resized = create({**kwargs, "img_size": target}, overlay)
            state = {k: v.clone() for k, v in model.state_dict().items()}
            if size[0] == size[1]:
                # timm's own state-dict loading path (what pretrained=True uses).
                state = checkpoint_filter_fn(state, resized, interpolation="bicubic", antialias=True)
            else:
                # checkpoint_filter_fn assumes a square source grid without
                # pretrained metadata; call the resampler it uses directly.
                state["pos_embed"] = resample_abs_pos_embed(
                    state["pos_embed"], new_size=resized.patch_embed.grid_size, old_size=model.patch_embed.grid_size,
                    num_prefix_tokens=0 if model.no_embed_class else model.num_prefix_tokens,
                    interpolation="bicubic", antialias=True,
                )
            resized.load_state_dict(state)
            target_images = make_images(200 + seed, target)
            result = outputs(resized, target_images, mean, std)
            result["pos_embed"] = resized.pos_embed.detach().numpy()
            file = f"reference_{target[0]}x{target[1]}.npz"
            write_reference(os.path.join(directory, file), target_images, result, image_size=np.array(target))
            entry["resampled"].append(file)
        manifest["fixtures"][name] = entry


def google_npz_from_timm(model, prefix, big_vision=False, scanned=False):
    """A Google-layout archive (the inverse of timm's `_load_weights`)."""
    sd = {k: v.detach().numpy().astype(np.float32) for k, v in model.state_dict().items()}
    dim = sd["patch_embed.proj.weight"].shape[0]
    heads = model.blocks[0].attn.num_heads
    out = {
        "embedding/kernel": sd["patch_embed.proj.weight"].transpose(2, 3, 1, 0),
        "embedding/bias": sd["patch_embed.proj.bias"],
        "Transformer/encoder_norm/scale": sd["norm.weight"],
        "Transformer/encoder_norm/bias": sd["norm.bias"],
    }
    if "head.weight" in sd:  # a tower without a classifier (SigLIP's image tower) has none
        out["head/kernel"] = sd["head.weight"].T
        out["head/bias"] = sd["head.bias"]
    if "cls_token" in sd:
        out["cls"] = sd["cls_token"]
    out["pos_embedding" if big_vision else "Transformer/posembed_input/pos_embedding"] = sd["pos_embed"]
    mha, mlp, ln2 = (0, 0, 1) if big_vision else (1, 3, 2)
    blocks = []
    for i in range(len(model.blocks)):
        b = f"blocks.{i}."
        q, k, v = np.split(sd[b + "attn.qkv.weight"], 3, axis=0)
        qb, kb, vb = np.split(sd[b + "attn.qkv.bias"], 3)
        block = {
            "LayerNorm_0/scale": sd[b + "norm1.weight"], "LayerNorm_0/bias": sd[b + "norm1.bias"],
            f"LayerNorm_{ln2}/scale": sd[b + "norm2.weight"], f"LayerNorm_{ln2}/bias": sd[b + "norm2.bias"],
            f"MultiHeadDotProductAttention_{mha}/out/kernel": sd[b + "attn.proj.weight"].T.reshape(heads, -1, dim),
            f"MultiHeadDotProductAttention_{mha}/out/bias": sd[b + "attn.proj.bias"],
        }
        for part, kernel, bias in (("query", q, qb), ("key", k, kb), ("value", v, vb)):
            block[f"MultiHeadDotProductAttention_{mha}/{part}/kernel"] = kernel.T.reshape(dim, heads, -1)
            block[f"MultiHeadDotProductAttention_{mha}/{part}/bias"] = bias.reshape(heads, -1)
        for r in range(2):
            block[f"MlpBlock_{mlp}/Dense_{r}/kernel"] = sd[b + f"mlp.fc{r + 1}.weight"].T
            block[f"MlpBlock_{mlp}/Dense_{r}/bias"] = sd[b + f"mlp.fc{r + 1}.bias"]
        blocks.append(block)
    if scanned:
        for key in blocks[0]:
            out[f"Transformer/encoderblock/{key}"] = np.stack([block[key] for block in blocks])
    else:
        for i, block in enumerate(blocks):
            out.update({f"Transformer/encoderblock_{i}/{key}": value for key, value in block.items()})
    return {prefix + k: np.ascontiguousarray(v) for k, v in out.items()}


def make_npz_fixtures(manifest):
    cases = {
        "google_vit": (dict(img_size=16), "opt/target/", False, False,
                       "original vision_transformer layout with the opt/target/ prefix, class token"),
        "big_vision_gap": (dict(img_size=16, class_token=False, no_embed_class=True, global_pool="avg", fc_norm=False),
                           "params/", True, True, "big_vision layout (params/, scanned encoderblock), GAP, no cls"),
    }
    for seed, (name, (kwargs, prefix, big_vision, scanned, description)) in enumerate(cases.items(), start=50):
        torch.manual_seed(seed)
        source = create(kwargs, {})
        randomize(source, seed)
        arrays = google_npz_from_timm(source, prefix, big_vision=big_vision, scanned=scanned)
        path = os.path.join(ROOT, f"{name}.npz")
        np.savez(path, **arrays)
        loaded = create(kwargs, {})  # a fresh model, filled by timm's own npz loader
        with torch.no_grad():
            _load_weights(loaded, path)
        images = make_images(300 + seed, (16, 16))
        mean, std = loaded.pretrained_cfg["mean"], loaded.pretrained_cfg["std"]
        write_reference(os.path.join(ROOT, f"{name}_reference.npz"), images, outputs(loaded, images, mean, std))
        manifest["fixtures"][name] = {"description": description, "model_args": {**TINY, **kwargs},
                                      "file": f"{name}.npz", "mean": list(mean), "std": list(std)}


def main():
    # parts/ is scripts/make_timm_part_fixtures.py's (issue 48's architectures): kept.
    for entry in os.listdir(ROOT) if os.path.isdir(ROOT) else ():
        if entry != "parts":
            path = os.path.join(ROOT, entry)
            shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
    os.makedirs(ROOT, exist_ok=True)
    torch.set_num_threads(1)
    manifest = {**versions(), "script": "scripts/make_timm_fixtures.py", "fixtures": {}}
    make_model_fixtures(manifest)
    make_npz_fixtures(manifest)
    with open(os.path.join(ROOT, "MANIFEST.json"), "w") as handle:
        json.dump(manifest, handle, indent=2)
    total = sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(ROOT) for f in files)
    print(f"wrote {ROOT} ({total / 1024:.0f} KB) with timm {timm.__version__}")


if __name__ == "__main__":
    main()
