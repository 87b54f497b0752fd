"""timm `vision_transformer` state dicts <-> keras_vit models."""

import json
import math
import re
import warnings

import numpy as np

from keras_vit.convert import class_names
from keras_vit.convert.exported_transform import timm_pretrained_cfg
from keras_vit.convert.io import write_safetensors
from keras_vit.convert.model_map import HEAD_ARGUMENTS, build_model, config_pair, check_tensors, model_to_timm
from keras_vit.models.variants import MODEL_SIZES
from keras_vit.utils.values import IMAGE_INTERPOLATIONS

# timm's ViT default preprocessing (`_cfg`: IMAGENET_INCEPTION_MEAN/STD).
TIMM_DEFAULT_MEAN = (0.5, 0.5, 0.5)
TIMM_DEFAULT_STD = (0.5, 0.5, 0.5)
TIMM_LAYER_NORM_EPSILON = 1e-6  # timm.layers.LayerNorm default

_TIMM_SIZE_NAMES = {"tiny": "Ti", "small": "S", "base": "B", "large": "L", "huge": "H", "so400m": "So400m"}
_HEADS_BY_WIDTH = {size["hidden_dim"]: size["num_heads"] for size in MODEL_SIZES.values()}
_UNSUPPORTED = {
    "attn_pool.q_norm.": "query/key normalisation inside attention pooling",
    "attn_pool.pos_embed": "a position embedding inside attention pooling (`pos_embed='abs'`)",
    "attn.norm.": "attention output normalisation (`scale_attn_norm=True`)",
    "mlp.norm.": "MLP normalisation (`scale_mlp_norm=True`)",
    "patch_embed.norm.": "a patch-embedding norm",
    "patch_embed.backbone.": "a hybrid CNN stem (use the hybrid converters)",
}
_KERAS_VIT_METADATA = "keras_vit_config"
_EPSILON_KEY = "keras_vit_layer_norm_epsilon"



def _heads_from_architecture(architecture):
    match = re.match(r"^(?:vit|deit3?|deit)_(tiny|small|base|large|huge|so400m)_", architecture or "")
    return MODEL_SIZES[_TIMM_SIZE_NAMES[match.group(1)]]["num_heads"] if match else None


def infer_num_heads(hidden_dim, architecture=None):
    """Best guess of the head count, which no weight shape records."""
    heads = _heads_from_architecture(architecture)
    if heads is None:
        heads = _HEADS_BY_WIDTH.get(hidden_dim)
    if heads is None and hidden_dim % 64 == 0:
        heads = hidden_dim // 64  # the usual head width
    if heads is None:
        raise ValueError(
            f"Cannot tell the number of attention heads of a checkpoint with hidden_dim={hidden_dim}: "
            "no weight shape records it. Pass it, e.g. `load_checkpoint(path, num_heads=...)`."
        )
    return heads


def _check_unsupported(state_dict):
    found = {}
    for key in state_dict:
        for marker, meaning in _UNSUPPORTED.items():
            if key.startswith(marker) or f".{marker}" in f".{key}":
                found.setdefault(meaning, []).append(key)
    if found:
        details = "; ".join(f"{meaning}: {keys[:4]}" for meaning, keys in found.items())
        raise ValueError(f"This timm checkpoint uses parts keras_vit's ViT does not implement ({details}).")


def _grid_from_tokens(num_tokens, num_prefix_tokens, grid=None, prefer_prefix_rows=True):
    """(grid, prefix_position_embedding) that explain `num_tokens` rows."""
    if grid is not None:
        patches = grid[0] * grid[1]
        if num_tokens == patches + num_prefix_tokens:
            return grid, True
        if num_tokens == patches:
            return grid, num_prefix_tokens == 0
        raise ValueError(
            f"The position embedding has {num_tokens} rows, which fits neither {patches} patches "
            f"({grid[0]}x{grid[1]} grid) nor {patches} + {num_prefix_tokens} prefix tokens. The "
            "image size given with the checkpoint is wrong."
        )
    candidates = [(num_tokens - num_prefix_tokens, True), (num_tokens, False)]
    for rows, with_prefix in candidates if prefer_prefix_rows else candidates[::-1]:
        side = math.isqrt(max(rows, 0))
        if rows > 0 and side * side == rows:
            return (side, side), with_prefix or num_prefix_tokens == 0
    raise ValueError(
        f"Cannot infer the patch grid from a position embedding of {num_tokens} rows: it is not a "
        "square grid. Give the checkpoint's image size (a timm config.json with `pretrained_cfg."
        "input_size`, or `source_image_size=(height, width)`)."
    )


# timm's `crop_mode` names and keras_vit's `resize_mode` for each ("border", which pads the longer side's
# resize with the mean colour, has no keras_vit equivalent).
TIMM_CROP_MODES = {"center": "center_crop", "squash": "stretch"}
# `timm.data.resolve_data_config`'s defaults where `pretrained_cfg` leaves a field out (timm 1.0.31,
# timm/data/config.py and constants.py: DEFAULT_CROP_PCT, DEFAULT_CROP_MODE, 'bicubic').
TIMM_DEFAULT_CROP_PCT = 0.875


def timm_image_transform(pretrained_cfg, skip=()):
    """The evaluation transform timm gives a checkpoint, as `ViTBackbone` arguments.

    `timm.data.resolve_data_config` then `create_transform` (timm 1.0.31,
    `transforms_imagenet_eval`): `crop_pct` (default 0.875), `crop_mode`
    ("center", default, or "squash"), `interpolation` (default
    "bicubic"); the file is read as `Image.open(path).convert("RGB")`, which
    drops alpha. A checkpoint without a `pretrained_cfg` (a bare state dict)
    keeps keras_vit's resize (its source's is unknown) and drops alpha.

    Args:
        pretrained_cfg: dict or `None`. The `pretrained_cfg` of timm's hub
            `config.json`.
        skip: names of the fields the caller overrides: neither read nor
            refused.

    Returns:
        A dict of `resize_mode`, `crop_fraction`, `interpolation`, `alpha`.
    """
    transform = {"alpha": "drop"}
    if pretrained_cfg is not None:
        crop_mode = pretrained_cfg.get("crop_mode") or "center"
        if crop_mode not in TIMM_CROP_MODES and "resize_mode" not in skip:
            raise ValueError(
                f"timm's pretrained_cfg asks for crop_mode={crop_mode!r}, which keras_vit's evaluation transform "
                f"does not implement (it reads {sorted(TIMM_CROP_MODES)}). Pass resize_mode='center_crop' or "
                "'stretch' to choose the nearest one.")
        interpolation = pretrained_cfg.get("interpolation") or "bicubic"
        if interpolation not in IMAGE_INTERPOLATIONS:
            warnings.warn(
                f"timm's pretrained_cfg resamples with interpolation={interpolation!r}, which keras_vit does not "
                "implement; the evaluation transform uses 'bicubic' instead (change it with "
                "`model.set_image_transform(interpolation=...)`).", stacklevel=3)
            interpolation = "bicubic"
        transform.update(resize_mode=TIMM_CROP_MODES.get(crop_mode, "center_crop"),
                         crop_fraction=float(pretrained_cfg.get("crop_pct") or TIMM_DEFAULT_CROP_PCT),
                         interpolation=interpolation)
    return {key: value for key, value in transform.items() if key not in skip}


def timm_spec(state_dict, config=None, *, include_head=True, source_image_size=None, **overrides):
    """Infer keras_vit arguments from a timm ViT state dict (and its hub config).

    Returns:
        `(backbone_config, head_config_or_None, source_grid, ignored_keys)`.
    """
    config = dict(config or {})
    model_args = dict(config.get("model_args") or {})
    pretrained_cfg = dict(config.get("pretrained_cfg") or {})
    _check_unsupported(state_dict)
    check_tensors(state_dict, "timm checkpoint")
    if "patch_embed.proj.weight" not in state_dict:
        raise ValueError(
            "This is not a timm ViT state dict: it has no 'patch_embed.proj.weight'. "
            f"First keys: {sorted(state_dict)[:8]}"
        )
    patch_weight = np.asarray(state_dict["patch_embed.proj.weight"])
    if patch_weight.ndim != 4:
        raise ValueError(
            "'patch_embed.proj.weight' must be a (hidden_dim, channels, patch_h, patch_w) conv kernel. "
            f"Received shape {patch_weight.shape}."
        )
    hidden_dim, num_channels, patch_h, patch_w = (int(v) for v in patch_weight.shape)
    block_ids = sorted({int(m.group(1)) for k in state_dict if (m := re.match(r"blocks\.(\d+)\.", k))})
    if block_ids != list(range(len(block_ids))) or not block_ids:
        raise ValueError(f"The checkpoint's transformer blocks are not numbered 0..N-1: {block_ids}")
    num_layers = len(block_ids)
    mlp_dim = int(np.shape(state_dict.get("blocks.0.mlp.fc1.weight", np.zeros((0,))))[0])
    use_class_token = "cls_token" in state_dict
    num_register_tokens = int(np.shape(state_dict["reg_token"])[1]) if "reg_token" in state_dict else 0
    parts = later_family_parts(state_dict, config)
    num_prefix_tokens = int(use_class_token) + int(parts["use_distillation_token"]) + num_register_tokens

    image_size = config_pair(source_image_size or model_args.get("img_size") or pretrained_cfg.get("input_size"))
    grid = None if image_size is None else (image_size[0] // patch_h, image_size[1] // patch_w)
    if "pos_embed" in state_dict:
        position_embedding = "learned"
        rows = int(np.shape(state_dict["pos_embed"])[1])
        prefer_prefix_rows = not model_args.get("no_embed_class", False)
        try:
            grid, prefix_position_embedding = _grid_from_tokens(rows, num_prefix_tokens, grid, prefer_prefix_rows)
        except ValueError:
            if source_image_size is not None:
                raise
            # A hub config's input size can describe test-time resizing rather
            # than the table; the weights themselves then decide (square grid).
            grid, prefix_position_embedding = _grid_from_tokens(rows, num_prefix_tokens, None, prefer_prefix_rows)
    else:
        position_embedding = "none"
        prefix_position_embedding = True
        if grid is None:
            raise ValueError(
                "The checkpoint has no position embedding, so its image size cannot be inferred. "
                "Pass `source_image_size=(height, width)`."
            )

    num_heads = (
        overrides.get("num_heads") or model_args.get("num_heads")
        or infer_num_heads(hidden_dim, config.get("architecture"))
    )
    transform = timm_image_transform(None if config.get("pretrained_cfg") is None else pretrained_cfg,
                                     skip=overrides)
    mean = pretrained_cfg.get("mean", TIMM_DEFAULT_MEAN)
    std = pretrained_cfg.get("std", TIMM_DEFAULT_STD)
    backbone_config = {
        "image_size": (grid[0] * patch_h, grid[1] * patch_w),
        "patch_size": (patch_h, patch_w),
        "num_channels": num_channels,
        "hidden_dim": hidden_dim,
        "num_layers": num_layers,
        "num_heads": int(num_heads),
        "mlp_dim": mlp_dim,
        "layer_norm_epsilon": parts.pop("layer_norm_epsilon"),
        "use_class_token": use_class_token,
        "num_register_tokens": num_register_tokens,
        "position_embedding": position_embedding,
        "prefix_position_embedding": prefix_position_embedding,
        "layer_scale_init": 1e-5 if "blocks.0.ls1.gamma" in state_dict else None,
        "use_qkv_bias": "blocks.0.attn.qkv.bias" in state_dict,
        "final_norm": "norm.weight" in state_dict,
        **parts,
        "pixel_scale": 1.0 / 255.0,
        "pixel_mean": tuple(float(v) for v in mean),
        "pixel_std": tuple(float(v) for v in std),
        **transform,
    }
    head_overrides = {k: overrides.pop(k) for k in list(overrides) if k in HEAD_ARGUMENTS}
    backbone_config.update(overrides)

    ignored = []
    head_keys = [k for k in state_dict if k.startswith(("head.", "head_dist.", "fc_norm.", "pre_logits."))]
    has_head = "head.weight" in state_dict
    head_config = None
    if include_head and has_head:
        global_pool = model_args.get("global_pool", config.get("global_pool"))
        if global_pool is None:
            global_pool = "avg" if ("fc_norm.weight" in state_dict or not use_class_token) else "token"
            if parts["attention_pooling"]:
                global_pool = "map"
        pools = {"token": "token", "avg": "gap", "map": "map"}
        if global_pool not in pools:
            raise ValueError(
                f"timm global_pool={global_pool!r} is not supported; keras_vit pools with 'token', "
                "'avg' (gap) or 'map' (attention pooling)."
            )
        head_config = {
            "num_classes": int(np.shape(state_dict["head.weight"])[0]),
            "pooling": pools[global_pool],
            "representation_size": (
                int(np.shape(state_dict["pre_logits.fc.weight"])[0]) if "pre_logits.fc.weight" in state_dict else None
            ),
            "pooled_norm": "fc_norm.weight" in state_dict,
            "activation": "softmax",  # probabilities, like every ViTClassifier; activation=None for logits
        }
        head_config.update(head_overrides)
        # The checkpoint's names travel with its head (a head of another size has none of them).
        if head_config["num_classes"] == int(np.shape(state_dict["head.weight"])[0]):
            names = class_names.from_timm_config(pretrained_cfg, head_config["num_classes"])
            if names is not None:
                head_config.setdefault("class_names", names)
    else:
        # A backbone is asked for, or the checkpoint has no classifier: the
        # head-side tensors (head, fc_norm, pre_logits) are deliberately dropped.
        ignored = head_keys
    return backbone_config, head_config, grid, ignored


# timm's MLP activations (`act_layer`) by the name keras_vit's config gives them.
_TIMM_ACTIVATIONS = {"gelu": "gelu", "gelu_tanh": "gelu_tanh", "quick_gelu": "quick_gelu"}
CLIP_LAYER_NORM_EPSILON = 1e-5  # timm builds its CLIP towers with `partial(LayerNorm, eps=1e-5)`


def later_family_parts(state_dict, config):
    """The parts of SigLIP, CLIP, DeiT and qk-norm ViTs in a timm checkpoint, as `ViTBackbone` arguments.

    The weights record pre-norm (`norm_pre`), qk-norm (`attn.q_norm`), the
    MAP head (`attn_pool`) and the distillation token (`dist_token`). No
    weight records the MLP activation or the LayerNorm epsilon: they come
    from the hub config's `model_args.act_layer` and from the architecture's
    name (timm's `*_quickgelu_*` towers use quick-GELU, its `*_clip_*`
    towers LayerNorms with epsilon 1e-5).
    """
    config = dict(config or {})
    model_args = dict(config.get("model_args") or {})
    architecture = str(config.get("architecture") or "")
    activation = model_args.get("act_layer") or ("quick_gelu" if "quickgelu" in architecture else "gelu")
    if activation not in _TIMM_ACTIVATIONS:
        raise ValueError(
            f"This timm checkpoint's MLP activation act_layer={activation!r} is not one keras_vit implements "
            f"({', '.join(sorted(_TIMM_ACTIVATIONS))})."
        )
    epsilon = CLIP_LAYER_NORM_EPSILON if "_clip" in architecture else TIMM_LAYER_NORM_EPSILON
    # `export_timm` records the epsilon beside timm's config (timm's own config has no field for it).
    epsilon = float(config.get(_EPSILON_KEY, epsilon))
    return {
        "layer_norm_epsilon": epsilon,
        "pre_norm": "norm_pre.weight" in state_dict,
        "mlp_activation": _TIMM_ACTIVATIONS[activation],
        "qk_norm": "blocks.0.attn.q_norm.weight" in state_dict,
        "use_distillation_token": "dist_token" in state_dict,
        "attention_pooling": "attn_pool.latent" in state_dict,
    }


def is_timm_hybrid(state_dict):
    """Whether a timm state dict is a hybrid ViT (a ResNet stem under `patch_embed.backbone.`)."""
    return any(key.startswith("patch_embed.backbone.") for key in state_dict)


def from_timm_vit(
    state_dict,
    *,
    config=None,
    image_size=None,
    interpolation="bicubic",
    antialias=True,
    include_head=True,
    source_image_size=None,
    allow_non_finite=False,
    **overrides,
):
    """Build a keras_vit model from a timm ViT state dict (plain ViTs; `keras_vit.convert.from_timm` also reads hybrids).

    The architecture is read from the tensors themselves (width, depth, MLP
    width, patch size, class and register tokens, `no_embed_class`,
    LayerScale, qkv bias, final norm vs. `fc_norm`, head) and, when given,
    from timm's hub `config.json` (image size, heads, pooling, mean/std).

    Args:
        state_dict: dict of str to numpy arrays, timm names and layouts.
        config: dict or `None`. timm's hub `config.json` (`architecture`,
            `model_args`, `pretrained_cfg`, ...). Defaults to `None`: a square
            image, heads from the width, timm's default mean/std 0.5.
        image_size: int, pair or `None`. Build the model at this resolution,
            resampling the position embedding. Defaults to the checkpoint's.
        interpolation: str. `"bicubic"` or `"bilinear"`. Defaults to
            `"bicubic"` (timm's choice).
        antialias: bool. Defaults to `True` (timm's choice).
        include_head: bool. Return a `ViTClassifier` when the checkpoint has
            a head; otherwise a `ViTBackbone`. Defaults to `True`.
        source_image_size: int, pair or `None`. The checkpoint's image size,
            for non-square checkpoints without a config.
        allow_non_finite: bool. Load weights that hold NaN or infinity;
            by default they are refused with an error naming them (such a
            model outputs NaN). Defaults to `False`.
        **overrides: `ViTBackbone` / `ViTClassifier` arguments that replace
            the inferred ones (e.g. `num_heads=...`, `pixel_mean=...`,
            `activation=None` for logits).

    Returns:
        A `ViTClassifier` that outputs probabilities (`activation="softmax"`,
        the rule of every ViTClassifier; pass `activation=None` for timm's
        logits), or a `ViTBackbone`.
    """
    state_dict = {k: np.asarray(v) for k, v in state_dict.items()}
    if is_timm_hybrid(state_dict):
        raise ValueError("This timm state dict is a hybrid ViT (a ResNet stem under `patch_embed.backbone.`): "
                         "convert it with `keras_vit.convert.from_timm`, which reads hybrids too.")
    backbone_config, head_config, grid, ignored = timm_spec(
        state_dict, config, include_head=include_head, source_image_size=source_image_size, **overrides
    )
    return build_model(
        backbone_config,
        head_config,
        state_dict,
        source_grid=grid,
        image_size=image_size,
        interpolation=interpolation,
        antialias=antialias,
        ignored=ignored,
        source="timm checkpoint",
        allow_non_finite=allow_non_finite,
    )


def timm_config_from_metadata(metadata, source="the checkpoint"):
    """The timm-style config stored by `export_timm` in safetensors metadata."""
    if metadata and _KERAS_VIT_METADATA in metadata:
        try:
            config = json.loads(metadata[_KERAS_VIT_METADATA])
        except (TypeError, json.JSONDecodeError, RecursionError) as error:
            raise ValueError(
                f"The metadata key {_KERAS_VIT_METADATA!r} of {source} is not JSON ({error}); the file is "
                "damaged. Export it again with `export_timm`."
            ) from None
        if not isinstance(config, dict) or not isinstance(config.get("model_args", {}), dict) or not isinstance(
            config.get("pretrained_cfg", {}), dict
        ):
            raise ValueError(
                f"The metadata key {_KERAS_VIT_METADATA!r} of {source} must hold a JSON object with "
                "'model_args' and 'pretrained_cfg' objects; the file is damaged. Export it again."
            )
        return config
    return None


def model_timm_config(backbone, classifier):
    """A timm hub `config.json` describing a keras_vit model."""
    model_args = {
        "img_size": list(backbone.image_size),
        "patch_size": backbone.patch_size[0] if backbone.patch_size[0] == backbone.patch_size[1]
        else list(backbone.patch_size),
        "in_chans": backbone.num_channels,
        "embed_dim": backbone.hidden_dim,
        "depth": backbone.num_layers,
        "num_heads": backbone.num_heads,
        "mlp_ratio": backbone.mlp_dim / backbone.hidden_dim,
        "qkv_bias": bool(backbone.use_qkv_bias),
        "class_token": bool(backbone.use_class_token),
        "reg_tokens": backbone.num_register_tokens,
        "no_embed_class": not backbone.prefix_position_embedding,
        "init_values": backbone.layer_scale_init,
        "pre_norm": bool(backbone.pre_norm),
        "qk_norm": bool(backbone.qk_norm),
        "act_layer": backbone.mlp_activation,
    }
    if backbone.position_embedding == "none":
        model_args["pos_embed"] = "none"
    if classifier is not None:
        model_args["global_pool"] = {"gap": "avg", "map": "map"}.get(classifier.pooling, "token")
        model_args["fc_norm"] = bool(classifier.pooled_norm)
        num_classes = classifier.num_classes
    else:
        model_args["global_pool"] = "map" if backbone.attention_pooling else (
            "avg" if not backbone.use_class_token else "token")
        num_classes = 0
    mean, std, scale = backbone.pixel_mean, backbone.pixel_std, backbone.pixel_scale
    per_channel = lambda v: [float(x) for x in (v if np.ndim(v) else [v] * backbone.num_channels)]  # noqa: E731
    # timm feeds pixels in [0, 1]; fold our pixel_scale (x * scale) into mean/std.
    factor = scale * 255.0
    return {
        "architecture": "vit_custom",
        "num_classes": num_classes,
        "num_features": backbone.hidden_dim,
        "global_pool": model_args["global_pool"],
        _EPSILON_KEY: float(backbone.layer_norm_epsilon),
        "model_args": model_args,
        "pretrained_cfg": {
            "input_size": [backbone.num_channels, *backbone.image_size],
            "mean": [m / factor for m in per_channel(mean)],
            "std": [s / factor for s in per_channel(std)],
            # timm's create_transform then feeds the model what keras_vit's reader does.
            **timm_pretrained_cfg(backbone),
            "num_classes": num_classes,
            **_label_names(classifier),
        },
    }


def _label_names(classifier):
    """timm's `label_names` for a classifier with its own names; none for ImageNet-1k, which timm infers."""
    names = getattr(classifier, "class_names", None)
    return {"label_names": list(names)} if isinstance(names, (list, tuple)) else {}


def export_timm(model, path):
    """Write a keras_vit model as a timm ViT state dict (`.safetensors`).

    The file holds timm's names and layouts, so
    `timm.create_model(..., pretrained_cfg_overlay=dict(file=path))` with the
    matching architecture loads it; the keras_vit configuration is kept in
    the safetensors metadata so `load_checkpoint(path)` rebuilds the model
    exactly (including non-square sizes and the head count).

    Args:
        model: `ViTBackbone` or `ViTClassifier` (plain ViT, learned
            position embedding).
        path: str or path-like. The `.safetensors` file to write.

    Returns:
        The timm-style config dict that was stored.
    """
    state_dict, backbone, classifier = model_to_timm(model)
    config = model_timm_config(backbone, classifier)
    write_safetensors(path, state_dict, metadata={"format": "pt", _KERAS_VIT_METADATA: json.dumps(config)})
    return config
