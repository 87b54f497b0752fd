"""`load_preset`: resolve a handle, read its format, build the model, adapt it.

Adapting uses the models' own methods (`with_image_size`, `with_head`), so
the loader never edits serialized configs.
"""

import os

from keras_vit.convert.formats import FORMATS, detect_format
from keras_vit.presets.handles import hub_files, resolve
from keras_vit.presets.keras_vit_format import model_classes
from keras_vit.utils import to_pair

TARGETS = ("classifier", "backbone")


def _build_registry_model(entry, image_size=None):
    classes = model_classes()
    backbone = classes["ViTBackbone"].from_variant(
        entry["variant"], image_size=image_size or entry["image_size"], pixel_mean=entry["pixel_mean"],
        pixel_std=entry["pixel_std"], **entry["config"],
    )
    if entry["num_classes"] is None:
        return backbone
    return classes["ViTClassifier"](backbone=backbone, num_classes=entry["num_classes"],
                                    class_names=entry["class_names"])


def _target_name(target):
    if isinstance(target, str):
        if target not in TARGETS:
            raise ValueError(f"`target` must be one of {TARGETS} or a model class. Received: target={target!r}")
        return target
    names = {"ViTClassifier": "classifier", "ViTBackbone": "backbone"}
    if getattr(target, "__name__", None) in names:
        return names[target.__name__]
    return target.__name__


def _adapt(model, target, image_size, num_classes):
    classes = model_classes()
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


def load_preset(handle, target="classifier", image_size=None, num_classes=None, load_weights=True):
    """Load a model from any preset handle.

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
    if image_size is not None:
        image_size = to_pair(image_size, "image_size")
    if num_classes is not None:
        if target != "classifier":
            raise ValueError("`num_classes` is an argument of ViTClassifier.from_preset; a backbone has no head.")
        if not isinstance(num_classes, int) or isinstance(num_classes, bool) or num_classes <= 0:
            raise ValueError(f"`num_classes` must be a positive int. Received: num_classes={num_classes!r}")
    kind, value, entry = resolve(handle)
    if entry is not None and target == "classifier" and entry["num_classes"] is None and num_classes is None:
        raise ValueError(
            f"The preset {handle!r} is a pre-trained backbone without a classification head. Pass "
            f"`num_classes=` to attach a new zero-initialised head, or use ViTBackbone.from_preset({handle!r})."
        )

    if kind == "registry" and not load_weights:
        model = _build_registry_model(entry, image_size)
    else:
        if kind == "registry":
            fmt, path = hub_files(entry["source"], entry["revision"], entry["sha256"], entry["format"])
        elif kind == "hub":
            fmt, path = hub_files(value)
        elif kind == "kaggle":
            from keras_vit.presets.kaggle import kaggle_directory

            fmt, path = "kerashub", kaggle_directory(value)
        else:
            path = value
            fmt = detect_format(path)
        where = handle if kind != "local" else path
        row = FORMATS[fmt]
        # A registry entry without a head (num_classes None) may still name a file that carries
        # an unusable one (timm's R50+ViT-B/16 in21k keeps its head but not its pre-logits layer).
        include_head = entry is None or entry["num_classes"] is not None
        model = row.load(path, image_size=image_size, include_head=include_head, load_weights=load_weights,
                         where=where)
        if entry is not None and load_weights:
            _check_against_entry(model, entry, handle, image_size)
        if entry is not None and entry["class_names"] and getattr(model, "num_classes", None) == entry["num_classes"]:
            model.class_names = entry["class_names"]
    if target not in TARGETS:
        if type(model).__name__ != target:
            raise ValueError(
                f"{handle!r} holds a {type(model).__name__}, not a {target}. For masked patch prediction, "
                f"wrap a backbone: MaskedPatchPredictor(ViTBackbone.from_preset({os.fspath(handle)!r}))."
            )
        return model
    if type(model).__name__ == "MaskedPatchPredictor":
        model = model.backbone  # its pre-trained encoder
    if target == "classifier" and not hasattr(model, "num_classes") and num_classes is None:
        raise ValueError(
            f"{handle!r} holds a backbone without a classification head. Pass `num_classes=` to attach a new "
            "zero-initialised head, or use ViTBackbone.from_preset."
        )
    return _adapt(model, target, image_size, num_classes)


def _check_against_entry(model, entry, name, image_size):
    if image_size is not None and to_pair(image_size, "image_size") != to_pair(entry["image_size"], "image_size"):
        return
    count = model.count_params()
    if count != entry["params"]:
        raise ValueError(
            f"The checkpoint downloaded for preset {name!r} ({entry['source']}) has {count:,} parameters where "
            f"the registry expects {entry['params']:,}: the repository changed. Pin a revision or report it."
        )
