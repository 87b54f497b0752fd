"""Small helpers with one rule each, used everywhere in keras_vit.

- `to_pair`: an int or a pair of ints as a `(height, width)` tuple.
- `per_channel`: one value, or one per channel, as a tuple of floats.
- `quote`: a path as a user may paste it into a shell, for messages.
- `ArgumentError`: a wrong argument, spelled as a keyword in Python and as
  the flag on the command line.

This package imports nothing else from keras_vit, so every layer, model,
converter and command can use it. Every file keras_vit writes goes through
the writer, `keras_vit.writer`, a package of its own.
"""

from keras_vit.utils.errors import ArgumentError, quote
from keras_vit.utils.values import per_channel, to_pair

__all__ = ["ArgumentError", "per_channel", "quote", "to_pair"]
