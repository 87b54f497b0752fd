"""Argument rules: the checks layers and models apply to their constructor arguments.

One function per rule, so each rule is written once and every message has
the same form, "`name` must be ... Received: name=value". What only one
model means (its size limits, its class-name lists) stays with that model.

- `is_int`: the one test of "an integer" (numpy integers yes, bools no).
- `check_count`, `check_optional_count`, `check_counts`: sizes and counts.
- `check_rate`: dropout-like rates and other fractions.
- `check_number`: finite numbers such as epsilons and initial values.
- `check_positive_number`: finite numbers above zero, such as learning rates.
- `check_choice`: one of a fixed set of names.
- `check_divisible`, `check_group_count`: a size that must split evenly.
- `to_pair`: image sizes, patch sizes, grids, kernels and strides.
- `per_channel`: one value, or one per channel.
- `check_image_transform`: the evaluation transform's four arguments.
"""

import math
import numbers


def is_int(value):
    """Whether `value` is an integer: a Python or numpy int, never a bool.

    `True` is an `int` to Python, but `num_classes=True` is a mistake, not
    the number 1.
    """
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_real(value):
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _int_range(minimum, maximum=None):
    if maximum is not None:
        return f"an int from {minimum} to {maximum}"
    return "a positive int" if minimum == 1 else f"an int >= {minimum}"


def check_count(value, name, minimum=1, maximum=None):
    """Refuse anything but an int of at least `minimum` (a bool is not a count).

    Args:
        value: the argument.
        name: str. Its name, for the message.
        minimum: int. `1` for sizes, `0` for optional counts. Defaults to `1`.
        maximum: int or `None`. The largest value allowed, if any. Defaults
            to `None`.
    """
    if not is_int(value) or value < minimum or (maximum is not None and value > maximum):
        raise ValueError(f"`{name}` must be {_int_range(minimum, maximum)}. Received: {name}={value!r}")


def check_optional_count(value, name, minimum=1):
    """Like `check_count`, but `None` (the feature is off) passes too."""
    if value is not None and (not is_int(value) or value < minimum):
        raise ValueError(f"`{name}` must be {_int_range(minimum)} or None. Received: {name}={value!r}")


def check_counts(values, name, minimum=1, what=""):
    """Refuse anything but a tuple or list of ints of at least `minimum` (it may be empty).

    Args:
        values: the argument.
        name: str. Its name, for the message.
        minimum: int. Smallest value allowed in it. Defaults to `1`.
        what: str. What the entries are, appended to the message (for
            example `", one per stage"`). Defaults to `""`.
    """
    if not isinstance(values, (tuple, list)) or not all(is_int(v) and v >= minimum for v in values):
        expected = "positive ints" if minimum == 1 else f"ints >= {minimum}"
        raise ValueError(f"`{name}` must be a tuple of {expected}{what}. Received: {name}={values!r}")


def check_rate(value, name, include_zero=True, include_one=False):
    """Refuse a rate (a number between 0 and 1) outside its interval.

    Args:
        value: the argument.
        name: str. Its name, for the message.
        include_zero: bool. Whether 0 is allowed. Defaults to `True`.
        include_one: bool. Whether 1 is allowed; a dropout rate of 1 drops
            everything, so it is not by default. Defaults to `False`.
    """
    if not _is_real(value) or not (
        (value >= 0.0 if include_zero else value > 0.0) and (value <= 1.0 if include_one else value < 1.0)
    ):
        interval = ("[0" if include_zero else "(0") + ", " + ("1]" if include_one else "1)")
        raise ValueError(f"`{name}` must be a number in {interval}. Received: {name}={value!r}")


def check_number(value, name, minimum=None):
    """Refuse anything but a finite number (no bools, no strings), at least `minimum` when given."""
    if not _is_real(value) or not math.isfinite(value) or (minimum is not None and value < minimum):
        expected = "a finite number" if minimum is None else f"a number >= {minimum}"
        raise ValueError(f"`{name}` must be {expected}. Received: {name}={value!r}")


def check_positive_number(value, name):
    """Refuse anything but a finite number above zero (a learning rate, a scale); zero is refused too."""
    if not _is_real(value) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"`{name}` must be a finite number > 0. Received: {name}={value!r}")


def check_choice(value, choices, name):
    """Refuse a value that is not one of `choices` (a tuple of names), listing them."""
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"Unknown `{name}`. Use one of {tuple(choices)}. Received: {name}={value!r}")


def check_divisible(value, name, divisor, divisor_name=None, reason="", fix=""):
    """Refuse a size that `divisor` does not divide.

    Args:
        value: int. The size, already checked to be a count.
        name: str. Its name, for the message.
        divisor: int. What must divide it.
        divisor_name: str or `None`. The argument that sets `divisor`, if
            any; `None` for a fixed divisor.
        reason: str. Why, appended after the rule (for example `" so each
            head gets an equal share"`). Defaults to `""`.
        fix: str. A sentence saying how to fix it. Defaults to `""`.
    """
    if value % divisor:
        by = f"`{divisor_name}`" if divisor_name else str(divisor)
        received = f"{name}={value!r}" + (f", {divisor_name}={divisor!r}" if divisor_name else "")
        fix = f" {fix}" if fix else ""
        raise ValueError(f"`{name}` must be divisible by {by}{reason}.{fix} Received: {received}")


def check_group_count(channels, num_groups, name):
    """Refuse a GroupNorm split whose `num_groups` does not divide the channel count.

    Args:
        channels: int. The channel count of the layer's output.
        num_groups: int. The GroupNorm group count.
        name: str. The argument that sets `channels`, for the message.
    """
    check_count(channels, name)
    check_count(num_groups, "num_groups")
    if channels % num_groups:
        raise ValueError(
            f"GroupNorm needs `num_groups` to divide the channel count. Received: {name}={channels}, "
            f"num_groups={num_groups}. Choose a channel count that is a multiple of {num_groups} or fewer groups."
        )


def to_pair(value, name, minimum=1):
    """Return `value` as a `(height, width)` tuple of ints.

    The one rule for every size-like argument (`image_size`, `patch_size`,
    grids, kernels, strides): an int means a square, a list or tuple of two
    ints is `(height, width)`; numpy integers are accepted; bools, floats
    and everything else are refused.

    Args:
        value: int or sequence of two ints.
        name: str. The argument's name, used in the error message.
        minimum: int. Smallest value allowed. Defaults to `1`.

    Returns:
        A tuple of two Python ints.

    Raises:
        ValueError: naming the argument and what it received.
    """
    if is_int(value):
        pair = (value, value)
    elif isinstance(value, (tuple, list)) and len(value) == 2 and all(is_int(v) for v in value):
        pair = tuple(value)
    else:
        raise ValueError(
            f"`{name}` must be an int or a tuple of two ints (height, width). Received: {name}={value!r}"
        )
    if any(v < minimum for v in pair):
        expected = "positive integers" if minimum == 1 else f"integers >= {minimum}"
        raise ValueError(f"`{name}` must hold {expected}. Received: {name}={value!r}")
    return (int(pair[0]), int(pair[1]))


def per_channel(value, name, num_channels=None, positive=False):
    """Return `value` as a tuple of floats: one value, or one per channel.

    Args:
        value: number or sequence of numbers.
        name: str. The argument's name, used in the error message.
        num_channels: int or `None`. When given, a sequence must have one
            value or exactly `num_channels`, and a single value is repeated
            to `num_channels` values.
        positive: bool. Refuse zero and negative values (a divisor such as
            `std`). Defaults to `False`.

    Returns:
        A tuple of finite floats.

    Raises:
        ValueError: naming the argument and what it received.
    """
    if _is_real(value):
        values = (float(value),)
    elif hasattr(value, "__len__") and not isinstance(value, (str, bytes)) and len(value) > 0 and all(
        _is_real(v) for v in value
    ):
        values = tuple(float(v) for v in value)
    else:
        raise ValueError(f"`{name}` must be a number or a sequence of numbers. Received: {name}={value!r}")
    if not all(math.isfinite(v) for v in values):
        raise ValueError(f"`{name}` must hold finite numbers. Received: {name}={value!r}")
    if positive and any(v <= 0 for v in values):
        raise ValueError(f"`{name}` must be positive. Received: {name}={value!r}")
    if num_channels is not None:
        if len(values) == 1:
            values = values * num_channels
        elif len(values) != num_channels:
            raise ValueError(
                f"`{name}` must have one value or one per channel ({num_channels}). Received: {name}={value!r}"
            )
    return values


# The evaluation transform's choices (`keras_vit.utils.image_resize.ImageTransform`): how an image of
# any size becomes the model's input, as each source library's evaluation does it.
RESIZE_MODES = ("center_crop", "stretch")
INTERPOLATIONS = ("bicubic", "bilinear", "nearest")
ALPHA_RULES = ("white", "drop")


def check_image_transform(resize_mode, crop_fraction, interpolation, alpha):
    """Refuse an evaluation transform argument that is not one of its choices (`crop_fraction` in (0, 1])."""
    check_choice(resize_mode, RESIZE_MODES, "resize_mode")
    check_rate(crop_fraction, "crop_fraction", include_zero=False, include_one=True)
    check_choice(interpolation, INTERPOLATIONS, "interpolation")
    check_choice(alpha, ALPHA_RULES, "alpha")
