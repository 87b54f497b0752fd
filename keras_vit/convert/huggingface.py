"""Hugging Face `transformers` ViT checkpoints <-> keras_vit models.

Hugging Face keeps separate query/key/value projections and calls the
block norms `layernorm_before`/`layernorm_after`; this module translates its
names into timm's layout (fused qkv, rows in q, k, v order) and back, and
`model_map` does the rest.
"""

import os
import re
import warnings

import numpy as np

from keras_vit.convert import class_names
from keras_vit.convert.exported_transform import huggingface_processor
from keras_vit.convert.io import write_safetensors
from keras_vit.convert.huggingface_families import (
    EXPORT_CLASSES, FAMILIES, export_family, family_config_and_tensors, from_huggingface_family, fused_qkv)
from keras_vit.convert.model_map import HEAD_ARGUMENTS, build_model, config_pair, check_tensors, model_to_timm
from keras_vit.writer.files import claim, write_json_file
from keras_vit.utils.values import IMAGE_INTERPOLATIONS, is_int

# ViTImageProcessor defaults (IMAGENET_STANDARD_MEAN / STD).
HF_DEFAULT_MEAN = (0.5, 0.5, 0.5)
HF_DEFAULT_STD = (0.5, 0.5, 0.5)

# Per-block names: legacy on-disk names (what save_pretrained writes and the
# hub holds) and the in-memory names of transformers 5.
_BLOCK_NAMES = {
    "layernorm_before": "norm1",
    "attention.attention.query": "q",
    "attention.attention.key": "k",
    "attention.attention.value": "v",
    "attention.output.dense": "attn.proj",
    "layernorm_after": "norm2",
    "intermediate.dense": "mlp.fc1",
    "output.dense": "mlp.fc2",
    "attention.q_proj": "q",
    "attention.k_proj": "k",
    "attention.v_proj": "v",
    "attention.o_proj": "attn.proj",
    "mlp.fc1": "mlp.fc1",
    "mlp.fc2": "mlp.fc2",
}
_TOP_NAMES = {
    "embeddings.cls_token": "cls_token",
    "embeddings.position_embeddings": "pos_embed",
    "embeddings.patch_embeddings.projection.weight": "patch_embed.proj.weight",
    "embeddings.patch_embeddings.projection.bias": "patch_embed.proj.bias",
    "layernorm.weight": "norm.weight",
    "layernorm.bias": "norm.bias",
    "embeddings.distillation_token": "dist_token",  # DeiT distilled (model_type "deit")
}
# timm-layout block name -> the legacy Hugging Face name export writes.
_EXPORT_BLOCK_NAMES = {
    "norm1": "layernorm_before",
    "attn.proj": "attention.output.dense",
    "norm2": "layernorm_after",
    "mlp.fc1": "intermediate.dense",
    "mlp.fc2": "output.dense",
}
_EXPORT_TOP_NAMES = {timm: hf for hf, timm in _TOP_NAMES.items()}
_IGNORED = ("embeddings.mask_token", "pooler.dense.weight", "pooler.dense.bias")
# The heads' Hugging Face names -> timm's: ViT's one head, DeiT's two (on the class and distillation tokens).
_HEAD_NAMES = {"classifier": "head", "cls_classifier": "head", "distillation_classifier": "head_dist"}
_EXPORT_HEAD_NAMES = {"head": "cls_classifier", "head_dist": "distillation_classifier"}
_BLOCK_PATTERN = re.compile(r"^(?:encoder\.layer|encoder\.layers|layers)\.(\d+)\.(.+)\.(weight|bias)$")


def is_huggingface_state_dict(state_dict):
    return any(key.startswith(("embeddings.", "vit.embeddings.", "deit.embeddings.")) for key in state_dict)



def huggingface_to_timm(state_dict):
    """Rename / fuse a Hugging Face ViT (or distilled DeiT) state dict into timm's layout.

    DeiT's `DeiTForImageClassificationWithTeacher` keeps its encoder under
    `deit.` and its two heads as `cls_classifier` (timm's `head`) and
    `distillation_classifier` (timm's `head_dist`).

    Returns:
        `(timm_state_dict, ignored_hf_keys)`. Raises a `ValueError` listing
        any key it does not know.
    """
    base = {}
    head = {}
    for key, value in state_dict.items():
        if key.startswith(("vit.", "deit.")):
            base[key.partition(".")[2]] = value
        elif key.startswith(("classifier.", "cls_classifier.", "distillation_classifier.")):
            head[key] = value
        else:
            base[key] = value
    out, ignored, unknown = {}, [], []
    parts = {}
    for key, value in base.items():
        value = np.asarray(value)
        if key in _TOP_NAMES:
            out[_TOP_NAMES[key]] = value
        elif key in _IGNORED:
            ignored.append(key)
        elif (match := _BLOCK_PATTERN.match(key)) and match.group(2) in _BLOCK_NAMES:
            index, name, param = int(match.group(1)), _BLOCK_NAMES[match.group(2)], match.group(3)
            if name in ("q", "k", "v"):
                parts.setdefault((index, param), {})[name] = value
            else:
                out[f"blocks.{index}.{name}.{param}"] = value
        else:
            unknown.append(key)
    for key, value in head.items():
        name, _, param = key.rpartition(".")
        if name in _HEAD_NAMES and param in ("weight", "bias"):
            out[f"{_HEAD_NAMES[name]}.{param}"] = np.asarray(value)
        else:
            unknown.append(key)
    if unknown:
        raise ValueError(
            f"The Hugging Face checkpoint has tensors keras_vit does not know: {sorted(unknown)}. "
            "Only ViTModel, ViTForImageClassification, DeiTModel and DeiTForImageClassificationWithTeacher "
            "checkpoints are supported."
        )
    out.update(fused_qkv(parts))
    return out, sorted(ignored)


def _preprocessing(preprocessor_config, skip=()):
    config = preprocessor_config or {}
    scale = float(config.get("rescale_factor", 1.0 / 255.0)) if config.get("do_rescale", True) else 1.0
    if config.get("do_normalize", True):
        mean = tuple(float(v) for v in np.atleast_1d(config.get("image_mean", HF_DEFAULT_MEAN)))
        std = tuple(float(v) for v in np.atleast_1d(config.get("image_std", HF_DEFAULT_STD)))
    else:
        mean, std = 0.0, 1.0
    return {"pixel_scale": scale, "pixel_mean": mean, "pixel_std": std,
            **huggingface_image_transform(preprocessor_config, skip)}


# Pillow's resampling codes, as image processor configs store them (`PILImageResampling`).
PIL_RESAMPLE_NAMES = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic", 4: "box", 5: "hamming"}
# Each processor class's default filter where its config leaves `resample` out (transformers 5.23's
# class attributes: image_processing_{vit,siglip,clip,bit,convnext,deit}.py).
_DEFAULT_RESAMPLE = {"ViTImageProcessor": 2, "ViTFeatureExtractor": 2, "SiglipImageProcessor": 3,
                     "CLIPImageProcessor": 3, "BitImageProcessor": 3, "ConvNextImageProcessor": 3,
                     "DeiTImageProcessor": 3}
# Processors whose plain-int `size` (configs older than transformers 4.26) is the shortest edge, not a square.
_SHORTEST_EDGE_PROCESSORS = ("CLIP", "Bit", "ConvNext")


def _processor_pair(value, what):
    if isinstance(value, dict) and "height" in value and "width" in value:
        return int(value["height"]), int(value["width"])
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return int(value), int(value)
    raise ValueError(f"The image processor config's `{what}` is {value!r}; keras_vit reads "
                     "{'height': h, 'width': w}, {'shortest_edge': s} or an int.")


def huggingface_image_transform(preprocessor_config, skip=()):
    """The evaluation transform of a Hugging Face image processor config, as `ViTBackbone` arguments.

    transformers resizes and crops as follows (transformers 5.23,
    `image_processing_*.py`): ViTImageProcessor / SiglipImageProcessor
    resize the whole image to `size = {height, width}` (a stretch);
    DeiT then crops `crop_size` from the centre (a stretch at
    `crop_size / size`); CLIP / BiT (DINOv2) resize the shortest edge to
    `size.shortest_edge` and crop `crop_size` from the centre (a centre crop
    at `crop / shortest_edge`); ConvNext resizes the shortest edge to
    `int(shortest_edge / crop_pct)` and crops `shortest_edge` below 384,
    stretches at 384 and above. Every processor converts to RGB, dropping
    alpha. Without a config, ViTImageProcessor's defaults (a bilinear
    stretch). transformers' own centre crop starts at
    `(size - crop) // 2` where torchvision rounds: at most one pixel apart.

    Args:
        preprocessor_config: dict or `None`. `preprocessor_config.json`.
        skip: names of the fields the caller sets itself (overrides): they
            are neither read nor refused.

    Returns:
        A dict of `resize_mode`, `crop_fraction`, `interpolation`, `alpha`.
    """
    config = dict(preprocessor_config or {})
    kind = str(config.get("image_processor_type") or config.get("feature_extractor_type") or "ViTImageProcessor")
    kind = kind.replace("Fast", "")
    resample = config.get("resample", _DEFAULT_RESAMPLE.get(kind, 2))
    interpolation = PIL_RESAMPLE_NAMES.get(resample, resample) if not isinstance(resample, str) else resample.lower()
    transform = {"resize_mode": "center_crop", "crop_fraction": 1.0, "interpolation": interpolation, "alpha": "drop"}
    size = config.get("size", {"height": 224, "width": 224})
    shortest_edge = size.get("shortest_edge") if isinstance(size, dict) else (
        size if kind.startswith(_SHORTEST_EDGE_PROCESSORS) else None)
    do_crop = config.get("do_center_crop", kind.startswith(("CLIP", "Bit", "DeiT")))
    if config.get("do_resize", True) is False:
        pass  # the images must already have the model's size; a centre crop at 1 brings any other there
    elif kind.startswith("ConvNext") or (shortest_edge is not None and "crop_pct" in config):
        crop_pct = float(config.get("crop_pct") or 224 / 256)
        if int(shortest_edge or 384) >= 384:
            transform["resize_mode"] = "stretch"  # ConvNext warps to (shortest_edge, shortest_edge) at 384+
        else:
            transform["crop_fraction"] = crop_pct
    elif shortest_edge is not None:
        if do_crop:
            crop_h, crop_w = _processor_pair(config.get("crop_size", 224), "crop_size")
            transform["crop_fraction"] = min(1.0, min(crop_h, crop_w) / int(shortest_edge))
    else:
        height, width = _processor_pair(size, "size")
        transform["resize_mode"] = "stretch"
        if do_crop:
            crop_h, crop_w = _processor_pair(config.get("crop_size", {"height": height, "width": width}),
                                             "crop_size")
            if crop_h * width != crop_w * height:
                raise ValueError(
                    f"The image processor crops {crop_h} x {crop_w} from images resized to {height} x {width}: "
                    "a crop of another aspect than the resize, which keras_vit's transform cannot express. "
                    "Pass resize_mode= and crop_fraction= to choose one.")
            transform["crop_fraction"] = min(1.0, crop_h / height)
    if "interpolation" not in skip and transform["interpolation"] not in IMAGE_INTERPOLATIONS:
        warnings.warn(
            f"The image processor resamples with {transform['interpolation']!r} (resample={resample!r}), which "
            "keras_vit does not implement; its evaluation transform uses 'bicubic' instead (change it with "
            "`model.set_image_transform(interpolation=...)`).", stacklevel=3)
        transform["interpolation"] = "bicubic"
    return {key: value for key, value in transform.items() if key not in skip}


_REQUIRED_INTS = ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size")


def _check_config(config):
    missing = [key for key in _REQUIRED_INTS if key not in config]
    if missing:
        raise ValueError(f"The Hugging Face config.json lacks {missing}; it is not a complete ViT config.")
    for key in _REQUIRED_INTS:
        value = config[key]
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"The Hugging Face config.json must give `{key}` as a positive integer. "
                             f"Received: {key}={value!r}")
    for key in ("image_size", "patch_size"):
        value = config.get(key, 1)
        values = value if isinstance(value, list) and len(value) == 2 else [value]
        if not all(is_int(v) and v > 0 for v in values):
            raise ValueError(f"The Hugging Face config.json must give `{key}` as a positive integer or "
                             f"[height, width]. Received: {key}={value!r}")
    if config["hidden_size"] % config["num_attention_heads"]:
        raise ValueError(
            f"The Hugging Face config.json has hidden_size={config['hidden_size']}, which "
            f"num_attention_heads={config['num_attention_heads']} does not divide: the attention head size "
            "is not a whole number. The config does not belong to these weights."
        )


def _check_config_against_weights(config, timm_state, source_size, patch_size):
    """The config's sizes must be those of the weights; say which key disagrees."""
    problems = []
    weight = timm_state.get("patch_embed.proj.weight")
    if weight is not None and np.ndim(weight) == 4:
        if weight.shape[0] != config["hidden_size"]:
            problems.append(f"hidden_size={config['hidden_size']} but the patch embedding has {weight.shape[0]} "
                            "outputs")
        if tuple(weight.shape[2:]) != tuple(patch_size):
            problems.append(f"patch_size={list(patch_size)} but the patch embedding kernel is "
                            f"{list(weight.shape[2:])}")
    fc1 = timm_state.get("blocks.0.mlp.fc1.weight")
    if fc1 is not None and np.ndim(fc1) == 2 and fc1.shape[0] != config["intermediate_size"]:
        problems.append(f"intermediate_size={config['intermediate_size']} but the MLP has {fc1.shape[0]} units")
    position = timm_state.get("pos_embed")
    if position is not None and np.ndim(position) == 3 and not problems:
        prefix_rows = 2 if "dist_token" in timm_state else 1  # DeiT: class and distillation tokens
        rows = (source_size[0] // patch_size[0]) * (source_size[1] // patch_size[1]) + prefix_rows
        if position.shape[1] != rows:
            problems.append(f"image_size={list(source_size)} with patch_size={list(patch_size)} gives {rows} "
                            f"positions but the position embedding has {position.shape[1]}")
    head = timm_state.get("head.weight")
    if head is not None and np.ndim(head) == 2:
        labels = config.get("id2label")
        declared = len(labels) if isinstance(labels, dict) and labels else config.get("num_labels")
        if declared is not None and declared != head.shape[0]:
            problems.append(f"{'id2label has' if labels else 'num_labels is'} {declared} classes but the "
                            f"classifier has {head.shape[0]} outputs")
    if problems:
        raise ValueError(
            "The Hugging Face config.json disagrees with its weights: " + "; ".join(problems) + ". The config "
            "belongs to another model, or was edited; use the config.json saved with these weights."
        )


def from_huggingface(
    config,
    state_dict,
    *,
    preprocessor_config=None,
    image_size=None,
    interpolation="bicubic",
    antialias=True,
    include_head=True,
    allow_non_finite=False,
    **overrides,
):
    """Build a keras_vit model from a Hugging Face `transformers` ViT.

    Args:
        config: dict. The model's `config.json` (`model_type="vit"`). Its
            `layer_norm_eps` (1e-12 in Google's published conversions),
            `num_attention_heads`, `image_size` (int or `[height, width]`)
            and `qkv_bias` are honoured.
        state_dict: dict of numpy arrays from `model.safetensors` of a
            `ViTModel` or `ViTForImageClassification`. `pooler.*` (the tanh
            pooler of a bare `ViTModel`) and `embeddings.mask_token` are
            ignored: keras_vit's backbone returns the normalised tokens, the
            same as `last_hidden_state`.
        preprocessor_config: dict or `None`. `preprocessor_config.json`
            (`image_mean`, `image_std`, `rescale_factor`, ...); defaults to
            `ViTImageProcessor`'s defaults (mean = std = 0.5).
        image_size, interpolation, antialias, include_head,
            allow_non_finite, **overrides: as in `from_timm`. Note that Hugging Face's own
            `interpolate_pos_encoding` is bicubic without antialiasing.

    Returns:
        A `ViTClassifier` (probabilities unless `activation=None`, class-token pooling) or a `ViTBackbone`.
    """
    config = dict(config)
    model_type = config.get("model_type", "vit")
    if model_type in FAMILIES:  # SigLIP, CLIP and DINOv2 vision towers: their own name maps
        return from_huggingface_family(
            config, state_dict, preprocessing=_preprocessing(preprocessor_config), image_size=image_size,
            interpolation=interpolation, antialias=antialias, include_head=include_head,
            allow_non_finite=allow_non_finite, **overrides)
    if model_type not in ("vit", "deit"):
        raise ValueError(
            "Only Hugging Face ViT, DeiT, SigLIP, CLIP and DINOv2 checkpoints (model_type 'vit', 'deit', "
            f"{', '.join(repr(f) for f in FAMILIES)}) are supported. Received: model_type={model_type!r}"
        )
    activation = config.get("hidden_act", "gelu")
    if activation != "gelu":
        raise ValueError(
            f"keras_vit's MLP uses the exact (erf) GELU; this checkpoint uses hidden_act={activation!r}, "
            "so it cannot be converted faithfully."
        )
    _check_config(config)
    check_tensors(state_dict, "Hugging Face checkpoint")  # dtypes, before q/k/v are fused
    num_layers = int(config["num_hidden_layers"])
    timm_state, ignored = huggingface_to_timm(state_dict)
    check_tensors(timm_state, "Hugging Face checkpoint")  # ranks, under timm's names
    patch_size = config_pair(config.get("patch_size", 16))
    source_size = config_pair(config.get("image_size", 224))
    _check_config_against_weights(config, timm_state, source_size, patch_size)
    distilled = "dist_token" in timm_state
    if distilled and "head.weight" in timm_state and "head_dist.weight" not in timm_state:
        # DeiTForImageClassification: one head on the class token of a model that has a distillation token.
        raise ValueError(
            "This DeiT checkpoint has a distillation token but one classifier (DeiTForImageClassification); "
            "keras_vit's DeiT classifier has both heads (DeiTForImageClassificationWithTeacher). Load the "
            "backbone with include_head=False and add a head, or use the checkpoint with both heads.")
    backbone_config = {
        "image_size": source_size,
        "patch_size": patch_size,
        "num_channels": int(config.get("num_channels", 3)),
        "hidden_dim": int(config["hidden_size"]),
        "num_layers": num_layers,
        "num_heads": int(config["num_attention_heads"]),
        "mlp_dim": int(config["intermediate_size"]),
        "layer_norm_epsilon": float(config.get("layer_norm_eps", 1e-12)),
        "use_class_token": True,
        "use_distillation_token": distilled,
        "use_qkv_bias": bool(config.get("qkv_bias", True)),
        "final_norm": True,
        **_preprocessing(preprocessor_config, skip=overrides),
    }
    head_overrides = {k: overrides.pop(k) for k in list(overrides) if k in HEAD_ARGUMENTS}
    backbone_config.update(overrides)
    head_config = None
    if include_head and "head.weight" in timm_state:
        head_config = {
            "num_classes": int(timm_state["head.weight"].shape[0]),
            "pooling": "token",
            "activation": "softmax",  # probabilities, like every ViTClassifier; activation=None for logits
            **head_overrides,
        }
        # The checkpoint's own names (transformers' LABEL_0... placeholders are none), unless the caller gave some.
        names = class_names.from_id2label(config.get("id2label"), head_config["num_classes"])
        if names is not None:
            head_config.setdefault("class_names", names)
    elif "head.weight" in timm_state:
        for timm_head in ("head", "head_dist"):
            if f"{timm_head}.weight" in timm_state:
                ignored += [f"{_EXPORT_HEAD_NAMES[timm_head] if distilled else 'classifier'}.{param}"
                            for param in ("weight", "bias")]
                timm_state.pop(f"{timm_head}.weight")
                timm_state.pop(f"{timm_head}.bias", None)
    grid = (source_size[0] // patch_size[0], source_size[1] // patch_size[1])
    return build_model(
        backbone_config,
        head_config,
        timm_state,
        source_grid=grid,
        image_size=image_size,
        interpolation=interpolation,
        antialias=antialias,
        source="Hugging Face checkpoint",
        allow_non_finite=allow_non_finite,
    )


def _check_exportable(backbone, classifier):
    problems = []
    if not backbone.use_class_token:
        problems.append("it has no class token")
    if backbone.num_register_tokens:
        problems.append("it has register tokens")
    if backbone.position_embedding != "learned" or not backbone.prefix_position_embedding:
        problems.append("its position embedding is not a learned table with a class-token row")
    if backbone.layer_scale_init is not None:
        problems.append("it uses LayerScale")
    if not backbone.final_norm:
        problems.append("it has no final LayerNorm")
    if classifier is not None and (
        classifier.pooling != "token" or classifier.pooled_norm or classifier.representation_size is not None
    ):
        problems.append("its head is not a single Dense on the class token")
    if problems:
        raise ValueError(
            "This model cannot be written as a Hugging Face ViT because " + "; ".join(problems) + ". "
            "Use `export_timm` instead, which supports all of these."
        )


# (backbone, classifier) class names of the paper's ViT and of DeiT distilled, as `config.json` names them.
_EXPORT_ARCHITECTURES = {"vit": ("ViTModel", "ViTForImageClassification"),
                         "deit": ("DeiTModel", "DeiTForImageClassificationWithTeacher")}

# What export_huggingface writes, and the kind its ownership marker records.
HUGGINGFACE_FILES = ("config.json", "preprocessor_config.json", "model.safetensors")
HUGGINGFACE_KIND = "huggingface"


def export_huggingface(model, directory):
    """Write a keras_vit model as a Hugging Face `transformers` directory.

    Writes `config.json`, `model.safetensors` and `preprocessor_config.json`,
    loadable with `ViTForImageClassification.from_pretrained(directory)` (a
    classifier) or `ViTModel.from_pretrained(directory,
    add_pooling_layer=False)` (a backbone) for the paper's ViT. A backbone of
    a later family is written as its vision tower: SigLIP (no class token,
    its MAP head when it has one) as `SiglipVisionModel`, CLIP (pre-norm) as
    `CLIPVisionModel`, DINOv2 (LayerScale) as `Dinov2Model`, or
    `Dinov2WithRegistersModel` with registers; `AutoModel.from_pretrained`
    reads each. DeiT with its distillation token is written as `DeiTModel`
    (a backbone) or `DeiTForImageClassificationWithTeacher` (a classifier,
    both heads). qk-norm has no transformers class: `export_timm` writes it.

    Args:
        model: `ViTClassifier` or `ViTBackbone` with a layout one of those
            classes can express (a square image and patch; for the ViT a
            class token, token pooling, no representation layer; the later
            families as backbones only).
        directory: str or path-like. Created if needed; the three files
            replace the old ones in one step (a directory swap). A directory
            holding anything keras_vit did not write there (a README, a
            `notes/` folder) is refused before anything is written, naming
            those entries.

    Returns:
        The `config.json` dict that was written.
    """
    # The directory is replaced whole: one holding a user's files (a README, notes/) is refused, never carried.
    destination = claim(directory, HUGGINGFACE_KIND, argument="directory")
    return write_huggingface(model, destination)


def write_huggingface(model, destination):
    """`export_huggingface` through a claim made before: what `keras-vit convert --to huggingface` calls.

    Args:
        model: as `export_huggingface` takes it.
        destination: the `keras_vit.writer.files.Destination` of the
            directory, claimed with kind `HUGGINGFACE_KIND` (`keras-vit
            convert` claims it at its start, with the source as an input).

    Returns:
        The `config.json` dict that was written.
    """
    state_dict, backbone, classifier = model_to_timm(model)
    family = export_family(backbone)
    if family is not None:
        if classifier is not None:
            raise ValueError(
                f"This classifier's backbone is a {EXPORT_CLASSES[family]}, which keras_vit writes without a "
                "classification head. Export the backbone, `export_huggingface(model.backbone, directory)`, or "
                "the whole classifier with `keras_vit.convert.export_timm`.")
        config, out = family_config_and_tensors(backbone, family, state_dict)
    else:
        _check_exportable(backbone, classifier)
        config, out = _vit_config_and_tensors(state_dict, backbone, classifier)
    # The model's own evaluation transform (resize rule, crop, interpolation), so transformers' pipeline
    # feeds it what keras_vit's reader does.
    processor = huggingface_processor(backbone)
    # The three files are built in a staging directory and swapped in together: a kill leaves the old
    # directory or the new one, never one model's config beside another's weights.
    with destination.directory() as staging:
        for name, document in (("config.json", config), ("preprocessor_config.json", processor)):
            write_json_file(os.path.join(staging, name), document, indent=2)
        write_safetensors(os.path.join(staging, "model.safetensors"), out, metadata={"format": "pt"})
    return config


def _vit_config_and_tensors(state_dict, backbone, classifier):
    """The `config.json` and tensors of a `ViTModel` / `ViTForImageClassification` (the paper's ViT).

    With DeiT's distillation token: `DeiTModel` / `DeiTForImageClassificationWithTeacher`, the same names
    under `deit.`, the distillation token and the two heads (`cls_classifier`, `distillation_classifier`).
    """
    distilled = bool(backbone.use_distillation_token)
    model_type = "deit" if distilled else "vit"
    prefix = f"{model_type}." if classifier is not None else ""
    out = {}
    for key, value in state_dict.items():
        head, _, param = key.rpartition(".")
        if head in _EXPORT_HEAD_NAMES:
            out[f"{_EXPORT_HEAD_NAMES[head] if distilled else 'classifier'}.{param}"] = value
            continue
        match = re.match(r"blocks\.(\d+)\.(.+)\.(weight|bias)$", key)
        if match:
            index, name, param = match.groups()
            layer = f"{prefix}encoder.layer.{index}."
            if name == "attn.qkv":
                for part, chunk in zip(("query", "key", "value"), np.split(value, 3, axis=0)):
                    out[f"{layer}attention.attention.{part}.{param}"] = np.ascontiguousarray(chunk)
                continue
            out[f"{layer}{_EXPORT_BLOCK_NAMES[name]}.{param}"] = value
            continue
        out[prefix + _EXPORT_TOP_NAMES[key]] = value
    num_labels = classifier.num_classes if classifier is not None else 0
    image_size = list(backbone.image_size)
    patch_size = list(backbone.patch_size)
    config = {
        "architectures": [_EXPORT_ARCHITECTURES[model_type][classifier is not None]],
        "model_type": model_type,
        "hidden_size": backbone.hidden_dim,
        "num_hidden_layers": backbone.num_layers,
        "num_attention_heads": backbone.num_heads,
        "intermediate_size": backbone.mlp_dim,
        "hidden_act": "gelu",
        "hidden_dropout_prob": 0.0,
        "attention_probs_dropout_prob": 0.0,
        "initializer_range": 0.02,
        "layer_norm_eps": float(backbone.layer_norm_epsilon),
        "image_size": image_size[0] if image_size[0] == image_size[1] else image_size,
        "patch_size": patch_size[0] if patch_size[0] == patch_size[1] else patch_size,
        "num_channels": backbone.num_channels,
        "qkv_bias": bool(backbone.use_qkv_bias),
        "encoder_stride": patch_size[0],
        "pooler_output_size": backbone.hidden_dim,
        "pooler_act": "tanh",
        "dtype": "float32",
    }
    if num_labels:
        # The model's names (ImageNet's for a 1000-class model without names, as `predict` prints them), so
        # transformers' pipeline prints what keras_vit prints; LABEL_i only where the model has no names.
        names = class_names.names_of(classifier) or [f"LABEL_{i}" for i in range(num_labels)]
        config["id2label"] = {str(i): name for i, name in enumerate(names)}
        # Two classes may share a name (ImageNet has two "crane"s): label2id keeps the first index of each.
        config["label2id"] = {}
        for i, name in enumerate(names):
            config["label2id"].setdefault(name, i)
    return config, out
