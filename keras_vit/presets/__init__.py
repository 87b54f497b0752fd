"""Pretrained presets: the registry, `from_preset` / `save_to_preset`, download and cache.

>>> keras_vit.presets.list()              # names of the registered presets
>>> keras_vit.presets.get("vit_b16_in21k_ft_in1k")["description"]
>>> model = keras_vit.ViTClassifier.from_preset("vit_b16_in21k_ft_in1k")
>>> model = keras_vit.presets.load_model("model.keras", model_classes=("ViTClassifier",), purpose="my script")

`load_model` is the one reader of every model handle; its table of formats
is `keras_vit.presets.formats.READ_FORMATS`.
"""

import copy as _copy

from keras_vit.presets.hub import cache_dir
from keras_vit.presets.imagenet import decode_predictions, imagenet_classes
from keras_vit.presets.keras_vit_format import save_to_preset, validate_config
from keras_vit.presets.load import check_model_handle, load_model, load_preset
from keras_vit.presets.registry import PRESETS


def list(with_head=None):  # noqa: A001 - the public name the issue asks for
    """Names of the registered presets, sorted.

    Args:
        with_head: bool or `None`. `True` lists presets with a classification
            head, `False` the headless backbones, `None` all of them.

    Returns:
        A list of str.
    """
    names = sorted(PRESETS)
    if with_head is None:
        return names
    return [name for name in names if (PRESETS[name]["num_classes"] is not None) == with_head]


def get(name):
    """A copy of the registry entry of preset `name` (see `registry.py` for its fields)."""
    if name not in PRESETS:
        raise ValueError(f"Unknown preset {name!r}. Known presets: {', '.join(sorted(PRESETS))}.")
    return _copy.deepcopy(PRESETS[name])


__all__ = [
    "PRESETS", "cache_dir", "check_model_handle", "decode_predictions", "get", "imagenet_classes", "list",
    "load_model", "load_preset",
    "save_to_preset", "validate_config",
]
