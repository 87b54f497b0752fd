"""`from_preset` and `save_to_preset`: resolve a handle, check it, build, load, adapt.

A handle is one of:

- a registry name (`"vit_b16_in21k_ft_in1k"`, see `keras_vit.presets.list()`);
- `hf://org/repo` or `hf://org/repo@revision`: a hub repository holding a
  keras_vit preset, a Hugging Face `transformers` ViT or a timm ViT;
- a local directory: a keras_vit preset (`config.json` + `model.weights.h5` +
  `metadata.json`) or a Hugging Face model (`config.json` + `model.safetensors`);
- a local file: a timm `.safetensors` or a Google `.npz` checkpoint.

The keras_vit format is read without pickles and its config is checked
before anything is built. Other formats go through `keras_vit.convert`.
"""

import datetime
import inspect
import json
import os
import platform

import keras
import numpy as np

from keras_vit.presets import hub
from keras_vit.presets.registry import PRESETS

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.weights.h5"
METADATA_FILE = "metadata.json"
FORMAT_VERSION = 1
_KERAS_VIT_FILES = (CONFIG_FILE, METADATA_FILE, WEIGHTS_FILE)
_HF_WEIGHTS = "model.safetensors"
_HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"


# === Handles ===


def _describe_handles():
    return ("a preset name (see `keras_vit.presets.list()`), 'hf://org/repo', a directory saved by "
            "`save_to_preset`, a Hugging Face model directory, or a timm .safetensors / Google .npz file")


def _resolve(handle):
    """Return `(kind, value, entry)`: kind is 'registry', 'hub' or 'local'."""
    if not isinstance(handle, (str, os.PathLike)):
        raise ValueError(f"A preset handle is {_describe_handles()}. Received: {handle!r}")
    handle = os.fspath(handle)
    if handle in PRESETS:
        return "registry", handle, PRESETS[handle]
    if handle.startswith("hf://"):
        hub.parse_hub_handle(handle)
        return "hub", handle, None
    if handle.startswith("kaggle://"):  # keras-hub presets on Kaggle (issue 16)
        from keras_vit.presets.kaggle import parse_kaggle_handle

        parse_kaggle_handle(handle)
        return "kaggle", handle, None
    if os.path.exists(handle):
        return "local", handle, None
    close = [name for name in PRESETS if handle.lower() in name or name in handle.lower()][:5]
    hint = f" Close matches: {', '.join(close)}." if close else ""
    raise ValueError(
        f"Unknown preset {handle!r}: it is not a registered preset, an 'hf://' handle or an existing path.{hint} "
        f"A handle is {_describe_handles()}."
    )


def _hub_files(handle, revision=None, sha256=None, weights_format=None):
    """Download what a hub repository needs; return a local path to load from."""
    repo_id, handle_revision = hub.parse_hub_handle(handle)
    revision = handle_revision or revision
    config_path = hub.fetch(repo_id, CONFIG_FILE, revision)
    revision = hub.commit_of(config_path) or revision  # every file from the config's commit (issue 16)
    if weights_format is None:
        weights_format = _sniff_config_format(config_path, handle)
    if weights_format == "kerashub":  # issue 16
        hub.fetch(repo_id, WEIGHTS_FILE, revision, sha256=sha256)
        for optional in ("task.json", "task.weights.h5", "image_converter.json", "preprocessor.json"):
            try:
                hub.fetch(repo_id, optional, revision)
            except FileNotFoundError:
                pass
        return "kerashub", os.path.dirname(config_path)
    if weights_format == "keras_vit":
        hub.fetch(repo_id, METADATA_FILE, revision)
        hub.fetch(repo_id, WEIGHTS_FILE, revision, sha256=sha256)
        return "keras_vit", os.path.dirname(config_path)
    hub.fetch(repo_id, _HF_WEIGHTS, revision, sha256=sha256)
    if weights_format == "huggingface":
        # Preprocessing (mean / std) of a transformers model lives beside its config; optional.
        try:
            hub.fetch(repo_id, "preprocessor_config.json", revision)
        except FileNotFoundError:
            pass
    # Both Hugging Face and timm hub folders (config.json + model.safetensors) load with load_checkpoint.
    return weights_format, os.path.dirname(config_path)


def _sniff_config_format(config_path, where):
    config = _read_json(config_path, where)
    if str(config.get("registered_name", "")).startswith("keras_hub>"):  # issue 16
        return "kerashub"
    if "format_version" in config and "class_name" in config:
        return "keras_vit"
    if config.get("model_type") == "vit":
        return "huggingface"
    if "architecture" in config:
        return "timm"
    raise ValueError(
        f"{where} does not hold a checkpoint keras_vit can load: its config.json is neither a keras_vit "
        "preset, a Hugging Face ViT (model_type 'vit') nor a timm model (with 'architecture')."
    )


def _local_format(path):
    if os.path.isdir(path):
        from keras_vit.convert.kerashub import is_kerashub_preset  # issue 16

        if is_kerashub_preset(path):
            return "kerashub"
        names = set(os.listdir(path))
        if METADATA_FILE in names or WEIGHTS_FILE in names:
            return "keras_vit"
        if CONFIG_FILE in names:
            return "huggingface"
        raise ValueError(
            f"The directory {path} holds neither a keras_vit preset ({', '.join(_KERAS_VIT_FILES)}) nor a "
            f"Hugging Face model ({CONFIG_FILE} + {_HF_WEIGHTS}). Found: {sorted(names) or 'nothing'}."
        )
    if path.endswith((".safetensors", ".npz")):
        return "checkpoint"
    raise ValueError(
        f"Cannot load {path}: a checkpoint file must be a timm '.safetensors' or a Google '.npz' file "
        "(pickled '.bin' / '.pth' files are never loaded)."
    )


# === The keras_vit format ===


def _read_json(path, where):
    try:
        with open(path) as file:
            value = json.load(file)
    except ValueError as error:
        raise ValueError(f"{path} (from {where}) is not valid JSON: {error}") from error
    if not isinstance(value, dict):
        raise ValueError(f"{path} (from {where}) must hold a JSON object. Received: {type(value).__name__}")
    return value


def _model_classes():
    from keras_vit.models.vit_backbone import ViTBackbone
    from keras_vit.models.vit_classifier import ViTClassifier

    return {"ViTBackbone": ViTBackbone, "ViTClassifier": ViTClassifier}


def _constructor_arguments(cls):
    return set(inspect.signature(cls.__init__).parameters) - {"self", "kwargs"}


def _check_pair(config, key, where):
    value = config.get(key)
    values = [value] if isinstance(value, int) else value
    if not (isinstance(values, (list, tuple)) and len(values) in (1, 2)
            and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in values)):
        raise ValueError(f"{where}: `{key}` must be a positive int or a pair of them. Received: {key}={value!r}")
    return tuple(values) * (2 // len(values))


def validate_config(document, where="config.json"):
    """Check a keras_vit `config.json` document before anything is built.

    Args:
        document: dict. The parsed file: `{"format_version", "class_name",
            "config"}`.
        where: str. Named in error messages.

    Returns:
        `(class_name, config)` with the config ready for `from_config`.

    Raises:
        ValueError: naming the first problem found.
    """
    version = document.get("format_version")
    if version != FORMAT_VERSION:
        raise ValueError(
            f"{where}: unsupported keras_vit preset format_version {version!r} (this keras_vit reads "
            f"{FORMAT_VERSION}). Upgrade keras_vit, or re-save the model with `save_to_preset`."
        )
    classes = _model_classes()
    class_name = document.get("class_name")
    if class_name not in classes:
        raise ValueError(f"{where}: `class_name` must be one of {sorted(classes)}. Received: class_name={class_name!r}")
    config = document.get("config")
    if not isinstance(config, dict):
        raise ValueError(f"{where}: `config` must be a JSON object. Received: {type(config).__name__}")
    if class_name == "ViTClassifier":
        _check_keys(config, classes["ViTClassifier"], where, required=("backbone", "num_classes"))
        num_classes = config["num_classes"]
        if not isinstance(num_classes, int) or isinstance(num_classes, bool) or num_classes <= 0:
            raise ValueError(f"{where}: `num_classes` must be a positive int. Received: num_classes={num_classes!r}")
        if config.get("pooling", "token") not in ("token", "gap"):
            raise ValueError(f"{where}: `pooling` must be 'token' or 'gap'. Received: pooling={config['pooling']!r}")
        backbone = config["backbone"]
        if not (isinstance(backbone, dict) and backbone.get("class_name") == "ViTBackbone"
                and isinstance(backbone.get("config"), dict)):
            raise ValueError(f"{where}: `backbone` must be a serialized ViTBackbone. Received: {str(backbone)[:200]}")
        _check_backbone(backbone["config"], where)
    else:
        _check_backbone(config, where)
    return class_name, config


def _check_keys(config, cls, where, required=()):
    unknown = sorted(set(config) - _constructor_arguments(cls))
    if unknown:
        raise ValueError(
            f"{where}: unknown {cls.__name__} arguments {unknown}. The file was written by another keras_vit "
            "version or edited by hand; upgrade keras_vit or remove them."
        )
    missing = [key for key in required if key not in config]
    if missing:
        raise ValueError(f"{where}: the {cls.__name__} config lacks {missing}.")


def _check_backbone(config, where):
    backbone_class = _model_classes()["ViTBackbone"]
    _check_keys(config, backbone_class, where)
    image_size = _check_pair(config, "image_size", where) if "image_size" in config else (224, 224)
    patch_size = _check_pair(config, "patch_size", where) if "patch_size" in config else (16, 16)
    for key in ("num_channels", "hidden_dim", "num_layers", "num_heads", "mlp_dim"):
        if key in config:
            value = config[key]
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{where}: `{key}` must be a positive int. Received: {key}={value!r}")
    for key in ("dropout", "attention_dropout", "drop_path_rate"):
        value = config.get(key, 0.0)
        if not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
            raise ValueError(f"{where}: `{key}` must be a number in [0, 1). Received: {key}={value!r}")
    if config.get("position_embedding", "learned") not in ("learned", "sincos2d", "none"):
        raise ValueError(f"{where}: `position_embedding` must be 'learned', 'sincos2d' or 'none'. "
                         f"Received: position_embedding={config['position_embedding']!r}")
    stem = config.get("stem")
    if stem is None:
        if image_size[0] % patch_size[0] or image_size[1] % patch_size[1]:
            raise ValueError(f"{where}: `image_size` {image_size} is not divisible by `patch_size` {patch_size}.")
    elif not (isinstance(stem, dict) and isinstance(stem.get("class_name"), str)):
        raise ValueError(f"{where}: `stem` must be null or a serialized Keras layer. Received: {str(stem)[:200]}")


def _build_from_document(class_name, config):
    classes = _model_classes()
    if class_name == "ViTClassifier":
        config = dict(config)
        backbone = classes["ViTBackbone"].from_config(config.pop("backbone")["config"])
        return classes["ViTClassifier"](backbone=backbone, **config)
    return classes["ViTBackbone"].from_config(config)


def _document_of(model):
    """The `config.json` document of a ViTBackbone or ViTClassifier."""
    classes = _model_classes()
    if isinstance(model, classes["ViTClassifier"]):
        config = model.get_config()
        config["backbone"] = {"class_name": "ViTBackbone", "config": model.backbone.get_config()}
        return {"format_version": FORMAT_VERSION, "class_name": "ViTClassifier", "config": config}
    if isinstance(model, classes["ViTBackbone"]):
        return {"format_version": FORMAT_VERSION, "class_name": "ViTBackbone", "config": model.get_config()}
    raise ValueError(f"`save_to_preset` saves a ViTBackbone or ViTClassifier. Received: {type(model).__name__}")


def _json_default(value):
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating,)):
        return float(value)
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def save_to_preset(model, directory, **metadata):
    """Write `model` as a keras_vit preset: config.json, model.weights.h5, metadata.json.

    Args:
        model: `ViTBackbone` or `ViTClassifier`.
        directory: str. Created if missing; existing preset files are replaced.
        **metadata: Extra JSON-serializable fields for `metadata.json`
            (for example `class_names="imagenet-1k"`).
    """
    import keras_vit

    document = _document_of(model)
    directory = os.fspath(directory)
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, CONFIG_FILE), "w") as file:
        json.dump(document, file, indent=2, default=_json_default)
    model.save_weights(os.path.join(directory, WEIGHTS_FILE))
    info = {
        "format_version": FORMAT_VERSION,
        "class_name": document["class_name"],
        "keras_vit_version": keras_vit.__version__,
        "keras_version": keras.__version__,
        "backend": keras.backend.backend(),
        "python_version": platform.python_version(),
        "parameter_count": int(model.count_params()),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        **metadata,
    }
    if getattr(model, "num_classes", None) == 1000 and getattr(model, "class_names", None) == "imagenet-1k":
        info.setdefault("class_names", "imagenet-1k")
    with open(os.path.join(directory, METADATA_FILE), "w") as file:
        json.dump(info, file, indent=2, default=_json_default)


def _load_keras_vit(directory, load_weights, where):
    config_path = os.path.join(directory, CONFIG_FILE)
    weights_path = os.path.join(directory, WEIGHTS_FILE)
    missing = [name for name in (CONFIG_FILE, WEIGHTS_FILE if load_weights else None) if name
               and not os.path.exists(os.path.join(directory, name))]
    if missing:
        raise ValueError(f"The keras_vit preset {where} lacks {missing} (expected {list(_KERAS_VIT_FILES)}).")
    class_name, config = validate_config(_read_json(config_path, where), where=f"{where}/{CONFIG_FILE}")
    if load_weights:
        with open(weights_path, "rb") as file:
            if file.read(8) != _HDF5_MAGIC:
                raise ValueError(f"{weights_path} is not an HDF5 .weights.h5 file; the preset is damaged. "
                                 "Save it again with `save_to_preset`.")
    model = _build_from_document(class_name, config)
    if load_weights:
        try:
            model.load_weights(weights_path)
        except (ValueError, KeyError) as error:
            raise ValueError(f"The weights in {weights_path} do not fit the model described by its "
                             f"{CONFIG_FILE}: {error}") from error
    metadata_path = os.path.join(directory, METADATA_FILE)
    if os.path.exists(metadata_path):
        class_names = _read_json(metadata_path, where).get("class_names")
        if class_names is not None:
            model.class_names = class_names
    return model


# === Converted checkpoints ===


def _load_converted(path, image_size, include_head=True):
    from keras_vit.convert import load_checkpoint

    # Converters return logits like their sources; presets give probabilities like every
    # other ViTClassifier (the default `activation`), which `decode_predictions` expects.
    return load_checkpoint(path, image_size=image_size, include_head=include_head, activation="softmax")


# === Building from the registry ===


def _build_registry_model(entry, image_size=None):
    classes = _model_classes()
    backbone = classes["ViTBackbone"].from_variant(
        entry["variant"], image_size=image_size or entry["image_size"], pixel_mean=entry["pixel_mean"],
        pixel_std=entry["pixel_std"], **entry["config"],
    )
    if entry["num_classes"] is None:
        return backbone
    return classes["ViTClassifier"](backbone=backbone, num_classes=entry["num_classes"])


# === Adapting a loaded model ===


def _copy_backbone_weights(source, target):
    """Copy weights between two backbones that differ at most in image size.

    Variables are matched by path (layer names are stable); a learned
    position-embedding table whose grid changed is resampled.
    """
    source_weights = {variable.path: variable for variable in source.weights}
    for variable in target.weights:
        if variable.path not in source_weights:
            raise ValueError(f"Cannot transfer weights: the source model has no variable {variable.path!r}.")
        value = keras.ops.convert_to_numpy(source_weights[variable.path].value)
        if tuple(value.shape) != tuple(variable.shape):
            if not variable.path.endswith("position_embedding"):
                raise ValueError(
                    f"Cannot transfer {variable.path!r}: shape {value.shape} vs {tuple(variable.shape)}."
                )
            prefix_rows = value.shape[1] - source.grid_size[0] * source.grid_size[1]
            from keras_vit.convert import resample_position_embedding

            value = resample_position_embedding(value, prefix_rows, source.grid_size, target.grid_size)
        variable.assign(value.astype(keras.backend.standardize_dtype(variable.dtype)))


def _stem_config_at(stem_config, image_size, num_channels):
    """A serialized `keras.Sequential` stem re-declared for `image_size` inputs.

    A built Sequential records its input shape (an `InputLayer` and its build
    shape); the convolutional stems of hybrids (`bit_resnet_stem`) have
    weights that do not depend on it, so only that declared shape changes.
    Other stems are returned as they are.
    """
    if stem_config.get("class_name") != "Sequential":
        return stem_config
    shape = [None, *image_size, num_channels]
    stem_config = json.loads(json.dumps(stem_config))  # a deep copy of plain JSON data
    inner = stem_config.get("config", {})
    for layer in inner.get("layers", []):
        if layer.get("class_name") == "InputLayer" and "batch_shape" in layer.get("config", {}):
            layer["config"]["batch_shape"] = list(shape)
    if "build_input_shape" in inner:
        inner["build_input_shape"] = list(shape)
    if "input_shape" in (stem_config.get("build_config") or {}):
        stem_config["build_config"]["input_shape"] = list(shape)
    return stem_config


def _rebuild(model, image_size=None, num_classes=None, as_backbone=False):
    """A model like `model` at another image size and / or with a new head, weights carried over."""
    classes = _model_classes()
    if as_backbone and isinstance(model, classes["ViTClassifier"]):
        model = model.backbone
    backbone = getattr(model, "backbone", model)
    new_image = image_size is not None and tuple(backbone.image_size) != _pair(image_size)
    is_classifier = isinstance(model, classes["ViTClassifier"])
    new_head = num_classes is not None and (not is_classifier or model.num_classes != num_classes)
    if not new_image and not new_head:
        return model
    if new_image:
        backbone_config = backbone.get_config()
        backbone_config.update(image_size=_pair(image_size))
        if backbone_config.get("stem") is not None:
            backbone_config["stem"] = _stem_config_at(
                backbone_config["stem"], _pair(image_size), backbone.num_channels)
        try:
            new_backbone = classes["ViTBackbone"].from_config(backbone_config)
        except ValueError as error:
            if backbone_config.get("stem") is None:
                raise
            raise ValueError(
                f"Cannot rebuild this hybrid backbone at image_size={_pair(image_size)}: its stem "
                f"({backbone_config['stem'].get('class_name')}) was saved for {tuple(backbone.image_size)} "
                "inputs and does not accept the new size (a functional-model stem declares its input shape). "
                "Load it at its saved size, or build the stem for the new size, pass it as "
                "`ViTBackbone(stem=...)` and copy the weights."
            ) from error
        _copy_backbone_weights(backbone, new_backbone)
    else:
        new_backbone = backbone
    if not is_classifier:
        if num_classes is None:
            return new_backbone
        return classes["ViTClassifier"](backbone=new_backbone, num_classes=num_classes)
    head_config = model.get_config()
    head_config.pop("backbone")
    head_config["num_classes"] = num_classes or model.num_classes
    rebuilt = classes["ViTClassifier"](backbone=new_backbone, **head_config)
    # Backbone weights are shared or already copied; copy the pooled norm / pre-logits layers.
    for name in ("fc_norm", "pre_logits") + (() if new_head else ("head",)):
        try:
            source_layer = model.get_layer(name)
        except ValueError:
            continue
        rebuilt.get_layer(name).set_weights(source_layer.get_weights())
    if not new_head and hasattr(model, "class_names"):
        rebuilt.class_names = model.class_names
    return rebuilt


def _pair(value):
    return (value, value) if isinstance(value, int) else tuple(value)


# === Public entry points ===


def load_preset(handle, target="classifier", image_size=None, num_classes=None, load_weights=True):
    """Load a model from any preset handle.

    Args:
        handle: str. See the module docstring.
        target: `"classifier"` or `"backbone"`: the class asking.
        image_size: int, pair or `None`. Input size; a different size
            resamples the learned position embeddings of the patch grid.
        num_classes: int or `None`. A new zero-initialised head with this
            many classes (classifier only); `None` keeps the released head.
        load_weights: bool. `False` builds the architecture with random
            weights (for the registry, without downloading anything).

    Returns:
        A `ViTClassifier` or `ViTBackbone`.
    """
    if image_size is not None:
        image_size = _pair(image_size)
        if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in image_size):
            raise ValueError(f"`image_size` must be a positive int or a pair of them. Received: image_size={image_size!r}")
    if num_classes is not None:
        if target == "backbone":
            raise ValueError("`num_classes` is an argument of ViTClassifier.from_preset; a backbone has no head.")
        if not isinstance(num_classes, int) or isinstance(num_classes, bool) or num_classes <= 0:
            raise ValueError(f"`num_classes` must be a positive int. Received: num_classes={num_classes!r}")
    kind, value, entry = _resolve(handle)
    if entry is not None and target == "classifier" and entry["num_classes"] is None and num_classes is None:
        raise ValueError(
            f"The preset {handle!r} is a pre-trained backbone without a classification head. Pass "
            f"`num_classes=` to attach a new zero-initialised head, or use ViTBackbone.from_preset({handle!r})."
        )

    if kind == "registry" and not load_weights:
        model = _build_registry_model(entry, image_size)
    else:
        if kind == "registry":
            fmt, path = _hub_files(entry["source"], entry["revision"], entry["sha256"], entry["format"])
        elif kind == "hub":
            fmt, path = _hub_files(value)
        elif kind == "kaggle":  # issue 16
            from keras_vit.presets.kaggle import kaggle_directory

            fmt, path = "kerashub", kaggle_directory(value)
        else:
            fmt, path = value, value
            fmt = _local_format(path)
        where = handle if kind != "local" else path
        if fmt == "kerashub":  # issue 16
            from keras_vit.convert.kerashub import load_kerashub_preset

            model = load_kerashub_preset(path)
            if not load_weights:
                model = model.__class__.from_config(model.get_config())
        elif fmt == "keras_vit":
            model = _load_keras_vit(path, load_weights, where)
        else:
            # A registry entry without a head (num_classes None) may still name a file that carries
            # an unusable one (timm's R50+ViT-B/16 in21k keeps its head but not its pre-logits layer).
            include_head = entry is None or entry["num_classes"] is not None
            model = _load_converted(path, image_size, include_head)
            if entry is not None:
                _check_against_entry(model, entry, handle, image_size)
            if not load_weights:
                model = model.__class__.from_config(model.get_config())
        if entry is not None and entry["class_names"] and getattr(model, "num_classes", None) == entry["num_classes"]:
            model.class_names = entry["class_names"]
    if target == "classifier" and not hasattr(model, "num_classes") and num_classes is None:
        raise ValueError(
            f"{handle!r} holds a backbone without a classification head. Pass `num_classes=` to attach a new "
            "zero-initialised head, or use ViTBackbone.from_preset."
        )
    return _rebuild(model, image_size=image_size, num_classes=num_classes, as_backbone=target == "backbone")


def _check_against_entry(model, entry, name, image_size):
    if image_size is not None and _pair(image_size) != _pair(entry["image_size"]):
        return
    count = model.count_params()
    if count != entry["params"]:
        raise ValueError(
            f"The checkpoint downloaded for preset {name!r} ({entry['source']}) has {count:,} parameters where "
            f"the registry expects {entry['params']:,}: the repository changed. Pin a revision or report it."
        )
