"""`load_checkpoint`, and the loaders that `convert.formats.FORMATS` names for the converted formats.

Every loader takes `(path, *, image_size=None, include_head=True,
load_weights=True, where=None, **options)` and returns a keras_vit model.
"""

import os

from keras_vit.convert.formats import FORMATS, detect_format
from keras_vit.convert.google import from_npz_vit, is_npz_hybrid
from keras_vit.convert.hybrid import from_npz_hybrid, from_timm_hybrid
from keras_vit.convert.io import PICKLE_SUFFIXES, pickle_refusal, read_npz, read_safetensors_with_metadata
from keras_vit.convert.timm import from_timm_vit, is_timm_hybrid
from keras_vit.utils.files import read_json_object

_SAFETENSORS_NAMES = ("model.safetensors", "open_clip_model.safetensors")


def from_timm(state_dict, **options):
    """Build a keras_vit model from a timm ViT state dict, plain or hybrid.

    A hybrid (a ResNet stem under `patch_embed.backbone.`) goes to
    `keras_vit.convert.hybrid.from_timm_hybrid`, which builds on the plain
    mapping; anything else to `keras_vit.convert.timm.from_timm_vit`, whose
    docstring lists the arguments (`config`, `image_size`, `interpolation`,
    `antialias`, `include_head`, `source_image_size`, `allow_non_finite`,
    and model arguments that replace inferred ones).
    """
    if is_timm_hybrid(state_dict):
        return from_timm_hybrid(state_dict, **options)
    return from_timm_vit(state_dict, **options)


def from_npz(arrays, **options):
    """Build a keras_vit model from a Google `.npz` checkpoint, plain or hybrid.

    A hybrid (a ResNet root conv) goes to `keras_vit.convert.hybrid.from_npz_hybrid`;
    anything else to `keras_vit.convert.google.from_npz_vit` (see it for the
    arguments).
    """
    if is_npz_hybrid(arrays):
        return from_npz_hybrid(arrays, **options)
    return from_npz_vit(arrays, **options)


def _architecture_only(model, load_weights):
    """The model itself, or with `load_weights=False` a fresh copy of its architecture (random weights)."""
    return model if load_weights else model.__class__.from_config(model.get_config())


def load_checkpoint_directory(path, *, load_weights=True, where=None, **options):
    """The `huggingface` row's loader (and a timm hub directory's): config.json + model.safetensors."""
    return _architecture_only(_load_directory(path, detect_format(path), **options), load_weights)


def load_timm_checkpoint(path, *, load_weights=True, where=None, **options):
    """The `timm` row's loader: a hub directory or a `.safetensors` state dict (or `export_timm`'s file)."""
    from keras_vit.convert.huggingface import is_huggingface_state_dict
    from keras_vit.convert.timm import timm_config_from_metadata

    if os.path.isdir(path):
        return load_checkpoint_directory(path, load_weights=load_weights, **options)
    state_dict, metadata = read_safetensors_with_metadata(path)
    config = timm_config_from_metadata(metadata)
    sibling = os.path.join(os.path.dirname(path), "config.json")
    if config is None and os.path.basename(path) in _SAFETENSORS_NAMES and os.path.exists(sibling):
        return load_checkpoint_directory(os.path.dirname(path) or ".", load_weights=load_weights, **options)
    if is_huggingface_state_dict(state_dict):
        raise ValueError(
            f"{path} holds Hugging Face ViT weights; pass the directory with its config.json "
            "(the config carries the head count and epsilon)."
        )
    return _architecture_only(from_timm(state_dict, config=config, **options), load_weights)


def load_npz_checkpoint(path, *, load_weights=True, where=None, **options):
    """The `npz` row's loader: Google's vision_transformer or big_vision `.npz`."""
    return _architecture_only(from_npz(read_npz(path), **options), load_weights)


def load_kerashub_checkpoint(path, *, image_size=None, include_head=True, load_weights=True, where=None,
                             activation="softmax", **resampling):
    """The `kerashub` row's loader: a keras-hub ViT preset directory (its own image converter's size)."""
    from keras_vit.convert.kerashub import load_kerashub_preset

    model = load_kerashub_preset(path, include_head=include_head, image_size=image_size, activation=activation)
    return _architecture_only(model, load_weights)


def _load_directory(directory, fmt, **kwargs):
    from keras_vit.convert.huggingface import from_huggingface

    config_path = os.path.join(directory, "config.json")
    weights_path = next(
        (os.path.join(directory, n) for n in _SAFETENSORS_NAMES if os.path.exists(os.path.join(directory, n))), None
    )
    if weights_path is None:
        pickles = [n for n in sorted(os.listdir(directory)) if n.endswith(PICKLE_SUFFIXES)]
        if pickles:
            raise pickle_refusal(os.path.join(directory, pickles[0]))
        raise ValueError(
            f"{directory} has no model.safetensors. A checkpoint directory needs config.json and "
            "model.safetensors (Hugging Face or timm hub layout). Sharded checkpoints are not supported."
        )
    if not os.path.exists(config_path):
        raise ValueError(f"{directory} has model.safetensors but no config.json; pass the .safetensors file instead.")
    config = read_json_object(config_path)
    state_dict, _ = read_safetensors_with_metadata(weights_path)
    if fmt == "huggingface":
        processor_path = os.path.join(directory, "preprocessor_config.json")
        processor = read_json_object(processor_path) if os.path.exists(processor_path) else None
        return from_huggingface(config, state_dict, preprocessor_config=processor, **kwargs)
    return from_timm(state_dict, config=config, **kwargs)


def load_checkpoint(
    source, *, image_size=None, interpolation="bicubic", antialias=True, include_head=True, **overrides
):
    """Load a timm, Hugging Face or Google ViT checkpoint as a keras_vit model.

    The format is recognised from `source` by
    `keras_vit.convert.formats.detect_format`:

    - a `.safetensors` file: a timm state dict (or the output of
      `export_timm`); a Hugging Face state dict is recognised by its names;
    - a directory with `config.json` and `model.safetensors`: a Hugging Face
      `transformers` ViT (with `preprocessor_config.json` when present) or a
      timm hub checkpoint (its config has `architecture`);
    - a `.npz` file: the original Google `vision_transformer` release
      (including `opt/target/` prefixed files) or big_vision.

    PyTorch pickles (`.bin`, `.pth`, `.pt`, `.ckpt`) are refused; the error
    says how to convert them to safetensors.

    Args:
        source: str or path-like. File or directory.
        image_size: int, pair or `None`. Build the model for this image
            size, resampling the position embedding. Defaults to the
            checkpoint's own size.
        interpolation: str. `"bicubic"` or `"bilinear"` resampling.
            Defaults to `"bicubic"`.
        antialias: bool. Antialiased resampling (timm's default for state
            dicts). Defaults to `True`.
        include_head: bool. Return a `ViTClassifier` when the checkpoint has
            a classification head, else a `ViTBackbone`. Defaults to `True`.
        **overrides: Model arguments that replace inferred ones (e.g.
            `num_heads` for a checkpoint whose width is not a standard one,
            `pixel_mean`/`pixel_std`, `activation=None`).

    Returns:
        A `ViTClassifier` or a `ViTBackbone`. Like every ViTClassifier, the
        classifier outputs probabilities (`activation="softmax"`); pass
        `activation=None` for the logits the source library computes. Both
        carry the checkpoint's pixel preprocessing: feed raw [0, 255] images.
    """
    path = os.fspath(source)
    row = FORMATS[detect_format(path)]
    if row.load_instead:
        raise ValueError(f"{path} is {row.description}: not a checkpoint to convert. Load it with "
                         f"{row.load_instead.format(path=repr(path))}.")
    return row.load(path, image_size=image_size, interpolation=interpolation, antialias=antialias,
                    include_head=include_head, **overrides)
