"""The `keras-vit` subcommands, one module each (`add_arguments(parser)`, `run(args)`).

Two modules are not subcommands: `arguments` (the flag types, which check
each value while parsing) and `training_options` (what `train`, `pretrain`
and `finetune` share: `--distribute`, their checks, the run's settings).

A subcommand reports anything the user got wrong by raising `ValueError` with
a message that names the problem and the fix; `keras_vit.cli.main` prints it
as `keras-vit <command>: error: <message>` and exits with 1, or with 2 when
the error is the user's input: a `UsageError`, or any
`keras_vit.utils.ArgumentError` raised by the library (a bad number, a
missing folder), which the command line re-spells with the flag.
"""

from keras_vit.utils.errors import ArgumentError


class UsageError(ArgumentError):
    """A command-line argument is wrong (exit status 2).

    Raise it from a subcommand's `run(args)` for what argparse cannot check
    itself: an option out of range, an output path that is a directory, a
    destination equal to the source.
    """
