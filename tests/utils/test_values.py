"""keras_vit.utils.values: each argument rule against hand-written accept/refuse tables."""

import numpy as np
import pytest

from keras_vit.utils import values

pytestmark = pytest.mark.one_backend("pure-Python argument rules")

# The values every integer rule must treat alike: what is an int, and what only looks like one.
INTS = [1, 7, np.int64(3), np.int32(2), np.uint8(5)]
NOT_INTS = [True, False, 2.0, np.float32(2.0), "3", None, (3,), [3], 1 + 0j]


@pytest.mark.parametrize("value", INTS)
def test_is_int_accepts_python_and_numpy_integers(value):
    assert values.is_int(value)


@pytest.mark.parametrize("value", NOT_INTS)
def test_is_int_refuses_bools_floats_strings_and_containers(value):
    assert not values.is_int(value)


@pytest.mark.parametrize("value", INTS)
def test_check_count_accepts_positive_ints(value):
    values.check_count(value, "num_heads")


@pytest.mark.parametrize("value", NOT_INTS + [0, -1, np.int64(0)])
def test_check_count_refuses_with_the_name_and_the_value(value):
    with pytest.raises(ValueError, match=r"^`num_heads` must be a positive int\. Received: num_heads="):
        values.check_count(value, "num_heads")


def test_check_count_minimum_and_maximum():
    values.check_count(0, "num_register_tokens", minimum=0)
    with pytest.raises(ValueError, match=r"`num_register_tokens` must be an int >= 0\. Received: num_register_tokens=-1"):
        values.check_count(-1, "num_register_tokens", minimum=0)
    for accepted in (1, 8):
        values.check_count(accepted, "color_bits", maximum=8)
    for refused in (0, 9, True, 3.0):
        with pytest.raises(ValueError, match=r"`color_bits` must be an int from 1 to 8\. Received: color_bits="):
            values.check_count(refused, "color_bits", maximum=8)


@pytest.mark.parametrize("value", [None, 1, 768, np.int64(512)])
def test_check_optional_count_accepts_none_and_counts(value):
    values.check_optional_count(value, "representation_size")


@pytest.mark.parametrize("value", [True, False, 0, -3, 1.5, "768", (768,)])
def test_check_optional_count_refuses_bools_and_non_counts(value):
    with pytest.raises(ValueError, match=r"`representation_size` must be a positive int or None\. Received: "):
        values.check_optional_count(value, "representation_size")


@pytest.mark.parametrize("value", [(), (3, 4, 9), [2, 2], (np.int64(1),)])
def test_check_counts_accepts_tuples_of_counts(value):
    values.check_counts(value, "stage_depths")


@pytest.mark.parametrize("value", [3, "349", (3, 0), (3, True), (3.0, 4), None, {3, 4}])
def test_check_counts_refuses_anything_else(value):
    with pytest.raises(ValueError, match=r"`stage_depths` must be a tuple of positive ints, one per stage\. Received: "):
        values.check_counts(value, "stage_depths", what=", one per stage")


# (value, include_zero, include_one, accepted) for the rate rule, worked out by hand from the intervals.
RATES = [
    (0.0, True, False, True), (0.5, True, False, True), (np.float32(0.25), True, False, True), (0, True, False, True),
    (1.0, True, False, False), (-0.1, True, False, False), (True, True, False, False), ("0.1", True, False, False),
    (None, True, False, False), (float("nan"), True, False, False),
    (1.0, False, True, True), (0.0, False, True, False), (1e-9, False, True, True), (1.5, False, True, False),
    (0.0, True, True, True), (1.0, True, True, True), (1.0001, True, True, False), (False, True, True, False),
]


@pytest.mark.parametrize("value, include_zero, include_one, accepted", RATES)
def test_check_rate_follows_its_interval(value, include_zero, include_one, accepted):
    interval = ("[0" if include_zero else "(0") + ", " + ("1]" if include_one else "1)")
    if accepted:
        values.check_rate(value, "rate", include_zero=include_zero, include_one=include_one)
        return
    with pytest.raises(ValueError, match=rf"`rate` must be a number in \{interval[0]}0, 1\{interval[-1]}\. Received: rate="):
        values.check_rate(value, "rate", include_zero=include_zero, include_one=include_one)


def test_check_number():
    for accepted in (0, 1e-6, -2.5, np.float64(3.0)):
        values.check_number(accepted, "init_value")
    for refused in (True, "1e-6", None, float("inf"), float("nan"), [1.0]):
        with pytest.raises(ValueError, match=r"`init_value` must be a finite number\. Received: init_value="):
            values.check_number(refused, "init_value")
    values.check_number(0.0, "epsilon", minimum=0)
    with pytest.raises(ValueError, match=r"`epsilon` must be a number >= 0\. Received: epsilon=-1e-08"):
        values.check_number(-1e-8, "epsilon", minimum=0)


def test_check_positive_number_refuses_zero_negatives_and_non_numbers():
    for accepted in (1e-8, 2e-3, 1, np.float32(0.5)):
        values.check_positive_number(accepted, "learning_rate")
    for refused in (0, 0.0, -1e-3, True, "1e-3", None, float("inf"), float("nan")):
        with pytest.raises(ValueError, match=r"`learning_rate` must be a finite number > 0\. Received: learning_rate="):
            values.check_positive_number(refused, "learning_rate")


def test_check_choice_lists_the_choices():
    values.check_choice("gap", ("token", "gap"), "pooling")
    for refused in ("max", "TOKEN", None, ("token",), 1):
        with pytest.raises(ValueError, match=r"Unknown `pooling`\. Use one of \('token', 'gap'\)\. Received: pooling="):
            values.check_choice(refused, ("token", "gap"), "pooling")


def test_check_divisible_names_both_arguments_or_the_fixed_divisor():
    values.check_divisible(768, "hidden_dim", 12, "num_heads")
    with pytest.raises(ValueError) as error:
        values.check_divisible(10, "hidden_dim", 3, "num_heads", reason=" so each head gets an equal share",
                               fix="Choose `num_heads` that divides `hidden_dim`.")
    assert str(error.value) == (
        "`hidden_dim` must be divisible by `num_heads` so each head gets an equal share. "
        "Choose `num_heads` that divides `hidden_dim`. Received: hidden_dim=10, num_heads=3"
    )
    values.check_divisible(8, "hidden_dim", 4)
    with pytest.raises(ValueError, match=r"^`hidden_dim` must be divisible by 4\. Received: hidden_dim=6$"):
        values.check_divisible(6, "hidden_dim", 4)


@pytest.mark.parametrize(
    "value, expected",
    [(7, (7, 7)), ((3, 5), (3, 5)), ([3, 5], (3, 5)), (np.int64(4), (4, 4)), ((np.int32(2), 6), (2, 6))],
)
def test_to_pair_accepts_ints_and_pairs_of_ints(value, expected):
    pair = values.to_pair(value, "patch_size")
    assert pair == expected and all(type(v) is int for v in pair)


@pytest.mark.parametrize("value", [True, 2.0, (1, 2, 3), (4,), (), "16", None, (2.5, 2), (True, 2), {1, 2}])
def test_to_pair_refuses_what_is_not_an_int_or_two(value):
    with pytest.raises(ValueError, match=r"`patch_size` must be an int or a tuple of two ints \(height, width\)\. Received"):
        values.to_pair(value, "patch_size")


@pytest.mark.parametrize("value", [0, -1, (2, 0), (-3, 4)])
def test_to_pair_refuses_zero_and_negative_sizes(value):
    with pytest.raises(ValueError, match=r"`patch_size` must hold positive integers\. Received: patch_size="):
        values.to_pair(value, "patch_size")


def test_per_channel_table():
    assert values.per_channel(0.5, "mean", 3) == (0.5, 0.5, 0.5)
    assert values.per_channel(1, "mean") == (1.0,)
    assert values.per_channel(np.array([0.1, 0.2, 0.3]), "mean", 3) == (0.1, 0.2, 0.3)
    assert values.per_channel([0.2], "std", 3, positive=True) == (0.2, 0.2, 0.2)
    for refused, message in [
        ([0.1, 0.2], r"must have one value or one per channel \(3\)"),
        ("0.5", "must be a number or a sequence of numbers"),
        (True, "must be a number or a sequence of numbers"),
        ([], "must be a number or a sequence of numbers"),
        ([0.5, None, 0.5], "must be a number or a sequence of numbers"),
        (float("inf"), "must hold finite numbers"),
    ]:
        with pytest.raises(ValueError, match=rf"`mean` {message}.*Received: mean="):
            values.per_channel(refused, "mean", 3)
    for refused in (0.0, -0.5, (0.2, 0.0, 0.2)):
        with pytest.raises(ValueError, match=r"`std` must be positive\. Received: std="):
            values.per_channel(refused, "std", 3, positive=True)
