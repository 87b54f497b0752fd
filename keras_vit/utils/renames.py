"""Keyword arguments that were renamed: the old name keeps working, with a `DeprecationWarning` naming the new one."""

import warnings


def renamed_argument(options, old, new, value, where, default=None):
    """The value of argument `new`, taking it from `options[old]` (the name it had before) with a warning.

    As Keras does for a renamed argument: the call keeps working, and the
    `DeprecationWarning` says which name to write instead.

    Args:
        options: dict. The function's `**kwargs`; `old` is removed from it.
        old: str. The argument's former name.
        new: str. Its name now.
        value: the value given under `new` (`default` when not given).
        where: str. The function, named in the messages (`"load_model"`).
        default: what `new` defaults to. Defaults to `None`.

    Returns:
        The value given under either name.

    Raises:
        TypeError: the value was given under both names.
    """
    if old not in options:
        return value
    given = options.pop(old)
    if value is not default:
        raise TypeError(f"{where}() got `{new}` and its former name `{old}`; give `{new}` alone.")
    warnings.warn(f"`{old}` of {where}() is now called `{new}`; `{old}=` will be removed. Write "
                  f"`{new}={given!r}`.", DeprecationWarning, stacklevel=3)
    return given


def refuse_unknown(options, where):
    """Raise `TypeError` for keyword arguments left in `options` (a `**kwargs` that only took renamed ones)."""
    if options:
        raise TypeError(f"{where}() got unexpected keyword argument(s): {', '.join(sorted(options))}")
