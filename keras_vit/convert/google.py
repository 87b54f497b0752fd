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

big_vision's `pool_type='map'` models (SigLIP's image tower) add `MAPHead_0/`
(big_vision/models/vit.py, `MAPHead`): a `probe` `(1, 1, D)`, its own
`MultiHeadDotProductAttention_0` (query from the probe, key and value from the
tokens), `LayerNorm_0` and `MlpBlock_0`, read into the backbone's
`attention_pool`. big_vision's MLPs use Flax's `nn.gelu`, the tanh
approximation, which such a model gets (`mlp_activation="gelu_tanh"`, as timm
and Hugging Face build SigLIP). A SigLIP two-tower archive
(big_vision/models/proj/image_text/two_towers.py) holds the image tower under
`params/img/`: only the image tower is read; the text tower (`params/txt/`) and
the loss's temperature and bias (`params/t`, `params/b`) are ignored by name.
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
    (r"^(cls|pos_embedding|Transformer/posembed_input/pos_embedding|MAPHead_0/probe)$", 3),
)
# Beside the image tower of a SigLIP two-tower archive (prefix `params/img/`): the text tower and the
# sigmoid loss's learned temperature and bias, which a vision model does not use.
_TEXT_TOWER = ("params/txt/",)
_TWO_TOWER_SCALARS = ("params/t", "params/b")
_MAP_HEAD = "MAPHead_0/"


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
    # `opt/target/`) and, beside a two-tower archive's image tower, its text tower are expected; both
    # are deliberately ignored, by name.
    outside = sorted(k for k in arrays if not k.startswith(prefix) and not (prefix and k.startswith("opt/"))
                     and not (prefix == "params/img/" and (k.startswith(_TEXT_TOWER) or k in _TWO_TOWER_SCALARS)))
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

    if any(k.startswith(_MAP_HEAD) for k in w):
        out.update(_map_head_to_timm(w, take, prefix))

    unused = sorted(prefix + k for k in set(w) - used) + outside
    if unused:
        raise ValueError(f"The .npz has arrays keras_vit cannot place: {unused[:20]}. keras_vit reads the ViT of "
                         "the original release and big_vision's ViT (token, GAP or MAP pooling), and the image "
                         "tower (params/img/) of a SigLIP two-tower archive.")
    if num_heads is None:
        raise ValueError("The .npz has no transformer blocks.")
    return out, int(num_heads)


_MAP_HEAD_ARRAYS = ("probe", "LayerNorm_0/scale", "LayerNorm_0/bias") + tuple(
    f"MultiHeadDotProductAttention_0/{part}/{param}" for part in ("query", "key", "value", "out")
    for param in ("kernel", "bias")) + tuple(f"MlpBlock_0/Dense_{r}/{p}" for r in range(2) for p in ("kernel", "bias"))


def _map_head_to_timm(w, take, prefix):
    """big_vision's `MAPHead_0/` arrays under timm's `attn_pool.*` names (timm's `AttentionPoolLatent`)."""
    missing = [prefix + _MAP_HEAD + name for name in _MAP_HEAD_ARRAYS if _MAP_HEAD + name not in w]
    if missing:
        raise ValueError(f"The .npz has an incomplete MAP head (big_vision's MAPHead): it lacks {missing}. "
                         "The file is damaged or was cut.")
    head = {name: take(_MAP_HEAD + name) for name in _MAP_HEAD_ARRAYS}
    attention = "MultiHeadDotProductAttention_0/"
    # Flax's per-head kernels (D, heads, head_dim) flattened head-major are a Linear's (in, out) columns.
    flat = {part: head[f"{attention}{part}/kernel"].reshape(head[f"{attention}{part}/kernel"].shape[0], -1).T
            for part in ("query", "key", "value")}
    bias = {part: head[f"{attention}{part}/bias"].reshape(-1) for part in ("query", "key", "value")}
    out_kernel = head[attention + "out/kernel"]  # (heads, head_dim, D)
    out = {
        "attn_pool.latent": head["probe"],
        "attn_pool.q.weight": flat["query"],
        "attn_pool.q.bias": bias["query"],
        # timm's kv Linear: all key rows, then all value rows.
        "attn_pool.kv.weight": np.concatenate([flat["key"], flat["value"]], axis=0),
        "attn_pool.kv.bias": np.concatenate([bias["key"], bias["value"]]),
        "attn_pool.proj.weight": out_kernel.reshape(-1, out_kernel.shape[-1]).T,
        "attn_pool.proj.bias": head[attention + "out/bias"],
        "attn_pool.norm.weight": head["LayerNorm_0/scale"],
        "attn_pool.norm.bias": head["LayerNorm_0/bias"],
    }
    for r in range(2):
        out[f"attn_pool.mlp.fc{r + 1}.weight"] = head[f"MlpBlock_0/Dense_{r}/kernel"].T
        out[f"attn_pool.mlp.fc{r + 1}.bias"] = head[f"MlpBlock_0/Dense_{r}/bias"]
    return out


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
    `cls` pools with `"gap"`, one with big_vision's MAP head (`MAPHead_0/`,
    SigLIP) with `"map"` and tanh GELU. Of a SigLIP two-tower archive only
    the image tower (`params/img/`) is read (a `ViTBackbone` with its MAP head
    when the tower has no `head`: `pooled_model()` is SigLIP's image
    embedding before the text tower).

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
    model_args = {"num_heads": num_heads}
    if "attn_pool.latent" in state_dict:
        model_args.update(global_pool="map", act_layer="gelu_tanh")  # big_vision's MLPs: Flax nn.gelu, tanh
    config = {"model_args": model_args,
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
