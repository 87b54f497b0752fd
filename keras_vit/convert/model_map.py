"""The one name map between timm-layout tensors and keras_vit weights.

Every converter first brings its checkpoint into timm's layout (timm's
names, PyTorch `(out, in)` Linear weights, `(D, C, P, P)` patch conv), so the
transposes and reshapes that reach our Keras weights live here only. The
assignment is strict: every model weight is set exactly once with a checked
shape, and every source tensor is consumed or explicitly ignored.

timm's fused `qkv` orders its output columns q, k, v (each head-major);
keras_vit's attention groups them per head. The columns of the qkv kernels
and biases are permuted here, both ways, with
`keras_vit.layers.attention.qkv_column_order`.
"""

import re

import numpy as np

from keras_vit.convert.io import check_finite
from keras_vit.layers.attention import qkv_column_order
from keras_vit.utils.resample import resample_position_embedding
from keras_vit.models.vit_backbone import ViTBackbone
from keras_vit.models.vit_classifier import ViTClassifier

HEAD_ARGUMENTS = ("num_classes", "pooling", "representation_size", "pooled_norm", "head_dropout", "activation")


def _linear(array):
    return np.asarray(array).T  # PyTorch Linear (out, in) -> Keras Dense (in, out)


def _same(array):
    return np.asarray(array)


def _patch_kernel(array):
    # (D, C, Ph, Pw) conv -> (Ph * Pw * C, D): our Patches flatten each patch
    # in (row, col, channel) order.
    array = np.asarray(array)
    out_dim, channels, patch_h, patch_w = array.shape
    return array.transpose(2, 3, 1, 0).reshape(patch_h * patch_w * channels, out_dim)


def _patch_conv(kernel, patch_size, num_channels):
    patch_h, patch_w = patch_size
    return np.asarray(kernel).reshape(patch_h, patch_w, num_channels, -1).transpose(3, 2, 0, 1)


def timm_name_map(num_layers):
    """[(timm key, keras weight path, to_keras)] for every weight of a ViT."""
    entries = [
        ("patch_embed.proj.weight", "patch_encoder/projection/kernel", _patch_kernel),
        ("patch_embed.proj.bias", "patch_encoder/projection/bias", _same),
        ("cls_token", "patch_encoder/class_token", _same),
        ("reg_token", "patch_encoder/register_tokens", _same),
        ("pos_embed", "patch_encoder/position_embedding", _same),
        ("norm.weight", "final_norm/gamma", _same),
        ("norm.bias", "final_norm/beta", _same),
        ("fc_norm.weight", "fc_norm/gamma", _same),
        ("fc_norm.bias", "fc_norm/beta", _same),
        ("pre_logits.fc.weight", "pre_logits/kernel", _linear),
        ("pre_logits.fc.bias", "pre_logits/bias", _same),
        ("head.weight", "head/kernel", _linear),
        ("head.bias", "head/bias", _same),
    ] + _later_family_entries()
    for i in range(num_layers):
        src, dst = f"blocks.{i}.", f"transformer_block_{i}/"
        entries += [
            (src + "norm1.weight", dst + "norm1/gamma", _same),
            (src + "norm1.bias", dst + "norm1/beta", _same),
            (src + "attn.qkv.weight", dst + "attention/qkv/kernel", _linear),
            (src + "attn.qkv.bias", dst + "attention/qkv/bias", _same),
            (src + "attn.proj.weight", dst + "attention/proj/kernel", _linear),
            (src + "attn.proj.bias", dst + "attention/proj/bias", _same),
            (src + "norm2.weight", dst + "norm2/gamma", _same),
            (src + "norm2.bias", dst + "norm2/beta", _same),
            (src + "mlp.fc1.weight", dst + "mlp/fc1/kernel", _linear),
            (src + "mlp.fc1.bias", dst + "mlp/fc1/bias", _same),
            (src + "mlp.fc2.weight", dst + "mlp/fc2/kernel", _linear),
            (src + "mlp.fc2.bias", dst + "mlp/fc2/bias", _same),
            (src + "ls1.gamma", dst + "layer_scale1/gamma", _same),
            (src + "ls2.gamma", dst + "layer_scale2/gamma", _same),
            # qk-norm: a LayerNorm over the head width on q and on k
            (src + "attn.q_norm.weight", dst + "attention/q_norm/gamma", _same),
            (src + "attn.q_norm.bias", dst + "attention/q_norm/beta", _same),
            (src + "attn.k_norm.weight", dst + "attention/k_norm/gamma", _same),
            (src + "attn.k_norm.bias", dst + "attention/k_norm/beta", _same),
        ]
    return entries


def _later_family_entries():
    """The parts of SigLIP, CLIP and DeiT: pre-norm, the MAP head, the distillation token and head."""
    entries = [
        ("norm_pre.weight", "pre_norm/gamma", _same),  # CLIP's ln_pre
        ("norm_pre.bias", "pre_norm/beta", _same),
        ("dist_token", "patch_encoder/distillation_token", _same),  # DeiT
        ("head_dist.weight", "head_distillation/kernel", _linear),
        ("head_dist.bias", "head_distillation/bias", _same),
        ("attn_pool.latent", "attention_pool/probe", _same),  # SigLIP's MAP head (timm AttentionPoolLatent)
        ("attn_pool.norm.weight", "attention_pool/norm/gamma", _same),
        ("attn_pool.norm.bias", "attention_pool/norm/beta", _same),
    ]
    # timm's kv Linear puts all keys' columns before all values', each head-major: AttentionPooling's order.
    for timm_name, name in (("q", "q"), ("kv", "kv"), ("proj", "proj"), ("mlp.fc1", "mlp/fc1"), ("mlp.fc2", "mlp/fc2")):
        entries += [(f"attn_pool.{timm_name}.weight", f"attention_pool/{name}/kernel", _linear),
                    (f"attn_pool.{timm_name}.bias", f"attention_pool/{name}/bias", _same)]
    return entries


# Keras weights whose last axis holds the qkv projection's 3 * D output columns.
_QKV_COLUMNS = re.compile(r"(?:^|/)transformer_block_\d+/attention/qkv/(?:kernel|bias)$")


def qkv_columns(backbone):
    """The timm -> model column order of `backbone`'s qkv weights.

    A timm-layout qkv kernel, once in Keras' `(in, out)` layout, is
    `kernel[:, order]` in the model (a bias `bias[order]`); `np.argsort`
    of the order goes back. Every block of a backbone has the same order.
    """
    return qkv_column_order(backbone.num_heads, backbone.hidden_dim // backbone.num_heads)


def _rank(key, to_keras):
    if to_keras is _patch_kernel:
        return 4
    if to_keras is _linear:
        return 2
    return 3 if key in ("cls_token", "reg_token", "pos_embed", "dist_token", "attn_pool.latent") else 1


# timm-layout name (block names without their index) -> the rank its tensor must have.
_RANKS = {key.replace("blocks.0.", ""): _rank(key, to_keras) for key, _, to_keras in timm_name_map(1)}


def check_tensors(state_dict, source):
    """Refuse tensors that cannot be ViT weights before anything indexes their shapes.

    Every tensor must be floating point (an integer or boolean one means the
    file's dtype labels are wrong, e.g. F32 bytes labelled I32), and every
    tensor with a timm ViT name must have that weight's rank (4 for the patch
    kernel, 3 for tokens and the position embedding, 2 for Linear weights, 1
    for biases and norms).

    Args:
        state_dict: dict of str to arrays, timm names (other names are only
            dtype-checked).
        source: str. Names the checkpoint in the message.

    Raises:
        ValueError: listing the offending tensors.
    """
    _check_dtypes(state_dict, source)
    wrong = []
    for key, value in state_dict.items():
        match = re.match(r"blocks\.\d+\.(.+)$", key)
        rank = _RANKS.get(match.group(1) if match else key)
        if rank is not None and np.ndim(value) != rank:
            wrong.append(f"{key} has shape {tuple(np.shape(value))}, a ViT needs a rank-{rank} tensor")
    if wrong:
        raise ValueError(f"The {source} has tensors of the wrong rank: " + "; ".join(sorted(wrong)[:8])
                         + ". The file is damaged or is not a ViT checkpoint.")


def _check_dtypes(tensors, source):
    # Every ViT weight is floating point; an integer or boolean tensor means the
    # file's dtype labels are wrong (e.g. F32 bytes labelled I32), and casting
    # it would load garbage silently.
    wrong = sorted(f"{name} ({np.asarray(value).dtype})" for name, value in tensors.items()
                   if np.asarray(value).dtype.kind != "f")
    if wrong:
        raise ValueError(
            f"The {source} stores these weights with a non-floating-point dtype: {', '.join(wrong[:8])}. "
            "ViT weights are floating point, so the file's dtype labels are wrong; export it again."
        )


def _describe(backbone_config):
    keys = ("image_size", "patch_size", "hidden_dim", "num_layers", "num_heads", "mlp_dim",
            "use_class_token", "num_register_tokens", "prefix_position_embedding")
    return ", ".join(f"{k}={backbone_config[k]!r}" for k in keys if k in backbone_config)


def config_pair(value):
    """A size from a checkpoint's config as `(height, width)`: an int is a square; of a longer
    sequence (timm's `input_size` is `(channels, height, width)`) the last two; `None` stays `None`."""
    if value is None:
        return None
    if isinstance(value, (int, np.integer)):
        return (int(value), int(value))
    return tuple(int(v) for v in value)[-2:]


def build_model(
    backbone_config,
    head_config,
    state_dict,
    *,
    source_grid,
    image_size=None,
    interpolation="bicubic",
    antialias=True,
    ignored=(),
    source="checkpoint",
    extra_weights=None,
    allow_non_finite=False,
):
    """Build a keras_vit model and load timm-layout tensors into it, strictly.

    Args:
        backbone_config: dict of `ViTBackbone` arguments at the source
            resolution.
        head_config: dict of `ViTClassifier` arguments, or `None` for a
            backbone.
        state_dict: dict of timm-layout numpy arrays.
        source_grid: `(rows, cols)` of the checkpoint's patch grid.
        image_size: int, pair or `None`. Target resolution; the position
            embedding is resampled when it changes the grid.
        interpolation, antialias: passed to `resample_position_embedding`.
        ignored: keys of `state_dict` that are deliberately not loaded.
        source: str. Names the checkpoint in error messages.
        extra_weights: dict or `None`. Keras weight path -> array for
            weights outside the ViT name map (e.g. a hybrid's stem), already
            in Keras layout; assigned with the same checks.
        allow_non_finite: bool. Load weights holding NaN or infinity
            instead of refusing them. Defaults to `False`.

    Returns:
        A `ViTClassifier` (when `head_config` is given) or `ViTBackbone`.
    """
    # Deliberately dropped tensors (e.g. the head when a backbone is asked for).
    state_dict = {k: v for k, v in state_dict.items() if k not in set(ignored)}
    backbone_config = dict(backbone_config)
    patch_size = backbone_config["patch_size"]
    patch_size = (patch_size, patch_size) if isinstance(patch_size, int) else tuple(patch_size)
    if image_size is not None:
        image_size = (image_size, image_size) if isinstance(image_size, int) else tuple(int(v) for v in image_size)
        if backbone_config.get("stem") is None:
            for size, patch, axis in zip(image_size, patch_size, ("height", "width")):
                if size % patch:
                    raise ValueError(
                        f"`image_size` {axis} {size} is not a multiple of the checkpoint's patch size {patch}. "
                        f"Choose a multiple of {patch}. Received: image_size={image_size}"
                    )
        backbone_config["image_size"] = image_size

    backbone = ViTBackbone(**backbone_config)
    # The grid comes from the built model, so hybrids (whose stem shrinks the
    # image before patching) resample to the right grid too.
    new_grid = tuple(backbone.grid_size)
    if "pos_embed" in state_dict and new_grid != tuple(source_grid):
        prefix_rows = backbone.num_prefix_tokens if backbone.prefix_position_embedding else 0
        state_dict["pos_embed"] = resample_position_embedding(
            state_dict["pos_embed"], prefix_rows, tuple(source_grid), new_grid, interpolation, antialias
        )
    if head_config is not None and "dtype" in backbone_config:
        head_config = {"dtype": backbone_config["dtype"], **head_config}
    model = backbone if head_config is None else ViTClassifier(backbone, **head_config)
    variables = {variable.path: variable for variable in model.weights}
    entries = [e for e in timm_name_map(backbone_config["num_layers"]) if e[1] in variables or e[0] in state_dict]

    unknown = sorted(set(state_dict) - {e[0] for e in entries})
    if unknown:
        raise ValueError(
            f"The {source} has tensors that a keras_vit ViT cannot use: {unknown}. They belong to "
            "an architecture keras_vit does not implement, or the checkpoint is not a plain ViT. "
            f"(Model inferred from the checkpoint: {_describe(backbone_config)}.)"
        )
    missing = sorted(e[0] for e in entries if e[1] in variables and e[0] not in state_dict)
    if missing:
        raise ValueError(
            f"The {source} lacks tensors the model needs: {missing}. The file is incomplete, or "
            f"its configuration was inferred wrongly ({_describe(backbone_config)})."
        )
    extra = sorted(e[0] for e in entries if e[1] not in variables and e[0] in state_dict)
    if extra:
        raise ValueError(
            f"The {source} has tensors {extra} that the inferred model has no weight for "
            f"({_describe(backbone_config)}). Check the configuration passed with the checkpoint."
        )
    check_tensors({e[0]: state_dict[e[0]] for e in entries}, source)
    _check_dtypes(extra_weights or {}, source)
    check_finite({**{e[0]: state_dict[e[0]] for e in entries}, **(extra_weights or {})}, source, allow_non_finite)
    assigned = set()
    mismatched = []
    values = []
    qkv_order = qkv_columns(backbone)
    for key, path, to_keras in entries:
        variable = variables[path]
        value = to_keras(state_dict[key]).astype(np.float32)
        if _QKV_COLUMNS.search(path) and value.shape[-1] == len(qkv_order):
            value = value[..., qkv_order]  # the shape check below reports any other width
        if tuple(value.shape) != tuple(variable.shape):
            mismatched.append(f"{key}: checkpoint {tuple(np.shape(state_dict[key]))} -> {tuple(value.shape)}, "
                              f"model weight {path} needs {tuple(variable.shape)}")
            continue
        values.append((variable, value))
        assigned.add(path)
    for path, value in (extra_weights or {}).items():
        if path not in variables:
            mismatched.append(f"{path}: the model has no such weight")
            continue
        if path in assigned:
            mismatched.append(f"{path}: set twice")
            continue
        value = np.asarray(value, dtype=np.float32)
        if tuple(value.shape) != tuple(variables[path].shape):
            mismatched.append(f"{path}: given {tuple(value.shape)}, model needs {tuple(variables[path].shape)}")
            continue
        values.append((variables[path], value))
        assigned.add(path)
    if mismatched:
        raise ValueError(
            f"The {source} has tensors whose shapes do not fit the model inferred from it "
            f"({_describe(backbone_config)}):\n  " + "\n  ".join(mismatched)
        )
    unset = sorted(set(variables) - assigned)
    if unset:
        raise ValueError(
            f"The {source} does not set these model weights: {unset}. Pass them with `extra_weights` "
            "(for layers outside the ViT name map, such as a hybrid stem)."
        )
    for variable, value in values:
        variable.assign(value)
    return model


def model_to_timm(model):
    """The timm-layout state dict of a keras_vit `ViTBackbone` / `ViTClassifier`.

    Returns:
        `(state_dict, backbone, classifier_or_None)`.
    """
    if isinstance(model, ViTClassifier):
        backbone, classifier = model.backbone, model
    elif isinstance(model, ViTBackbone):
        backbone, classifier = model, None
    else:
        raise ValueError(
            f"Only keras_vit ViTBackbone and ViTClassifier models can be exported. Received: {type(model).__name__}"
        )
    if backbone.stem is not None:
        raise ValueError("Hybrid models (with a `stem`) cannot be exported to a plain ViT checkpoint.")
    if backbone.position_embedding == "sincos2d":
        raise ValueError(
            "A model with position_embedding='sincos2d' has no position-embedding weights; timm and "
            "Hugging Face ViTs expect a learned table. Export is only supported for 'learned'."
        )
    variables = {variable.path: np.asarray(variable.numpy()) for variable in model.weights}
    state_dict = {}
    qkv_order = qkv_columns(backbone)
    for key, path, to_keras in timm_name_map(backbone.num_layers):
        if path not in variables:
            continue
        value = np.asarray(variables[path], dtype=np.float32)
        if _QKV_COLUMNS.search(path):
            value = value[..., np.argsort(qkv_order)]
        if to_keras is _linear:
            value = value.T
        elif to_keras is _patch_kernel:
            value = _patch_conv(value, backbone.patch_size, backbone.num_channels)
        state_dict[key] = np.ascontiguousarray(value)
    if not backbone.final_norm:
        for key in ("norm.weight", "norm.bias"):
            state_dict.pop(key, None)
    if classifier is not None and not classifier.pooled_norm:
        for key in ("fc_norm.weight", "fc_norm.bias"):
            state_dict.pop(key, None)
    return state_dict, backbone, classifier
