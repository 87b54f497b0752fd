"""Class names in and out of other libraries' files: Hugging Face `id2label`, timm `label_names`, ImageNet-1k.

keras_vit keeps a classifier's names as `class_names`: a list of str, the
named list `"imagenet-1k"`, or `None`. A 1000-class model without names is
read as ImageNet-1k, as `keras-vit predict` and `decode_predictions` print
it; every export writes those names, so the same photo prints the same
labels in every client.
"""

import functools
import os
import re

# The 1000 ImageNet-1k classes (synset, WordNet lemmas), read by `keras_vit.presets.imagenet` too.
_CLASSES_FILE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "presets",
                             "imagenet_classes.txt")
IMAGENET = "imagenet-1k"
IMAGENET_SIZE = 1000
# The names transformers writes when a model has none (`PretrainedConfig` defaults): not names.
_PLACEHOLDER = re.compile(r"^LABEL_(\d+)$")


@functools.lru_cache(maxsize=1)
def imagenet_classes():
    """The 1000 ImageNet-1k classes in index order, as `(synset, names)` pairs.

    `names` is the comma-separated WordNet lemma list, e.g.
    `("n01440764", "tench, Tinca tinca")`.
    """
    with open(_CLASSES_FILE, encoding="utf-8") as file:
        rows = [line.rstrip("\n").split("\t") for line in file if not line.startswith("#") and line.strip()]
    return tuple((synset, names) for synset, names in rows)


def imagenet_names():
    """The first lemma of each ImageNet-1k class (`"tench"`), as `keras-vit predict` prints them."""
    return [names.split(",")[0] for _, names in imagenet_classes()]


def names_of(classifier):
    """The list of names a classifier's outputs carry in an export, or `None` when it has none.

    Its own list; the ImageNet-1k names for `class_names="imagenet-1k"` and
    for a 1000-class model without names (what `predict` prints for it).
    """
    class_names = getattr(classifier, "class_names", None)
    num_classes = getattr(classifier, "num_classes", None)
    if isinstance(class_names, (list, tuple)):
        return [str(name) for name in class_names]
    if class_names == IMAGENET or (class_names is None and num_classes == IMAGENET_SIZE):
        return imagenet_names()
    return None


def from_names(names, num_classes):
    """`class_names` for a model read from a list of `num_classes` names (index order), or `None`.

    The ImageNet-1k list (by synsets, first lemmas or full lemma lists) is
    kept as `"imagenet-1k"`; placeholders (`LABEL_3`, `"3"`), a list of
    another length or of non-str are no names.
    """
    if names is None or len(names) != num_classes or not all(isinstance(name, str) for name in names):
        return None
    if all(_PLACEHOLDER.match(name) or name == str(index) for index, name in enumerate(names)):
        return None
    if num_classes == IMAGENET_SIZE:
        classes = imagenet_classes()
        for known in ([synset for synset, _ in classes], [lemmas for _, lemmas in classes], imagenet_names()):
            if list(names) == known:
                return IMAGENET
    return list(names)


def from_id2label(id2label, num_classes):
    """`class_names` from a Hugging Face config's `id2label` (`{"0": "cat", ...}`), or `None`.

    transformers writes `LABEL_0 ... LABEL_n` into every config without
    names; those are not names. Keys must be exactly `0 .. num_classes - 1`.
    """
    if not isinstance(id2label, dict):
        return None
    try:
        by_index = {int(key): value for key, value in id2label.items()}
    except (TypeError, ValueError):
        return None
    if sorted(by_index) != list(range(num_classes)):
        return None
    return from_names([by_index[index] for index in range(num_classes)], num_classes)


def from_timm_config(pretrained_cfg, num_classes):
    """`class_names` from a timm `pretrained_cfg`, or `None`.

    timm records names in `label_names` (and a longer text per name in
    `label_descriptions`); a 1000-class checkpoint without them is
    ImageNet-1k by timm's convention (`infer_imagenet_subset`: 1000
    classes, no label offset).
    """
    pretrained_cfg = pretrained_cfg if isinstance(pretrained_cfg, dict) else {}
    label_names = pretrained_cfg.get("label_names")
    if isinstance(label_names, (list, tuple)):
        return from_names(list(label_names), num_classes)
    if num_classes == IMAGENET_SIZE and not pretrained_cfg.get("label_offset"):
        return IMAGENET
    return None
