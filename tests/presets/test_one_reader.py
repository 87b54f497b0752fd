"""Only the reader decides what a model file is.

Every model handle (registry name, `hf://`, `kaggle://`, a directory of any
format, a single file) is read by `keras_vit.presets.load_model`, through the
one reading table `keras_vit.presets.formats.READ_FORMATS`. This test reads
the package's source with `ast` (nothing is imported) and fails on any other
module that decides a file's format for itself: a suffix test on a model file
name, `is_keras_file`, magic bytes, or `keras.saving.load_model`.
"""

import ast
import os

import pytest

import keras_vit
from tests.package_source import package_modules


# The reader: where a handle's format is decided and the model is read.
READER = {"presets/formats.py", "presets/load.py", "presets/handles.py"}

# File-name endings of model files (what a suffix test on a handle compares against).
MODEL_SUFFIXES = (".keras", ".safetensors", ".npz", ".h5", ".hdf5", ".weights.h5", ".bin", ".pth", ".pt", ".ckpt",
                  ".pkl", ".pickle")
# Constants that hold such endings.
SUFFIX_NAMES = {"PICKLE_SUFFIXES", "KERAS_FILE_SUFFIX", "suffixes"}
# The first bytes of the containers model files come in.
MAGIC = (b"PK\x03\x04", b"PK\x05\x06", b"\x89HDF")

# Functions that tell formats apart: defined and used in the reader only.
DETECTORS = {"is_keras_file", "is_kerashub_preset", "detect_format", "detect_config_format"}

# `(module, function)` pairs that may do one of those things, each with its reason.
EXCEPTIONS = {
    ("convert/io.py", "sniff"):
        "the container readers check the bytes of a file the reader already gave them, so a mislabelled file "
        "gets an error naming what it really is; they never pick another reader",
    ("convert/io.py", "_zip_error"): "names the zip archive found in place of safetensors (a torch.save pickle)",
    ("convert/io.py", "read_safetensors_with_metadata"):
        "refuses a pickle renamed to .safetensors (the check above), and a pickle it cannot tell by its bytes",
    ("utils/checks.py", None):
        "the magic-byte constants of the container checks (`check_keras_file`, `check_weights_file`), which "
        "validate a file whose kind the reader (or the writer) already decided",
}


def _is_model_suffix(node):
    """True when `node` (an argument of `endswith`) is a model-file ending or a name holding them."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value.lower() in MODEL_SUFFIXES
    if isinstance(node, ast.Tuple):
        return any(_is_model_suffix(element) for element in node.elts)
    if isinstance(node, ast.Name):
        return node.id in SUFFIX_NAMES
    if isinstance(node, ast.Attribute):
        return node.attr in SUFFIX_NAMES
    return False


def _decisions(tree):
    """`[(line, function or None, what)]`: the places in one module that decide a file's format."""
    found = []

    def visit(node, function):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            function = function or node.name  # the outermost function names the place
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr == "endswith" and any(_is_model_suffix(arg) for arg in node.args):
                found.append((node.lineno, function, f"suffix test {ast.unparse(node)[:60]}"))
            if node.func.attr == "load_model" and ast.unparse(node.func.value) in ("keras.saving", "saving"):
                found.append((node.lineno, function, "keras.saving.load_model"))
        if isinstance(node, ast.Name) and node.id in DETECTORS:
            found.append((node.lineno, function, node.id))
        if isinstance(node, ast.FunctionDef) and node.name in DETECTORS:
            found.append((node.lineno, function, f"a format detector {node.name}"))
        if isinstance(node, ast.ImportFrom) and {alias.name for alias in node.names} & DETECTORS:
            found.append((node.lineno, function, f"imports {sorted({a.name for a in node.names} & DETECTORS)}"))
        if isinstance(node, ast.Constant) and isinstance(node.value, bytes) and node.value.startswith(MAGIC):
            found.append((node.lineno, function, f"magic bytes {node.value!r}"))
        for child in ast.iter_child_nodes(node):
            visit(child, function)

    visit(tree, None)
    return found


def format_decisions():
    """`{(module, line): what}` outside the reader and the listed exceptions."""
    wrong = {}
    for _, module, tree in package_modules():
        if module in READER:
            continue
        for line, function, what in _decisions(tree):
            if (module, function) not in EXCEPTIONS:
                wrong[(module, line)] = f"{function or '<module>'}: {what}"
    return wrong


@pytest.mark.one_backend("reads the package's source; no backend runs")
def test_only_the_reader_decides_a_files_format():
    wrong = format_decisions()
    listing = "\n".join(f"keras_vit/{module}:{line}: {what}" for (module, line), what in sorted(wrong.items()))
    assert not wrong, (
        "These places decide what a model file is outside the reader (keras_vit/presets/formats.py, "
        f"load.py, handles.py); load through keras_vit.presets.load_model instead:\n{listing}"
    )


@pytest.mark.one_backend("reads the package's source; no backend runs")
def test_every_exception_is_still_needed():
    """An exception that no longer matches anything is removed, so the list stays short and true."""
    used = set()
    for _, module, tree in package_modules():
        used.update((module, function) for _, function, _ in _decisions(tree))
    assert not set(EXCEPTIONS) - used, f"exceptions that match nothing: {sorted(set(EXCEPTIONS) - used)}"


@pytest.mark.one_backend("checks the checker on source text; no backend runs")
def test_the_checker_sees_each_kind_of_decision():
    source = '''
import keras
def a(path):
    if path.lower().endswith(".keras"):
        return keras.saving.load_model(path)
def b(handle):
    from keras_vit.convert.formats import is_keras_file
    return is_keras_file(handle) or handle.endswith((".npz", ".x"))
def c(head):
    return head[:4] == b"PK\\x03\\x04"
def d(name):
    return name.endswith(".png")
'''
    found = _decisions(ast.parse(source))
    assert {function for _, function, _ in found} == {"a", "b", "c"}
    assert sum(what.startswith("suffix test") for _, _, what in found) == 2
