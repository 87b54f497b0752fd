"""Errors in what the caller passed, spelled the way the caller passed it.

The same check serves `keras_vit.finetune(epochs=0)` and `keras-vit finetune
--epochs 0`. Python callers read keyword names (`epochs=0`); command-line
users read the flag they typed (`--epochs 0`). An `ArgumentError` keeps the
argument's Python name and its value apart from the sentence, so the command
line can re-spell the message with the flag, and it marks the error as the
caller's input (the command line exits with 2 for it, not 1).
"""

import os
import shlex

_NO_VALUE = object()


def quote(path):
    """`path` quoted for a message a user may paste into a shell."""
    return shlex.quote(os.fspath(path))


class ArgumentError(ValueError):
    """A value the caller passed is wrong: a number out of range, a missing path.

    Args:
        message: str. The sentence. `{name}` in it stands for the argument
            (`` `epochs` `` in Python, `--epochs` on the command line).
        argument: str or `None`. The Python name of the argument (the
            keyword, or the command line's `dest`); `None` when the
            message names no argument.
        value: the value received; appended as "Received: epochs=0" in
            Python and "Received: --epochs 0" on the command line. Omit it to
            append nothing.

    Example:

    >>> raise ArgumentError("{name} must be a positive integer.", "epochs", 0)
    ValueError: `epochs` must be a positive integer. Received: epochs=0
    """

    def __init__(self, message, argument=None, value=_NO_VALUE):
        self.template = message
        self.argument = argument
        self.value = value
        super().__init__(self.spelled())

    def spelled(self, flag=None):
        """The message with the keyword name, or with `flag` (e.g. `"--epochs"`) when given."""
        if self.argument is None:  # "{name} /some/path is ..." -> "/some/path is ..."
            return self.template.replace("{name} ", "").replace("{name}", "")
        name = flag or f"`{self.argument}`"
        text = self.template.replace("{name}", name)
        if self.value is not _NO_VALUE:
            received = f"{flag} {self.value}" if flag else f"{self.argument}={self.value!r}"
            text += f" Received: {received}"
        return text


class OptInRequired(ValueError):
    """Refused by default, allowed by a boolean option the message names (a failure, not a wrong input).

    Args:
        message: str. `{option}` in it stands for how to opt in:
            `` `allow_non_finite=True` `` in Python, `--allow-non-finite` on
            the command line.
        argument: str. The Python name of the boolean option.
    """

    def __init__(self, message, argument):
        self.template = message
        self.argument = argument
        super().__init__(self.spelled())

    def spelled(self, flag=None):
        """The message with the keyword, or with `flag` when given."""
        return self.template.replace("{option}", flag or f"`{self.argument}=True`")
