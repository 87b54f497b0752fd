"""The keras_vit preset format: write it, check it, read it.

A preset directory holds `config.json` (`{"format_version", "class_name",
"config"}`), `model.weights.h5` (HDF5, never a pickle) and `metadata.json`
(versions, parameter count, date, and any extra fields such as
`class_names`). Before a model is built, every file is checked and the
config is checked as a file: each key the format has always carried is
there, with a value its argument rule takes (`CONFIG_KEYS`: the rules of
`keras_vit.utils.values` the constructors apply, or a JSON type). The
relations between values (the heads dividing the width) are checked by the
model constructors themselves, before any variable is created. Every error
names the file, and the key.
"""

import contextlib
import datetime
import functools
import inspect
import json
import os
import platform
import time
import warnings

import keras
import numpy as np

from keras_vit.convert.io import CONFIG_FILE, read_json_file
from keras_vit.layers.activations import ACTIVATIONS
from keras_vit.layers.patch_encoder import POSITION_EMBEDDINGS
from keras_vit.models import MaskedPatchPredictor, ViTBackbone, ViTClassifier
from keras_vit.models.base import dtype_policy_from_config
from keras_vit.models.masked_patch_predictor import TARGETS
from keras_vit.models.vit_classifier import check_class_names
from keras_vit.utils.checks import check_weights_file
from keras_vit.utils.errors import ArgumentError
from keras_vit.writer.files import claim, quote, write_json_file, write_model_file
from keras_vit.utils.image_resize import image_transform
from keras_vit.utils.values import (ALPHA_RULES, IMAGE_INTERPOLATIONS, RESIZE_MODES, check_choice, check_count,
                                    check_number, check_optional_count, check_positive_number, check_rate, is_int,
                                    per_channel, to_pair)

WEIGHTS_FILE = "model.weights.h5"
METADATA_FILE = "metadata.json"
FORMAT_VERSION = 1
KERAS_VIT_FILES = (CONFIG_FILE, METADATA_FILE, WEIGHTS_FILE)
# The kind recorded in a preset directory's ownership marker (keras_vit.writer.files).
PRESET_KIND = "preset"


def model_classes():
    return {"ViTBackbone": ViTBackbone, "ViTClassifier": ViTClassifier, "MaskedPatchPredictor": MaskedPatchPredictor}


def _json_type(test, what):
    """A rule for a value of a JSON type the constructors do not check (or check under another name)."""
    def check(value, name):
        if not test(value):
            raise ValueError(f"`{name}` must be {what}. Received: {name}={value!r}")
    return check


def _or_null(rule):
    return lambda value, name: None if value is None else rule(value, name)


_BOOL = _json_type(lambda value: isinstance(value, bool), "true or false")
_TEXT = _json_type(lambda value: isinstance(value, str), "a string")
_LAYER = _json_type(
    lambda value: value is None or (isinstance(value, dict) and isinstance(value.get("class_name"), str)),
    "null or a serialized Keras layer")
_DTYPE_POLICY = _json_type(lambda value: value is None or isinstance(value, str) or (
    isinstance(value, dict) and isinstance(value.get("class_name"), str) and isinstance(value.get("config"), dict)),
    "null, a dtype policy name or a serialized dtype policy")
_COUNT = check_count


def _is_keras_activation(value):
    try:
        keras.activations.get(value)
    except (ValueError, TypeError):
        return False
    return True


# The classifier passes its `activation` to `keras.layers.Activation`: a name Keras knows.
_ACTIVATION = _json_type(lambda value: isinstance(value, str) and _is_keras_activation(value),
                         "null or the name of a Keras activation (\"softmax\", \"sigmoid\", \"linear\", ...)")
_NUMBER = check_number
_RATE = check_rate
_FRACTION = functools.partial(check_rate, include_one=True)  # the masked patch predictor's rates


# Every key each model has written into config.json since format_version 1, and the rule of its value, one
# of the argument rules of `keras_vit.utils.values` the constructors apply (so a message is the same from a
# file or a call), or a JSON type where a constructor would take any value (a string where a bool belongs
# counts as true) or names the value otherwise (`std`, not `pixel_std`). A key missing would be built with
# the constructor's default (a ViT-B's 12 heads for a ViT-Ti): refused, naming the key. `OPTIONAL_KEYS` may be
# absent (a name, the dtype policy, the class names that came after format 1): their defaults build the same
# weights. Relations between values (heads dividing the width) stay the constructors' to check.
CONFIG_KEYS = {
    "ViTBackbone": {
        "image_size": to_pair, "patch_size": to_pair, "num_channels": _COUNT, "hidden_dim": _COUNT,
        "num_layers": _COUNT, "num_heads": _COUNT, "mlp_dim": _COUNT, "dropout": _RATE, "attention_dropout": _RATE,
        "drop_path_rate": _RATE, "layer_norm_epsilon": check_positive_number, "use_class_token": _BOOL,
        "num_register_tokens": functools.partial(check_count, minimum=0), "position_embedding": lambda value, name: check_choice(value, POSITION_EMBEDDINGS, name),
        "prefix_position_embedding": _BOOL, "layer_scale_init": _or_null(_NUMBER), "use_qkv_bias": _BOOL,
        "final_norm": _BOOL, "pixel_scale": _NUMBER, "pixel_mean": per_channel,
        "pixel_std": functools.partial(per_channel, positive=True), "stem": _LAYER,
    },
    "ViTClassifier": {
        "num_classes": _COUNT, "pooling": lambda value, name: check_choice(value, ("token", "gap", "map"), name), "representation_size": check_optional_count, "pooled_norm": _BOOL,
        "head_dropout": _RATE, "activation": _or_null(_ACTIVATION),
    },
    "MaskedPatchPredictor": {
        "corruption_rate": _FRACTION, "mask_rate": _FRACTION, "random_rate": _FRACTION,
        "target": lambda value, name: check_choice(value, TARGETS, name),
        "color_bits": _COUNT, "seed": _or_null(_json_type(is_int, "an integer")),
    },
}
OPTIONAL_KEYS = {"name": _or_null(_TEXT), "dtype": _DTYPE_POLICY}
# Keys a model's config gained after format 1, absent from the presets written before: their defaults
# build the same weights and the transform every model had then (the evaluation transform of issue 47;
# the parts of later ViT families of issue 48: off, exact GELU).
LATER_KEYS = {
    "ViTBackbone": {
        "resize_mode": lambda value, name: check_choice(value, RESIZE_MODES, name),
        "crop_fraction": functools.partial(check_rate, include_zero=False, include_one=True),
        "interpolation": lambda value, name: check_choice(value, IMAGE_INTERPOLATIONS, name),
        "alpha": lambda value, name: check_choice(value, ALPHA_RULES, name),
        "pre_norm": _BOOL,
        "mlp_activation": lambda value, name: check_choice(value, ACTIVATIONS, name),
        "qk_norm": _BOOL,
        "use_distillation_token": _BOOL,
        "attention_pooling": _BOOL,
    },
}
_RESAVE = "Restore it, or save the model again with `save_to_preset`."


def _default_of(class_name, key):
    parameter = inspect.signature(model_classes()[class_name].__init__).parameters.get(key)
    if parameter is None or parameter.default is inspect.Parameter.empty:
        return "it has no default"
    return f"its default, {parameter.default!r}, would build another model than the one saved"


def _check_keys(config, class_name, where, prefix):
    """Every key of `class_name`'s config present, with a value its rule takes; the first fault is named."""
    for key in CONFIG_KEYS[class_name]:
        if key not in config:
            raise ValueError(f"{where}: `{prefix}{key}` is missing ({class_name}'s {key}: "
                             f"{_default_of(class_name, key)}). The file was edited or damaged. {_RESAVE}")
    def dtype_policy(value, name):  # a name Keras knows, or each entry of a serialized policy (map) a policy
        _DTYPE_POLICY(value, name)
        if isinstance(value, str):
            keras.dtype_policies.get(value)
        elif value is not None:
            dtype_policy_from_config(value, class_name)

    # The models' own rules for the dtype policy and the class names too (cheap: nothing is built).
    rules = {**CONFIG_KEYS[class_name], **LATER_KEYS.get(class_name, {}), **OPTIONAL_KEYS, "dtype": dtype_policy}
    if class_name == "ViTClassifier":
        rules["class_names"] = lambda value, name: check_class_names(value, max(config["num_classes"], 1))
    for key, rule in rules.items():
        if key in config:
            try:
                rule(config[key], key)
            except ValueError as error:
                raise ValueError(f"{where}: {error} (at `{prefix}{key}`). The file was edited or damaged. "
                                 f"{_RESAVE}") from None


def _check_format_version(document, where):
    if "format_version" not in document:
        raise ValueError(f"{where}: `format_version` is missing: a keras_vit preset's config.json starts with "
                         f'"format_version": {FORMAT_VERSION}. {_RESAVE}')
    version = document["format_version"]
    if not is_int(version):
        spelled = (f"the integer {FORMAT_VERSION}, not the string {version!r}" if isinstance(version, str)
                   else f"the integer {FORMAT_VERSION}")
        raise ValueError(f"{where}: `format_version` must be {spelled}. Received: format_version={version!r} "
                         f"({type(version).__name__}). Write {FORMAT_VERSION} without quotes or a decimal point. "
                         f"{_RESAVE}")
    if version > FORMAT_VERSION:
        raise ValueError(
            f"{where}: unsupported keras_vit preset format_version {version!r} (this keras_vit reads "
            f"{FORMAT_VERSION}). Upgrade keras_vit, or re-save the model with `save_to_preset`."
        )
    if version < FORMAT_VERSION:
        raise ValueError(f"{where}: format_version {version!r} was never written by keras_vit (the first is 1). "
                         f"The file was edited or damaged. {_RESAVE}")


def validate_config(document, where="config.json"):
    """Check a keras_vit `config.json` document as a file: its structure, every key, the types of values.

    The values' meaning is checked by the model constructors when
    `build_preset_model` runs (before any variable is created).

    Args:
        document: dict. The parsed file: `{"format_version", "class_name",
            "config"}`.
        where: str. Named in error messages.

    Returns:
        `(class_name, config)`.

    Raises:
        ValueError: naming the file and the first key at fault.
    """
    _check_format_version(document, where)
    classes = model_classes()
    if "class_name" not in document:
        raise ValueError(f"{where}: `class_name` is missing (one of {sorted(classes)}). {_RESAVE}")
    class_name = document["class_name"]
    if not isinstance(class_name, str) or class_name not in classes:
        raise ValueError(f"{where}: `class_name` must be one of {sorted(classes)}. Received: class_name={class_name!r}")
    if "config" not in document:
        raise ValueError(f"{where}: `config` is missing: it holds the model's arguments. {_RESAVE}")
    config = document["config"]
    if not isinstance(config, dict):
        raise ValueError(f"{where}: `config` must be a JSON object. Received: {type(config).__name__}")
    if class_name != "ViTBackbone":
        if "backbone" not in config:
            raise ValueError(f"{where}: `config.backbone` is missing: a {class_name} holds a ViTBackbone. {_RESAVE}")
        backbone = config["backbone"]
        # Only a ViTBackbone is deserialized here: a preset never builds arbitrary Keras objects.
        if not (isinstance(backbone, dict) and backbone.get("class_name") == "ViTBackbone"
                and isinstance(backbone.get("config"), dict)):
            raise ValueError(f"{where}: `backbone` must be a serialized ViTBackbone. Received: {str(backbone)[:200]}")
        _check_keys(backbone["config"], "ViTBackbone", where, "config.backbone.config.")
    _check_keys(config, class_name, where, "config.")
    return class_name, config


def build_preset_model(class_name, config, where):
    """Build the model a checked document describes; constructor errors name the file."""
    try:
        return model_classes()[class_name].from_config(config)
    except (ValueError, TypeError) as error:
        raise ValueError(f"{where}: {error}") from error
    except Exception as error:  # noqa: BLE001 - whatever the constructors raise, the file is named
        raise ValueError(f"{where}: the model it describes cannot be built ({type(error).__name__}: {error}). "
                         f"{_RESAVE}") from error


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
            "is gone once the save completes.", UserWarning, stacklevel=4,  # the caller of save_to_preset
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
        directory: str or path-like. Created if missing; an existing preset
            that keras_vit wrote is replaced. A directory holding anything
            else (a user's files, another model) is refused before anything
            is written.
        **metadata: Extra JSON-serializable fields for `metadata.json`.
            `class_names=[...]` (or `"imagenet-1k"`) also names the classes
            of a classifier that has none in its config.
    """
    _refuse_keras_hub_task(directory)
    # Only a directory keras_vit wrote as a preset is replaced: a user's own files (a config.json of another
    # project, notes, data, a model card they edited) are never touched.
    write_preset(model, claim(directory, PRESET_KIND, argument="directory"), **metadata)


def _refuse_keras_hub_task(directory):
    """Refuse keras-hub's `Task.save_to_preset` of a task whose backbone is keras_vit's, saying what works.

    keras-hub writes its `task.json` into the directory, then calls this
    save of the backbone there; keras-hub cannot load a keras_vit backbone
    back from a preset. The writer's own refusal would blame the user.
    """
    try:
        with open(os.path.join(os.fspath(directory), "task.json"), encoding="utf-8") as file:
            task = json.load(file)
    except (OSError, ValueError):
        return
    if isinstance(task, dict) and str(task.get("registered_name", "")).startswith("keras_hub>"):
        raise ArgumentError(
            f"{{name}} {quote(directory)} holds keras-hub's task files (task.json): keras-hub's "
            "`Task.save_to_preset` is saving a task whose backbone is a keras_vit model, and keras-hub cannot "
            "load a keras_vit backbone from a preset. Save the whole task as one file instead: "
            "`task.save('task.keras')` (it loads with `keras.saving.load_model('task.keras')` once keras_vit and "
            "keras_hub are imported), or the backbone alone with `keras_vit`: "
            "`task.backbone.save_to_preset(another_directory)`.", "directory")


def write_preset(model, destination, **metadata):
    """`save_to_preset` through a claim made before: what `finetune` and `keras-vit quantize` call.

    Args:
        model: `ViTBackbone`, `ViTClassifier` or `MaskedPatchPredictor`.
        destination: the `keras_vit.writer.files.Destination` of the preset
            directory (`claim(path, PRESET_KIND)`), made by the command at
            its start.
        **metadata: as `save_to_preset` takes it.
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
        # The model's own evaluation transform, in words and as its arguments (a masked patch
        # predictor's is its backbone's).
        "image_transform": image_transform(getattr(model, "backbone", model)).describe(),
        **metadata,
    }
    _check_json_metadata(info)
    if os.path.isdir(destination.path):
        _warn_if_another_model(destination.path, document)
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


# A save replaces the whole directory in one step (writer/files.py), but a load reads its files one by one and
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


def _checked_files(directory, load_weights, where):
    """`(class_name, config)` of a preset directory whose files are all there and readable, before any build."""
    config_path = os.path.join(directory, CONFIG_FILE)
    weights_path = os.path.join(directory, WEIGHTS_FILE)
    missing = [name for name in (CONFIG_FILE, WEIGHTS_FILE if load_weights else None) if name
               and not os.path.exists(os.path.join(directory, name))]
    if missing:
        raise ValueError(f"The keras_vit preset {where} lacks {missing} (expected {list(KERAS_VIT_FILES)}).")
    file_name = f"{where}/{CONFIG_FILE}"
    class_name, config = validate_config(read_json_file(config_path, where), where=file_name)
    metadata_path = os.path.join(directory, METADATA_FILE)
    if os.path.lexists(metadata_path):
        read_json_file(metadata_path, where)  # the versions and class names beside the model: a JSON object
    if load_weights:
        try:
            check_weights_file(weights_path)
        except ValueError as error:
            raise ValueError(f"The preset {where} is damaged: {error} Save it again with `save_to_preset`.") from None
    return class_name, config


def check_preset_directory(path):
    """The `keras_vit` row's check before any work: every file of the preset readable, the config whole.

    Raises:
        ValueError: naming the file (and the key) at fault.
    """
    path = os.fspath(path)
    _checked_files(path, True, path)


def _read_keras_vit(directory, load_weights, where):
    class_name, config = _checked_files(directory, load_weights, where)
    model = build_preset_model(class_name, config, f"{where}/{CONFIG_FILE}")
    if load_weights:
        weights_path = os.path.join(directory, WEIGHTS_FILE)
        try:
            model.load_weights(weights_path)
        except (ValueError, KeyError) as error:
            raise ValueError(f"The weights in {weights_path} do not fit the model described by its "
                             f"{CONFIG_FILE}: {error}") from error
        except OSError as error:
            raise ValueError(f"The preset {where} is damaged: {weights_path} cannot be read ({error}). Save it "
                             "again with `save_to_preset`.") from error
    return model
