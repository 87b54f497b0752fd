"""The one place that decides what a checkpoint is.

`load_checkpoint`, the preset loader (`from_preset`) and the CLI's help all
ask `detect_format` / `detect_config_format`, so a path is recognised by one
set of rules everywhere.
"""

import os

from keras_vit.convert.io import PICKLE_SUFFIXES, pickle_refusal
from keras_vit.utils.files import read_json_object

# Format name -> what it is, in the words the CLI help and errors use.
FORMATS = {
    "keras_vit": "a keras_vit preset directory (config.json + model.weights.h5 + metadata.json, from save_to_preset)",
    "huggingface": "a Hugging Face transformers ViT directory (config.json with model_type + model.safetensors)",
    "timm": "a timm checkpoint: a .safetensors state dict, or a hub directory (config.json with architecture "
    "+ model.safetensors)",
    "npz": "a Google vision_transformer / big_vision .npz checkpoint",
    "kerashub": "a keras-hub ViT preset directory (config.json naming keras_hub>ViTBackbone + model.weights.h5)",
}
CONFIG_FILE = "config.json"
KERAS_VIT_FILES = ("config.json", "model.weights.h5", "metadata.json")


KERAS_FILE_SUFFIX = ".keras"


def is_keras_file(handle):
    """True when `handle` names a whole-model `.keras` file (an existing file, not a directory)."""
    handle = os.fspath(handle)
    return handle.lower().endswith(KERAS_FILE_SUFFIX) and not os.path.isdir(handle)


def load_keras_file(path, kinds=None, purpose="keras_vit"):
    """A model from a whole-model `.keras` file: the one way every command and workflow reads one.

    The file is checked first (a missing, empty, truncated or non-zip file
    gets an error naming it; Keras itself calls a truncated file "not
    found"), then loaded in Keras' safe mode (no Python code from the file
    runs) without its compile state.

    Args:
        path: str or path-like. The `.keras` file.
        kinds: tuple of model classes, or `None` for any. The kinds the
            caller can use; another kind is refused.
        purpose: str. Who asks (e.g. `"predict"`), named in the error.

    Returns:
        The `keras.Model`.

    Raises:
        ArgumentError: no such file (the caller's input).
        ValueError: a damaged file, or a model of another kind.
    """
    import keras

    import keras_vit.models  # noqa: F401  (registers the classes the file names)
    from keras_vit.utils.checks import check_keras_file
    from keras_vit.utils.errors import ArgumentError
    from keras_vit.utils.files import quote

    path = os.fspath(path)
    if not os.path.isfile(path):
        raise ArgumentError(f"No such .keras file: {quote(path)}.")
    check_keras_file(path)
    model = keras.saving.load_model(path, compile=False, safe_mode=True)
    if kinds is not None and not isinstance(model, tuple(kinds)):
        names = " or ".join(kind.__name__ for kind in kinds)
        raise ValueError(f"{quote(path)} holds a {type(model).__name__}; {purpose} takes a {names}.")
    return model


def describe_formats():
    """One line per format, for help texts and error messages."""
    return "\n".join(f"- {name}: {text}" for name, text in FORMATS.items())


def detect_config_format(config, where="config.json"):
    """The format of a checkpoint directory from its parsed `config.json`.

    Args:
        config: dict. The parsed file.
        where: str. Named in the error message.

    Returns:
        `"keras_vit"`, `"huggingface"`, `"timm"` or `"kerashub"`.
    """
    if isinstance(config, dict):
        if str(config.get("registered_name", "")).startswith("keras_hub>"):
            return "kerashub"
        if "format_version" in config and "class_name" in config:
            return "keras_vit"
        if "architecture" in config:
            return "timm"
        if "model_type" in config or "hidden_size" in config:
            return "huggingface"
    raise ValueError(
        f"{where} is not a config keras_vit can load: it is neither a keras_vit preset (format_version + "
        "class_name), a Hugging Face ViT (model_type) nor a timm hub config (architecture)."
    )


def detect_format(path):
    """What the checkpoint at `path` is.

    Args:
        path: str or path-like. A file or a directory.

    Returns:
        One of `FORMATS`: `"keras_vit"`, `"huggingface"`, `"timm"`,
        `"npz"` or `"kerashub"`.

    Raises:
        ValueError: for a missing path, a pickle (never loaded), or
            anything else, naming the formats that are accepted.
    """
    path = os.fspath(path)
    if not os.path.exists(path):
        raise ValueError(f"Checkpoint not found: {path}")
    if os.path.isdir(path):
        names = set(os.listdir(path))
        if CONFIG_FILE in names:
            return detect_config_format(read_json_object(os.path.join(path, CONFIG_FILE)), os.path.join(path, CONFIG_FILE))
        if names & set(KERAS_VIT_FILES):
            return "keras_vit"  # its loader names the missing file
        pickles = sorted(n for n in names if n.lower().endswith(PICKLE_SUFFIXES))
        if pickles:
            raise pickle_refusal(os.path.join(path, pickles[0]))
        raise ValueError(
            f"The directory {path} holds neither a keras_vit preset ({', '.join(KERAS_VIT_FILES)}) nor a "
            f"Hugging Face / timm model (config.json + model.safetensors). Found: {sorted(names) or 'nothing'}."
        )
    lower = path.lower()
    if lower.endswith(PICKLE_SUFFIXES):
        raise pickle_refusal(path)
    if lower.endswith(".npz"):
        return "npz"
    if lower.endswith(".safetensors"):
        return "timm"
    if lower.endswith(KERAS_FILE_SUFFIX):
        raise ValueError(f"{path} is a whole Keras model, not a checkpoint; load it with "
                         f"`keras_vit.convert.formats.load_keras_file({path!r})` or `keras.saving.load_model`.")
    raise ValueError(f"Unrecognised checkpoint {path}. keras_vit loads:\n{describe_formats()}")
