"""Every file keras_vit writes, renames or removes goes through its one writer, `keras_vit.writer.files`.

The package's source is read with `ast` (nothing is imported) and every call
that writes, renames or removes a file is listed with its place; the test
fails on any outside the writer module, except:

- a call inside a `with` block of one of the writer's staging methods
  (`claim(...).directory()`, `.staged()`, `.new_directory()`, `.file()`,
  `atomic_write`): it writes into the private path the
  writer gave, which the writer then records and swaps into place;
- the few in `EXCEPTIONS`, each with its reason.

On 2026-11-25's main it listed 26 such calls in 8 modules besides those 4
(two `.keras` savers, Hugging Face files written one by one, figures, the
epoch backup's own writes and cleanup, Keras' CSVLogger, cache cleanup).
Before issue 50 the writer carried one-line wrappers (`export_graph`,
`write_arrays`, `make_directory`) so that such calls were spelled inside it.
"""

import ast
import os

import pytest

from tests.package_source import package_modules

# The writer, split by job: files.py writes. writer/ownership.py decides what may be written and writes nothing
# itself (checked below).
WRITER = ("writer/files.py",)

# Calls by attribute or name that write, rename or remove files, whatever they are called on.
WRITING_CALLS = {
    "os": {"replace", "rename", "renames", "remove", "unlink", "rmdir", "removedirs", "link", "symlink",
           "makedirs", "mkdir", "truncate"},
    "shutil": {"rmtree", "move", "copy", "copy2", "copyfile", "copytree", "copyfileobj"},
    "np": {"save", "savez", "savez_compressed", "savetxt"},
    "numpy": {"save", "savez", "savez_compressed", "savetxt"},
    "tempfile": {"mkstemp", "mkdtemp", "NamedTemporaryFile", "TemporaryDirectory", "TemporaryFile"},
}
# Methods that write whatever object they are called on (a Path, a model, a figure), and Keras'
# callbacks that write files themselves.
WRITING_METHODS = {"write_text", "write_bytes", "unlink", "rename", "rmdir", "savefig", "save", "save_weights",
                   "export", "save_file", "save_to_preset", "touch", "mkdir", "CSVLogger", "ModelCheckpoint",
                   "BackupAndRestore"}
# Methods of our own API that are named like writes but go through the writer.
OWN_API = {"save_to_preset"}

# The writer's methods and functions whose `with` block is handed a private staging path to write into.
STAGING = {"directory", "staged", "new_directory", "file", "atomic_write"}

# (module, function, call) -> why it is allowed outside the writer (and outside a staging block).
EXCEPTIONS = {
    ("presets/hub.py", "_writable_problem", "os.makedirs"):
        "the download cache's root, which the hub library owns: made before a download, never an output",
    ("presets/hub.py", "_writable_problem", "tempfile.TemporaryFile"):
        "a nameless file (never in the file system's tree) that proves the download cache is writable",
    ("presets/hub.py", "_remove_damaged_download", "os.remove"):
        "a downloaded file whose checksum failed, inside the hub library's cache (checked first), never an output",
    ("commands/training_options.py", "run_distributed", "open"):
        "opens os.devnull as stdout of processes other than 0: silences them, writes no file",
    ("cli.py", "_without_start_up_chatter", "tempfile.TemporaryFile"):
        "a nameless file (never in the file system's tree) that holds stderr while the backend starts",
}


def _writes_in(path, tree=None):
    """`[(function, call, line)]` of every file-writing call in the module at `path` (parsed as `tree`, if given).

    Calls inside a `with` block of the writer's staging (`STAGING`) are left out: they write into the path
    the writer gave.
    """
    if tree is None:
        with open(path, encoding="utf-8") as file:
            tree = ast.parse(file.read(), path)
    found = []

    def visit(node, scope):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                visit(child, f"{scope}.{child.name}" if scope else child.name)
                continue
            if isinstance(child, (ast.With, ast.AsyncWith)) and any(_stages(item.context_expr)
                                                                    for item in child.items):
                continue  # the block writes into the writer's staging
            if isinstance(child, ast.Call):
                call = _writing_call(child)
                if call:
                    found.append((scope or "<module>", call, child.lineno))
            visit(child, scope)

    visit(tree, "")
    return found


def _stages(expression):
    """True if `expression` is a call of one of the writer's staging methods (`destination.directory()`...)."""
    if not isinstance(expression, ast.Call):
        return False
    function = expression.func
    name = function.attr if isinstance(function, ast.Attribute) else getattr(function, "id", None)
    return name in STAGING


def _writing_call(call):
    function = call.func
    if isinstance(function, ast.Name):
        if function.id == "open" and _opens_for_writing(call):
            return "open"
        if function.id == "save_file":
            return "save_file"
        return None
    if not isinstance(function, ast.Attribute):
        return None
    owner = function.value.id if isinstance(function.value, ast.Name) else None
    if owner in WRITING_CALLS:
        return f"{owner}.{function.attr}" if function.attr in WRITING_CALLS[owner] else None
    if function.attr == "File" and owner == "h5py" and _opens_for_writing(call, position=1):
        return "h5py.File"
    if function.attr in ("open", "fdopen") and _opens_for_writing(call):
        return function.attr
    if function.attr in WRITING_METHODS and function.attr not in OWN_API:
        return function.attr
    return None


def _opens_for_writing(call, position=1):
    mode = call.args[position] if len(call.args) > position else next(
        (keyword.value for keyword in call.keywords if keyword.arg == "mode"), None)
    if mode is None:
        return False
    if not isinstance(mode, ast.Constant):
        return True  # a mode we cannot read is counted
    return any(letter in str(mode.value) for letter in "wax+")


def package_writes():
    """`{module: [(function, call, line)]}` for every module of the package."""
    writes = {}
    for path, module, tree in package_modules():
        found = _writes_in(path, tree)
        if found:
            writes[module] = found
    return writes


@pytest.mark.one_backend("reads the package's source")
def test_every_write_goes_through_the_writer():
    outside = []
    for module, found in package_writes().items():
        if module in WRITER:
            continue
        for function, call, line in found:
            if (module, function, call) not in EXCEPTIONS:
                outside.append(f"keras_vit/{module}:{line} {function}: {call}")
    assert not outside, "files written outside keras_vit/writer/files.py:\n" + "\n".join(outside)


@pytest.mark.one_backend("reads the package's source")
def test_the_ownership_checks_write_nothing():
    assert "writer/ownership.py" not in package_writes()


@pytest.mark.one_backend("reads the package's source")
def test_every_exception_is_still_needed():
    writes = package_writes()
    stale = [key for key in EXCEPTIONS if not any((key[1], key[2]) == (function, call)
                                                  for function, call, _ in writes.get(key[0], []))]
    assert not stale, f"exceptions that no longer match a call (remove them): {stale}"


@pytest.mark.one_backend("reads the package's source")
def test_the_scan_finds_each_kind_of_write(tmp_path):
    # The scanner itself: each spelling of a write in a sample module is found, reads are not.
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import os, shutil, h5py\nimport numpy as np\n"
        "def f(path, model, figure):\n"
        "    open(path, 'w'); open(path, mode='ab'); open(path); open(path, 'rb')\n"
        "    os.replace(path, path); shutil.rmtree(path); np.savez(path); path.write_text('x')\n"
        "    model.save(path); figure.savefig(path); h5py.File(path, 'w'); h5py.File(path, 'r')\n"
    )
    calls = [call for _, call, _ in _writes_in(str(sample))]
    assert calls == ["open", "open", "os.replace", "shutil.rmtree", "np.savez", "write_text", "save", "savefig",
                     "h5py.File"]


@pytest.mark.one_backend("reads the package's source")
def test_a_write_inside_the_writers_staging_is_allowed_and_one_outside_is_not(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import numpy as np\n"
        "def f(destination, arrays):\n"
        "    with destination.staged(suffix='.npz') as temporary:\n"
        "        np.savez(temporary, **arrays)\n"
        "    with open('notes.txt') as file:\n"
        "        np.savez('elsewhere.npz', **arrays)\n"
    )
    assert _writes_in(str(sample)) == [("f", "np.savez", 6)]
