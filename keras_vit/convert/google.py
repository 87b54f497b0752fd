"""Google ViT `.npz` checkpoints (vision_transformer and big_vision) -> keras_vit.

The original release (`gs://vit_models`) stores Flax parameters under
pre-Linen names, sometimes below an `opt/target/` prefix:
`Transformer/encoderblock_{i}/MultiHeadDotProductAttention_1/query/kernel`
(shaped `(D, heads, head_dim)`), `LayerNorm_0`, `LayerNorm_2`,
`MlpBlock_3/Dense_{0,1}`, `Transformer/encoder_norm`, `cls`, `embedding`
(an HWIO conv kernel), `Transformer/posembed_input/pos_embedding`,
`pre_logits` and `head`. big_vision writes `params/` names with
`MultiHeadDotProductAttention_0`, `LayerNorm_1`, `MlpBlock_0`, a top-level
`pos_embedding` that covers the patches only (the class token gets none)
and, for scanned models, one stacked `Transformer/encoderblock/`.
"""

import re

import numpy as np

from keras_vit.convert.model_map import check_tensors
from keras_vit.convert.timm import from_timm_vit

_PREFIXES = ("opt/target/", "params/img/", "params/", "")


# The evaluation of the released .npz checkpoints, in timm's pretrained_cfg words: the paper's code
# (google-research/vision_transformer, vit_jax/input_pipeline.py, `get_data`, mode "test") resizes the
# whole image to the crop size, `tf.image.resize(im, [crop_size, crop_size])` (bilinear, no crop, no
# antialiasing), after tfds decoded it to 3 channels (alpha dropped). A stretch at fraction 1, bilinear
# (keras_vit's is Pillow's filter, antialiased when it shrinks: docs/converting.md).
NPZ_EVALUATION = {"crop_pct": 1.0, "crop_mode": "squash", "interpolation": "bilinear"}


def find_npz_prefix(arrays):
    for prefix in _PREFIXES:
        if f"{prefix}embedding/kernel" in arrays:
            return prefix
    raise ValueError(
        "This .npz is not a Google ViT checkpoint: it has no 'embedding/kernel' (with or without an "
        f"'opt/target/' or 'params/' prefix). First keys: {sorted(arrays)[:8]}"
    )


# Google parameter name -> rank; a scanned model (`Transformer/encoderblock/`) stacks one more axis.
_NPZ_RANKS = (
    (r"MultiHeadDotProductAttention_\d/(query|key|value|out)/kernel$", 3),
    (r"MultiHeadDotProductAttention_\d/(query|key|value)/bias$", 2),
    (r"(Dense_\d|head|pre_logits)/kernel$", 2),
    (r"(/bias|/scale)$", 1),
    (r"^embedding/kernel$", 4),
    (r"^(cls|pos_embedding|Transformer/posembed_input/pos_embedding)$", 3),
)


def _check_arrays(params, prefix):
    """Float arrays of the ranks a Google ViT has, before any shape is indexed."""
    check_tensors(params, ".npz checkpoint")  # dtypes (no name here is a timm name)
    wrong = []
    for name, value in params.items():
        rank = next((r for pattern, r in _NPZ_RANKS if re.search(pattern, name)), None)
        if rank is not None and name.startswith("Transformer/encoderblock/"):
            rank += 1
        if rank is not None and np.ndim(value) != rank:
            wrong.append(f"{prefix}{name} has shape {tuple(np.shape(value))}, a ViT needs a rank-{rank} array")
    if wrong:
        raise ValueError("The .npz has arrays of the wrong rank: " + "; ".join(sorted(wrong)[:8])
                         + ". The file is damaged or is not a Google ViT checkpoint.")


def npz_to_timm(arrays):
    """Translate Google `.npz` arrays into a timm-layout state dict.

    Returns:
        `(timm_state_dict, num_heads)`. Raises a `ValueError` listing any
        array it cannot place.
    """
    prefix = find_npz_prefix(arrays)
    w = {k[len(prefix) :]: np.asarray(v) for k, v in arrays.items() if k.startswith(prefix)}
    # Outside the parameters, only optimizer state (`opt/state/...` beside
    # `opt/target/`) is expected; it is deliberately ignored.
    outside = sorted(k for k in arrays if not k.startswith(prefix) and not (prefix and k.startswith("opt/")))
    _check_arrays(w, prefix)
    used = set()

    def take(name):
        used.add(name)
        return w[name]

    out = {}
    kernel = take("embedding/kernel")
    if kernel.ndim != 4:
        raise ValueError(
            f"'embedding/kernel' must be a 4-D (patch_h, patch_w, channels, dim) kernel. Received: {kernel.shape}"
        )
    out["patch_embed.proj.weight"] = kernel.transpose(3, 2, 0, 1)  # HWIO -> OIHW
    out["patch_embed.proj.bias"] = take("embedding/bias")
    if "cls" in w:
        out["cls_token"] = take("cls")
    for name in ("Transformer/posembed_input/pos_embedding", "pos_embedding"):
        if name in w:
            out["pos_embed"] = take(name).reshape(1, -1, kernel.shape[-1])
    if "Transformer/encoder_norm/scale" in w:
        out["norm.weight"] = take("Transformer/encoder_norm/scale")
        out["norm.bias"] = take("Transformer/encoder_norm/bias")
    for src, dst in (("head", "head"), ("pre_logits", "pre_logits.fc")):
        if f"{src}/kernel" in w:
            out[f"{dst}.weight"] = take(f"{src}/kernel").T
            out[f"{dst}.bias"] = take(f"{src}/bias")

    scanned = "Transformer/encoderblock/LayerNorm_0/scale" in w
    big_vision = prefix.startswith("params/") or "pos_embedding" in w or scanned
    mha, mlp, norm2 = (0, 0, 1) if big_vision else (1, 3, 2)
    if scanned:
        num_layers = w["Transformer/encoderblock/LayerNorm_0/scale"].shape[0]
    else:
        num_layers = len({m.group(1) for k in w if (m := re.match(r"Transformer/encoderblock_(\d+)/", k))})
    num_heads = None
    for i in range(num_layers):
        block = "Transformer/encoderblock/" if scanned else f"Transformer/encoderblock_{i}/"

        def get(name, block=block, i=i):
            value = take(block + name)
            return value[i] if scanned else value

        attention = f"MultiHeadDotProductAttention_{mha}/"
        dst = f"blocks.{i}."
        out[dst + "norm1.weight"] = get("LayerNorm_0/scale")
        out[dst + "norm1.bias"] = get("LayerNorm_0/bias")
        query = get(attention + "query/kernel")  # (D, heads, head_dim)
        num_heads = query.shape[1]
        kernels = [query] + [get(attention + f"{n}/kernel") for n in ("key", "value")]
        out[dst + "attn.qkv.weight"] = np.concatenate([k.reshape(k.shape[0], -1).T for k in kernels], axis=0)
        if block + attention + "query/bias" in w:
            out[dst + "attn.qkv.bias"] = np.concatenate(
                [get(attention + f"{n}/bias").reshape(-1) for n in ("query", "key", "value")]
            )
        out_kernel = get(attention + "out/kernel")  # (heads, head_dim, D)
        out[dst + "attn.proj.weight"] = out_kernel.reshape(-1, out_kernel.shape[-1]).T
        out[dst + "attn.proj.bias"] = get(attention + "out/bias")
        out[dst + "norm2.weight"] = get(f"LayerNorm_{norm2}/scale")
        out[dst + "norm2.bias"] = get(f"LayerNorm_{norm2}/bias")
        for r in range(2):
            out[dst + f"mlp.fc{r + 1}.weight"] = get(f"MlpBlock_{mlp}/Dense_{r}/kernel").T
            out[dst + f"mlp.fc{r + 1}.bias"] = get(f"MlpBlock_{mlp}/Dense_{r}/bias")

    unused = sorted(prefix + k for k in set(w) - used) + outside
    if unused:
        hint = " (a MAP attention-pooling head, which keras_vit does not implement)" if any(
            "MAPHead" in k for k in unused
        ) else ""
        raise ValueError(f"The .npz has arrays keras_vit cannot place{hint}: {unused[:20]}")
    if num_heads is None:
        raise ValueError("The .npz has no transformer blocks.")
    return out, int(num_heads)


def is_npz_hybrid(arrays):
    """Whether a Google `.npz` holds a hybrid ViT (R50+ViT-B/16, R26+ViT-S/32, ...: a ResNet root conv)."""
    return any(key.endswith("conv_root/kernel") for key in arrays)


def from_npz_vit(arrays, *, image_size=None, interpolation="bicubic", antialias=True, include_head=True, **overrides):
    """Build a keras_vit model from a Google ViT `.npz` checkpoint (plain ViTs; `keras_vit.convert.from_npz` also reads hybrids).

    The head count comes from the attention kernels, the image size from
    the (square) position-embedding grid, LayerNorm epsilon is Flax's 1e-6
    and the pixel preprocessing maps [0, 255] to [-1, 1], as in the original
    training code. A model whose `pos_embedding` has no class-token row
    (big_vision) gets `prefix_position_embedding=False`; a model without
    `cls` pools with `"gap"`.

    Args:
        arrays: dict of str to numpy arrays, e.g. `read_npz(path)`.
        image_size, interpolation, antialias, include_head, **overrides: as
            in `from_timm`.

    Returns:
        A `ViTClassifier` (probabilities unless `activation=None`, plus the `tanh` pre-logits layer when
        the checkpoint has one) or a `ViTBackbone`.
    """
    if is_npz_hybrid(arrays):
        raise ValueError("This .npz holds a hybrid ViT (a ResNet root conv): convert it with "
                         "`keras_vit.convert.from_npz`, which reads hybrids too.")
    state_dict, num_heads = npz_to_timm(arrays)
    # The original training code maps [0, 255] pixels to [-1, 1].
    channels = state_dict["patch_embed.proj.weight"].shape[1]
    config = {"model_args": {"num_heads": num_heads},
              "pretrained_cfg": {"mean": (0.5,) * channels, "std": (0.5,) * channels, **NPZ_EVALUATION}}
    return from_timm_vit(
        state_dict,
        config=config,
        image_size=image_size,
        interpolation=interpolation,
        antialias=antialias,
        include_head=include_head,
        **overrides,
    )
