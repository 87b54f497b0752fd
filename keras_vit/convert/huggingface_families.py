"""Hugging Face `SiglipVisionModel`, `CLIPVisionModel` and `Dinov2Model` checkpoints -> keras_vit models.

One name map per family brings its tensors into timm's layout (pure numpy:
q, k and v fused row-wise as timm's `qkv`, `nn.MultiheadAttention`'s packed
projection split into timm's `q` and `kv`), and `model_map.build_model` does
the rest, as for timm checkpoints. Each family's architecture is read from its
`config.json`:

- SigLIP (`model_type="siglip_vision_model"`): no class token, position
  embedding of the patches only, the MAP head (`head.*`) when
  `vision_use_head` (the default), tanh GELU (`gelu_pytorch_tanh`).
- CLIP (`"clip_vision_model"`): `pre_layrnorm` before the blocks, no patch
  bias, quick-GELU, epsilon 1e-5. Hugging Face applies `post_layernorm` to the
  class token only (its `pooler_output`); keras_vit applies it to every token
  as timm does, so the class token of the backbone's output is CLIP's
  `pooler_output` (the other tokens are normalised where Hugging Face's
  `last_hidden_state` is not).
- DINOv2 (`"dinov2"`, `"dinov2_with_registers"`): LayerScale, registers; the
  class token's position row is folded into the class token when there are
  registers (Hugging Face adds positions before inserting the registers,
  which is timm's `no_embed_class` once the class row is folded in).
"""

import re

import numpy as np

from keras_vit.convert.model_map import HEAD_ARGUMENTS, build_model, check_tensors, config_pair

FAMILIES = ("siglip_vision_model", "clip_vision_model", "dinov2", "dinov2_with_registers")
_ACTIVATIONS = {"gelu": "gelu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_new": "gelu_tanh", "quick_gelu": "quick_gelu"}

# Per-block names (after the layer index) -> timm's.
_BLOCK = {
    "layer_norm1": "norm1", "layer_norm2": "norm2", "norm1": "norm1", "norm2": "norm2",
    "self_attn.q_proj": "q", "self_attn.k_proj": "k", "self_attn.v_proj": "v", "self_attn.out_proj": "attn.proj",
    "attention.attention.query": "q", "attention.attention.key": "k", "attention.attention.value": "v",
    "attention.output.dense": "attn.proj", "attention.q_proj": "q", "attention.k_proj": "k",
    "attention.v_proj": "v", "attention.o_proj": "attn.proj",
    "mlp.fc1": "mlp.fc1", "mlp.fc2": "mlp.fc2",
}
_LAYER_SCALES = {"layer_scale1.lambda1": "ls1.gamma", "layer_scale2.lambda1": "ls2.gamma"}
_BLOCK_KEY = re.compile(r"^encoder\.(?:layers|layer)\.(\d+)\.(.+?)(?:\.(weight|bias))?$")
_TOP = {
    "embeddings.patch_embedding.weight": "patch_embed.proj.weight",
    "embeddings.patch_embedding.bias": "patch_embed.proj.bias",
    "embeddings.patch_embeddings.projection.weight": "patch_embed.proj.weight",
    "embeddings.patch_embeddings.projection.bias": "patch_embed.proj.bias",
    "embeddings.cls_token": "cls_token",
    "embeddings.register_tokens": "reg_token",
    "embeddings.position_embeddings": "pos_embed",
    "pre_layrnorm.weight": "norm_pre.weight", "pre_layrnorm.bias": "norm_pre.bias",
    "post_layernorm.weight": "norm.weight", "post_layernorm.bias": "norm.bias",
    "layernorm.weight": "norm.weight", "layernorm.bias": "norm.bias",
    "head.probe": "attn_pool.latent",
    "head.attention.out_proj.weight": "attn_pool.proj.weight", "head.attention.out_proj.bias": "attn_pool.proj.bias",
    "head.layernorm.weight": "attn_pool.norm.weight", "head.layernorm.bias": "attn_pool.norm.bias",
    "head.mlp.fc1.weight": "attn_pool.mlp.fc1.weight", "head.mlp.fc1.bias": "attn_pool.mlp.fc1.bias",
    "head.mlp.fc2.weight": "attn_pool.mlp.fc2.weight", "head.mlp.fc2.bias": "attn_pool.mlp.fc2.bias",
}
_IGNORED = ("embeddings.mask_token", "embeddings.position_ids")


def family_to_timm(state_dict):
    """Rename a SigLIP / CLIP / DINOv2 vision state dict into timm's layout.

    Returns:
        `(timm_state_dict, ignored_keys)`; raises a `ValueError` listing
        keys it does not know.
    """
    out, qkv, ignored, unknown = {}, {}, [], []
    for key, value in state_dict.items():
        name = key[len("vision_model."):] if key.startswith("vision_model.") else key
        value = np.asarray(value)
        if name in _TOP:
            out[_TOP[name]] = value
        elif name == "embeddings.class_embedding":  # CLIP: a (D,) vector
            out["cls_token"] = value.reshape(1, 1, -1)
        elif name == "embeddings.position_embedding.weight":  # CLIP / SigLIP: an nn.Embedding table
            out["pos_embed"] = value[None]
        elif name in ("head.attention.in_proj_weight", "head.attention.in_proj_bias"):
            # nn.MultiheadAttention packs q, k, v row-wise: timm's q, then its kv (k rows before v rows).
            width = value.shape[0] // 3
            param = "weight" if name.endswith("weight") else "bias"
            out[f"attn_pool.q.{param}"], out[f"attn_pool.kv.{param}"] = value[:width], value[width:]
        elif name in _IGNORED:
            ignored.append(key)
        elif (match := _BLOCK_KEY.match(name)) and (match.group(2) in _BLOCK or match.group(2) in _LAYER_SCALES):
            index, part, param = int(match.group(1)), match.group(2), match.group(3)
            if part in _LAYER_SCALES:
                out[f"blocks.{index}.{_LAYER_SCALES[part]}"] = value
            elif _BLOCK[part] in ("q", "k", "v"):
                qkv.setdefault((index, param), {})[_BLOCK[part]] = value
            else:
                out[f"blocks.{index}.{_BLOCK[part]}.{param}"] = value
        else:
            unknown.append(key)
    if unknown:
        raise ValueError(
            f"The Hugging Face checkpoint has tensors keras_vit does not know: {sorted(unknown)[:8]}. Supported: "
            "SiglipVisionModel, CLIPVisionModel, Dinov2Model and Dinov2WithRegistersModel (their vision towers)."
        )
    out.update(fused_qkv(qkv))
    return out, sorted(ignored)


def fused_qkv(separate):
    """timm's fused `blocks.{i}.attn.qkv.{param}` from Hugging Face's separate query, key and value tensors.

    Args:
        separate: dict. `{(block index, "weight" | "bias"): {"q": array, "k": array, "v": array}}`.

    Returns:
        A dict of timm names to arrays: q, k and v rows stacked in that order (timm splits its columns q|k|v).

    Raises:
        ValueError: a block lacks one of the three, naming it.
    """
    fused = {}
    for (index, param), parts in separate.items():
        if set(parts) != {"q", "k", "v"}:
            raise ValueError(
                f"Layer {index} of the Hugging Face checkpoint has only {sorted(parts)} of its query/key/value {param}s."
            )
        fused[f"blocks.{index}.attn.qkv.{param}"] = np.concatenate([parts["q"], parts["k"], parts["v"]], axis=0)
    return fused


def from_huggingface_family(config, state_dict, *, preprocessing, image_size=None, interpolation="bicubic",
                            antialias=True, include_head=True, allow_non_finite=False, **overrides):
    """Build a keras_vit `ViTBackbone` from a SigLIP, CLIP or DINOv2 vision checkpoint (see the module docstring).

    Args:
        config: dict. The vision config (`config.json`, or its
            `vision_config` for a two-tower checkpoint).
        state_dict: dict of numpy arrays (names with or without `vision_model.`).
        preprocessing: dict of `pixel_scale`, `pixel_mean`, `pixel_std`.
        include_head: bool. Keep SigLIP's MAP head (the pooled embedding).
        image_size, interpolation, antialias, allow_non_finite, **overrides:
            as in `from_huggingface`.

    Returns:
        A `ViTBackbone` (these towers have no classifier).
    """
    model_type = config.get("model_type")
    if model_type not in FAMILIES:
        raise ValueError(f"Not a SigLIP, CLIP or DINOv2 vision config: model_type={model_type!r}.")
    activation = config.get("hidden_act", "gelu")
    if activation not in _ACTIVATIONS:
        raise ValueError(f"This checkpoint's MLP activation hidden_act={activation!r} is not one keras_vit "
                         f"implements ({', '.join(sorted(_ACTIVATIONS))}).")
    if config.get("use_swiglu_ffn"):
        raise ValueError("This DINOv2 checkpoint uses a SwiGLU MLP (use_swiglu_ffn=True, the giant model), "
                         "which keras_vit's ViT does not implement.")
    check_tensors(state_dict, "Hugging Face checkpoint")
    timm_state, ignored = family_to_timm(state_dict)
    check_tensors(timm_state, "Hugging Face checkpoint")
    patch_size = config_pair(config.get("patch_size", 16))
    source_size = config_pair(config.get("image_size", 224))
    grid = (source_size[0] // patch_size[0], source_size[1] // patch_size[1])
    registers = int(np.shape(timm_state["reg_token"])[1]) if "reg_token" in timm_state else 0
    if registers and "pos_embed" in timm_state and "cls_token" in timm_state:
        # Hugging Face adds the class token's position before the registers are inserted: fold it in.
        timm_state["cls_token"] = timm_state["cls_token"] + timm_state["pos_embed"][:, :1]
        timm_state["pos_embed"] = timm_state["pos_embed"][:, 1:]
    width = int(config["hidden_size"])
    mlp_dim = int(config.get("intermediate_size") or round(width * float(config.get("mlp_ratio", 4))))
    if not include_head:
        ignored += [k for k in timm_state if k.startswith("attn_pool.")]
        timm_state = {k: v for k, v in timm_state.items() if not k.startswith("attn_pool.")}
    backbone_config = {
        "image_size": source_size,
        "patch_size": patch_size,
        "num_channels": int(config.get("num_channels", 3)),
        "hidden_dim": width,
        "num_layers": int(config["num_hidden_layers"]),
        "num_heads": int(config["num_attention_heads"]),
        "mlp_dim": mlp_dim,
        "layer_norm_epsilon": float(config.get("layer_norm_eps", 1e-6)),
        "use_class_token": "cls_token" in timm_state,
        "num_register_tokens": registers,
        "prefix_position_embedding": not registers,
        "layer_scale_init": 1.0 if "blocks.0.ls1.gamma" in timm_state else None,
        "use_qkv_bias": "blocks.0.attn.qkv.bias" in timm_state,
        "pre_norm": "norm_pre.weight" in timm_state,
        "mlp_activation": _ACTIVATIONS[activation],
        "attention_pooling": "attn_pool.latent" in timm_state,
        **preprocessing,
    }
    if {k: v for k, v in overrides.items() if k in HEAD_ARGUMENTS}:
        raise ValueError(f"A {model_type} checkpoint converts to a ViTBackbone, which takes no head arguments "
                         f"({sorted(k for k in overrides if k in HEAD_ARGUMENTS)}).")
    backbone_config.update(overrides)
    return build_model(backbone_config, None, timm_state, source_grid=grid, image_size=image_size,
                       interpolation=interpolation, antialias=antialias, source="Hugging Face checkpoint",
                       allow_non_finite=allow_non_finite)


# keras_vit's MLP activations in Hugging Face's `hidden_act` words (transformers' ACT2FN).
_EXPORT_ACTIVATIONS = {"gelu": "gelu", "gelu_tanh": "gelu_pytorch_tanh", "quick_gelu": "quick_gelu"}
# Each family's class, and the per-block names (timm's -> the names `save_pretrained` writes).
EXPORT_CLASSES = {"siglip_vision_model": "SiglipVisionModel", "clip_vision_model": "CLIPVisionModel",
                  "dinov2": "Dinov2Model", "dinov2_with_registers": "Dinov2WithRegistersModel"}
_CLIP_BLOCK = {"norm1": "layer_norm1", "norm2": "layer_norm2", "attn.proj": "self_attn.out_proj",
               "mlp.fc1": "mlp.fc1", "mlp.fc2": "mlp.fc2", "q": "self_attn.q_proj", "k": "self_attn.k_proj",
               "v": "self_attn.v_proj"}
_DINOV2_BLOCK = {"norm1": "norm1", "norm2": "norm2", "attn.proj": "attention.output.dense", "mlp.fc1": "mlp.fc1",
                 "mlp.fc2": "mlp.fc2", "q": "attention.attention.query", "k": "attention.attention.key",
                 "v": "attention.attention.value", "ls1.gamma": "layer_scale1.lambda1",
                 "ls2.gamma": "layer_scale2.lambda1"}
_TIMM_EXPORT = "Use `keras_vit.convert.export_timm`, which writes every part keras_vit has."


def export_family(backbone):
    """The Hugging Face family that computes what `backbone` computes, or `None` for the paper's ViT.

    SigLIP (`SiglipVisionModel`): no class token (attention pooling or
    none). CLIP (`CLIPVisionModel`): pre-norm. DINOv2 (`Dinov2Model`, or
    `Dinov2WithRegistersModel` with registers): LayerScale or registers.
    Anything else with a class token is the paper's ViT (`ViTModel`).

    Raises:
        ValueError: a part no transformers vision class has (qk-norm, DeiT's
            distillation token), naming the timm export.
    """
    if backbone.qk_norm:
        raise ValueError("This model normalises q and k inside attention (qk_norm=True), which none of "
                         "transformers' ViT classes has. " + _TIMM_EXPORT)
    if backbone.use_distillation_token:
        raise ValueError("This model has DeiT's distillation token; keras_vit does not write transformers' "
                         "DeiT classes. " + _TIMM_EXPORT)
    if backbone.attention_pooling or not backbone.use_class_token:
        return "siglip_vision_model"
    if backbone.pre_norm:
        return "clip_vision_model"
    if backbone.num_register_tokens:
        return "dinov2_with_registers"
    if backbone.layer_scale_init is not None:
        return "dinov2"
    return None


def _check_family(backbone, family):
    problems = []
    height, width = (int(v) for v in backbone.image_size)
    patch_h, patch_w = (int(v) for v in backbone.patch_size)
    if height != width or patch_h != patch_w:
        problems.append(f"its image ({height}x{width}) or patch ({patch_h}x{patch_w}) is not square, and "
                        f"{EXPORT_CLASSES[family]}'s config holds one side of each (load it at a square size, or "
                        "run the export at that size and use transformers' `interpolate_pos_encoding`)")
    if backbone.position_embedding != "learned":
        problems.append(f"its position embedding is {backbone.position_embedding!r}, not a learned table")
    if not backbone.final_norm:
        problems.append("it has no final LayerNorm")
    if backbone.mlp_activation not in _EXPORT_ACTIVATIONS:
        problems.append(f"its MLP activation {backbone.mlp_activation!r} has no transformers name")
    if family == "siglip_vision_model":
        if backbone.use_class_token or backbone.num_register_tokens:
            problems.append("SigLIP has no class or register tokens")
        if backbone.pre_norm or backbone.layer_scale_init is not None:
            problems.append("SigLIP has neither a pre-norm nor LayerScale")
    elif family == "clip_vision_model":
        if backbone.num_register_tokens or backbone.layer_scale_init is not None:
            problems.append("CLIP has neither registers nor LayerScale")
        if not backbone.prefix_position_embedding:
            problems.append("CLIP's position embedding has a class-token row (the model's has none)")
    elif backbone.pre_norm:
        problems.append("DINOv2 has no pre-norm")
    if problems:
        raise ValueError(f"This model cannot be written as a Hugging Face {EXPORT_CLASSES[family]} because "
                         + "; ".join(problems) + ". " + _TIMM_EXPORT)


def family_config_and_tensors(backbone, family, timm_state):
    """The `config.json` and the tensors (`save_pretrained`'s names) of `backbone` as `family`'s class.

    Args:
        backbone: `ViTBackbone`.
        family: str. One of `FAMILIES` (see `export_family`).
        timm_state: dict. The backbone's timm-layout tensors (`model_map.model_to_timm`).

    Returns:
        `(config, tensors)`.
    """
    _check_family(backbone, family)
    state = {k: np.asarray(v, np.float32) for k, v in timm_state.items()}
    width = backbone.hidden_dim
    out = {}
    names = _DINOV2_BLOCK if family.startswith("dinov2") else _CLIP_BLOCK
    layers = "encoder.layer." if family.startswith("dinov2") else "encoder.layers."
    for index in range(backbone.num_layers):
        block = f"blocks.{index}."
        qkv_bias = state.pop(block + "attn.qkv.bias", np.zeros((3 * width,), np.float32))  # no bias: zeros, exact
        for part, weight, bias in zip("qkv", np.split(state.pop(block + "attn.qkv.weight"), 3, axis=0),
                                      np.split(qkv_bias, 3)):
            out[f"{layers}{index}.{names[part]}.weight"] = weight
            out[f"{layers}{index}.{names[part]}.bias"] = bias
        for key in [k for k in state if k.startswith(block)]:
            name, _, param = key[len(block):].rpartition(".")
            if key.endswith(".gamma"):
                out[f"{layers}{index}.{names[key[len(block):]]}"] = state.pop(key)
            else:
                out[f"{layers}{index}.{names[name]}.{param}"] = state.pop(key)
        if family.startswith("dinov2") and backbone.layer_scale_init is None:  # registers without LayerScale
            for scale in ("layer_scale1", "layer_scale2"):
                out[f"{layers}{index}.{scale}.lambda1"] = np.ones((width,), np.float32)
    config = {
        "architectures": [EXPORT_CLASSES[family]],
        "model_type": family,
        "hidden_size": width,
        "num_hidden_layers": backbone.num_layers,
        "num_attention_heads": backbone.num_heads,
        "num_channels": backbone.num_channels,
        "image_size": int(backbone.image_size[0]),
        "patch_size": int(backbone.patch_size[0]),
        "hidden_act": _EXPORT_ACTIVATIONS[backbone.mlp_activation],
        "layer_norm_eps": float(backbone.layer_norm_epsilon),
        "attention_dropout": 0.0,
        "dtype": "float32",
    }
    position = state.pop("pos_embed")  # (1, rows, D)
    if family == "siglip_vision_model":
        out["embeddings.patch_embedding.weight"] = state.pop("patch_embed.proj.weight")
        out["embeddings.patch_embedding.bias"] = state.pop("patch_embed.proj.bias")
        out["embeddings.position_embedding.weight"] = position[0]
        config.update(intermediate_size=backbone.mlp_dim, vision_use_head=bool(backbone.attention_pooling))
        if backbone.attention_pooling:
            out["head.probe"] = state.pop("attn_pool.latent")
            # nn.MultiheadAttention's packed projection: q rows, then timm's kv (all k rows, then all v rows).
            out["head.attention.in_proj_weight"] = np.concatenate(
                [state.pop("attn_pool.q.weight"), state.pop("attn_pool.kv.weight")])
            out["head.attention.in_proj_bias"] = np.concatenate(
                [state.pop("attn_pool.q.bias"), state.pop("attn_pool.kv.bias")])
            for timm_name, name in (("proj", "attention.out_proj"), ("norm", "layernorm"), ("mlp.fc1", "mlp.fc1"),
                                    ("mlp.fc2", "mlp.fc2")):
                for param in ("weight", "bias"):
                    out[f"head.{name}.{param}"] = state.pop(f"attn_pool.{timm_name}.{param}")
        final = "post_layernorm"
    elif family == "clip_vision_model":
        out["embeddings.patch_embedding.weight"] = state.pop("patch_embed.proj.weight")
        out["embeddings.class_embedding"] = state.pop("cls_token").reshape(-1)
        out["embeddings.position_embedding.weight"] = position[0]
        for param in ("weight", "bias"):
            out[f"pre_layrnorm.{param}"] = state.pop(f"norm_pre.{param}")
        config.update(intermediate_size=backbone.mlp_dim)
        final = "post_layernorm"
    else:
        cls_token = state.pop("cls_token")
        registers = state.pop("reg_token", None)
        if backbone.prefix_position_embedding and registers is not None:
            # Hugging Face adds positions before inserting the registers: a prefix token's row is a constant
            # of that token, so fold it in (the class row becomes zeros).
            cls_token = cls_token + position[:, :1]
            registers = registers + position[:, 1:1 + backbone.num_register_tokens]
            position = position[:, 1 + backbone.num_register_tokens:]
        if not backbone.prefix_position_embedding or registers is not None:
            position = np.concatenate([np.zeros((1, 1, width), np.float32), position], axis=1)
        out["embeddings.cls_token"] = cls_token
        out["embeddings.mask_token"] = np.zeros((1, width), np.float32)  # used only for masked inputs
        out["embeddings.position_embeddings"] = position
        out["embeddings.patch_embeddings.projection.weight"] = state.pop("patch_embed.proj.weight")
        out["embeddings.patch_embeddings.projection.bias"] = state.pop("patch_embed.proj.bias")
        if registers is not None:
            out["embeddings.register_tokens"] = registers
            config["num_register_tokens"] = backbone.num_register_tokens
        if backbone.mlp_dim % width:  # transformers 5's Dinov2Config takes an integer mlp_ratio
            raise ValueError(f"DINOv2's config gives the MLP width as hidden_size * mlp_ratio with an integer "
                             f"ratio, which cannot give {backbone.mlp_dim} for width {width}. " + _TIMM_EXPORT)
        ratio = backbone.mlp_dim // width
        config.update(mlp_ratio=ratio, qkv_bias=True, layerscale_value=1.0, drop_path_rate=0.0,
                      hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, use_swiglu_ffn=False,
                      apply_layernorm=True)
        final = "layernorm"
    for param in ("weight", "bias"):
        out[f"{final}.{param}"] = state.pop(f"norm.{param}")
    if state:
        raise ValueError(f"keras_vit cannot place these weights in a {EXPORT_CLASSES[family]}: {sorted(state)}. "
                         + _TIMM_EXPORT)
    return config, {k: np.ascontiguousarray(v) for k, v in out.items()}
