"""Cheap checks that turn silently wrong input into a clear error or a warning.

- `check_image_batch`: an image batch that cannot be right (empty, boolean).
- `check_pixel_range`: a warning, once per model, when images look like
  [0, 1] data fed to a model that expects [0, 255].
- `check_keras_file` / `check_weights_file`: a `.keras` / `.weights.h5` file
  that is truncated or not what it should be, named before Keras reports
  "File not found".

Each works on numpy data (or anything with `.shape` / `.dtype`) without
touching a backend, so it can run at the entry of `predict` / `fit`.
"""

import os
import warnings
import weakref

from keras_vit.utils.errors import quote

# The first bytes of the two containers Keras saves in: an HDF5 `.weights.h5` and a zip `.keras` archive.
HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"
ZIP_MAGIC = b"PK\x03\x04"
_warned = weakref.WeakSet()
_warned_ids = set()


def check_image_batch(images, name="images"):
    """Refuse a batch that no model can use: empty, or boolean.

    Args:
        images: array-like with `.shape` and `.dtype` (numpy, or a tensor).
        name: str. How the message calls the input. Defaults to `"images"`.

    Raises:
        ValueError: naming the problem and the fix.

    Example:

    >>> check_image_batch(np.zeros((0, 224, 224, 3)))
    Traceback (most recent call last):
    ValueError: `images` is an empty batch (shape (0, 224, 224, 3)) ...
    """
    shape = tuple(getattr(images, "shape", ()) or ())
    dtype = str(getattr(images, "dtype", ""))
    if shape and shape[0] == 0:
        raise ValueError(
            f"`{name}` is an empty batch (shape {shape}): there is nothing to compute. Pass at least one "
            "image; check the filter or split that produced the batch."
        )
    if dtype in ("bool", "torch.bool", "<dtype: 'bool'>"):
        raise ValueError(
            f"`{name}` is boolean (shape {shape}): True/False are not pixels. Convert masks to images "
            f"first, e.g. `{name}.astype('float32') * 255` for a [0, 255] model."
        )


def check_pixel_range(images, expected_max=255.0, model=None, name="images"):
    """Warn (once per model) when pixels look like [0, 1] data for a [0, 255] model.

    A ViT that carries its own preprocessing multiplies pixels by
    `1 / 255`; fed images already in [0, 1], it sees a nearly black image
    and predicts confidently and wrongly. The check costs one `min` / `max`
    over a numpy batch, so it belongs at the entry of `predict` / `fit`, not
    inside a traced graph.

    Args:
        images: numpy array (or array-like). Other inputs (tensors, datasets)
            are skipped: reading them would cost a device sync.
        expected_max: float. The largest pixel value the model expects
            (255 for the default preprocessing). Defaults to `255.0`.
        model: object or `None`. Warn only once for this model. Defaults to
            `None` (Python's warning filter de-duplicates per call site).
        name: str. How the message calls the input.

    Returns:
        bool. Whether a warning was issued.
    """
    import numpy as np

    if expected_max <= 1.5 or not isinstance(images, (np.ndarray, list, tuple)):
        return False
    images = np.asarray(images)
    if images.size == 0 or images.dtype.kind != "f":
        return False  # integer pixels are [0, 255] data
    low, high = float(np.min(images)), float(np.max(images))
    if not (high <= 1.0 and low >= -1.0 and high > low):
        return False
    if model is not None:
        try:
            if model in _warned:
                return False
            _warned.add(model)
        except TypeError:  # not weak-referenceable
            if id(model) in _warned_ids:
                return False
            _warned_ids.add(id(model))
    warnings.warn(
        f"`{name}` lie in [{low:.3g}, {high:.3g}], which looks like images already scaled to [0, 1] (or "
        f"[-1, 1]), but the model expects pixels in [0, {expected_max:g}] and scales them itself. Pass the "
        f"raw pixels (e.g. `images * {expected_max:g}`), or build the model with `pixel_scale=1.0` if the "
        "data is meant to be in [0, 1].",
        UserWarning,
        stacklevel=2,
    )
    return True


def _check_nonempty_file(path, expected):
    """The first 8 bytes of `path`, after refusing a missing, directory or empty path."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise ValueError(f"{quote(path)} does not exist.")
    if os.path.isdir(path):
        raise ValueError(f"{quote(path)} is a directory, not a {expected} file.")
    if os.path.getsize(path) == 0:
        raise ValueError(f"{quote(path)} is empty (0 bytes): the save that wrote it did not finish. Save it again.")
    with open(path, "rb") as handle:
        return handle.read(8)


_DAMAGED = ("is truncated or damaged ({}); the save or download that wrote it did not finish. Save or download "
            "it again.")


def check_keras_file(path):
    """Fail clearly if a whole-model `.keras` file is missing, empty, truncated or not a zip archive.

    Keras reports a truncated `.keras` archive as "File not found"; this
    check names the file and the fix first. The caller knows the file is
    meant to be a `.keras` file (the reader decided it); this only checks it.

    Args:
        path: str or path-like.

    Raises:
        ValueError: naming the file and what is wrong with it.
    """
    import zipfile

    path = os.fspath(path)
    head = _check_nonempty_file(path, ".keras")
    if head[:4] != ZIP_MAGIC:
        raise ValueError(f"{quote(path)} is not a .keras file: a .keras file is a zip archive, and this one "
                         f"starts with {head[:8]!r}.")
    try:
        with zipfile.ZipFile(path) as archive:
            broken = archive.testzip()
            names = archive.namelist()
    except (zipfile.BadZipFile, OSError, EOFError) as error:
        raise ValueError(f"{quote(path)} " + _DAMAGED.format(error)) from None
    if broken is not None:
        raise ValueError(f"{quote(path)} " + _DAMAGED.format(f"member {broken!r} fails its checksum"))
    if "config.json" not in names:
        raise ValueError(f"{quote(path)} is a zip archive without config.json, not a Keras model file.")


def check_weights_file(path):
    """Fail clearly if a `.weights.h5` file is missing, empty, truncated or not HDF5.

    Keras reports a truncated `.weights.h5` as an HDF5 "unable to
    synchronously open" error; this check names the file and the fix first.

    Args:
        path: str or path-like.

    Raises:
        ValueError: naming the file and what is wrong with it.
    """
    path = os.fspath(path)
    head = _check_nonempty_file(path, ".weights.h5")
    if head != HDF5_MAGIC:
        raise ValueError(f"{quote(path)} is not an HDF5 .weights.h5 file (it starts with {head!r}); one "
                         "is written by `model.save_weights`.")
    import h5py

    try:
        with h5py.File(path, "r"):
            pass
    except OSError as error:
        raise ValueError(f"{quote(path)} " + _DAMAGED.format(error)) from None
