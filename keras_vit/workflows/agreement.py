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


def _without_paths(settings):
    """`settings` with each value that names a local path replaced: hosts may mount data at other paths."""
    if not isinstance(settings, dict):
        return settings
    return {name: "a local path (compared by what it holds)" if isinstance(value, str) and os.path.exists(value)
            else value for name, value in settings.items()}


def training_fingerprint(model, data, validation_data=None, settings=None):
    """What every process of a job must agree on before training: data, held-out data, model, settings, versions.

    Args:
        model: the compiled `keras.Model` to train.
        data: the training data as the caller passed it (before sharding).
        validation_data: the held-out data, or `None`.
        settings: dict or `None`. The run's settings (those a checkpoint
            records); values that name local paths are compared by what
            the data's listing holds instead.
    """
    import keras_vit  # the package's __init__ imports the workflows: its version is read when needed

    settings = _without_paths(settings)
    return {"the training data": data_listing(data), "the held-out data": data_listing(validation_data),
            "the model": model_description(model), "the run's settings": settings,
            "keras_vit version": keras_vit.__version__, "Keras version": keras.__version__}
