"""Warnings meant for the person running a workflow, printed as one clean line.

Python prints a warning as `file.py:123: UserWarning: ...` followed by the
source line that issued it: noise for someone who typed `keras-vit
finetune`. A `KerasViTWarning` is still a `UserWarning` (filters,
`pytest.warns` and `warnings.catch_warnings` see it as before), but it is
printed as `keras_vit: warning: <message>`, with no file, line or source.
Other warnings keep Python's format.
"""

import warnings


class KerasViTWarning(UserWarning):
    """A warning about the user's run (data, settings), not about code: printed without a source line."""


def _format(message, category, filename, lineno, line=None):
    if isinstance(category, type) and issubclass(category, KerasViTWarning):
        return f"keras_vit: warning: {message}\n"
    return _python_format(message, category, filename, lineno, line)


# Installed once, when a workflow first imports this module; any other
# category is handed to the format that was in place before.
_python_format = warnings.formatwarning
if getattr(_python_format, "__module__", None) != __name__:
    warnings.formatwarning = _format


def warn(message, stacklevel=3):
    """Issue `message` as a `KerasViTWarning` (one line; Python's filters decide how often)."""
    warnings.warn(message, KerasViTWarning, stacklevel=stacklevel)
