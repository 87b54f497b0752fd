"""`load_checkpoint`: one entry point that recognises the checkpoint format."""

import os

from keras_vit.convert.formats import detect_format
from keras_vit.convert.io import PICKLE_SUFFIXES, pickle_refusal, read_npz, read_safetensors_with_metadata
from keras_vit.utils.files import read_json_object

_SAFETENSORS_NAMES = ("model.safetensors", "open_clip_model.safetensors")


def _load_directory(directory, fmt, **kwargs):
    from keras_vit.convert.huggingface import from_huggingface
    from keras_vit.convert.timm import from_timm

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
    from keras_vit.convert.google import from_npz
    from keras_vit.convert.huggingface import from_huggingface, is_huggingface_state_dict
    from keras_vit.convert.timm import from_timm, timm_config_from_metadata

    kwargs = dict(
        image_size=image_size, interpolation=interpolation, antialias=antialias, include_head=include_head, **overrides
    )
    path = os.fspath(source)
    fmt = detect_format(path)
    if fmt == "keras_vit":
        raise ValueError(
            f"{path} is a keras_vit preset, not a checkpoint to convert; load it with "
            f"`keras_vit.ViTClassifier.from_preset({path!r})` (or ViTBackbone.from_preset)."
        )
    if fmt == "kerashub":
        from keras_vit.convert.kerashub import load_kerashub_preset

        return load_kerashub_preset(path, include_head=include_head, image_size=image_size,
                                    activation=overrides.get("activation", "softmax"))
    if os.path.isdir(path):
        return _load_directory(path, fmt, **kwargs)
    if fmt == "npz":
        return from_npz(read_npz(path), **kwargs)
    if fmt == "timm":
        state_dict, metadata = read_safetensors_with_metadata(path)
        config = timm_config_from_metadata(metadata)
        sibling = os.path.join(os.path.dirname(path), "config.json")
        if config is None and os.path.basename(path) in _SAFETENSORS_NAMES and os.path.exists(sibling):
            directory = os.path.dirname(path) or "."
            return _load_directory(directory, detect_format(directory), **kwargs)
        if is_huggingface_state_dict(state_dict):
            raise ValueError(
                f"{path} holds Hugging Face ViT weights; pass the directory with its config.json "
                "(the config carries the head count and epsilon)."
            )
        return from_timm(state_dict, config=config, **kwargs)
