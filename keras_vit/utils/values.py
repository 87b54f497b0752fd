"""Argument helpers: image-size pairs, per-channel values, counts, group counts and rates."""

import math
import numbers


def _is_int(value):
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_count(value, name, minimum=1):
    """Refuse anything but an int of at least `minimum` (a bool is not a count).

    Args:
        value: the argument.
        name: str. Its name, for the message.
        minimum: int. `1` for sizes, `0` for optional counts. Defaults to `1`.
    """
    if not _is_int(value) or value < minimum:
        kind = "a positive int" if minimum == 1 else f"an int >= {minimum}"
        raise ValueError(f"`{name}` must be {kind}. Received: {name}={value!r}")


def check_rate(value, name):
    """Refuse a dropout-like rate outside [0, 1) (a rate of 1 drops everything)."""
    if not isinstance(value, numbers.Real) or isinstance(value, bool) or not 0.0 <= value < 1.0:
        raise ValueError(f"`{name}` must be a number in [0, 1). Received: {name}={value!r}")


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
    grids, strides): an int means a square, a list or tuple of two ints is
    `(height, width)`; numpy integers are accepted; bools, floats and
    everything else are refused.

    Args:
        value: int or sequence of two ints.
        name: str. The argument's name, used in the error message.
        minimum: int. Smallest value allowed. Defaults to `1`.

    Returns:
        A tuple of two Python ints.

    Raises:
        ValueError: naming the argument and what it received.
    """
    if _is_int(value):
        pair = (value, value)
    elif isinstance(value, (tuple, list)) and len(value) == 2 and all(_is_int(v) for v in value):
        pair = tuple(value)
    else:
        raise ValueError(
            f"`{name}` must be an int or a tuple of two ints (height, width). Received: {name}={value!r}"
        )
    if any(v < minimum for v in pair):
        raise ValueError(f"`{name}` must hold integers >= {minimum}. Received: {name}={value!r}")
    return (int(pair[0]), int(pair[1]))


def per_channel(value, name, num_channels=None):
    """Return `value` as a tuple of floats: one value, or one per channel.

    Args:
        value: number or sequence of numbers.
        name: str. The argument's name, used in the error message.
        num_channels: int or `None`. When given, a sequence must have one
            value or exactly `num_channels`, and a single value is repeated
            to `num_channels` values.

    Returns:
        A tuple of finite floats.

    Raises:
        ValueError: naming the argument and what it received.
    """
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        values = (float(value),)
    elif hasattr(value, "__len__") and not isinstance(value, (str, bytes)) and len(value) > 0 and all(
        isinstance(v, numbers.Real) and not isinstance(v, bool) for v in value
    ):
        values = tuple(float(v) for v in value)
    else:
        raise ValueError(f"`{name}` must be a number or a sequence of numbers. Received: {name}={value!r}")
    if not all(math.isfinite(v) for v in values):
        raise ValueError(f"`{name}` must hold finite numbers. Received: {name}={value!r}")
    if num_channels is not None:
        if len(values) == 1:
            values = values * num_channels
        elif len(values) != num_channels:
            raise ValueError(
                f"`{name}` must have one value or one per channel ({num_channels}). Received: {name}={value!r}"
            )
    return values
