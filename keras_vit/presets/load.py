"""The one reader: `load_model` reads every model handle; `load_preset` (behind `from_preset`) uses it.

A handle is a registry name, `hf://org/repo[@rev]`, `kaggle://...`, a
directory of any format or a single file (see `keras_vit.presets.handles`).
`load_model` resolves it, downloads what a hub repository holds, asks the
reading table (`keras_vit.presets.formats.READ_FORMATS`) what a local path
is, reads it with that row's reader, checks the result against the registry
and against the model classes the caller can use, and adapts it (image
size, head) with the models' own methods, never by editing serialized
configs. Every command and workflow reads models through it; the checks
(pickles refused, non-finite tensors, mismatches, safe mode for `.keras`,
the model's class) are made here or in the readers it calls, once.
"""

import os

from keras_vit.convert.loader import set_checkpoint_reader
from keras_vit.presets.formats import READ_FORMATS, detect_format
from keras_vit.presets.handles import hub_files, resolve
from keras_vit.presets.kaggle import kaggle_directory
from keras_vit.presets.keras_vit_format import model_classes as class_table
from keras_vit.utils import to_pair
from keras_vit.utils.errors import ArgumentError
from keras_vit.utils.renames import renamed_argument

# What `load_model(target=...)` builds from any handle: a classifier, or the backbone alone.
LOAD_TARGETS = ("classifier", "backbone")
# The model classes keras_vit reads; a `.keras` file of any other Keras model is refused.
MODEL_CLASSES = ("ViTClassifier", "ViTBackbone", "MaskedPatchPredictor")


def _build_registry_model(entry, image_size=None):
    classes = class_table()
    backbone = classes["ViTBackbone"].from_variant(
        entry["variant"], image_size=image_size or entry["image_size"], pixel_mean=entry["pixel_mean"],
        pixel_std=entry["pixel_std"], **entry["config"],
    )
    if entry["num_classes"] is None:
        return backbone
    return classes["ViTClassifier"](backbone=backbone, num_classes=entry["num_classes"],
                                    class_names=entry["class_names"])


def _class_names(model_classes):
    if model_classes is None:
        return MODEL_CLASSES
    names = tuple(cls if isinstance(cls, str) else cls.__name__ for cls in model_classes)
    unknown = [name for name in names if name not in MODEL_CLASSES]
    if unknown or not names:
        raise ValueError(f"`model_classes` names model classes among {MODEL_CLASSES}. Received: "
                         f"model_classes={model_classes!r}")
    return names


def _spelled(names):
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


def _locate(source, value, entry):
    """`(format, local path)` of a resolved handle, downloading what a hub repository holds."""
    if source == "registry":
        return hub_files(entry["source"], entry["revision"], entry["sha256"], entry["format"])
    if source == "hub":
        return hub_files(value)
    if source == "kaggle":
        value = kaggle_directory(value)
    return detect_format(value), value


def check_model_handle(handle):
    """Refuse, before any work and without downloading, a handle that cannot name a model.

    A missing path, an unknown name, a malformed `hf://` / `kaggle://`
    handle, a pickle, an unrecognised file or a damaged `.keras` archive is
    refused here, so a command can check its model before it checks images
    or starts a long job. A hub handle is only parsed.

    Args:
        handle: str or path-like.

    Returns:
        The format name of a local handle (a key of `READ_FORMATS`), else `None`.
    """
    source, value, _ = resolve(handle)
    if source != "local":
        return None
    name = detect_format(value)
    if READ_FORMATS[name].check is not None:
        READ_FORMATS[name].check(value)
    return name


def _adapt(model, target, image_size, num_classes):
    classes = class_table()
    is_classifier = isinstance(model, classes["ViTClassifier"])
    if target == "backbone" and is_classifier:
        model, is_classifier = model.backbone, False
    backbone = model.backbone if is_classifier else model
    if image_size is not None and tuple(backbone.image_size) != image_size:
        model = model.with_image_size(image_size)
    if target == "classifier" and num_classes is not None:
        if not is_classifier:
            model = classes["ViTClassifier"](backbone=model, num_classes=num_classes)
        elif model.num_classes != num_classes:
            model = model.with_head(num_classes)
    return model


def load_model(handle, model_classes=None, *, purpose="load_model", target=None, image_size=None, num_classes=None,
               include_head=True, load_weights=True, converted_only=False, **options):
    """Read a model from any handle: the one way keras_vit reads a model.

    Args:
        handle: str or path-like. A registry name, `hf://org/repo[@rev]`,
            `kaggle://owner/model/framework/variation[/version]`, a directory
            (keras_vit preset, Hugging Face, timm or keras-hub) or a file
            (`.keras`, timm `.safetensors`, Google `.npz`); see
            `keras_vit.presets.formats.READ_FORMATS`.
        model_classes: tuple of model classes or class names, or `None`.
            The classes of stored model the caller can use (`None`: any of
            ViTClassifier, ViTBackbone, MaskedPatchPredictor). Another class
            is refused with a message naming what was found and what
            `purpose` takes.
            Called `kinds` before; that keyword still works, with a
            `DeprecationWarning`.
        purpose: str. Who asks (`"keras-vit predict"`, `"from_preset"`),
            named in errors.
        target: `None`, `"classifier"` or `"backbone"`. `None` returns the
            model as stored; `"backbone"` its backbone (of a classifier or a
            masked patch predictor); `"classifier"` a classifier (a backbone
            gets a new head when `num_classes` is given).
        image_size: int, pair or `None`. Input size; another size than the
            stored one resamples the learned position embeddings.
        num_classes: int or `None`. With `target="classifier"`, a new
            zero-initialised head with this many classes when the stored one
            has another count (or none).
        include_head: bool. Converted checkpoints: build the head too.
        load_weights: bool. `False` builds the architecture with random
            weights (for a registry name, without downloading anything).
        converted_only: bool. Refuse keras_vit's own formats (a preset, a
            `.keras` file): `load_checkpoint` converts, it does not load.
        **options: Converter options of converted checkpoints
            (`interpolation`, `antialias`, `num_heads`, `activation`,
            `allow_non_finite`, ...); refused for keras_vit's own formats,
            which are read as saved.

    Returns:
        A `ViTClassifier`, `ViTBackbone` or `MaskedPatchPredictor`.

    Raises:
        ArgumentError: a handle that names nothing, or a model of a class
            `purpose` cannot use (the caller's input).
        ValueError: a file that is damaged, a pickle, or not what it claims.
    """
    # The argument's former name is still taken, with a warning (the word now means an ownership marker's).
    model_classes = renamed_argument(options, "kinds", "model_classes", model_classes, "load_model")
    names = _class_names(model_classes)
    if target is not None and target not in LOAD_TARGETS:
        raise ValueError(f"`target` must be one of {LOAD_TARGETS} or None. Received: target={target!r}")
    if image_size is not None:
        image_size = to_pair(image_size, "image_size")
    if num_classes is not None:
        if target != "classifier":
            raise ValueError("`num_classes` is an argument of ViTClassifier.from_preset; a backbone has no head.")
        if not isinstance(num_classes, int) or isinstance(num_classes, bool) or num_classes <= 0:
            raise ValueError(f"`num_classes` must be a positive int. Received: num_classes={num_classes!r}")
    source, value, entry = resolve(handle)
    where = os.fspath(handle)
    if entry is not None and target == "classifier" and entry["num_classes"] is None and num_classes is None:
        raise ValueError(
            f"The preset {handle!r} is a pre-trained backbone without a classification head. Pass "
            f"`num_classes=` to attach a new zero-initialised head, or use ViTBackbone.from_preset({handle!r})."
        )

    if source == "registry" and not load_weights and not options:
        model = _build_registry_model(entry, image_size)
    else:
        fmt, path = _locate(source, value, entry)
        row = READ_FORMATS[fmt]
        if converted_only and not row.converted:
            raise ArgumentError(
                f"{where} is {row.description}: not a checkpoint to convert. Read it with "
                f"`keras_vit.presets.load_model({where!r})` (or `ViTClassifier.from_preset`)."
            )
        if options and not row.converted:
            raise ArgumentError(
                f"{', '.join(sorted(options))} apply to converted checkpoints; {where} is {row.description}, "
                "read as it was saved."
            )
        # A registry entry without a head (num_classes None) may still name a file that carries
        # an unusable one (timm's R50+ViT-B/16 in21k keeps its head but not its pre-logits layer).
        include_head = include_head and (entry is None or entry["num_classes"] is not None)
        # What the registry knows and the checkpoint's files do not say (CLIP's quick-GELU), the
        # reader is told, so the weights load into the architecture `load_weights=False` builds.
        decided = {key: entry["config"][key] for key in entry.get("registry_decides", ())} if entry else {}
        model = row.read(path, image_size=image_size, include_head=include_head, load_weights=load_weights,
                         where=where, **{**decided, **options})
        if entry is not None and load_weights:
            _check_against_entry(model, entry, handle, image_size)
        if entry is not None and entry["class_names"] and getattr(model, "num_classes", None) == entry["num_classes"]:
            model.class_names = entry["class_names"]

    found = type(model).__name__
    if found not in names:
        hint = ""
        if names == ("MaskedPatchPredictor",):
            hint = (f" For masked patch prediction, wrap a backbone: "
                    f"MaskedPatchPredictor(ViTBackbone.from_preset({where!r})).")
        raise ArgumentError(f"{where} holds a {found}; {purpose} takes a {_spelled(names)}.{hint}")
    if target is None:
        return model if image_size is None or found == "MaskedPatchPredictor" else _adapt(model, None, image_size, None)
    if found == "MaskedPatchPredictor":
        model = model.backbone  # its pre-trained encoder
    if target == "classifier" and not hasattr(model, "num_classes") and num_classes is None:
        raise ArgumentError(
            f"{where} holds a backbone without a classification head; {purpose} takes a ViTClassifier. Pass "
            "`num_classes=` to attach a new zero-initialised head, or use ViTBackbone.from_preset."
        )
    return _adapt(model, target, image_size, num_classes)


def _target_name(target):
    if isinstance(target, str):
        if target not in LOAD_TARGETS:
            raise ValueError(f"`target` must be one of {LOAD_TARGETS} or a model class. Received: target={target!r}")
        return target
    names = {"ViTClassifier": "classifier", "ViTBackbone": "backbone"}
    if getattr(target, "__name__", None) in names:
        return names[target.__name__]
    return target.__name__


def load_preset(handle, target="classifier", image_size=None, num_classes=None, load_weights=True):
    """Load a model from any preset handle: `from_preset`'s reader, a thin user of `load_model`.

    Args:
        handle: str. See `keras_vit.presets.handles`.
        target: `"classifier"`, `"backbone"` or the model class asking.
        image_size: int, pair or `None`. Input size; a different size
            resamples the learned position embeddings of the patch grid.
        num_classes: int or `None`. A new zero-initialised head with this
            many classes (classifier only); `None` keeps the released head.
        load_weights: bool. `False` builds the architecture with random
            weights (for the registry, without downloading anything).

    Returns:
        A `ViTClassifier`, `ViTBackbone` (or `MaskedPatchPredictor` from a
        preset saved from one).
    """
    target = _target_name(target)
    if target in LOAD_TARGETS:
        return load_model(handle, purpose=f"{'ViTClassifier' if target == 'classifier' else 'ViTBackbone'}"
                          ".from_preset", target=target, image_size=image_size, num_classes=num_classes,
                          load_weights=load_weights)
    if num_classes is not None:
        raise ValueError(f"`num_classes` is an argument of ViTClassifier.from_preset, not of {target}.from_preset.")
    return load_model(handle, model_classes=(target,), purpose=f"{target}.from_preset", image_size=image_size,
                      load_weights=load_weights)


def _check_against_entry(model, entry, name, image_size):
    if image_size is not None and to_pair(image_size, "image_size") != to_pair(entry["image_size"], "image_size"):
        return
    count = model.count_params()
    if count != entry["params"]:
        raise ValueError(
            f"The checkpoint downloaded for preset {name!r} ({entry['source']}) has {count:,} parameters where "
            f"the registry expects {entry['params']:,}: the repository changed. Pin a revision or report it."
        )


# `keras_vit.convert.load_checkpoint` reads through this module's reader; `convert` lies below
# `presets` and never imports it, so the reader is handed down here (see `convert/loader.py`).
set_checkpoint_reader(load_model)
