"""The `keras-vit` command line: parses arguments, then calls the library.

Each subcommand lives in `keras_vit/commands/<name>.py`, which defines
`add_arguments(parser)` and `run(args) -> int`. Only the chosen subcommand's
module is imported, so `keras-vit --help` and `--version` do not pay for a
backend import.

One error style for every subcommand: `run` raises `ValueError` for anything
that went wrong, `keras_vit.utils.ArgumentError` (or its subclass
`keras_vit.commands.UsageError`) when it is the user's input (a flag, a
path, a folder), and `main` prints `keras-vit <command>: error: <message>`
on stderr without a traceback (an `ArgumentError` spelled with the flag the
user typed) and returns 2 for the user's input, 1 for failures. `--debug` (or
`KERAS_VIT_DEBUG=1`) prints the traceback too.
"""

import argparse
import importlib
import importlib.util
import json
import os
import sys
import traceback

COMMANDS = {
    "train": "Train a ViT classifier (scikit-learn's digits by default).",
    "pretrain": "Self-supervised masked patch prediction pre-training.",
    "convert": "Convert a timm, Hugging Face or Google .npz checkpoint.",
    "presets": "List the pretrained presets.",
    "predict": "Classify an image with a pretrained preset.",
    "explain": "Attention maps, attention rollout and the paper's Figure 7 for images, as PNG files.",
    "finetune": "Fine-tune a ViT on a folder of images (one subfolder per class).",
    "fewshot": "Few-shot linear evaluation of a frozen model on a folder of images.",
    "export": "Export a model as a TensorFlow SavedModel, ONNX or LiteRT graph, checked in its runtime.",
    "quantize": "Quantize a model's weights to int8 and save it as a .keras file or a preset.",
}

# The order in which an unset KERAS_BACKEND is filled in from what is installed.
BACKEND_PREFERENCE = ("jax", "torch", "tensorflow")
DEBUG_VARIABLE = "KERAS_VIT_DEBUG"
_KERAS_DEFAULT_BACKEND = "tensorflow"


def _version():
    # The package's own attribute, which pyproject.toml also reads: one source of the version.
    from keras_vit import __version__

    return __version__


def _command_module(name):
    return importlib.import_module(f"keras_vit.commands.{name}")


def build_parser(command=None):
    parser = argparse.ArgumentParser(
        prog="keras-vit",
        description="Vision Transformers for Keras 3.",
        epilog="The backend is KERAS_BACKEND (jax, torch or tensorflow); when it is unset, the first installed "
               f"of {', '.join(BACKEND_PREFERENCE)} is used. Errors print without a traceback; add --debug or "
               f"set {DEBUG_VARIABLE}=1 to see it.",
    )
    parser.add_argument("--version", action="version", version=f"keras-vit {_version()}")
    parser.add_argument("--debug", action="store_true", help="print the traceback of an error")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, help_text in COMMANDS.items():
        subparser = subparsers.add_parser(name, help=help_text, description=help_text)
        subparser.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                               help="print the traceback of an error")
        if name == command:
            _command_module(name).add_arguments(subparser)
            parser.flag_names = _flag_names(subparser)
    return parser


def _flag_names(parser):
    """`{dest: what the user typed}`: `"epochs" -> "--epochs"`, `"data_dir" -> "DATA_DIR"`."""
    names = {}
    for action in parser._actions:  # argparse keeps no public list of a parser's arguments
        if action.option_strings:
            names[action.dest] = max(action.option_strings, key=len)
        else:
            names[action.dest] = action.metavar or action.dest.upper()
    return names


def _installed(backend):
    return importlib.util.find_spec(backend) is not None


def _configured_backend():
    """A backend chosen in ~/.keras/keras.json (or $KERAS_HOME), if any other than Keras's default."""
    home = os.environ.get("KERAS_HOME") or os.path.join(os.path.expanduser("~"), ".keras")
    try:
        with open(os.path.join(home, "keras.json")) as handle:
            backend = json.load(handle).get("backend")
    except (OSError, ValueError, AttributeError):
        return None
    # Keras writes "tensorflow" into a fresh keras.json itself, so only another
    # value says that the user chose it.
    return backend if isinstance(backend, str) and backend != _KERAS_DEFAULT_BACKEND else None


def choose_backend(environ=None, installed=_installed, configured=_configured_backend):
    """Fill in KERAS_BACKEND before Keras is imported; return a note for stderr, or `None`.

    Order: KERAS_BACKEND when set (refused with a clear error when its package
    is missing); a non-default backend from keras.json when installed; else
    the first installed of jax, torch, tensorflow.

    Raises:
        ValueError: no backend is installed, or KERAS_BACKEND names one that is not.
    """
    environ = os.environ if environ is None else environ
    requested = environ.get("KERAS_BACKEND")
    if requested:
        package = "torch" if requested == "torch" else requested
        if requested in BACKEND_PREFERENCE and not installed(package):
            available = [b for b in BACKEND_PREFERENCE if installed(b)]
            raise ValueError(
                f"KERAS_BACKEND={requested} but {package} is not installed. Install it, or choose an installed "
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


def _debug_requested(argv):
    return "--debug" in argv or os.environ.get(DEBUG_VARIABLE, "").strip().lower() in ("1", "true", "yes", "on")


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    command = next((arg for arg in argv if not arg.startswith("-")), None)
    debug = _debug_requested(argv)
    prefix = f"keras-vit {command}" if command in COMMANDS else "keras-vit"
    try:
        # Before the parser imports the command's module, which imports Keras: Keras reads
        # KERAS_BACKEND once, at its import. In-process callers (tests, notebooks) have fixed it.
        if command in COMMANDS and "keras" not in sys.modules:
            note = choose_backend()
            if note:
                print(note, file=sys.stderr)
        parser = build_parser(command if command in COMMANDS else None)
        args = parser.parse_args(argv)  # argparse prints its own usage errors and exits with 2
        if args.command is None:
            parser.print_help()
            return 2
        return _command_module(args.command).run(args) or 0
    except KeyboardInterrupt:
        print(f"{prefix}: interrupted", file=sys.stderr)
        return 130
    except Exception as error:  # noqa: BLE001 - the one place that turns errors into messages
        from keras_vit.utils.errors import ArgumentError, OptInRequired

        if debug:
            traceback.print_exc()
        if isinstance(error, (ArgumentError, OptInRequired)):
            # Spelled with the flag the user typed (`--epochs 0`), not the Python keyword (`epochs=0`).
            flags = getattr(parser, "flag_names", {}) if "parser" in locals() else {}
            message = error.spelled(flags.get(error.argument, f"--{str(error.argument).replace('_', '-')}"))
        elif isinstance(error, (ValueError, OSError, ImportError)):
            message = str(error) or type(error).__name__
            if isinstance(error, OSError) and not isinstance(error, FileNotFoundError) and error.filename:
                message = f"{error.strerror or error} ({error.filename})"
        else:  # not a user error: say so, and how to see where it happened
            message = f"{type(error).__name__}: {error}"
            if not debug:
                message += f"\n(an unexpected error; run again with --debug or {DEBUG_VARIABLE}=1 for the traceback)"
        print(f"{prefix}: error: {message}", file=sys.stderr)
        # 2: the user's input (flags, paths, folders); 1: a failure while working.
        return 2 if isinstance(error, ArgumentError) else 1


if __name__ == "__main__":
    sys.exit(main())
