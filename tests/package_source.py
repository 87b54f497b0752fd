"""The package's own source, parsed once per file, for the tests that hold its rules by reading it
(the import graph, the one reader, the one writer)."""

import ast
import os

import keras_vit

ROOT = os.path.dirname(os.path.abspath(keras_vit.__file__))


def package_modules():
    """Every `.py` file of keras_vit in a stable order: `(path, "presets/load.py", parsed tree)`."""
    for directory, subdirectories, names in os.walk(ROOT):
        subdirectories.sort()
        for name in sorted(names):
            if name.endswith(".py"):
                path = os.path.join(directory, name)
                with open(path, encoding="utf-8") as file:
                    tree = ast.parse(file.read(), path)
                yield path, os.path.relpath(path, ROOT).replace(os.sep, "/"), tree
