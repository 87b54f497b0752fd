"""Hybrid (BiT ResNet + ViT) checkpoints from timm and Google `.npz` -> keras_vit.

timm's hybrids (`vit_base_r50_s16_384`, `vit_small_r26_s32_224`, ...) keep
the CNN under `patch_embed.backbone.`: `stem.conv` / `stem.norm` (or
`conv` / `norm` when the root is the whole stem, as in
`vit_tiny_r_s16_p8_*`) and `stages.{i}.blocks.{j}.conv{1,2,3}`,
`norm{1,2,3}`, `downsample.conv`, `downsample.norm`; the 1x1 projection of
the feature map is the ordinary `patch_embed.proj`. The Google release
names the same tensors `conv_root`, `gn_root`, `block{i}/unit{j}/conv{r}`,
`gn{r}`, `conv_proj`, `gn_proj` (HWIO kernels) next to the plain ViT ones.

Both are brought into timm's layout; the ViT part then goes through the
plain converters (`keras_vit.convert.timm`, `keras_vit.convert.google`)
and the stem's weights are added to the same strict name map, so every
tensor is placed exactly once. The stem is `bit_resnet_stem` with timm's
epsilons (weight standardisation 1e-8, GroupNorm 1e-5), which is also how
timm runs the Google weights.
"""

import math
import re

import numpy as np

from keras_vit.convert.google import NPZ_EVALUATION, find_npz_prefix, npz_to_timm
from keras_vit.convert.model_map import build_model, config_pair
from keras_vit.convert.timm import timm_spec
from keras_vit.models.hybrid import bit_resnet_stem

BACKBONE_PREFIX = "patch_embed.backbone."
STEM_NAME = "bit_resnet"
_STEM_OPTIONS = ("num_groups", "std_conv_epsilon", "group_norm_epsilon")


def _conv_kernel(array):
    return np.asarray(array).transpose(2, 3, 1, 0)  # PyTorch OIHW -> Keras HWIO


def _same(array):
    return np.asarray(array)


def hybrid_stem_spec(state_dict):
    """Read the BiT ResNet's shape from timm-layout tensors.

    Returns:
        `(stem_arguments, num_channels, entries)`: `bit_resnet_stem`
        arguments (`stage_depths`, `width`), the image channels, and the
        `(timm key, keras path, to_keras)` entries of every stem weight.
    """
    b = BACKBONE_PREFIX
    stem_only = b + "conv.weight" in state_dict
    root = b if stem_only else b + "stem."
    if root + "conv.weight" not in state_dict:
        raise ValueError(
            "This hybrid checkpoint's CNN is not a BiT ResNet: there is no 'patch_embed.backbone.stem.conv.weight' "
            "(or 'patch_embed.backbone.conv.weight' for a root-only stem). keras_vit converts the ResNetV2 "
            "hybrids (vit_*_r50_*, vit_*_r26_*, vit_tiny_r_*); other CNN stems are not supported. "
            f"Backbone keys: {sorted(k for k in state_dict if k.startswith(b))[:6]}"
        )
    wrong = [f"{key} has shape {tuple(np.shape(value))}, a rank-{rank} tensor is needed"
             for key, value in state_dict.items() if key.startswith(b)
             for rank in [4 if re.search(r"conv\d?\.weight$", key) else 1] if np.ndim(value) != rank]
    if wrong:
        raise ValueError("The hybrid checkpoint's CNN has tensors of the wrong rank: " + "; ".join(sorted(wrong)[:8])
                         + ". The file is damaged or its CNN is not a BiT ResNet.")
    width, num_channels = (int(v) for v in np.shape(state_dict[root + "conv.weight"])[:2])
    entries = [
        (root + "conv.weight", f"{STEM_NAME}/root/conv/kernel", _conv_kernel),
        (root + "norm.weight", f"{STEM_NAME}/root/norm/gamma", _same),
        (root + "norm.bias", f"{STEM_NAME}/root/norm/beta", _same),
    ]
    units = {}
    for key in state_dict:
        match = re.match(re.escape(b) + r"stages\.(\d+)\.blocks\.(\d+)\.", key)
        if match:
            units.setdefault(int(match.group(1)), set()).add(int(match.group(2)))
    if sorted(units) != list(range(len(units))) or any(sorted(u) != list(range(len(u))) for u in units.values()):
        raise ValueError(f"The hybrid's ResNet stages/blocks are not numbered 0..N-1: {units}")
    stage_depths = tuple(len(units[i]) for i in range(len(units)))
    for i, depth in enumerate(stage_depths):
        for j in range(depth):
            src, dst = f"{b}stages.{i}.blocks.{j}.", f"{STEM_NAME}/block{i + 1}_unit{j + 1}/"
            for r in (1, 2, 3):
                entries += [
                    (src + f"conv{r}.weight", dst + f"conv{r}/kernel", _conv_kernel),
                    (src + f"norm{r}.weight", dst + f"norm{r}/gamma", _same),
                    (src + f"norm{r}.bias", dst + f"norm{r}/beta", _same),
                ]
            entries += [
                (src + "downsample.conv.weight", dst + "conv_proj/kernel", _conv_kernel),
                (src + "downsample.norm.weight", dst + "norm_proj/gamma", _same),
                (src + "downsample.norm.bias", dst + "norm_proj/beta", _same),
            ]
            out_key, mid_key = src + "conv3.weight", src + "conv1.weight"
            if out_key in state_dict and mid_key in state_dict:
                out_channels, mid_channels = np.shape(state_dict[out_key])[0], np.shape(state_dict[mid_key])[0]
                if (out_channels, mid_channels) != (4 * width * 2**i, width * 2**i):
                    raise ValueError(
                        f"Stage {i} unit {j} has {mid_channels} bottleneck and {out_channels} output channels; "
                        f"a BiT ResNet of root width {width} has {width * 2**i} and {4 * width * 2**i}. "
                        "keras_vit's bit_resnet_stem cannot represent this checkpoint."
                    )
    return {"stage_depths": stage_depths, "width": width}, num_channels, entries


def _output_stride(stage_depths):
    # Root: stride 4; the first stage keeps the resolution, each later one halves it.
    return 4 * 2 ** max(len(stage_depths) - 1, 0)



def from_timm_hybrid(
    state_dict,
    *,
    config=None,
    image_size=None,
    interpolation="bicubic",
    antialias=True,
    include_head=True,
    source_image_size=None,
    num_groups=32,
    std_conv_epsilon=1e-8,
    group_norm_epsilon=1e-5,
    allow_non_finite=False,
    **overrides,
):
    """Build a hybrid keras_vit model from a timm hybrid ViT state dict.

    The ResNet's stage depths and width come from the tensors; the ViT is
    inferred as in `from_timm`. GroupNorm's group count is not recorded
    in any weight: timm's hybrids use 32.

    Args:
        state_dict: dict of str to numpy arrays in timm's names and layouts
            (e.g. `read_safetensors("vit_base_r50_s16_384.safetensors")`).
        config: dict or `None`. timm's hub `config.json`.
        image_size: int, pair or `None`. Build the model at this image size,
            resampling the position embedding to the new token grid.
            Defaults to the checkpoint's.
        interpolation: str. Position-embedding resampling. Defaults to
            `"bicubic"`.
        antialias: bool. Defaults to `True`.
        include_head: bool. Return a `ViTClassifier` when the checkpoint has
            a head. Defaults to `True`.
        source_image_size: int, pair or `None`. The checkpoint's image size,
            for non-square checkpoints without a config.
        num_groups: int. GroupNorm groups of the stem. Defaults to `32`.
        std_conv_epsilon: float. Defaults to `1e-8` (timm's
            `StdConv2dSame`).
        group_norm_epsilon: float. Defaults to `1e-5` (timm's GroupNorm).
        **overrides: `ViTBackbone` / `ViTClassifier` arguments that replace
            inferred ones (e.g. `num_heads`).

    Returns:
        A `ViTClassifier` (probabilities unless `activation=None`) or a `ViTBackbone` whose `stem` is the
        converted BiT ResNet.
    """
    state_dict = {k: np.asarray(v) for k, v in state_dict.items()}
    stem_arguments, num_channels, stem_entries = hybrid_stem_spec(state_dict)
    stride = _output_stride(stem_arguments["stage_depths"])
    vit_part = {k: v for k, v in state_dict.items() if not k.startswith(BACKBONE_PREFIX)}

    # timm's config sizes are image sizes; the plain-ViT inference works on
    # the feature map the patches are cut from, `ceil(image / stride)`.
    config = {key: (dict(value) if isinstance(value, dict) else value) for key, value in dict(config or {}).items()}
    model_args = config.setdefault("model_args", {})
    pretrained_cfg = config.setdefault("pretrained_cfg", {})
    source_size = config_pair(source_image_size or model_args.pop("img_size", None) or pretrained_cfg.pop("input_size", None))
    if "num_heads" in overrides:
        model_args["num_heads"] = overrides["num_heads"]
    feature_size = None if source_size is None else tuple(math.ceil(s / stride) for s in source_size)
    backbone_config, head_config, grid, ignored = timm_spec(
        vit_part, config, include_head=include_head, source_image_size=feature_size, **overrides
    )
    patch_size = backbone_config["patch_size"]
    if source_size is None:
        source_size = (grid[0] * patch_size[0] * stride, grid[1] * patch_size[1] * stride)

    backbone_config["image_size"] = source_size
    backbone_config["num_channels"] = num_channels
    backbone_config["stem"] = bit_resnet_stem(
        **stem_arguments,
        num_groups=num_groups,
        std_conv_epsilon=std_conv_epsilon,
        group_norm_epsilon=group_norm_epsilon,
        name=STEM_NAME,
        dtype=backbone_config.get("dtype"),
    )
    stem_keys = {e[0] for e in stem_entries}
    stray = sorted(k for k in state_dict if k.startswith(BACKBONE_PREFIX) and k not in stem_keys)
    if stray:
        raise ValueError(f"The hybrid checkpoint has CNN tensors keras_vit's BiT ResNet has no place for: {stray[:10]}")
    # The stem's weights join the ViT's strict assignment; build_model
    # resamples the position embedding when `image_size` changes the grid.
    extra_weights = {path: to_keras(state_dict[key]) for key, path, to_keras in stem_entries if key in state_dict}
    return build_model(
        backbone_config,
        head_config,
        vit_part,
        source_grid=grid,
        image_size=image_size,
        interpolation=interpolation,
        antialias=antialias,
        ignored=ignored,
        source="timm hybrid checkpoint",
        extra_weights=extra_weights,
        allow_non_finite=allow_non_finite,
    )


_RESNET_KEY = re.compile(r"^(conv_root|gn_root|block\d+/unit\d+)/")


def npz_hybrid_to_timm(arrays):
    """Translate a Google hybrid `.npz` into a timm-layout state dict.

    Returns:
        `(timm_state_dict, num_heads)`.
    """
    prefix = find_npz_prefix(arrays)
    resnet = {k[len(prefix):]: np.asarray(v) for k, v in arrays.items()
              if k.startswith(prefix) and _RESNET_KEY.match(k[len(prefix):])}
    rest = {k: v for k, v in arrays.items() if not (k.startswith(prefix) and _RESNET_KEY.match(k[len(prefix):]))}
    state_dict, num_heads = npz_to_timm(rest)
    stem_only = not any(k.startswith("block") for k in resnet)
    b = BACKBONE_PREFIX
    root = b if stem_only else b + "stem."
    used = set()

    def take(name):
        used.add(name)
        return resnet[name]

    state_dict[root + "conv.weight"] = take("conv_root/kernel").transpose(3, 2, 0, 1)  # HWIO -> OIHW
    state_dict[root + "norm.weight"] = take("gn_root/scale").reshape(-1)
    state_dict[root + "norm.bias"] = take("gn_root/bias").reshape(-1)
    for name in sorted(resnet):
        match = re.match(r"^block(\d+)/unit(\d+)/(conv\d|gn\d|conv_proj|gn_proj)/(kernel|scale|bias)$", name)
        if not match:
            continue
        stage, unit, layer, param = int(match.group(1)) - 1, int(match.group(2)) - 1, match.group(3), match.group(4)
        dst = f"{b}stages.{stage}.blocks.{unit}."
        if layer == "conv_proj":
            dst += "downsample.conv"
        elif layer == "gn_proj":
            dst += "downsample.norm"
        else:
            dst += layer.replace("gn", "norm")
        value = take(name)
        if param == "kernel":
            state_dict[dst + ".weight"] = value.transpose(3, 2, 0, 1)
        else:
            state_dict[dst + (".weight" if param == "scale" else ".bias")] = value.reshape(-1)
    unused = sorted(set(resnet) - used)
    if unused:
        raise ValueError(f"The hybrid .npz has ResNet arrays keras_vit cannot place: {unused[:20]}")
    return state_dict, num_heads


def from_npz_hybrid(arrays, *, image_size=None, interpolation="bicubic", antialias=True, include_head=True,
                    **overrides):
    """Build a hybrid keras_vit model from a Google `vision_transformer` hybrid `.npz`.

    The R50+ViT-B/16 of the paper and the AugReg R26/R50/R+Ti hybrids:
    `conv_root`, `gn_root`, `block{i}/unit{j}/{conv,gn}{1,2,3}`,
    `conv_proj`, `gn_proj` for the ResNet, the usual names for the ViT.
    Pixels map [0, 255] to [-1, 1]; the stem runs with timm's epsilons, as
    timm does with these files (see `from_timm_hybrid` for overrides).

    Args:
        arrays: dict of str to numpy arrays, e.g. `read_npz(path)`.
        image_size, interpolation, antialias, include_head, **overrides: as
            in `from_timm_hybrid`.

    Returns:
        A `ViTClassifier` (probabilities unless `activation=None`) or a `ViTBackbone`.
    """
    state_dict, num_heads = npz_hybrid_to_timm(arrays)
    channels = state_dict[BACKBONE_PREFIX + ("conv.weight" if BACKBONE_PREFIX + "conv.weight" in state_dict
                                             else "stem.conv.weight")].shape[1]
    config = {"model_args": {"num_heads": num_heads},
              "pretrained_cfg": {"mean": (0.5,) * channels, "std": (0.5,) * channels, **NPZ_EVALUATION}}
    return from_timm_hybrid(
        state_dict, config=config, image_size=image_size, interpolation=interpolation, antialias=antialias,
        include_head=include_head, **overrides,
    )
