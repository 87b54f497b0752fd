"""Every flag of every `keras-vit` subcommand that takes a value, tried with values a user may type.

The flags come from the parsers themselves (`cli.build_parser(command)`), not from a list kept by hand: a
flag added tomorrow is tried too, and one that takes a value without declaring what it accepts fails
`test_every_flag_that_takes_a_value_declares_what_it_accepts`. What each kind of value accepts is written
below from what the flags mean (`ACCEPTS`), not read from the code that checks them.

For a refused value: exit status 2; stderr starts `keras-vit <command>: error:` and names the flag as typed
(`--image-size`, not `image_size`); nothing on stdout; and the subcommand's `run` never starts, so no data
was read and no model built. For an accepted value: the subcommand receives it, converted.
"""

import math
import re

import pytest

from keras_vit import cli
from keras_vit.commands import arguments

LARGEST_COUNT = 2**31 - 1  # counts and sizes: a 32-bit integer, the backends' index type
LARGEST_SEED = 2**32 - 1  # numpy's seed range


def _integer(low, high):
    def accepts(text):
        if re.fullmatch(r"-?[0-9]+", text) is None:
            return False, None
        return low <= int(text) <= high, int(text)
    return accepts


def _number(rule):
    def accepts(text):
        try:
            value = float(text)
        except ValueError:
            return False, None
        return math.isfinite(value) and rule(value), value
    return accepts


def _integer_list(text):
    parts = [part for part in text.split(",") if part.strip()]
    if not parts or not all(re.fullmatch(r"[0-9]+", part.strip()) for part in parts):
        return False, None
    values = [int(part) for part in parts]
    return all(1 <= v <= LARGEST_COUNT for v in values), values


def _image_size(text):
    parts = re.split(r"[x,]", text.lower())
    if len(parts) not in (1, 2) or not all(re.fullmatch(r"[0-9]+", part) for part in parts):
        return False, None
    values = [int(part) for part in parts]
    return all(1 <= v <= LARGEST_COUNT for v in values), values[0] if len(values) == 1 else tuple(values)


def _non_empty(text):
    return text != "", text


def _variant(text):
    from keras_vit.models import variant_names
    from keras_vit.models.variants import hybrid_variant_names

    return text in set(variant_names()) | set(hybrid_variant_names()), text


# What each kind of value accepts: the declarative table the verdicts come from.
ACCEPTS = {
    arguments.PositiveInt: _integer(1, LARGEST_COUNT),  # a count or a size
    arguments.NonNegativeInt: _integer(0, LARGEST_COUNT),  # a count where 0 turns something off
    arguments.Seed: _integer(0, LARGEST_SEED),
    arguments.ColorBits: _integer(1, 8),  # bits per channel of an 8-bit image
    arguments.PositiveFloat: _number(lambda v: v > 0),  # learning rate, ridge strength
    arguments.NonNegativeFloat: _number(lambda v: v >= 0),  # weight decay, MixUp / CutMix (0: off)
    arguments.Fraction: _number(lambda v: 0 < v < 1),  # a held-out share: 0 holds out nothing, 1 everything
    arguments.PositiveFraction: _number(lambda v: 0 < v <= 1),  # share of patches corrupted
    arguments.Probability: _number(lambda v: 0 <= v <= 1),
    arguments.PositiveIntList: _integer_list,
    arguments.ImageSize: _image_size,
    arguments.Path: _non_empty,
    arguments.ModelHandle: _non_empty,
    arguments.Variant: _variant,
}

# The values tried on every flag: 0, -1, a huge value, nan, inf, a non-number, empty, and a few that some
# flags accept (a share, a size, a list, a variant), so each flag is also seen to accept what it should.
VALUES = ["0", "-1", "1" + "0" * 30, "1e30", "nan", "inf", "ten", "", "1", "8", "0.5", "1,5", "32x48", "ViT-Ti/16"]


def _value_actions(parser):
    """The arguments of a subcommand that take a value (argparse keeps no public list of them)."""
    return [action for action in parser._actions if action.nargs != 0 and action.dest not in ("help", "version")]


def _subparser(command):
    parser = cli.build_parser(command)
    subparsers = next(action for action in parser._actions if action.choices and command in action.choices)
    return subparsers.choices[command]


def _name(action):
    """The flag as typed (`--image-size`), or a positional argument's name in the usage (`DATA_DIR`)."""
    return max(action.option_strings, key=len) if action.option_strings else action.metavar or action.dest.upper()


def _sample(action):
    """A value `action` accepts, for the arguments that must be present when another one is tried."""
    if action.choices:
        return str(next(iter(action.choices)))
    return next(text for text in VALUES if ACCEPTS[type(action)](text)[0])


def _argv(command, parser, tried, value):
    """`command` with every required argument present and `tried` set to `value`."""
    positionals, options = [], []
    chosen = set()
    for group in parser._mutually_exclusive_groups:
        if group.required:
            chosen.add(tried if tried in group._group_actions else group._group_actions[0])
    for action in _value_actions(parser):
        in_group = any(action in group._group_actions for group in parser._mutually_exclusive_groups)
        needed = action is tried or (action in chosen) or (
            not in_group and (action.required if action.option_strings else action.nargs not in ("?", "*")))
        if not needed:
            continue
        text = value if action is tried else _sample(action)
        if action.option_strings:
            options += [_name(action), text]
        else:
            positionals.append(text)
    return [command, *positionals, *options]


def _expected(action, text):
    """(accepted, the value the subcommand should receive), from the table or from the declared choices."""
    if action.choices is not None:
        try:
            value = action.type(text) if action.type else text
        except ValueError:
            return False, None
        return value in action.choices, value
    return ACCEPTS[type(action)](text)


def _flags():
    return [(command, _name(action)) for command in cli.COMMANDS for action in _value_actions(_subparser(command))]


FLAGS = _flags()


@pytest.mark.one_backend("argument parsing: no data is read and no model built")
def test_every_flag_that_takes_a_value_declares_what_it_accepts():
    undeclared = []
    for command in cli.COMMANDS:
        for action in _value_actions(_subparser(command)):
            if action.choices is None and type(action) not in ACCEPTS:
                undeclared.append(f"{command} {_name(action)} ({type(action).__name__})")
    assert not undeclared, "flags whose values nothing checks while parsing:\n" + "\n".join(undeclared)
    # Numbers, options that are paths and positional paths are all among them: the sweep is not empty by accident.
    assert {("finetune", "--image-size"), ("finetune", "--output"), ("convert", "DESTINATION"),
            ("predict", "IMAGE")} <= set(FLAGS)


@pytest.mark.parametrize("command, flag", FLAGS, ids=[f"{command} {flag}" for command, flag in FLAGS])
@pytest.mark.one_backend("argument parsing: no data is read and no model built")
def test_flag_values(command, flag, monkeypatch, capsys):
    module = cli._command_module(command)
    received = []

    def run(args):  # stands in for the work: it records what the subcommand would have received
        received.append(args)
        return 0

    monkeypatch.setattr(module, "run", run)
    parser = _subparser(command)
    action = next(action for action in _value_actions(parser) if _name(action) == flag)
    wrong = []
    for text in VALUES:
        argv = _argv(command, parser, action, text)
        accepted, value = _expected(action, text)
        received.clear()
        code = cli.main(argv)
        out, err = capsys.readouterr()
        if accepted:
            got = getattr(received[0], action.dest) if received else None
            if action.nargs == "+":
                got = got[0] if got else None
            if code != 0 or got != value:
                wrong.append(f"{argv}: accepted value refused or changed (exit {code}, got {got!r}): {err}")
        elif (code, out, received) != (2, "", []) or not err.startswith(f"keras-vit {command}: error: ") \
                or flag not in err or "Traceback" in err:
            wrong.append(f"{argv}: exit {code}, ran: {bool(received)}, stdout {out!r}, stderr {err!r}")
    assert not wrong, "\n".join(wrong)


@pytest.mark.one_backend("the message format of a refused value")
def test_a_refused_value_reads_as_every_other_usage_error(capsys):
    # The example of the module's documentation, word for word.
    code = cli.main(["finetune", "photos", "--variant", "ViT-Ti/16", "--image-size", "-8"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.splitlines()[0] == \
        "keras-vit finetune: error: --image-size must be a positive integer. Received: --image-size -8"
    assert "keras-vit finetune --help" in err and "usage:" not in err
