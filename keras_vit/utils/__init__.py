"""Small helpers with one rule each, used everywhere in keras_vit.

- `to_pair`: an int or a pair of ints as a `(height, width)` tuple.
- `per_channel`: one value, or one per channel, as a tuple of floats.
- `atomic_write`, `atomic_directory`, `check_writable`: files that are
  either the old or the new version, never half written, and output paths
  checked before long work starts.
- `ArgumentError`: a wrong argument, spelled as a keyword in Python and as
  the flag on the command line.

This package imports nothing else from keras_vit, so every layer, model,
converter and command can use it.
"""

from keras_vit.utils.errors import ArgumentError
from keras_vit.utils.files import atomic_directory, atomic_write, check_writable
from keras_vit.utils.values import per_channel, to_pair

__all__ = ["ArgumentError", "atomic_directory", "atomic_write", "check_writable", "per_channel", "to_pair"]
