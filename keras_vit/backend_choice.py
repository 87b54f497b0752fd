"""Which Keras backend to start when the user has not said: one rule for `import keras_vit` and `keras-vit`.

Keras reads `KERAS_BACKEND` (or `keras.json`) once, when it is first
imported, and falls back to TensorFlow. On an install without TensorFlow
(`pip install "keras3-vit[torch]"`) that fallback fails deep inside Keras
with `ModuleNotFoundError: tensorflow`. So before anything imports Keras:

- `choose_backend_on_import()` (run by `import keras_vit`) leaves every
  choice the user made alone (`KERAS_BACKEND`, a backend in `keras.json`,
  Keras already imported) and Keras' default too when it is installed;
  only when TensorFlow is missing does it set `KERAS_BACKEND` to the first
  installed of jax, torch, and say so on stderr.
- `choose_backend()` (run by `keras-vit` before a subcommand) always
  decides: `KERAS_BACKEND` when set (refused when its package is missing),
  a non-default backend of `keras.json`, else the first installed of jax,
  torch, tensorflow; it returns the note to print.

This module imports nothing but the standard library: it runs before Keras.
"""

import importlib.util
import json
import os
import sys

# The order in which an unset KERAS_BACKEND is filled in from what is installed.
BACKEND_PREFERENCE = ("jax", "torch", "tensorflow")
KERAS_DEFAULT_BACKEND = "tensorflow"


def installed(backend):
    """Whether `backend`'s package can be imported, without importing it."""
    try:
        return importlib.util.find_spec(backend) is not None
    except (ImportError, ValueError):  # a broken or half-removed install
        return False


def _keras_directory(environ):
    # Where Keras itself looks (keras/src/backend/config.py): $KERAS_HOME, else ~/.keras, else /tmp/.keras
    # when the home directory is not writable.
    if "KERAS_HOME" in environ:
        return environ["KERAS_HOME"]
    base = os.path.expanduser("~")
    if not os.access(base, os.W_OK):
        base = "/tmp"
    return os.path.join(base, ".keras")


def configured_backend():
    """A backend chosen in `keras.json`, if any other than Keras's default; else `None`."""
    try:
        with open(os.path.join(os.path.expanduser(_keras_directory(os.environ)), "keras.json")) as handle:
            backend = json.load(handle).get("backend")
    except (OSError, ValueError, AttributeError):
        return None
    # Keras writes "tensorflow" into a fresh keras.json itself, so only another
    # value says that the user chose it.
    return backend if isinstance(backend, str) and backend != KERAS_DEFAULT_BACKEND else None


def choose_backend(environ=None, installed=installed, configured=configured_backend):
    """Fill in KERAS_BACKEND for the command line; return a note for stderr, or `None`.

    Order: KERAS_BACKEND when set (refused with a clear error when its package
    is missing); a non-default backend from keras.json when installed; else
    the first installed of jax, torch, tensorflow.

    Raises:
        ValueError: no backend is installed, or KERAS_BACKEND names one that is not.
    """
    environ = os.environ if environ is None else environ
    requested = environ.get("KERAS_BACKEND")
    if requested:
        if requested in BACKEND_PREFERENCE and not installed(requested):
            available = [b for b in BACKEND_PREFERENCE if installed(b)]
            raise ValueError(
                f"KERAS_BACKEND={requested} but {requested} is not installed. Install it, or choose an installed "
                f"backend: {', '.join(available) or 'none is installed (pip install jax)'}."
            )
        return None
    chosen = configured()
    if chosen is None or chosen not in BACKEND_PREFERENCE or not installed(chosen):
        chosen = next((b for b in BACKEND_PREFERENCE if installed(b)), None)
    if chosen is None:
        raise ValueError("No Keras backend is installed. Install one: `pip install jax` (or torch, or tensorflow).")
    environ["KERAS_BACKEND"] = chosen
    return f"keras-vit: using the {chosen} backend (KERAS_BACKEND is not set; set it to choose another)."


def started_as_command_line(argv=None):
    """Whether this process is `keras-vit ...` or `python -m keras_vit ...`.

    argv[0] is "-m" while `python -m` locates the package. The command line
    chooses the backend itself (`choose_backend`) and keeps `--help` instant,
    so `import keras_vit` leaves both to it.
    """
    argv = sys.argv if argv is None else argv
    first = argv[0] if argv else ""
    return first == "-m" or os.path.basename(first).lower() in ("keras-vit", "keras-vit.exe", "keras-vit-script.py")


def choose_backend_on_import(environ=None, installed=installed, configured=configured_backend, modules=None,
                             argv=None, stderr=None):
    """What `import keras_vit` does before Keras is imported: fill in a backend only where Keras' would fail.

    Nothing changes when Keras is already imported, when KERAS_BACKEND is
    set, when `keras.json` names a backend, when Keras' default (TensorFlow)
    is installed, or in the command line (which chooses for itself).
    Otherwise KERAS_BACKEND is set to the first installed of jax, torch, and
    a line on stderr says so.

    Raises:
        ImportError: no backend is installed at all (Keras would fail on
            TensorFlow, saying nothing of the alternatives).
    """
    environ = os.environ if environ is None else environ
    modules = sys.modules if modules is None else modules
    if started_as_command_line(argv) or "keras" in modules or environ.get("KERAS_BACKEND") or configured():
        return None
    if installed(KERAS_DEFAULT_BACKEND):
        return None  # Keras' own default works: a library does not second-guess it
    chosen = next((b for b in BACKEND_PREFERENCE if installed(b)), None)
    if chosen is None:
        raise ImportError("keras_vit needs a Keras backend and none is installed: install one "
                          "(`pip install jax`, torch or tensorflow) and set KERAS_BACKEND to it.")
    environ["KERAS_BACKEND"] = chosen
    note = (f"keras_vit: using the {chosen} backend: KERAS_BACKEND is not set and Keras' default, "
            f"{KERAS_DEFAULT_BACKEND}, is not installed. Set KERAS_BACKEND to choose another.")
    print(note, file=sys.stderr if stderr is None else stderr)
    return chosen
