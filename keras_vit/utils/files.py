"""Writes that lose nothing: a file is the old version or the new one, never half.

Every file keras_vit writes goes through `atomic_write` (one file) or
`atomic_directory` (a directory of files, e.g. a preset): the content is
written under a temporary name in the same directory, flushed to disk, and
renamed into place, which POSIX and Windows make atomic within a filesystem.
"""

import contextlib
import os
import shlex
import shutil
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


@contextlib.contextmanager
def atomic_directory(path):
    """Build a directory under a temporary name and swap it into place.

    The block writes into the yielded staging directory (a sibling of
    `path`). When it succeeds, an existing `path` is moved aside, the staging
    directory is renamed to `path`, and the old one is deleted; if the block
    or the swap fails, `path` keeps its old content.

    Args:
        path: str or path-like. The destination directory.

    Yields:
        str. The staging directory to write into.
    """
    path = os.path.abspath(os.fspath(path))
    parent = os.path.dirname(path)
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"{quote(path)} exists and is not a directory; choose a directory path.")
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=f".{os.path.basename(path)}.", suffix=".incoming", dir=parent)
    try:
        # mkdtemp makes the directory owner-only; give it the mode of a plain `os.makedirs`.
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(staging, 0o777 & ~umask)
        yield staging
        if os.path.isdir(path):
            retired = tempfile.mkdtemp(prefix=f".{os.path.basename(path)}.", suffix=".old", dir=parent)
            os.rmdir(retired)
            os.replace(path, retired)
            try:
                os.replace(staging, path)
            except BaseException:
                os.replace(retired, path)
                raise
            shutil.rmtree(retired, ignore_errors=True)
        else:
            os.replace(staging, path)
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
