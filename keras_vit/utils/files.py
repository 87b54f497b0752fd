"""Writes that lose nothing, and never touch what keras_vit did not write.

Every file keras_vit writes goes through `atomic_write` (one file) or
`atomic_directory` (a directory of files, e.g. a preset): the content is
written under a temporary name in the same directory, flushed to disk, and
renamed into place, which POSIX and Windows make atomic within a filesystem.

A directory keras_vit writes carries a marker, `.keras_vit.json`, that names
the kind of directory (`"preset"`, `"run"`, `"checkpoint"`, ...) and the
entries keras_vit wrote in it. An existing directory is replaced only when
everything in it is ours and of the same kind (`check_replaceable`); files are
written into an existing directory only under names that are free or ours
(`check_writable_names`). Anything else is refused before any work, with a
message that names the path and the argument to change: keras_vit never
deletes or overwrites a file it did not write.

A directory is replaced by swapping it with the finished new one in one step
(Linux's `renameat2(RENAME_EXCHANGE)`), so a kill at any instruction leaves
the old or the new directory at the path. Where the system has no exchange,
the old directory is moved aside first; if the process dies before the new one
is in place, the next save or load moves the old one back
(`recover_directory`). Leftover staging and retired directories of ours are
removed by the next save.
"""

import contextlib
import ctypes
import errno
import json
import os
import shlex
import shutil
import sys
import tempfile

from keras_vit.utils.errors import ArgumentError


@contextlib.contextmanager
def atomic_write(path, mode="wb"):
    """Open a temporary file that replaces `path` only when the block succeeds.

    Args:
        path: str or path-like. The destination. Its directory must exist.
        mode: str. `"wb"` or `"w"`. Defaults to `"wb"`.

    Yields:
        A file object. If the block raises, `path` is left as it was and the
        temporary file is removed.

    Example:

    >>> with atomic_write("config.json", "w") as file:
    ...     json.dump(config, file)
    """
    if mode not in ("w", "wb"):
        raise ValueError(f"`mode` must be 'w' or 'wb'. Received: mode={mode!r}")
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    check_writable(path)
    handle, temporary = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=directory)
    try:
        # mkstemp makes the file owner-only; give it the mode a plain `open` would have.
        os.chmod(temporary, _mode_for(path))
        with os.fdopen(handle, mode) as file:
            yield file
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(temporary)
        raise


def _mode_for(path):
    """The permission bits of the file being replaced, or those the umask gives a new file."""
    try:
        return os.stat(path).st_mode & 0o7777
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def read_json_object(path, where=None):
    """The JSON object in `path`; a file that is not valid JSON or holds no object gets an error naming it.

    Args:
        path: str. The file to read.
        where: str or `None`. What the file belongs to (a preset handle, a
            checkpoint), named in the error. Defaults to `None`.

    Raises:
        ValueError: the file is not UTF-8 JSON, or holds another value than
            an object.
    """
    name = quote(path) + (f" (from {where})" if where else "")
    try:
        with open(path, encoding="utf-8") as file:
            value = json.load(file)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as error:
        raise ValueError(f"{name} is not valid JSON ({error}).") from None
    if not isinstance(value, dict):
        raise ValueError(f"{name} must hold a JSON object. Received: {type(value).__name__}")
    return value


MARKER = ".keras_vit.json"


def read_marker(directory):
    """`(kind, entries)` of the marker in `directory`, or `(None, set())` without a readable one."""
    try:
        with open(os.path.join(directory, MARKER), encoding="utf-8") as file:
            marker = json.load(file)
        if isinstance(marker, dict) and marker.get("writer") == "keras_vit":
            return marker.get("kind"), set(marker.get("entries", []))
    except (OSError, ValueError):
        pass
    return None, set()


def mark_directory(directory, kind, entries):
    """Record that keras_vit wrote `entries` (names inside `directory`) as a directory of `kind`.

    Entries already recorded for the same kind are kept; the marker itself
    is written atomically.
    """
    previous_kind, previous = read_marker(directory)
    entries = set(entries) | (previous if previous_kind == kind else set())
    with atomic_write(os.path.join(directory, MARKER), "w") as file:
        json.dump({"writer": "keras_vit", "kind": kind, "entries": sorted(entries)}, file, indent=1)


def foreign_entries(directory, kind):
    """Entries of an existing `directory` that keras_vit did not write as a directory of `kind`."""
    names = set(os.listdir(directory)) - {MARKER}
    marked_kind, ours = read_marker(directory)
    return sorted(names if marked_kind != kind else names - ours)


def check_replaceable(path, kind, argument=None):
    """Refuse, before any work, to replace `path` unless keras_vit wrote all of it as a `kind` directory.

    A missing path or an empty directory may be written; so may a directory
    whose marker says it is a `kind` directory and that holds nothing else.

    Args:
        path: str or path-like. The directory to be written.
        kind: str. What keras_vit writes there (`"preset"`, `"run"`...).
        argument: str or `None`. The argument that named `path`
            (`"output"`, `"run_dir"`); the command line shows its flag.

    Raises:
        ArgumentError: naming the path, the files that are not ours, and
            the argument to change.
    """
    path = os.fspath(path)
    if not os.path.lexists(path):
        return
    if not os.path.isdir(path) or os.path.islink(path):
        raise ArgumentError(f"{{name}} {quote(path)} exists and is not a directory; keras_vit writes a directory there. "
                       "Choose another path.", argument)
    foreign = foreign_entries(path, kind)
    if foreign:
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        raise ArgumentError(
            f"{{name}} {quote(path)} holds files keras_vit did not write there ({shown}); writing the {kind} "
            "there would replace them. Choose a new or empty directory.", argument)


def check_writable_names(directory, names, kind, argument=None):
    """Refuse, before any work, to write `names` into `directory` where one of them is not ours.

    Unlike `check_replaceable`, other files in the directory are left alone:
    only the names keras_vit is about to write must be free or written by
    keras_vit (as a `kind` directory) before.

    Raises:
        ArgumentError: naming the directory, the names taken and the argument.
    """
    directory = os.fspath(directory)
    if not os.path.lexists(directory):
        return
    if not os.path.isdir(directory):
        raise ArgumentError(f"{{name}} {quote(directory)} exists and is not a directory; give a directory.", argument)
    marked_kind, ours = read_marker(directory)
    taken = sorted(name for name in names if os.path.lexists(os.path.join(directory, name))
                   and not (marked_kind == kind and name in ours))
    if taken:
        raise ArgumentError(
            f"{{name}} {quote(directory)} already holds {', '.join(taken)}, which keras_vit did not write; it would "
            "overwrite them. Choose another directory, or move those files away.", argument)


def check_not_nested(output, others, argument=None):
    """Refuse an output path that is, contains, or lies inside one of `others` (`{what: path}`).

    Raises:
        ArgumentError: e.g. "`output` ... contains the data directory ...".
    """
    if output is None:
        return
    mine = os.path.realpath(os.fspath(output))
    for what, other in others.items():
        if other is None:
            continue
        theirs = os.path.realpath(os.fspath(other))
        if mine == theirs:
            relation = "is"
        elif theirs.startswith(mine.rstrip(os.sep) + os.sep):
            relation = "contains"
        elif mine.startswith(theirs.rstrip(os.sep) + os.sep):
            relation = "lies inside"
        else:
            continue
        raise ArgumentError(f"{{name}} {quote(output)} {relation} the {what} {quote(other)}; writing it could replace "
                       "or mix with those files. Choose a path outside it.", argument)


# === Replacing a directory without a gap ===

_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def exchange_paths(first, second):
    """Swap two existing paths in one atomic step; `False` where the system cannot.

    Linux (3.15+) exchanges them with `renameat2(..., RENAME_EXCHANGE)`: at
    no instant is either path missing. Elsewhere, or on a file system that
    does not support it, nothing is done and `False` is returned.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):  # glibc before 2.28, or another C library
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if renameat2(_AT_FDCWD, os.fsencode(first), _AT_FDCWD, os.fsencode(second), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(code, os.strerror(code), second)


def _siblings(path, suffix):
    """Our staging (`.incoming`) or retired (`.old`) directories beside `path`, newest first."""
    parent, base = os.path.split(path)
    found = [os.path.join(parent, name) for name in os.listdir(parent or ".")
             if name.startswith(f".{base}.") and name.endswith(suffix)
             and os.path.isdir(os.path.join(parent, name)) and read_marker(os.path.join(parent, name))[0]]
    return sorted(found, key=os.path.getmtime, reverse=True)


def recover_directory(path):
    """Put back a directory that a killed swap left aside; remove our leftovers beside `path`.

    Where the system has no atomic exchange, a swap moves the old directory
    to `.NAME.XXXX.old` before moving the new one in. A kill between the two
    leaves no directory at `path`: this moves the newest retired one back.
    Only directories that carry keras_vit's marker are touched.

    Args:
        path: str or path-like. A directory keras_vit writes with
            `atomic_directory`.
    """
    path = os.path.abspath(os.fspath(path))
    if not os.path.isdir(os.path.dirname(path)):
        return
    retired = _siblings(path, ".old")
    if not os.path.lexists(path) and retired:
        os.replace(retired.pop(0), path)
    for leftover in retired + _siblings(path, ".incoming"):
        shutil.rmtree(leftover, ignore_errors=True)


def _move_aside_and_in(staging, path, retired):
    """The swap where no exchange exists: old aside, new in (a kill between is undone by `recover_directory`)."""
    os.replace(path, retired)
    try:
        os.replace(staging, path)
    except BaseException:
        os.replace(retired, path)
        raise


@contextlib.contextmanager
def atomic_directory(path, kind="output"):
    """Build a directory under a temporary name and swap it into place.

    The block writes into the yielded staging directory (a sibling of
    `path`). When it succeeds, the staging directory is marked as keras_vit's
    (`kind`) and exchanged with `path` in one step, then the old content is
    deleted; if the block fails, `path` keeps its old content. Call
    `check_replaceable(path, kind)` before long work: an existing `path`
    that holds files keras_vit did not write is refused here too.

    Args:
        path: str or path-like. The destination directory.
        kind: str. What the directory is (`"preset"`, `"checkpoint"`...),
            recorded in its marker; only a directory of the same kind is
            replaced.

    Yields:
        str. The staging directory to write into.
    """
    path = os.path.abspath(os.fspath(path))
    parent = os.path.dirname(path)
    os.makedirs(parent, exist_ok=True)
    recover_directory(path)
    check_replaceable(path, kind)
    staging = tempfile.mkdtemp(prefix=f".{os.path.basename(path)}.", suffix=".incoming", dir=parent)
    try:
        # mkdtemp makes the directory owner-only; give it the mode of a plain `os.makedirs`.
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(staging, 0o777 & ~umask)
        mark_directory(staging, kind, [])  # a leftover staging directory is recognisably ours
        yield staging
        mark_directory(staging, kind, set(os.listdir(staging)) - {MARKER})
        if not os.path.isdir(path):
            os.replace(staging, path)
            return
        if not exchange_paths(staging, path):
            retired = tempfile.mkdtemp(prefix=f".{os.path.basename(path)}.", suffix=".old", dir=parent)
            os.rmdir(retired)
            _move_aside_and_in(staging, path, retired)
            staging = retired
        shutil.rmtree(staging, ignore_errors=True)  # now the old content, all of it ours
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def check_writable(path):
    """Fail at once if `path` cannot be written, before any long work.

    Args:
        path: str or path-like. A file to be created or replaced.

    Raises:
        ArgumentError: `path` is a directory, or its parent directory is
            missing or not writable; the message names the path and the fix.
    """
    path = os.fspath(path)
    if os.path.isdir(path):
        raise ArgumentError(f"{quote(path)} is a directory; give a file name to write to.")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise ArgumentError(f"Cannot write {quote(path)}: the directory {quote(parent)} does not exist. Create it first.")
    if not os.access(parent, os.W_OK):
        raise ArgumentError(f"Cannot write {quote(path)}: the directory {quote(parent)} is not writable.")


def quote(path):
    """`path` quoted for a message a user may paste into a shell."""
    return shlex.quote(os.fspath(path))
