"""What the processes of a job compare before training: the data each reads and the model each built.

The command line compares the flags at the join
(`keras_vit.commands.training_options.command_fingerprint`); the workflow
compares what the flags lead to, before the first step
(`keras_vit.workflows.resuming.fit_resumable` calls
`engines.current().agree(training_fingerprint(...))`): a folder that holds
other files on one host, another model config, another keras_vit. Library
callers that never went through the command line are checked here too.
"""

import hashlib
import json
import os

import keras
import numpy as np

from keras_vit.presets.registry import PRESETS


def _digest(value):
    """A short hex digest of a JSON value or of an array's bytes."""
    hasher = hashlib.sha256()
    if isinstance(value, np.ndarray):
        hasher.update(f"{value.dtype.str}{value.shape}".encode("ascii"))
        hasher.update(np.ascontiguousarray(value).tobytes())
    else:
        hasher.update(json.dumps(value, sort_keys=True, default=str).encode("utf-8"))
    return hasher.hexdigest()[:16]


def data_listing(dataset):
    """What a dataset holds, the same on every host that reads the same data (`None` for no dataset).

    An image folder's files by their names relative to the folder they
    share, with their sizes and labels (hosts may mount the folder at other
    paths); arrays by shape, dtype and a digest of their bytes; with the
    batch size. Any other data by its type.
    """
    if dataset is None:
        return None
    listing = {"batch size": getattr(dataset, "batch_size", None)}
    paths = getattr(dataset, "paths", None)
    if paths is not None:
        paths = [os.path.abspath(os.fspath(path)) for path in paths]
        root = os.path.commonpath([os.path.dirname(path) for path in paths]) if paths else ""
        names = [os.path.relpath(path, root) for path in paths]
        sizes = [os.stat(path).st_size if os.path.exists(path) else None for path in paths]
        labels = getattr(dataset, "labels", None)
        listing.update({
            "images": len(paths), "bytes": sum(size or 0 for size in sizes),
            "names, sizes and labels": _digest([names, sizes, None if labels is None else np.asarray(labels).tolist()])})
        return listing
    if isinstance(dataset, (tuple, list, np.ndarray)):  # arrays as `fit` takes them: (x, y) or x
        dataset = {"x": dataset} if isinstance(dataset, np.ndarray) else dict(zip(("x", "y", "weights"), dataset))
    elif hasattr(dataset, "x"):
        dataset = {name: getattr(dataset, name, None) for name in ("x", "y")}
    else:
        dataset = {}
    arrays = {name: array for name, array in dataset.items() if array is not None}
    if arrays:
        for name, array in arrays.items():
            array = np.asarray(array)
            listing[name] = {"shape": list(array.shape), "dtype": array.dtype.str, "values": _digest(array)}
        return listing
    listing["type"] = type(dataset).__name__
    return listing


def _without_names(config):
    """`config` without its layers' names: numbered by creation, they may differ where nothing else does."""
    if isinstance(config, dict):
        return {key: _without_names(value) for key, value in config.items() if key != "name"}
    if isinstance(config, (list, tuple)):
        return [_without_names(value) for value in config]
    return config


def model_description(model):
    """The model's config (without layer names) and its weights' shapes and dtypes, as JSON values."""
    try:
        config = json.loads(json.dumps(_without_names(model.get_config()), sort_keys=True,
                                       default=lambda value: type(value).__name__))
    except Exception:  # noqa: BLE001 - a model whose config cannot be read is compared by its weights
        config = type(model).__name__
    return {"config": config,
            "weights": {"count": len(model.weights),
                        "parameters": int(sum(int(np.prod(w.shape)) for w in model.weights)),
                        "shapes and dtypes": _digest([[list(w.shape), str(w.dtype)] for w in model.weights])}}


# The settings that name where a run reads or writes: hosts may mount them at other paths, and what they hold
# is compared by itself (the data's listing, the model's description; the run directory at the join,
# `run_directory`). Chosen by name, never by whether a value happens to exist as a path in this process's
# working directory: a recipe `adamw` beside a file named `adamw` is still the recipe.
PATH_SETTINGS = ("data_dir", "validation_dir", "preset", "init_from", "run_dir", "output", "save")


def _without_paths(settings):
    """`settings` with the values of `PATH_SETTINGS` replaced (each compared by what it holds instead)."""
    if not isinstance(settings, dict):
        return settings
    return {name: "a path (compared by what it holds)" if name in PATH_SETTINGS and isinstance(value, str)
            else value for name, value in settings.items()}


def contents_digest(path):
    """A digest of what a local file holds, or a directory's files (their names relative to it, and bytes)."""
    hasher = hashlib.sha256()

    def add(file_path):
        with open(file_path, "rb") as file:
            for block in iter(lambda: file.read(1 << 20), b""):
                hasher.update(block)

    if os.path.isdir(path):
        for folder, directories, names in os.walk(path):
            directories.sort()
            for name in sorted(names):
                file_path = os.path.join(folder, name)
                hasher.update(os.path.relpath(file_path, path).encode("utf-8", "surrogateescape") + b"\0")
                add(file_path)
    else:
        add(path)
    return "sha256:" + hasher.hexdigest()[:16]


def model_handle(handle):
    """`(compared, where)`: what a `--preset` or `--init-from` value means, the same on every host that reads it.

    A registry name, an `hf://` or a `kaggle://` handle is compared as it is
    (`where` is `None`), in the order `keras_vit.presets` reads a handle; a
    local file or directory by a digest of what it holds (hosts may mount
    it at other paths), with its resolved path as `where` for the message.
    """
    if not isinstance(handle, str) or not handle or handle in PRESETS or handle.startswith(("hf://", "kaggle://")):
        return handle, None
    if not os.path.exists(handle):
        return handle, None  # the loader names what is missing
    try:
        digest = contents_digest(handle)
    except OSError as error:  # compared as unreadable; the loader names the file and the fix
        digest = f"unreadable ({type(error).__name__})"
    return f"a local file or directory holding {digest}", os.path.realpath(handle)


def run_directory(run_dir, output=None):
    """The resolved run directory of a command: `run_dir`, else `OUTPUT.run` beside `output`; `None` without both.

    Compared at the join: every process restores from it on a resume, so
    processes that name different ones would resume from different epochs.
    """
    path = run_dir if run_dir and run_dir != "auto" else (
        None if output is None else os.path.abspath(os.fspath(output)).rstrip(os.sep) + ".run")
    return None if path is None else os.path.realpath(path)


def training_fingerprint(model, data, validation_data=None, settings=None):
    """What every process of a job must agree on before training: data, held-out data, model, settings, versions.

    Args:
        model: the compiled `keras.Model` to train.
        data: the training data as the caller passed it (before sharding).
        validation_data: the held-out data, or `None`.
        settings: dict or `None`. The run's settings (those a checkpoint
            records); the values of `PATH_SETTINGS` (where the run reads
            and writes) are compared by what they hold instead (the data's
            listing, the model), every other value as it is.
    """
    import keras_vit  # the package's __init__ imports the workflows: its version is read when needed

    settings = _without_paths(settings)
    return {"the training data": data_listing(data), "the held-out data": data_listing(validation_data),
            "the model": model_description(model), "the run's settings": settings,
            "keras_vit version": keras_vit.__version__, "Keras version": keras.__version__}
