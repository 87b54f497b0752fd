"""The one reading table: every model format keras_vit reads, how it is recognised, fetched and read.

`READ_FORMATS` has a row per format. `detect_format` asks the rows what a
local path is; `keras_vit.presets.load_model` (behind `from_preset`,
`load_checkpoint` and every command) reads the row's reader, and the hub
download fetches the row's files; help texts print the rows' descriptions.
Nothing else in the package decides what a model file is
(`tests/presets/test_one_reader.py` keeps it so).

A new source is one converter in `keras_vit.convert` (a pure function from
tensors and configs to a model) plus one row here. A single-file format
whose suffix another row already has (a second `.safetensors` flavour, a
`.keras` file of another model class) gives its row a `claims_file` test on the
file's content: rows that test content are asked before rows that take
every file with the suffix.

This table lives in `presets` (above `convert`) so that it imports its
readers directly: `convert` holds only converters and never imports it.
"""

import dataclasses
import json
import os

import keras_vit.models  # noqa: F401  (registers the classes a .keras file names, for read_keras_file)
from keras_vit.convert.huggingface import from_huggingface, is_huggingface_state_dict
from keras_vit.convert.io import (CONFIG_FILE, PICKLE_SUFFIXES, pickle_refusal, read_json_file, read_npz,
                                  read_safetensors_with_metadata)
from keras_vit.convert.kerashub import load_kerashub_preset
from keras_vit.convert.loader import from_npz, from_timm
from keras_vit.convert.timm import timm_config_from_metadata
from keras_vit.presets.keras_vit_format import (KERAS_VIT_FILES, check_preset_directory, load_preset_directory,
                                                model_classes)
from keras_vit.utils.checks import HDF5_MAGIC, check_keras_file
from keras_vit.writer.files import quote

# The weights file of a Hugging Face or timm hub directory (open_clip names its own).
SAFETENSORS_NAMES = ("model.safetensors", "open_clip_model.safetensors")
PREPROCESSOR_FILE = "preprocessor_config.json"
# Keras weights without an architecture: never a model on their own.
WEIGHTS_SUFFIXES = (".weights.h5", ".h5", ".hdf5")


@dataclasses.dataclass(frozen=True)
class ReadFormat:
    """One format of model file or directory keras_vit reads: a row of `READ_FORMATS`.

    Args:
        description: str. What it is, in the words of help texts and errors.
        read: callable. `read(path, *, image_size=None, include_head=True,
            load_weights=True, where=None, **options)` returns a keras_vit
            model; `where` names the handle in errors.
        claims_config: callable or `None`. `claims_config(config)` is true
            for the parsed `config.json` of a directory in this format (rows
            are asked in table order, the first claim wins); `None` for
            single-file formats.
        suffixes: tuple of str. File-name endings of a single-file format.
        claims_file: callable or `None`. `claims_file(path)` is true for a
            file with one of `suffixes` that this row reads, told apart by
            its content (for a suffix other rows have too). Rows with one are
            asked first; a row without one takes every file with its suffix.
        hub_files: tuple of str. What a hub repository must hold besides
            `config.json`; the first is the weights file, the one a registry
            entry pins by sha256. Empty: never read from a hub.
        optional_hub_files: tuple of str. Fetched when the repository has them.
        check: callable or `None`. `check(path)`: a cheap check of a local
            file before any work (a damaged `.keras` archive is refused
            before a command opens its images); the reader checks again.
        converted: bool. The file is converted from another library (the
            converter options `interpolation`, `antialias`, `num_heads`,
            `activation`, `allow_non_finite` apply). `False` for keras_vit's
            own formats, which are read as they were saved.
    """

    description: str
    read: object
    claims_config: object = None
    suffixes: tuple = ()
    claims_file: object = None
    hub_files: tuple = ()
    optional_hub_files: tuple = ()
    check: object = None
    converted: bool = True


def _architecture_only(model, load_weights):
    """The model itself, or with `load_weights=False` a fresh copy of its architecture (random weights)."""
    return model if load_weights else model.__class__.from_config(model.get_config())


def _weights_of_directory(directory):
    """The safetensors file of a Hugging Face / timm directory; refuses a pickle in its place."""
    for name in SAFETENSORS_NAMES:
        if os.path.isfile(os.path.join(directory, name)):
            return os.path.join(directory, name)
    pickles = sorted(n for n in os.listdir(directory) if n.lower().endswith(PICKLE_SUFFIXES))
    if pickles:
        raise pickle_refusal(os.path.join(directory, pickles[0]))
    raise ValueError(
        f"{quote(directory)} has no model.safetensors. A checkpoint directory needs {CONFIG_FILE} and "
        "model.safetensors (Hugging Face or timm hub layout). Sharded checkpoints are not supported."
    )


def read_huggingface_directory(path, *, load_weights=True, where=None, **options):
    """The `huggingface` row: a transformers ViT directory (config.json, model.safetensors, preprocessor)."""
    config = read_json_file(os.path.join(path, CONFIG_FILE))
    state_dict, _ = read_safetensors_with_metadata(_weights_of_directory(path))
    processor_path = os.path.join(path, PREPROCESSOR_FILE)
    processor = read_json_file(processor_path) if os.path.exists(processor_path) else None
    return _architecture_only(from_huggingface(config, state_dict, preprocessor_config=processor, **options),
                              load_weights)


def read_timm(path, *, load_weights=True, where=None, **options):
    """The `timm` row: a hub directory (config.json with `architecture`) or a `.safetensors` state dict."""
    if os.path.isdir(path):
        config = read_json_file(os.path.join(path, CONFIG_FILE))
        state_dict, _ = read_safetensors_with_metadata(_weights_of_directory(path))
        return _architecture_only(from_timm(state_dict, config=config, **options), load_weights)
    state_dict, metadata = read_safetensors_with_metadata(path)
    config = timm_config_from_metadata(metadata)
    directory = os.path.dirname(path) or "."
    if config is None and os.path.basename(path) in SAFETENSORS_NAMES and os.path.exists(
            os.path.join(directory, CONFIG_FILE)):
        # The weights file of a checkpoint directory, named by itself: its config is beside it.
        return read_format(directory, detect_format(directory), load_weights=load_weights, where=where, **options)
    if is_huggingface_state_dict(state_dict):
        raise ValueError(
            f"{quote(path)} holds Hugging Face ViT weights; pass the directory with its {CONFIG_FILE} "
            "(the config carries the head count and epsilon)."
        )
    return _architecture_only(from_timm(state_dict, config=config, **options), load_weights)


def read_npz_checkpoint(path, *, load_weights=True, where=None, **options):
    """The `npz` row: Google's vision_transformer or big_vision `.npz` (plain or hybrid)."""
    return _architecture_only(from_npz(read_npz(path), **options), load_weights)


def read_kerashub_directory(path, *, image_size=None, include_head=True, load_weights=True, where=None,
                            activation="softmax", **resampling):
    """The `kerashub` row: a keras-hub ViT preset directory (at its own image converter's size)."""
    model = load_kerashub_preset(path, include_head=include_head, image_size=image_size, activation=activation)
    return _architecture_only(model, load_weights)


def read_keras_vit_directory(path, *, load_weights=True, where=None, **options):
    """The `keras_vit` row: a preset directory as `save_to_preset` wrote it (adapted afterwards)."""
    return load_preset_directory(path, load_weights=load_weights, where=where)


# The members of a `.keras` archive that Keras reads (its metadata.json is a note Keras never reads).
KERAS_CONFIG_MEMBER, KERAS_WEIGHTS_MEMBER = "config.json", "model.weights.h5"


def check_keras_archive(path):
    """The `keras` row's check before any work: the archive whole, its config JSON, its weights HDF5.

    Keras reports a `config.json` member that is not JSON as a bare
    `JSONDecodeError` and a spoiled weights member as an HDF5 "unable to
    open" error, naming neither the file nor the member; this check names
    both. It reads the config (small) and opens the weights member (a
    `.keras` archive stores it uncompressed, so opening it reads its
    superblock, not its data).

    Raises:
        ValueError: naming the file, the member and what is wrong with it.
    """
    import zipfile

    check_keras_file(path)  # a zip archive, whole (every member's checksum), with a config.json
    fix = "Save or download the model again."
    with zipfile.ZipFile(path) as archive:
        try:
            document = json.loads(archive.read(KERAS_CONFIG_MEMBER).decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as error:
            raise ValueError(f"{quote(path)}: its member {KERAS_CONFIG_MEMBER} is not valid JSON ({error}). "
                             f"{fix}") from None
        if not isinstance(document, dict):
            raise ValueError(f"{quote(path)}: its member {KERAS_CONFIG_MEMBER} must hold a JSON object. Received: "
                             f"{type(document).__name__}. {fix}")
        if KERAS_WEIGHTS_MEMBER not in archive.namelist():
            return
        import h5py

        with archive.open(KERAS_WEIGHTS_MEMBER) as member:
            head = member.read(len(HDF5_MAGIC))
            if head != HDF5_MAGIC:
                what = "is empty" if not head else f"is not HDF5 (it starts with {head!r})"
                raise ValueError(f"{quote(path)}: its member {KERAS_WEIGHTS_MEMBER} {what}. {fix}")
            member.seek(0)
            try:
                with h5py.File(member, "r"):
                    pass
            except OSError as error:
                raise ValueError(f"{quote(path)}: its member {KERAS_WEIGHTS_MEMBER} is truncated or damaged "
                                 f"({error}). {fix}") from None


def read_keras_file(path, *, load_weights=True, where=None, **options):
    """The `keras` row: a whole-model `.keras` file, checked, then read in Keras' safe mode.

    The archive is checked first (`check_keras_archive`: Keras calls a
    truncated one "File not found" and a damaged member by no name); safe
    mode runs no Python code from the file; the compile state is not
    restored.
    """
    import keras

    check_keras_archive(path)
    try:
        model = keras.saving.load_model(path, compile=False, safe_mode=True)
    except Exception as error:  # noqa: BLE001 - whatever Keras raises, the file is named
        raise ValueError(f"{quote(path)} cannot be read as a Keras model ({type(error).__name__}: {error}).") \
            from error
    return model if load_weights or not hasattr(model, "get_config") else _architecture_only(model, False)


def _names_keras_hub(config):
    return (str(config.get("registered_name", "")).startswith("keras_hub>")
            or str(config.get("module", "")).startswith("keras_hub."))


READ_FORMATS = {
    "kerashub": ReadFormat(
        "a keras-hub ViT preset directory (config.json naming keras_hub>ViTBackbone + model.weights.h5)",
        read_kerashub_directory,
        claims_config=_names_keras_hub,
        hub_files=("model.weights.h5",),
        optional_hub_files=("task.json", "task.weights.h5", "image_converter.json", "preprocessor.json"),
    ),
    "keras_vit": ReadFormat(
        "a keras_vit preset directory (config.json + model.weights.h5 + metadata.json, from save_to_preset)",
        read_keras_vit_directory,
        # A config with its format_version, or one naming a keras_vit model whose format_version was lost
        # (its reader then says so, rather than "not a config keras_vit can load").
        claims_config=lambda config: "format_version" in config or (
            isinstance(config.get("class_name"), str) and config["class_name"] in model_classes()),
        hub_files=("model.weights.h5", "metadata.json"),
        check=check_preset_directory,
        converted=False,
    ),
    "timm": ReadFormat(
        "a timm checkpoint: a .safetensors state dict, or a hub directory (config.json with architecture "
        "+ model.safetensors)",
        read_timm,
        claims_config=lambda config: "architecture" in config,
        suffixes=(".safetensors",),
        hub_files=("model.safetensors",),
    ),
    "huggingface": ReadFormat(
        "a Hugging Face transformers ViT directory (config.json with model_type + model.safetensors)",
        read_huggingface_directory,
        claims_config=lambda config: "model_type" in config or "hidden_size" in config,
        hub_files=("model.safetensors",),
        optional_hub_files=(PREPROCESSOR_FILE,),  # the mean / std of a transformers model
    ),
    "npz": ReadFormat(
        "a Google vision_transformer / big_vision .npz checkpoint",
        read_npz_checkpoint,
        suffixes=(".npz",),
    ),
    "keras": ReadFormat(
        "a whole Keras model file (.keras, from model.save), read in safe mode",
        read_keras_file,
        suffixes=(".keras",),
        check=check_keras_archive,
        converted=False,
    ),
}


def read_format(path, name, **options):
    """Read `path` with the reader of row `name` of `READ_FORMATS`."""
    return READ_FORMATS[name].read(path, **options)


def describe_formats():
    """One line per format, for help texts and error messages."""
    return "\n".join(f"- {name}: {row.description}" for name, row in READ_FORMATS.items())


def detect_config_format(config, where=CONFIG_FILE):
    """The format of a checkpoint directory from its parsed `config.json`.

    Args:
        config: dict. The parsed file.
        where: str. Named in the error message.

    Returns:
        The name of the first row of `READ_FORMATS` that claims it.
    """
    if isinstance(config, dict):
        for name, row in READ_FORMATS.items():
            if row.claims_config is not None and row.claims_config(config):
                return name
    directories = "\n".join(f"- {name}: {row.description}" for name, row in READ_FORMATS.items()
                            if row.claims_config)
    raise ValueError(f"{where} is not a config keras_vit can load. A checkpoint directory is one of:\n{directories}")


def _detect_file(path):
    lower = path.lower()
    if lower.endswith(PICKLE_SUFFIXES):
        raise pickle_refusal(path)
    matching = [(name, row) for name, row in READ_FORMATS.items() if lower.endswith(row.suffixes)]
    # Rows that tell their files apart by content first; then the row that takes every file of its suffix.
    for name, row in matching:
        if row.claims_file is not None and row.claims_file(path):
            return name
    for name, row in matching:
        if row.claims_file is None:
            return name
    if lower.endswith(WEIGHTS_SUFFIXES):
        raise ValueError(
            f"{quote(path)} is a Keras weights file: it holds weights but no architecture. Pass the preset "
            "directory that holds it (with its config.json), or build the model and call "
            f"`model.load_weights({path!r})`."
        )
    raise ValueError(f"Unrecognised checkpoint or model file {quote(path)}. keras_vit reads:\n{describe_formats()}")


def detect_format(path):
    """What the model file or directory at `path` is.

    Args:
        path: str or path-like. A file or a directory.

    Returns:
        A key of `READ_FORMATS`.

    Raises:
        ValueError: for a missing path, a pickle (never loaded), a weights
            file without its architecture, or anything else, naming the
            formats that are read.
    """
    path = os.fspath(path)
    if not os.path.exists(path):
        raise ValueError(f"Checkpoint not found: {quote(path)}")
    if not os.path.isdir(path):
        return _detect_file(path)
    names = set(os.listdir(path))
    if CONFIG_FILE in names:
        config_path = os.path.join(path, CONFIG_FILE)
        return detect_config_format(read_json_file(config_path), config_path)
    if names & set(KERAS_VIT_FILES):
        return "keras_vit"  # its reader names the missing file
    pickles = sorted(n for n in names if n.lower().endswith(PICKLE_SUFFIXES))
    if pickles:
        raise pickle_refusal(os.path.join(path, pickles[0]))
    raise ValueError(
        f"The directory {quote(path)} holds neither a keras_vit preset ({', '.join(KERAS_VIT_FILES)}) nor another "
        f"checkpoint directory (a {CONFIG_FILE} and its weights). Found: {sorted(names) or 'nothing'}. "
        f"keras_vit reads:\n{describe_formats()}"
    )
