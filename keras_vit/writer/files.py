"""The writer's writing half: every file keras_vit writes, renames or removes is written here.

A command claims each output at its start (`claim`, before any work) and
writes through the claim: a file under a private name renamed over the old
one, a directory built under a private name and exchanged with the old one,
a private name of an ended process removed by the next save of its path.
The rules and why: docs/reliability.md, "The writer".
"""

import contextlib
import ctypes
import errno
import json
import os
import shutil
import stat
import sys
import tempfile
import warnings

from keras_vit.utils.errors import ArgumentError, quote
from keras_vit.writer.ownership import (
    FILE,
    MARKER,
    NO_SPACE,
    NOT_ALLOWED,
    abandoned,
    check_replaceable,
    check_output,
    check_writable,
    check_writable_names,
    digest_of,
    foreign_entries,
    owns,
    private_name,
    read_marker,
)


def claim(path, kind, *, inputs=None, argument=None, names=None, directories=None, make_parents=True):
    """Check an output before any work and return the `Destination` that writes it.

    Args:
        path: str or path-like. The file or directory to write.
        kind: str. `FILE` for one file, whatever its format; otherwise the
            directory's kind its marker records (`"preset"`, `"run"`...).
        inputs: dict `{what: path or list of paths}` the command reads; an
            output that is, contains or lies inside one is refused.
        argument: str or `None`. The argument that named `path`; errors
            name it (the command line shows its flag).
        names: list of str or `None`. The names the command writes *into*
            the directory, beside the user's own, each free or ours; `None`
            replaces the whole directory.
        directories: dict `{name: kind}`. With `names`: directories written
            into it whole (`new_directory`), each new, empty or
            ours by its own marker.
        make_parents: bool. `False` refuses an output whose parent
            directory is missing (a mistyped path fails before the work).

    Raises:
        ArgumentError: naming the path, the problem and the argument.
    """
    return Destination(path, kind, inputs=inputs, argument=argument, names=names, directories=directories,
                       make_parents=make_parents)


class Destination:
    """An output the writer checked (made by `claim`).

    Write a file with `file()` / `staged()`, a whole directory with
    `directory()`, names into a directory with `file(name)`,
    `staged(name=)`, `save_text`, `save_json`, `save_figure`,
    `new_directory(name)`; `remove(name)` deletes a claimed entry (and
    `remove()` a claimed directory) only while it holds what keras_vit
    wrote.
    """

    def __init__(self, path, kind, *, inputs=None, argument=None, names=None, directories=None, make_parents=True):
        if path is None:
            raise ArgumentError("{name} is required: give a path to write to.", argument)
        self.path, self.given, self.kind, self.argument = os.path.abspath(os.fspath(path)), os.fspath(path), kind, argument
        self.directories = dict(directories or {})
        self.names = None if names is None else [*names, *self.directories]
        check_output(self.path, kind, given=self.given, argument=argument, inputs=inputs, names=self.names,
                     directories=self.directories, make_parents=make_parents)

    def __fspath__(self):
        return self.path

    def _target(self, name):
        if self.kind == FILE:
            if name is not None:
                raise ValueError(f"A file destination is one file; it takes no name. Received: name={name!r}")
            return self.path
        if self.names is None or name not in self.names:
            raise ValueError(f"{name!r} was not claimed in {quote(self.path)} (claimed: {self.names}).")
        return os.path.join(self.path, name)

    def _announce(self, name):
        """Before `name` is put in place, its new digest beside the old in the marker: at no time is a file
        keras_vit wrote unrecorded, nor a user's file adopted (its digest is neither)."""
        if name is None:
            return None

        def announce(temporary):
            kind, entries = read_marker(self.path)
            entries = dict(entries) if kind == self.kind else {}
            old = entries.get(name)
            known = old if isinstance(old, list) else [old] if isinstance(old, str) else []
            entries[name] = sorted(set(known) | {digest_of(temporary)})
            _write_marker(self.path, self.kind, entries)

        return announce

    def _record(self, name):
        if name is not None:
            kind, entries = read_marker(self.path)
            entries = dict(entries) if kind == self.kind else {}
            entries[name] = digest_of(os.path.join(self.path, name))
            _write_marker(self.path, self.kind, entries)

    @contextlib.contextmanager
    def file(self, name=None, mode="wb"):
        """A file object whose content replaces the file only when the block succeeds."""
        with self.staged(name) as temporary, open(temporary, mode.replace("w", "x")) as file:
            yield file
            file.flush()
            os.fsync(file.fileno())

    @contextlib.contextmanager
    def staged(self, name=None, suffix=""):
        """A private temporary path (ending in `suffix`) renamed onto the file when the block succeeds."""
        if name is not None:
            # The one check after the claim: names are written into a directory at each epoch of a run (the
            # log, the pointer) or after the work, and a file the user put at `name` since is refused.
            check_writable_names(self.path, [name], self.kind, self.argument)
            os.makedirs(self.path, exist_ok=True)
        with _staged_path(self._target(name), suffix, before_replace=self._announce(name)) as temporary:
            yield temporary
        self._record(name)

    def save_json(self, name, value, **options):
        with self.file(name, "w") as file:
            json.dump(value, file, **options)

    def save_text(self, name, text):
        with self.file(name, "w") as file:
            file.write(text)

    def save_figure(self, name, figure):
        """A matplotlib figure as PNG, at its own size."""
        with self.file(name, "wb") as file:
            figure.savefig(file, format="png", dpi=figure.dpi)

    def remove(self, name=None):
        """Delete claimed entry `name`, or without one the claimed directory, while it holds what keras_vit wrote.

        Returns True if nothing is left there.
        """
        if name is None and (self.kind == FILE or self.names is not None):
            raise ValueError(f"{quote(self.path)} was claimed as a file or for names: remove a name in it.")
        path, kind = (self.path, self.kind) if name is None else (self._target(name), self.directories.get(name))
        if kind is not None:
            if os.path.isdir(path) and not os.path.islink(path) and not foreign_entries(path, kind):
                _remove_ours(path)
        else:
            kind, entries = read_marker(self.path)
            if kind == self.kind and owns(self.path, name, entries):
                os.remove(path)
        return not os.path.lexists(path)

    @contextlib.contextmanager
    def discarded_copy(self):
        """This claim's twin in a private scratch directory deleted afterwards.

        What a process other than 0 writes where a job's saving is
        collective (Keras needs every process in the save; only process 0's
        file is kept): `keras_vit.distribution.engines` decides.
        """
        names = None if self.names is None else [name for name in self.names if name not in self.directories]
        with tempfile.TemporaryDirectory(prefix="keras_vit-discarded-") as scratch:
            yield Destination(os.path.join(scratch, os.path.basename(self.path) or "saved"), self.kind,
                              names=names, directories=self.directories)

    @contextlib.contextmanager
    def new_directory(self, name):
        """Write claimed directory `name` anew: built under a private name, the old one removed, the new renamed in.

        For a directory nothing reads while it is written (the backup slot
        a run's pointer does not name), so nothing is exchanged:
        a kill leaves the old directory, a part of it (ours by its marker)
        or the new one, and at most a staging name the next write removes.
        """
        path, kind = self._target(name), self.directories.get(name)
        if kind is None:
            raise ValueError(f"{name!r} was not claimed as a directory in {quote(self.path)}.")
        os.makedirs(self.path, exist_ok=True)
        staging = os.path.join(self.path, private_name(name, "incoming"))
        try:
            os.mkdir(staging)
            _write_marker(staging, kind, {}, staging=True)  # a leftover is recognisably ours
            yield staging
            _write_marker(staging, kind, _digests(staging))
            _flush_tree(staging)
            # Again, on purpose: an epoch passed since the claim; a file the user put there since is refused.
            check_replaceable(path, kind, self.argument)
            if os.path.lexists(path):
                _remove_ours(path)
            os.rename(staging, path)
            _flush_directory(self.path)
            remove_abandoned(path)
        except BaseException as error:
            if os.path.isdir(staging):
                with contextlib.suppress(OSError):
                    shutil.rmtree(staging)  # all ours: made under our private name by this process
            _raise_for_user(error, path)
            raise

    @contextlib.contextmanager
    def directory(self):
        """A staging directory to write into; on success exchanged with the directory at the path in one step.

        What it holds is recorded as ours (with digests); the old content,
        ours by the claim's check, is removed. On failure the path keeps its
        old content.
        """
        if self.kind == FILE or self.names is not None:
            raise ValueError(f"{quote(self.path)} was claimed as a file or for names, not as a directory to replace.")
        with _replaced_directory(self.path, self.kind, self.argument) as staging:
            yield staging


def _write_marker(directory, kind, entries, staging=False):
    document = {"writer": "keras_vit", "kind": kind, "entries": dict(sorted(entries.items()))}
    if staging:  # a directory being built: all of it is ours, whatever its digests
        document["staging"] = {"pid": os.getpid()}
    with atomic_write(os.path.join(directory, MARKER), "w", checked=True) as file:
        json.dump(document, file, indent=1)


def _digests(directory):
    return {name: digest_of(os.path.join(directory, name)) for name in os.listdir(directory) if name != MARKER}


# === One file ===


@contextlib.contextmanager
def atomic_write(path, mode="wb", checked=False):
    """Open a private temporary file that replaces `path` only when the block succeeds.

    Args:
        path: str or path-like. The destination; its directory must exist.
        mode: str. `"wb"` or `"w"`.
        checked: bool. `path` is inside a directory the writer is building
            or was claimed: the checks of an output are skipped.

    Yields:
        A file object. If the block raises, `path` is left as it was.
    """
    if mode not in ("w", "wb"):
        raise ValueError(f"`mode` must be 'w' or 'wb'. Received: mode={mode!r}")
    if not checked:
        check_writable(path)
    with _staged_path(path) as temporary, open(temporary, mode.replace("w", "x")) as file:
        yield file
        file.flush()
        os.fsync(file.fileno())


def write_json_file(path, value, **options):
    """A JSON file written whole, inside a staging directory the writer gave."""
    with atomic_write(path, "w", checked=True) as file:
        json.dump(value, file, **options)


def _umask():
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    umask = os.umask(0o022)  # read it the portable way (briefly set, then restored)
    os.umask(umask)
    return umask


@contextlib.contextmanager
def _staged_path(path, suffix="", before_replace=None):
    """A private temporary path beside `path`, renamed onto it when the block succeeds.

    The file gets the mode of the file it replaces, or what the umask gives
    a new one; `before_replace(temporary)` runs just before the rename. Once
    it is in place, what killed writes of `path` left beside it goes.
    """
    directory, base = os.path.split(os.path.abspath(path))
    temporary = os.path.join(directory, private_name(base, "tmp", suffix))
    try:
        mode = os.stat(path).st_mode & 0o7777
    except (FileNotFoundError, NotADirectoryError):
        mode = 0o666 & ~_umask()
    try:
        yield temporary
        if not os.path.isfile(temporary):
            raise FileNotFoundError(errno.ENOENT, "the writer left no file", temporary)
        os.chmod(temporary, mode)  # mkstemp and Keras' zip writer do not follow the umask
        if before_replace is not None:
            before_replace(temporary)
        os.replace(temporary, path)
        remove_abandoned(path)
    except BaseException as error:
        with contextlib.suppress(OSError):
            os.remove(temporary)
        _raise_for_user(error, path)
        raise


def _raise_for_user(error, path):
    """Raise `error` again naming the user's `path` (not the private name) if it is a full disk or a refusal."""
    if not isinstance(error, OSError) or error.errno not in NO_SPACE + NOT_ALLOWED:
        return
    if error.errno in NO_SPACE:
        fix = "Free some space or write elsewhere, and save again"
    else:
        fix = "Choose a folder you can write to (or fix its permissions), and save again"
    made = PermissionError if error.errno in (errno.EACCES, errno.EPERM) else OSError
    raise made(error.errno, f"{os.strerror(error.errno)} while writing it; nothing was changed (the previous "
               f"content, if any, is kept). {fix}", path) from None


# === A Keras model ===


def save_model(model, destination, weights_only=False):
    """`model.save` (or `save_weights`) to a claimed file `destination`, through a private temporary name."""
    with destination.staged(suffix=".weights.h5" if weights_only else ".keras") as temporary:
        write_model_file(model, temporary, weights_only)


def write_model_file(model, path, weights_only=False):
    """Keras' own save into `path`, a staging path the writer gave, once the disk has room for it.

    HDF5 does not survive a full disk (the process dies inside the library),
    so the size is checked first: the variables' bytes, plus what HDF5 adds
    (about 3 KiB a variable measured; 4 KiB each and 64 KiB a file, to be
    safe).

    Raises:
        OSError: `ENOSPC`, before anything is written.
    """
    variables = list(model.weights)
    optimizer = getattr(model, "optimizer", None)
    if not weights_only and optimizer is not None and getattr(optimizer, "built", False):
        variables += list(optimizer.variables)
    size = 65536
    for variable in variables:
        count = 1
        for dimension in variable.shape:
            count *= int(dimension)
        itemsize = getattr(getattr(variable, "dtype", None), "itemsize", None)
        if itemsize is None:
            import numpy as np

            itemsize = np.dtype(variable.dtype).itemsize
        size += count * itemsize + 4096
    directory, free = os.path.dirname(os.path.abspath(path)), None
    with contextlib.suppress(OSError, AttributeError):  # no statvfs (Windows): nothing to check against
        status = os.statvfs(directory)
        free = status.f_bavail * status.f_frsize
    if free is not None and free < size:
        raise OSError(errno.ENOSPC, f"No space left on device: about {size / 2**20:.1f} MiB are needed and "
                      f"{free / 2**20:.1f} MiB are free", directory)
    if weights_only:
        model.save_weights(path)
    else:
        model.save(path)


# === A directory replaced in one step ===

_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def exchange_paths(first, second):
    """Swap two existing paths in one atomic step (Linux 3.15+ `renameat2`); `False` where the system cannot."""
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


@contextlib.contextmanager
def _replaced_directory(path, kind, argument=None):
    parent, base = os.path.split(path)
    os.makedirs(parent, exist_ok=True)
    staging = os.path.join(parent, private_name(base, "incoming"))
    try:
        os.mkdir(staging)  # mode 0o777 & ~umask
        _write_marker(staging, kind, {}, staging=True)  # a leftover is recognisably ours
        yield staging
        # From here the staging directory's marker is the new directory's.
        _write_marker(staging, kind, _digests(staging))
        # Again, on purpose: the work came between the claim and now; a file the user put there since is refused.
        check_replaceable(path, kind, argument)
        retired = None
        if not os.path.isdir(path):
            os.rename(staging, path)
        else:
            _keep_modes(path, staging)
            if exchange_paths(staging, path):
                retired = staging
            else:
                retired = os.path.join(parent, private_name(base, "old"))
                os.rename(path, retired)
                try:
                    os.rename(staging, path)
                except BaseException:
                    os.rename(retired, path)
                    raise
        staging = None
        try:
            if retired is not None:
                _remove_ours(retired)
        except OSError as error:  # the new content is in place; the next save of `path` removes the rest
            warnings.warn(f"{quote(path)} was saved, but its old content could not be removed ({error}); the "
                          "next save of it removes it.", UserWarning, stacklevel=3)
        remove_abandoned(path)  # a killed save's old copy goes only now that the new content is in place
    except BaseException as error:
        if staging is not None and os.path.isdir(staging):
            with contextlib.suppress(OSError):  # what stays is of an ended process: the next save removes it
                _remove_ours(staging)
        _raise_for_user(error, path)
        raise


def _keep_modes(old, new):
    """Give `new` the mode of `old`, and each regular file the mode of its namesake (a private preset stays so)."""
    os.chmod(new, stat.S_IMODE(os.stat(old).st_mode))
    for name in os.listdir(new):
        try:
            before, after = os.lstat(os.path.join(old, name)), os.lstat(os.path.join(new, name))
        except OSError:
            continue
        if stat.S_ISREG(before.st_mode) and stat.S_ISREG(after.st_mode):
            os.chmod(os.path.join(new, name), stat.S_IMODE(before.st_mode))


def _remove_ours(directory):
    """Remove what keras_vit wrote in `directory` (a slot, staging, a retired copy), its marker last, then the directory.

    An entry goes when the marker says the directory was staging (all of it
    ours), when it holds what the marker records, or when it is a private
    name of an ended process; a kill leaves a part that is still ours.
    Anything else (a file a user put there) stays, with the directory, and
    a warning names it.
    """
    marker = {}
    with contextlib.suppress(OSError, ValueError):
        with open(os.path.join(directory, MARKER), encoding="utf-8") as file:
            marker = json.load(file)
    staging = isinstance(marker, dict) and marker.get("writer") == "keras_vit" and "staging" in marker
    _, entries = read_marker(directory)
    kept = []
    for name in os.listdir(directory):
        if name == MARKER:
            continue
        entry = os.path.join(directory, name)
        if not (staging or owns(directory, name, entries) or abandoned(name)):
            kept.append(name)
        elif os.path.isdir(entry) and not os.path.islink(entry):
            # Renamed first: a private name of an ended process is ours wherever it is found, so a kill inside
            # the removal leaves only that.
            doomed = os.path.join(directory, name if abandoned(name) else private_name(name, "old"))
            try:
                if doomed != entry:
                    os.rename(entry, doomed)
            except OSError as error:  # a name too long for its private name: removed where it is
                if error.errno != errno.ENAMETOOLONG:
                    raise
                doomed = entry
            shutil.rmtree(doomed)
        else:
            os.remove(entry)
    if kept:
        warnings.warn(f"{quote(directory)} keeps {', '.join(sorted(kept))}, which keras_vit did not write; "
                      "move them back where they belong.", UserWarning, stacklevel=3)
        return
    with contextlib.suppress(FileNotFoundError):
        os.remove(os.path.join(directory, MARKER))
    os.rmdir(directory)


def _flush_tree(directory):
    """`fsync` each file of `directory` and the directory itself: on disk before a rename makes it the one read."""
    for name in os.listdir(directory):
        entry = os.path.join(directory, name)
        if os.path.isfile(entry) and not os.path.islink(entry):
            descriptor = os.open(entry, os.O_RDONLY)
            try:
                os.fsync(descriptor)
            finally:
                os.close(descriptor)
    _flush_directory(directory)


def _flush_directory(directory):
    with contextlib.suppress(OSError):  # a file system that cannot sync a directory (some network mounts)
        descriptor = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)


def remove_abandoned(path):
    """Remove what killed writes of `path` left beside it: private names of ended processes on this host only.

    A staging directory, a temporary file, or the old copy a kill between
    the fallback's two renames left (a load names it with the `mv` that
    restores it). Called once a save's new content is in place, never by a
    load; a failure here leaves the rest to the next save.
    """
    parent, base = os.path.split(os.path.abspath(os.fspath(path)))
    with contextlib.suppress(OSError):
        for name in os.listdir(parent):
            entry = os.path.join(parent, name)
            if not abandoned(name, base):
                continue
            if os.path.isdir(entry) and not os.path.islink(entry):
                _remove_ours(entry)
            else:
                os.remove(entry)  # a temporary file or a link: never a user's name
