"""The `keras-vit` command line: parses arguments, then calls the library.

Each subcommand lives in `keras_vit/commands/<name>.py`, which defines
`add_arguments(parser)` and `run(args) -> int`. Only the chosen subcommand's
module is imported, so `keras-vit --help` and `--version` do not pay for a
backend import.

One error style for every subcommand: each flag's value is checked while
the arguments are parsed (`keras_vit/commands/arguments.py`); `run` raises
`ValueError` for anything that went wrong, `keras_vit.utils.ArgumentError`
(or its subclass `keras_vit.commands.UsageError`) when it is the user's input
(a flag, a path, a folder), and `main` prints `keras-vit <command>: error:
<message>` on stderr without a traceback (an `ArgumentError` spelled with the
flag the user typed) and returns 2 for the user's input, 1 for failures.
`--debug` (or `KERAS_VIT_DEBUG=1`) prints the traceback too.
"""

import argparse
import contextlib
import importlib
import os
import re
import sys
import tempfile
import traceback

from keras_vit.backend_choice import BACKEND_PREFERENCE, choose_backend

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

DEBUG_VARIABLE = "KERAS_VIT_DEBUG"
TF_LOG_VARIABLE = "TF_CPP_MIN_LOG_LEVEL"


def _version():
    # The package's own attribute, which pyproject.toml also reads: one source of the version.
    from keras_vit import __version__

    return __version__


def _command_module(name):
    return importlib.import_module(f"keras_vit.commands.{name}")


class CommandParser(argparse.ArgumentParser):
    """argparse's parser, with its errors in the style of every other error of the command line.

    `keras-vit finetune: error: <message>` and where to read the options,
    instead of the full usage first: the line that says what is wrong is
    the first line of stderr, as for every error `main` reports. Exits with 2.
    """

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n(`{self.prog} --help` lists the options.)\n")


def build_parser(command=None):
    parser = CommandParser(
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


# TensorFlow's native log records: absl's ("I0000 00:00:1795643830.098469    8857 cudart_stub.cc:31] ...": before
# absl is initialised the seconds count from 1970) and TSL's older form ("2025-09-17 14:44:05.157831: I
# external/.../cudart_stub.cc:32] ..."). The severity letter is what matters.
_NATIVE_LOG_RECORD = re.compile(
    rb"^(?:(?P<absl>[IWEF])\d{4} [0-9:.]+ +\d+ |\d{4}-\d\d-\d\d [0-9:.]+: (?P<tsl>[IWEF]) )\S+:\d+\] "
)
_ABSL_BANNER = b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"


def quiet_tensorflow_logs(environ=None, debug=False):
    """Hide TensorFlow's C++ start-up chatter in this command, unless the user asked for it; return whether hidden.

    On a machine without a GPU every TensorFlow command printed "failed call
    to cuInit: CUDA error" (an ERROR record) and "Could not find cuda
    drivers", none of which is the user's business. TF_CPP_MIN_LOG_LEVEL=3
    keeps only FATAL records; TensorFlow's errors still reach the user as
    Python exceptions, which `main` prints. A value the user set (any value)
    and `--debug` leave everything as TensorFlow prints it. The command line
    only: `import keras_vit` never changes the caller's environment this way.
    """
    environ = os.environ if environ is None else environ
    if debug or TF_LOG_VARIABLE in environ:
        return False
    environ[TF_LOG_VARIABLE] = "3"
    return True


def is_start_up_chatter(line):
    """Whether a line of native stderr is a TensorFlow log record below FATAL, or absl's banner about them."""
    if line.rstrip(b"\r\n") == _ABSL_BANNER:
        return True
    record = _NATIVE_LOG_RECORD.match(line)
    return record is not None and (record.group("absl") or record.group("tsl")) != b"F"


@contextlib.contextmanager
def _without_start_up_chatter(active):
    """While the backend starts, drop the native log lines that TF_CPP_MIN_LOG_LEVEL cannot hide.

    TensorFlow's shared libraries log while they load, before absl's logging
    is initialised, and those lines ("Could not find cuda drivers ...")
    ignore TF_CPP_MIN_LOG_LEVEL. The process's stderr (file descriptor 2,
    which C++ writes to) goes to a temporary file for the block; every other
    line is written back, in order, when it ends, also when it raises.
    """
    if not active:
        yield
        return
    try:
        saved = os.dup(2)
    except OSError:  # no stderr to filter
        yield
        return
    with tempfile.TemporaryFile() as captured:
        if sys.stderr is not None:
            sys.stderr.flush()
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            if sys.stderr is not None:
                sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            for line in captured:
                if not is_start_up_chatter(line):
                    while line:
                        line = line[os.write(2, line):]


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
        starting = command in COMMANDS and "keras" not in sys.modules
        if starting:
            note = choose_backend()
            if note:
                print(note, file=sys.stderr)
        quiet = starting and quiet_tensorflow_logs(debug=debug)
        with _without_start_up_chatter(quiet):
            parser = build_parser(command if command in COMMANDS else None)
            try:
                # Every flag's value is checked here (keras_vit/commands/arguments.py), before any work.
                args = parser.parse_args(argv)
            except SystemExit as exit:  # --help, --version, or a usage error argparse has printed
                return 0 if exit.code is None else exit.code if isinstance(exit.code, int) else 2
            if args.command is None:
                parser.print_help()
                return 2
            if quiet:
                import keras  # noqa: F401 - the backend starts here, where its start-up lines are filtered
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
