"""Make the attention fixtures in tests/fixtures/inspection/.

Run with the reference environment (timm is never imported by the tests):

    /work/main/.venv-ref/bin/python scripts/make_attention_fixtures.py

Each fixture is a tiny, randomly initialised timm ViT written the way timm
publishes models (`config.json` + `model.safetensors` via
`timm.models._hub.save_for_hf`, which `keras_vit.convert.load_checkpoint`
reads), plus `attention.npz` with uint8 input images and the attention
probabilities timm computes on them: every block's `attn.fused_attn` is
switched off so timm takes its explicit path, and a forward hook on
`attn.attn_drop` (an identity in eval mode) records its input, the softmax
probabilities `(batch, heads, tokens, tokens)`. `attention` is stacked to
`(blocks, batch, heads, tokens, tokens)`. The input is the images scaled to
[0, 1] and normalised with the model's pretrained-cfg mean/std, as
`keras_vit` models do inside.

Everything is float32 on the CPU; the timm and torch versions are recorded
in every file and in MANIFEST.json.
"""

import json
import os
import shutil

import numpy as np
import timm
import torch
from make_timm_fixtures import make_images, to_input, versions  # the sibling script: same inputs, same records
from timm.models._hub import save_for_hf

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "inspection")
TINY = dict(patch_size=4, embed_dim=16, depth=2, num_heads=2, mlp_ratio=2.0, num_classes=3)

# name -> (model kwargs, description)
MODELS = {
    "registers_nonsquare": (dict(img_size=(12, 20), reg_tokens=2),
                            "class token + 2 register tokens, non-square 12x20 image (3x5 grid)"),
    "gap_no_class_token": (dict(img_size=16, class_token=False, global_pool="avg", fc_norm=False),
                           "no class token, GAP, 4x4 grid"),
}


def randomize(model, seed):
    # Random biases, norms and tokens (timm starts many at constants), scaled
    # so the attention is far from uniform and every weight matters.
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            noise = torch.randn(parameter.shape, generator=generator)
            if name.endswith(("norm1.weight", "norm2.weight", "norm.weight")):
                parameter.copy_(parameter + 0.1 * noise)
            elif name in ("cls_token", "reg_token", "pos_embed"):
                parameter.copy_(0.5 * noise)
            elif name.endswith("qkv.weight"):
                parameter.copy_(parameter + 0.3 * noise)  # sharper attention
            else:
                parameter.copy_(parameter + 0.05 * noise)


def attention(model, x):
    """timm's own attention probabilities of every block: (blocks, batch, heads, T, T)."""
    recorded = []
    hooks = []
    for block in model.blocks:
        block.attn.fused_attn = False
        hooks.append(block.attn.attn_drop.register_forward_hook(lambda module, args, out: recorded.append(args[0])))
    try:
        with torch.no_grad():
            model(x)
    finally:
        for hook in hooks:
            hook.remove()
    return torch.stack(recorded).numpy()


def main():
    if os.path.isdir(ROOT):
        shutil.rmtree(ROOT)
    os.makedirs(ROOT)
    torch.set_num_threads(1)
    manifest = {**versions(), "script": "scripts/make_attention_fixtures.py", "fixtures": {}}
    for seed, (name, (kwargs, description)) in enumerate(MODELS.items(), start=70):
        torch.manual_seed(seed)
        model = timm.create_model("vit_tiny_patch16_224", pretrained=False, **{**TINY, **kwargs}).eval().float()
        randomize(model, seed)
        directory = os.path.join(ROOT, name)
        save_for_hf(model, directory, safe_serialization=True)
        mean, std = model.pretrained_cfg["mean"], model.pretrained_cfg["std"]
        size = model.patch_embed.img_size
        images = make_images(seed, size)
        scores = attention(model, to_input(images, mean, std))
        np.savez(
            os.path.join(directory, "attention.npz"), images=images, attention=scores,
            num_prefix_tokens=np.array(model.num_prefix_tokens), grid_size=np.array(model.patch_embed.grid_size),
            **{k: np.array(v) for k, v in versions().items()},
        )
        manifest["fixtures"][name] = {"description": description, "model_args": {**TINY, **kwargs},
                                      "image_size": list(size), "attention_shape": list(scores.shape)}
    with open(os.path.join(ROOT, "MANIFEST.json"), "w") as handle:
        json.dump(manifest, handle, indent=2)
    print(f"wrote {', '.join(manifest['fixtures'])} to {ROOT} with timm {timm.__version__}")


if __name__ == "__main__":
    main()
