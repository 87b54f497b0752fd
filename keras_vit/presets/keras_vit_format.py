"""The keras_vit preset format: write it, check it, read it.

A preset directory holds `config.json` (`{"format_version", "class_name",
"config"}`), `model.weights.h5` (HDF5, never a pickle) and `metadata.json`
(versions, parameter count, date, and any extra fields such as
`class_names`). The config is checked by the model constructors themselves
(one source of truth), before any variable is created; errors name the file.
"""

import contextlib
import datetime
import json
import os
import platform
import time
import warnings

import keras
import numpy as np

from keras_vit.convert.io import CONFIG_FILE
from keras_vit.models import MaskedPatchPredictor, ViTBackbone, ViTClassifier
from keras_vit.models.vit_classifier import check_class_names
from keras_vit.utils.checks import check_weights_file
from keras_vit.utils.files import Destination, claim, quote, read_json_object, write_json_file, write_model_file
from keras_vit.utils.image_resize import EVAL_TRANSFORM

WEIGHTS_FILE = "model.weights.h5"
METADATA_FILE = "metadata.json"
FORMAT_VERSION = 1
KERAS_VIT_FILES = (CONFIG_FILE, METADATA_FILE, WEIGHTS_FILE)
# The kind recorded in a preset directory's ownership marker (keras_vit.utils.files).
PRESET_KIND = "preset"


def model_classes():
    return {"ViTBackbone": ViTBackbone, "ViTClassifier": ViTClassifier, "MaskedPatchPredictor": MaskedPatchPredictor}


def validate_config(document, where="config.json"):
    """Check the structure of a keras_vit `config.json` document.

    The values are checked by the model constructors when `build_preset_model`
    runs (before any variable is created).

    Args:
        document: dict. The parsed file: `{"format_version", "class_name",
            "config"}`.
        where: str. Named in error messages.

    Returns:
        `(class_name, config)`.

    Raises:
        ValueError: naming the first problem found.
    """
    version = document.get("format_version")
    if version != FORMAT_VERSION:
        raise ValueError(
            f"{where}: unsupported keras_vit preset format_version {version!r} (this keras_vit reads "
            f"{FORMAT_VERSION}). Upgrade keras_vit, or re-save the model with `save_to_preset`."
        )
    classes = model_classes()
    class_name = document.get("class_name")
    if class_name not in classes:
        raise ValueError(f"{where}: `class_name` must be one of {sorted(classes)}. Received: class_name={class_name!r}")
    config = document.get("config")
    if not isinstance(config, dict):
        raise ValueError(f"{where}: `config` must be a JSON object. Received: {type(config).__name__}")
    if class_name != "ViTBackbone":
        backbone = config.get("backbone")
        # Only a ViTBackbone is deserialized here: a preset never builds arbitrary Keras objects.
        if not (isinstance(backbone, dict) and backbone.get("class_name") == "ViTBackbone"
                and isinstance(backbone.get("config"), dict)):
            raise ValueError(f"{where}: `backbone` must be a serialized ViTBackbone. Received: {str(backbone)[:200]}")
    return class_name, config


def build_preset_model(class_name, config, where):
    """Build the model a checked document describes; constructor errors name the file."""
    try:
        return model_classes()[class_name].from_config(config)
    except (ValueError, TypeError) as error:
        raise ValueError(f"{where}: {error}") from error


def document_of(model):
    """The `config.json` document of a keras_vit model."""
    classes = model_classes()
    class_name = next((name for name, cls in classes.items() if type(model) is cls), None)
    if class_name is None:
        raise ValueError(
            f"`save_to_preset` saves a {', '.join(sorted(classes))}. Received: {type(model).__name__}"
        )
    config = model.get_config()
    if "backbone" in config:
        config["backbone"] = {"class_name": "ViTBackbone", "config": model.backbone.get_config()}
    return {"format_version": FORMAT_VERSION, "class_name": class_name, "config": config}


def _json_default(value):
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _check_json_metadata(info):
    for key, value in info.items():
        try:
            json.dumps(value, default=_json_default)
        except (TypeError, ValueError) as error:
            raise ValueError(
                f"The metadata field {key!r} cannot be written to {METADATA_FILE}: {error}. Pass JSON values "
                f"(str, int, float, bool, None, lists and dicts of them). Received: {key}={value!r}"
            ) from None


def _warn_if_another_model(directory, document):
    """Warn when a save replaces a preset of ours that holds a different model."""
    try:
        with open(os.path.join(directory, CONFIG_FILE), encoding="utf-8") as file:
            previous = json.load(file)
    except (OSError, ValueError):
        return
    if previous != json.loads(json.dumps(document, default=_json_default)):  # tuples read back as lists
        described = previous.get("class_name") if isinstance(previous, dict) else "an unreadable config"
        warnings.warn(
            f"Replacing the preset in {quote(directory)} ({described}) by a different model; the old one "
            "is gone once the save completes.", UserWarning, stacklevel=3,
        )


@contextlib.contextmanager
def optimizer_set_aside(model):
    """Within the block, `model` saves as a model for use: its weights, without the optimizer's state.

    Keras writes a compiled model's optimizer variables (AdamW's two moments
    per weight, the iteration count) next to its weights in
    `save_weights` and `save`: a fine-tuned ViT-Ti preset held 10,976,649
    values beside its 5,488,324 weights. A preset or a `.keras` meant for
    use holds the model only; the epoch checkpoint of a run keeps the
    optimizer to resume. The model is also saved as not compiled, so that
    loading it does not build a new optimizer and then warn that the file
    has no state for it. Both are restored after the block.
    """
    optimizer, compiled = getattr(model, "optimizer", None), getattr(model, "compiled", False)
    if optimizer is None:
        yield model
        return
    model.optimizer, model.compiled = None, False
    try:
        yield model
    finally:
        model.optimizer, model.compiled = optimizer, compiled


def save_to_preset(model, directory, **metadata):
    """Write `model` as a keras_vit preset: config.json, model.weights.h5, metadata.json.

    The directory is written under a temporary name and swapped into place,
    so it is either the old preset or the new one, never half written, even
    if the process is killed.

    Args:
        model: `ViTBackbone`, `ViTClassifier` or `MaskedPatchPredictor`.
        directory: str, or the `keras_vit.utils.files.Destination` a command
            claimed at its start. Created if missing; an existing preset that
            keras_vit wrote is replaced. A directory holding anything else (a user's
            files, another model) is refused before anything is written.
        **metadata: Extra JSON-serializable fields for `metadata.json`.
            `class_names=[...]` (or `"imagenet-1k"`) also names the classes
            of a classifier that has none in its config.
    """
    import keras_vit

    document = document_of(model)
    config = document["config"]
    if metadata.get("class_names") is not None and "class_names" in config and config["class_names"] is None:
        config["class_names"] = check_class_names(metadata["class_names"], model.num_classes)
    if config.get("class_names") is not None:
        metadata.setdefault("class_names", config["class_names"])
    info = {
        "format_version": FORMAT_VERSION,
        "class_name": document["class_name"],
        "keras_vit_version": keras_vit.__version__,
        "keras_version": keras.__version__,
        "backend": keras.backend.backend(),
        "python_version": platform.python_version(),
        "parameter_count": int(model.count_params()),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "image_transform": dict(EVAL_TRANSFORM),
        **metadata,
    }
    _check_json_metadata(info)
    # Only a directory keras_vit wrote as a preset is replaced: a user's own
    # files (a config.json of another project, notes, data, a model card they
    # edited) are never touched. A command claimed its output at its start and hands the claim down.
    destination = directory if isinstance(directory, Destination) else claim(directory, PRESET_KIND,
                                                                             argument="directory")
    directory = destination.path
    if os.path.isdir(directory):
        _warn_if_another_model(directory, document)
    with destination.directory() as staging:
        write_json_file(os.path.join(staging, CONFIG_FILE), document, indent=2, default=_json_default)
        with optimizer_set_aside(model):  # the model's weights only, not the optimizer's state
            write_model_file(model, os.path.join(staging, WEIGHTS_FILE), weights_only=True)
        write_json_file(os.path.join(staging, METADATA_FILE), info, indent=2, default=_json_default)


def load_preset_directory(path, *, load_weights=True, where=None, **options):
    """Read a preset as it was saved (the `keras_vit` row of `keras_vit.presets.formats.READ_FORMATS`).

    The size and head options of other formats do not apply: `from_preset`
    adapts the loaded model afterwards.
    """
    return load_keras_vit(path, load_weights, where or path)


# A save replaces the whole directory in one step (utils/files.py), but a load reads its files one by one and
# may straddle a save: the config of one, the weights of the next. The directory's identity is read before and
# after; where it changed, the load reads again, so it returns the old preset or the new one, whole. A writer
# that saves without pause could keep a load reading again; past READ_PATIENCE seconds the load says so.
READ_PATIENCE = 120.0


def _identity(directory):
    try:
        status = os.stat(directory)
    except OSError:
        return None
    return status.st_dev, status.st_ino


def load_keras_vit(directory, load_weights, where):
    """Read a keras_vit preset directory into a model: one save's files, read again if a save swapped them."""
    deadline = time.monotonic() + READ_PATIENCE
    while True:
        before = _identity(directory)
        try:
            model = _read_keras_vit(directory, load_weights, where)
        except (OSError, ValueError):
            if _identity(directory) == before or time.monotonic() > deadline:
                raise  # the files themselves are at fault, not a save beside the load
        else:
            if _identity(directory) == before:
                return model
        if time.monotonic() > deadline:
            raise ValueError(f"The preset {where} was saved again and again for {READ_PATIENCE:.0f} s while it "
                             "was read; load it once its writer is done.")
        time.sleep(0.01)  # a save beside this load: read the new directory once it is in place


def _read_keras_vit(directory, load_weights, where):
    config_path = os.path.join(directory, CONFIG_FILE)
    weights_path = os.path.join(directory, WEIGHTS_FILE)
    missing = [name for name in (CONFIG_FILE, WEIGHTS_FILE if load_weights else None) if name
               and not os.path.exists(os.path.join(directory, name))]
    if missing:
        raise ValueError(f"The keras_vit preset {where} lacks {missing} (expected {list(KERAS_VIT_FILES)}).")
    file_name = f"{where}/{CONFIG_FILE}"
    class_name, config = validate_config(read_json_object(config_path, where), where=file_name)
    metadata_path = os.path.join(directory, METADATA_FILE)
    metadata = read_json_object(metadata_path, where) if os.path.exists(metadata_path) else {}
    if load_weights:
        try:
            check_weights_file(weights_path)
        except ValueError as error:
            raise ValueError(f"The preset {where} is damaged: {error} Save it again with `save_to_preset`.") from None
    model = build_preset_model(class_name, config, file_name)
    if load_weights:
        try:
            model.load_weights(weights_path)
        except (ValueError, KeyError) as error:
            raise ValueError(f"The weights in {weights_path} do not fit the model described by its "
                             f"{CONFIG_FILE}: {error}") from error
    return model
