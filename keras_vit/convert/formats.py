"""The one table of checkpoint formats: what each is, how it is recognised, fetched and loaded.

`FORMATS` has a row per format. `detect_format` / `detect_config_format`
ask the rows which one a path is; `load_checkpoint`, `from_preset` (local
paths, hub repositories, registry entries) and the hub download read that
row's loader and file list; help texts print the rows' descriptions. A new
checkpoint source is one converter module plus one row.
"""

import dataclasses
import importlib
import os

from keras_vit.convert.io import PICKLE_SUFFIXES, pickle_refusal
from keras_vit.utils.files import read_json_object

@dataclasses.dataclass(frozen=True)
class CheckpointFormat:
    """One kind of checkpoint keras_vit reads: a row of `FORMATS`.

    Adding a source means one converter module and one row here: detection
    (`detect_format` / `detect_config_format`), the hub download
    (`keras_vit.presets.handles.hub_files`), `load_checkpoint` and
    `from_preset` all read the row.

    Args:
        description: str. What it is, in the words of help texts and errors.
        loader: str. `"module:function"`, imported when first used (so this
            table imports no converter): `function(path, *, image_size=None,
            include_head=True, load_weights=True, where=None, **options)`
            returns a keras_vit model.
        claims_config: callable or `None`. `claims_config(config)` is true
            for the parsed `config.json` of a directory in this format (rows
            are asked in table order, the first claim wins); `None` for
            formats that are single files.
        suffixes: tuple of str. File-name endings of a single-file checkpoint.
        hub_files: tuple of str. What a hub repository must hold besides
            `config.json`; the first is the weights file, the one a registry
            entry pins by sha256. Empty: never read from a hub.
        optional_hub_files: tuple of str. Fetched when the repository has them.
        load_instead: str or `None`. For a format that is already a keras_vit
            model (nothing to convert), how to load it (`{path}` stands for
            the path); `load_checkpoint` refuses it with this hint.
    """

    description: str
    loader: str
    claims_config: object = None
    suffixes: tuple = ()
    hub_files: tuple = ()
    optional_hub_files: tuple = ()
    load_instead: str = None

    def load(self, path, **options):
        """Load the checkpoint at `path` with this row's loader."""
        module_name, function_name = self.loader.split(":")
        return getattr(importlib.import_module(module_name), function_name)(path, **options)


FORMATS = {
    "kerashub": CheckpointFormat(
        "a keras-hub ViT preset directory (config.json naming keras_hub>ViTBackbone + model.weights.h5)",
        "keras_vit.convert.loader:load_kerashub_checkpoint",
        claims_config=lambda config: str(config.get("registered_name", "")).startswith("keras_hub>"),
        hub_files=("model.weights.h5",),
        optional_hub_files=("task.json", "task.weights.h5", "image_converter.json", "preprocessor.json"),
    ),
    "keras_vit": CheckpointFormat(
        "a keras_vit preset directory (config.json + model.weights.h5 + metadata.json, from save_to_preset)",
        # The preset format's reader lives with its writer, in presets; named here, imported on use.
        "keras_vit.presets.keras_vit_format:load_preset_directory",
        claims_config=lambda config: "format_version" in config and "class_name" in config,
        hub_files=("model.weights.h5", "metadata.json"),
        load_instead="`keras_vit.ViTClassifier.from_preset({path})` (or ViTBackbone.from_preset)",
    ),
    "timm": CheckpointFormat(
        "a timm checkpoint: a .safetensors state dict, or a hub directory (config.json with architecture "
        "+ model.safetensors)",
        "keras_vit.convert.loader:load_timm_checkpoint",
        claims_config=lambda config: "architecture" in config,
        suffixes=(".safetensors",),
        hub_files=("model.safetensors",),
    ),
    "huggingface": CheckpointFormat(
        "a Hugging Face transformers ViT directory (config.json with model_type + model.safetensors)",
        "keras_vit.convert.loader:load_checkpoint_directory",
        claims_config=lambda config: "model_type" in config or "hidden_size" in config,
        hub_files=("model.safetensors",),
        optional_hub_files=("preprocessor_config.json",),  # the mean / std of a transformers model
    ),
    "npz": CheckpointFormat(
        "a Google vision_transformer / big_vision .npz checkpoint",
        "keras_vit.convert.loader:load_npz_checkpoint",
        suffixes=(".npz",),
    ),
    "keras": CheckpointFormat(
        "a whole Keras model file (.keras, from model.save), read in safe mode",
        "keras_vit.convert.formats:load_keras_model",
        suffixes=(".keras",),
        load_instead="`keras_vit.convert.formats.load_keras_file({path})` or `keras.saving.load_model`",
    ),
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


def load_keras_model(path, *, where=None, **options):
    """The `keras` row's loader: `load_keras_file` for `from_preset` (any keras_vit model kind)."""
    return load_keras_file(path, purpose=where or "from_preset")


def describe_formats():
    """One line per format, for help texts and error messages."""
    return "\n".join(f"- {name}: {row.description}" for name, row in FORMATS.items())


def detect_config_format(config, where="config.json"):
    """The format of a checkpoint directory from its parsed `config.json`.

    Args:
        config: dict. The parsed file.
        where: str. Named in the error message.

    Returns:
        The name of the first row of `FORMATS` that claims it.
    """
    if isinstance(config, dict):
        for name, row in FORMATS.items():
            if row.claims_config is not None and row.claims_config(config):
                return name
    directories = "\n".join(f"- {name}: {row.description}" for name, row in FORMATS.items() if row.claims_config)
    raise ValueError(f"{where} is not a config keras_vit can load. A checkpoint directory is one of:\n{directories}")


def detect_format(path):
    """What the checkpoint at `path` is.

    Args:
        path: str or path-like. A file or a directory.

    Returns:
        A key of `FORMATS`: `"keras_vit"`, `"huggingface"`, `"timm"`,
        `"npz"`, `"kerashub"` or `"keras"`.

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
            f"The directory {path} holds neither a keras_vit preset ({', '.join(KERAS_VIT_FILES)}) nor another "
            f"checkpoint directory (a {CONFIG_FILE} and its weights). Found: {sorted(names) or 'nothing'}. "
            f"keras_vit loads:\n{describe_formats()}"
        )
    lower = path.lower()
    if lower.endswith(PICKLE_SUFFIXES):
        raise pickle_refusal(path)
    for name, row in FORMATS.items():
        if lower.endswith(row.suffixes):
            return name
    raise ValueError(f"Unrecognised checkpoint {path}. keras_vit loads:\n{describe_formats()}")
