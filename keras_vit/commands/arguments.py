"""What each `keras-vit` flag accepts, checked while the command line is parsed.

A flag that takes a number, a path or a name says what it accepts with its
`action`: `parser.add_argument("--epochs", action=PositiveInt, default=10)`.
argparse hands the action the text the user typed; a value it does not
accept stops the command before any data is read or any model is built,
with exit status 2 and the flag as the user typed it:

    keras-vit finetune: error: --image-size must be a positive integer. Received: --image-size -8

Defaults are not checked: they are ours. Checks that involve two flags
(`--model-parallelism` needs `--distribute model`) stay in the commands,
which run them before any work too.

This module imports no backend: `keras-vit --help` stays instant.
"""

import argparse
import math
import os
import shlex

# Counts and sizes stop at the largest 32-bit integer: the backends index arrays and batches with 32-bit
# integers, and any value above it is a typo, not a setting (it would fail later, deep in a backend).
LARGEST_COUNT = 2**31 - 1
# numpy's seed (which `keras.utils.set_random_seed` sets) takes 0 to 2**32 - 1.
LARGEST_SEED = 2**32 - 1


# The one place a command's output format is named: by the ending of the name; any other name is a directory.
OUTPUT_FILE_FORMATS = {".keras": "keras", ".weights.h5": "weights", ".safetensors": "safetensors"}


def output_format(path):
    """The format of file an output path names: `"keras"`, `"weights"`, `"safetensors"`, or `None` (a directory)."""
    lower = os.fspath(path).lower()
    return next((found for ending, found in OUTPUT_FILE_FORMATS.items() if lower.endswith(ending)), None)


class CheckedValue(argparse.Action):
    """Stores a flag's value once `parse` accepts it; refuses it with the flag as typed otherwise.

    A subclass defines `parse(text)`, which returns the value or raises
    `ValueError`, and `requirement`, the words after "must be" in the
    message (or `sentence`, the whole predicate, when "must be" does not
    fit). It serves options and positional arguments, with any `nargs`.
    """

    requirement = "a valid value"

    @property
    def sentence(self):
        return f"must be {self.requirement}"

    def parse(self, text):
        raise NotImplementedError

    def __call__(self, parser, namespace, values, option_string=None):
        if isinstance(values, list):
            values = [self._checked(parser, text, option_string) for text in values]
        elif isinstance(values, str):
            values = self._checked(parser, values, option_string)
        # Anything else is the default of an optional positional argument (`nargs="?"`): stored as it is.
        setattr(namespace, self.dest, values)

    def _checked(self, parser, text, option_string):
        try:
            return self.parse(text)
        except (ValueError, OverflowError):
            # An option as typed (`--image-size`); a positional argument by its name in the usage (`DATA_DIR`).
            name = option_string or self.metavar or self.dest.upper()
            received = f"{option_string} {shlex.quote(text)}" if option_string else shlex.quote(text)
            parser.error(f"{name} {self.sentence}. Received: {received}")


# === Numbers ===


class _Integer(CheckedValue):
    minimum = None
    maximum = LARGEST_COUNT

    def parse(self, text):
        value = int(text)  # "8.0", "nan", "" and "ten" raise ValueError
        if value < self.minimum or value > self.maximum:
            raise ValueError(text)
        return value


class PositiveInt(_Integer):
    """A count or a size: 1 to 2**31 - 1."""

    minimum = 1
    requirement = "a positive integer"


class NonNegativeInt(_Integer):
    """A count where 0 means off: 0 to 2**31 - 1."""

    minimum = 0
    requirement = "an integer >= 0 (0 turns it off)"


class Seed(_Integer):
    """A random seed: 0 to 2**32 - 1, numpy's range."""

    minimum = 0
    maximum = LARGEST_SEED
    requirement = f"an integer from 0 to {LARGEST_SEED}"


class ColorBits(_Integer):
    """Bits per channel of a colour class: 1 to 8 (8-bit images have no more)."""

    minimum = 1
    maximum = 8
    requirement = "an integer from 1 to 8"


class _Number(CheckedValue):
    def parse(self, text):
        value = float(text)  # "", "ten" raise ValueError; "nan", "inf" and "1e999" (inf) are refused below
        if not math.isfinite(value) or not self.accepts(value):
            raise ValueError(text)
        return value


class PositiveFloat(_Number):
    """A finite number > 0: a learning rate, a regularisation strength."""

    requirement = "a finite number > 0"

    def accepts(self, value):
        return value > 0


class NonNegativeFloat(_Number):
    """A finite number >= 0: a weight decay, a MixUp or CutMix strength (0 turns it off)."""

    requirement = "a finite number >= 0"

    def accepts(self, value):
        return value >= 0


class Fraction(_Number):
    """A share strictly between 0 and 1: a held-out split (0 holds nothing out, 1 trains on nothing)."""

    requirement = "a number between 0 and 1, both excluded"

    def accepts(self, value):
        return 0 < value < 1


class PositiveFraction(_Number):
    """A share > 0 and at most 1: the share of patches corrupted."""

    requirement = "a number > 0 and <= 1"

    def accepts(self, value):
        return 0 < value <= 1


class Probability(_Number):
    """A share from 0 to 1, both included."""

    requirement = "a number from 0 to 1"

    def accepts(self, value):
        return 0 <= value <= 1


class PositiveIntList(CheckedValue):
    """Comma-separated positive integers (`1,5,10`), stored as a list."""

    sentence = "takes positive integers, comma-separated (e.g. 1,5,10)"

    def parse(self, text):
        values = [int(part) for part in text.split(",") if part.strip()]
        if not values or min(values) < 1 or max(values) > LARGEST_COUNT:
            raise ValueError(text)
        return values


class ImageSize(CheckedValue):
    """`N` or `HxW` (also `H,W`) with positive sizes; stored as an int or a `(height, width)` tuple."""

    requirement = "N or HxW with positive sizes, e.g. 384 or 384x512"

    def parse(self, text):
        values = [int(part) for part in text.lower().replace(",", "x").split("x")]
        if len(values) not in (1, 2) or min(values) < 1 or max(values) > LARGEST_COUNT:
            raise ValueError(text)
        return values[0] if len(values) == 1 else tuple(values)


# === Paths and names ===


class Path(CheckedValue):
    """A file or directory path. Only the empty string is refused here: the commands check existence, type
    and writability themselves, with messages that say which."""

    requirement = "a path, not an empty string"

    def parse(self, text):
        if not text:
            raise ValueError(text)
        return text


class ModelHandle(Path):
    """What names a model: a preset name, `hf://org/repo`, a directory or a file."""

    requirement = "a preset name or a path, not an empty string"


class Variant(CheckedValue):
    """A named variant of `keras_vit.models.variants` (`ViT-B/16`, `R50+ViT-B/16`), stored as typed."""

    @property
    def requirement(self):
        from keras_vit.models.variants import hybrid_variant_names, variant_names

        return (f"a known variant: {', '.join(variant_names())} (the 'ViT-' prefix is optional), or a hybrid: "
                f"{', '.join(hybrid_variant_names())}")

    def parse(self, text):
        from keras_vit.models.variants import parse_variant  # the one table of variants

        parse_variant(text)  # an ArgumentError (a ValueError) for an unknown name
        return text
