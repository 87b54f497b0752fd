"""Make the timm fixtures of the hybrid (BiT ResNet + ViT) parity tests.

Run with the reference environment (timm lives only there):

    /work/main/.venv-ref/bin/python scripts/make_hybrid_fixtures.py

It builds a reduced R50+ViT-B/16-shaped hybrid in timm -- the same classes
as `vit_base_r50_s16_224` (ResNetV2 with `preact=False`,
`stem_type="same"`, `StdConv2dSame(eps=1e-8)`, GroupNorm + ReLU, three
stages so the output stride is 16, `HybridEmbed` with 1x1 patches), only
narrower and shallower -- and writes to `tests/fixtures/hybrid/`:

- `tiny_r50_vit.safetensors`: its timm state dict at 224x224.
- `tiny_r50_vit_google.npz`: the same weights under the Google
  `vision_transformer` names (`conv_root`, `gn_root`,
  `block1/unit1/conv1`, `gn_proj`, `Transformer/encoderblock_0/...`). The
  script checks the file with timm's own `.npz` reader before writing it.
- `reference.npz`: uint8 input images at 224x224 and 96x160, the position
  embedding of the same model built at 96x160 (timm computes a separate
  table per size), and timm's logits and final tokens at both sizes.

Every weight is rounded to float16 and stored as float16, so the files stay
small while timm (computing in float32) and keras_vit see identical
weights. The timm version is recorded in the files' metadata.
"""

import json
import os
from functools import partial

import numpy as np
import safetensors.torch
import timm
import torch
from timm.layers import GroupNormAct, HybridEmbed, StdConv2dSame
from timm.models.resnetv2 import ResNetV2
from timm.models.vision_transformer import VisionTransformer, _load_weights

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "hybrid")

# The reduced architecture: BiT width 8 (root 8 channels, stages 32/64/128),
# stage depths (1, 2, 1) so that every stage has a projection unit and one
# stage has a unit without, GroupNorm with 4 groups (32 does not divide 8),
# a 2-block ViT of width 32.
ARCH = {
    "stage_depths": [1, 2, 1],
    "width": 8,
    "num_groups": 4,
    "hidden_dim": 32,
    "num_layers": 2,
    "num_heads": 4,
    "mlp_dim": 64,
    "num_classes": 10,
}
SIZES = {"224": (224, 224), "96x160": (96, 160)}


def build(image_size):
    width = ARCH["width"]
    backbone = ResNetV2(
        layers=ARCH["stage_depths"],
        channels=tuple(4 * width * 2**i for i in range(len(ARCH["stage_depths"]))),
        stem_chs=width,
        num_classes=0,
        global_pool="",
        in_chans=3,
        preact=False,
        stem_type="same",
        conv_layer=partial(StdConv2dSame, eps=1e-8),
        norm_layer=partial(GroupNormAct, num_groups=ARCH["num_groups"]),
    )
    return VisionTransformer(
        img_size=image_size,
        patch_size=1,
        embed_dim=ARCH["hidden_dim"],
        depth=ARCH["num_layers"],
        num_heads=ARCH["num_heads"],
        mlp_ratio=ARCH["mlp_dim"] / ARCH["hidden_dim"],
        num_classes=ARCH["num_classes"],
        embed_layer=partial(HybridEmbed, backbone=backbone),
    ).eval()


def randomize_and_round(model, generator):
    """Give every weight non-trivial values, then make them float16-exact."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if torch.all(param == param.flatten()[0]):  # constant init (norm scales, biases, zero head)
                base = 1.0 if name.endswith("weight") and "norm" in name else 0.0
                param.copy_(base + 0.2 * torch.randn(param.shape, generator=generator))
            else:
                param.add_(0.05 * torch.randn(param.shape, generator=generator) * param.std().clamp(min=1e-3))
            param.copy_(param.half().float())


def to_google(state_dict):
    """timm hybrid state dict -> Google `vision_transformer` .npz names and layouts."""
    w = {}

    def conv(t):  # OIHW -> HWIO
        return t.permute(2, 3, 1, 0).numpy()

    b = "patch_embed.backbone."
    w["conv_root/kernel"] = conv(state_dict[b + "stem.conv.weight"])
    w["gn_root/scale"] = state_dict[b + "stem.norm.weight"].numpy()
    w["gn_root/bias"] = state_dict[b + "stem.norm.bias"].numpy()
    for i, depth in enumerate(ARCH["stage_depths"]):
        for j in range(depth):
            src, dst = f"{b}stages.{i}.blocks.{j}.", f"block{i + 1}/unit{j + 1}/"
            for r in (1, 2, 3):
                w[dst + f"conv{r}/kernel"] = conv(state_dict[src + f"conv{r}.weight"])
                w[dst + f"gn{r}/scale"] = state_dict[src + f"norm{r}.weight"].numpy()
                w[dst + f"gn{r}/bias"] = state_dict[src + f"norm{r}.bias"].numpy()
            if src + "downsample.conv.weight" in state_dict:
                w[dst + "conv_proj/kernel"] = conv(state_dict[src + "downsample.conv.weight"])
                w[dst + "gn_proj/scale"] = state_dict[src + "downsample.norm.weight"].numpy()
                w[dst + "gn_proj/bias"] = state_dict[src + "downsample.norm.bias"].numpy()
    w["embedding/kernel"] = conv(state_dict["patch_embed.proj.weight"])
    w["embedding/bias"] = state_dict["patch_embed.proj.bias"].numpy()
    w["cls"] = state_dict["cls_token"].numpy()
    w["Transformer/posembed_input/pos_embedding"] = state_dict["pos_embed"].numpy()
    w["Transformer/encoder_norm/scale"] = state_dict["norm.weight"].numpy()
    w["Transformer/encoder_norm/bias"] = state_dict["norm.bias"].numpy()
    w["head/kernel"] = state_dict["head.weight"].numpy().T
    w["head/bias"] = state_dict["head.bias"].numpy()
    d, heads = ARCH["hidden_dim"], ARCH["num_heads"]
    for i in range(ARCH["num_layers"]):
        src, dst = f"blocks.{i}.", f"Transformer/encoderblock_{i}/"
        attn = dst + "MultiHeadDotProductAttention_1/"
        w[dst + "LayerNorm_0/scale"] = state_dict[src + "norm1.weight"].numpy()
        w[dst + "LayerNorm_0/bias"] = state_dict[src + "norm1.bias"].numpy()
        qkv_w = state_dict[src + "attn.qkv.weight"].numpy()  # (3D, D), rows q|k|v, head-major
        qkv_b = state_dict[src + "attn.qkv.bias"].numpy()
        for n, name in enumerate(("query", "key", "value")):
            w[attn + f"{name}/kernel"] = qkv_w[n * d:(n + 1) * d].T.reshape(d, heads, d // heads)
            w[attn + f"{name}/bias"] = qkv_b[n * d:(n + 1) * d].reshape(heads, d // heads)
        w[attn + "out/kernel"] = state_dict[src + "attn.proj.weight"].numpy().T.reshape(heads, d // heads, d)
        w[attn + "out/bias"] = state_dict[src + "attn.proj.bias"].numpy()
        w[dst + "LayerNorm_2/scale"] = state_dict[src + "norm2.weight"].numpy()
        w[dst + "LayerNorm_2/bias"] = state_dict[src + "norm2.bias"].numpy()
        for r in range(2):
            w[dst + f"MlpBlock_3/Dense_{r}/kernel"] = state_dict[src + f"mlp.fc{r + 1}.weight"].numpy().T
            w[dst + f"MlpBlock_3/Dense_{r}/bias"] = state_dict[src + f"mlp.fc{r + 1}.bias"].numpy()
    return {k: np.ascontiguousarray(v).astype(np.float16) for k, v in w.items()}


def main():
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(0)
    os.makedirs(OUT, exist_ok=True)
    model = build(SIZES["224"])
    randomize_and_round(model, generator)
    state_dict = {k: v.detach().clone() for k, v in model.state_dict().items()}

    # The non-square model shares every weight but the position embedding,
    # which timm sizes to its own token grid.
    model_ns = build(SIZES["96x160"])
    randomize_and_round(model_ns, generator)
    state_ns = {k: v for k, v in state_dict.items() if k != "pos_embed"}
    missing, unexpected = model_ns.load_state_dict(state_ns, strict=False)
    assert missing == ["pos_embed"] and not unexpected, (missing, unexpected)

    rng = np.random.default_rng(0)
    images = {key: rng.integers(0, 256, size=(1, *size, 3), dtype=np.uint8) for key, size in SIZES.items()}
    reference = {"timm_version": np.array(timm.__version__)}
    for key, net in (("224", model), ("96x160", model_ns)):
        x = torch.from_numpy(images[key]).float().permute(0, 3, 1, 2) / 255.0
        x = (x - 0.5) / 0.5  # the hybrid cfgs' mean/std (0.5, 0.5, 0.5)
        with torch.no_grad():
            tokens = net.forward_features(x)
            logits = net.forward_head(tokens)
        reference[f"images_{key}"] = images[key]
        reference[f"tokens_{key}"] = tokens.numpy().astype(np.float32)
        reference[f"logits_{key}"] = logits.numpy().astype(np.float32)
    reference["pos_embed_96x160"] = model_ns.pos_embed.detach().numpy().astype(np.float16)

    metadata = {"format": "pt", "timm_version": timm.__version__, "architecture": json.dumps(ARCH)}
    safetensors.torch.save_file(
        {k: v.half().contiguous() for k, v in state_dict.items()},
        os.path.join(OUT, "tiny_r50_vit.safetensors"),
        metadata=metadata,
    )

    # Google layout, checked with timm's own .npz reader on a fresh model.
    google = to_google(state_dict)
    google_path = os.path.join(OUT, "tiny_r50_vit_google.npz")
    np.savez(google_path, **google)
    fresh = build(SIZES["224"])
    with torch.no_grad():
        _load_weights(fresh, google_path)
        x = torch.from_numpy(images["224"]).float().permute(0, 3, 1, 2) / 127.5 - 1.0
        check = fresh(x).numpy()
    np.testing.assert_allclose(check, reference["logits_224"], atol=1e-5)

    np.savez(os.path.join(OUT, "reference.npz"), **reference)
    with open(os.path.join(OUT, "README.md"), "w") as handle:
        handle.write(
            "# Hybrid ViT fixtures\n\n"
            f"Made by `scripts/make_hybrid_fixtures.py` with timm {timm.__version__} and torch "
            f"{torch.__version__}. Architecture: `{json.dumps(ARCH)}`; images 224x224 and 96x160. "
            "Weights are float16-exact. Regenerate with\n`/work/main/.venv-ref/bin/python "
            "scripts/make_hybrid_fixtures.py`.\n"
        )
    for name in sorted(os.listdir(OUT)):
        print(name, os.path.getsize(os.path.join(OUT, name)), "bytes")
    print("logits 224:", reference["logits_224"].round(4))


if __name__ == "__main__":
    main()
