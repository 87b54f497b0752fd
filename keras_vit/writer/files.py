"""The one writer: every file keras_vit writes, renames or removes goes through this module.

A command or workflow never writes a file itself. At its start it *claims*
each output, naming its inputs:

    destination = claim(args.out, FILE, inputs={"model": args.model}, argument="out")
    ...  # the long work
    save_model(model, destination)

and the claim refuses, before any work, what would lose a user's file or
fail after the work (`keras_vit.writer.ownership` decides, reading only): an
output that is, contains or lies inside an input, by identity; a directory
holding files keras_vit cannot prove it wrote; anything but a regular file or
a directory; a mount point; a name too long for its private staging name.
The claim is made once, by the command, and handed down to the save.

**A directory is replaced in one step.** It is built under a staging name
beside it and exchanged with the old one by Linux's
`renameat2(RENAME_EXCHANGE)`, so a kill at any instruction leaves the old or
the new directory at the path, never a mix. Where a kind keeps the user's
files (a Hugging Face directory beside a user's README), those plain files
are carried into the new directory as hard links before the exchange (the
same file, never a copy); a directory of the user's there is refused by name
before any work, never copied or moved. Where no exchange exists, the old
directory is moved aside first; a process that dies before the new one is in
place leaves no directory at the path: the next save of it moves the old one
back first, and a load, which never renames, names the old copy and the `mv`
that restores it.

**Staging is private and cleaned only when provably abandoned.** Staging,
retired and temporary names are `.NAME.keras_vit-HOST-PID-RANDOM.ROLE`:
the process id, a tag of the host and a random part, so no user and no
other process picks the same name. A leftover is removed (and only its
content that keras_vit wrote) when its host is this one and its process is
no longer alive, and only by a save of the same path, never by a load.

Reading a directory for upload (links refused, never followed) is
`keras_vit.writer.uploads`.

**Modes follow the umask**: new files get `0o666 & ~umask`, directories
`0o777 & ~umask`; a replaced file or directory keeps its mode.

**A full disk** is checked before a weights file is written (HDF5 does not
survive one), and any `ENOSPC` names the user's path, not the staging name.

**Jobs of many processes**: the writer writes wherever it is called. Which
process writes is the job's engine's decision alone
(`keras_vit.distribution.engines`): the callers above ask it
(`engines.current().save_for_job`), and the writer imports nothing above
`utils`.
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

from keras_vit.utils.errors import ArgumentError
from keras_vit.writer.ownership import (  # noqa: F401  (public names of the writer, importable from here)
    CHUNK,
    KEEPS_USERS_FILES,
    MARKER,
    NOT_ALLOWED,
    NO_SPACE,
    OUTPUT_FILE_FORMATS,
    abandoned_copy,
    abandoned_private,
    check_name_length,
    check_no_users_directories,
    check_not_nested,
    check_parent_writable,
    check_regular,
    check_replaceable,
    check_writable,
    check_writable_names,
    digest_of,
    foreign_entries,
    output_format,
    owns,
    path_relation,
    private_name,
    quote,
    read_marker,
)

# The one word `kind` means what keras_vit writes at a path: `FILE` (one file, whatever its format), or the
# kind of directory a marker records (`"preset"`, `"run"`, `"huggingface"`, ...). A file's format (`.keras`,
# `.weights.h5`, `.safetensors`) is said by its name (`output_format`), an entry's type by `os.stat`.
FILE = "file"


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


def _new_file_mode(path=None):
    """The mode of the file being replaced at `path`, or what the umask gives a new file."""
    if path is not None:
        try:
            return os.stat(path).st_mode & 0o7777
        except (FileNotFoundError, NotADirectoryError):
            pass
    return 0o666 & ~_umask()


def mark_directory(directory, kind, names):
    """Record that keras_vit wrote `names` (inside `directory`) as a `kind` directory, with their digests.

    Entries recorded before for the same kind are kept.

    Args:
        directory: str. The directory whose marker is written.
        kind: str. What keras_vit keeps there (e.g. `"run"`).
        names: iterable of str. Entries written, each recorded by its digest.
    """
    previous_kind, entries = read_marker(directory)
    entries = dict(entries) if previous_kind == kind else {}
    for name in names:
        path = os.path.join(directory, name)
        if os.path.lexists(path):
            entries[name] = digest_of(path)
        # A name not written yet is not recorded: whoever writes it first owns it.
    _write_marker(directory, {"writer": "keras_vit", "kind": kind, "entries": dict(sorted(entries.items()))})


def _write_marker(directory, document):
    with atomic_write(os.path.join(directory, MARKER), "w") as file:
        json.dump(document, file, indent=1)


# === Destinations ===


def claim(path, kind, *, inputs=None, argument=None, names=None, directories=None, reserved=(), in_place=False,
          make_parents=True):
    """Check an output before any work and return the `Destination` that writes it.

    Args:
        path: str or path-like. The file or directory to write.
        kind: str. `FILE` (`"file"`) for one file, whatever its format; a
            directory kind otherwise (`"preset"`,
            `"huggingface"`, `"export"`, `"run"`,
            `"figures"`...), recorded in its marker.
        inputs: dict `{what: path or list of paths}` the command reads;
            an output that is, contains or lies inside one is refused.
        argument: str or `None`. The argument that named `path` (`"out"`,
            `"directory"`); errors name it (the command line shows its flag).
        names: list of str or `None`. For a directory the command writes
            files *into* (beside the user's own, e.g. figures or a run
            directory): the names it writes, each free or ours. `None`
            replaces the whole directory.
        directories: dict `{name: kind}` or `None`. With `names`: the
            directories the command writes into it (a run's backup slots),
            each new, empty, or keras_vit's by its own marker (of that kind,
            holding nothing else); a user's file inside one is refused by
            name. Written with `new_directory(name)`.
        reserved: names the new directory will hold, for a kind that keeps
            the user's files beside ours: each must be free or ours.
        in_place: bool. The command is documented to update its input in
            place: the overlap check is skipped. Defaults to `False`.
        make_parents: bool. Create missing directories above the output;
            `False` refuses an output whose parent directory is missing
            (a mistyped path fails before the work). Defaults to `True`.

    Returns:
        A `Destination`.

    Raises:
        ArgumentError: naming the path, the problem and the argument.
    """
    return Destination(path, kind, inputs=inputs, argument=argument, names=names, directories=directories,
                       reserved=reserved, in_place=in_place, make_parents=make_parents)


class Destination:
    """An output the writer checked: a file, a directory replaced whole, or names written into a directory.

    Made by `claim`. Write with `file()` / `staged()` (one file), `directory()`
    (a directory replaced in one step), or `file(name)` / `staged(name=)` /
    `save_text` / `save_json` / `save_figure` / `new_directory(name)` (names
    into a directory); `remove(name)` deletes a claimed entry only while it
    holds what keras_vit wrote.
    """

    def __init__(self, path, kind, *, inputs=None, argument=None, names=None, directories=None, reserved=(),
                 in_place=False, make_parents=True):
        if path is None:
            raise ArgumentError("{name} is required: give a path to write to.", argument)
        self.path = os.path.abspath(os.fspath(path))
        self.given = os.fspath(path)
        self.kind = kind
        self.argument = argument
        self.directories = dict(directories or {})
        self.names = None if names is None else [*names, *self.directories]
        self.reserved = tuple(reserved)
        parent = os.path.dirname(self.path)
        if not make_parents and not os.path.isdir(parent):
            raise ArgumentError(f"Cannot write {{name}} {quote(self.given)}: the directory {quote(parent)} does not "
                                "exist. Create it first.", argument)
        if not in_place and inputs:
            check_not_nested(self.given, inputs, argument)
        for target in [self.path] if self.names is None else [os.path.join(self.path, name) for name in self.names]:
            check_name_length(target, argument, shown=self.given if target == self.path else None)
        if self.names is None and os.path.lexists(self.path) and os.path.ismount(self.path):
            raise ArgumentError(
                f"{{name}} {quote(self.given)} is a mount point; keras_vit replaces an output by renaming a new one "
                "into its place, which a mount point does not allow. Write into it, not over it: give a path "
                f"inside it, such as {quote(os.path.join(self.given, 'model'))}.", argument)
        if kind == FILE:
            if os.path.lexists(self.path) and os.path.isdir(self.path):
                raise ArgumentError(f"{{name}} {quote(self.given)} is a directory; give a file name to write to.",
                                    argument)
            check_writable(self.given, argument)
        elif self.names is not None:
            check_writable_names(self.path, [name for name in self.names if name not in self.directories], kind,
                                 argument)
            for name, entry_kind in self.directories.items():
                check_replaceable(os.path.join(self.path, name), entry_kind, argument)
            # The names are written inside it: it, or the nearest directory above it that exists, must be writable.
            check_parent_writable(os.path.join(self.path, self.names[0] if self.names else "."), argument)
        else:
            check_replaceable(self.path, kind, argument, names=self.reserved)
            retired = interrupted_save(self.path)
            if retired is not None:  # the save moves a killed save's copy back first: checked now, not after
                check_replaceable(retired, kind, argument, names=self.reserved)
            # Whether or not it exists: the new directory is built beside it, in its parent (a read-only mount).
            check_parent_writable(self.path, argument)

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

    def _prepare(self, name):
        if name is not None:
            # Again, on purpose: the claim was made at the command's start and the work (a training) came between;
            # a file the user put at `name` since is refused, not overwritten.
            check_writable_names(self.path, [name], self.kind, self.argument)
            os.makedirs(self.path, exist_ok=True)
        _clean_abandoned(self._target(name))

    def _record(self, name):
        if name is not None:
            mark_directory(self.path, self.kind, [name])

    def _announce(self, name):
        """Before `name` is put in place: record its new content beside the old in the marker (by digest).

        A kill after the file is in place and before `_record` leaves a file
        the marker already knows as ours, so the rerun replaces it; a kill
        before it is in place leaves the old file, also known. At no time
        is a file keras_vit wrote unrecorded, nor is a user's file adopted
        (its digest is neither).
        """
        if name is None:
            return None

        def announce(temporary):
            kind, entries = read_marker(self.path)
            entries = dict(entries) if kind == self.kind else {}
            old = entries.get(name)
            if isinstance(old, list):
                known = old
            else:
                known = [old] if isinstance(old, str) else []
            entries[name] = sorted(set(known) | {digest_of(temporary)})
            _write_marker(self.path, {"writer": "keras_vit", "kind": self.kind,
                                      "entries": dict(sorted(entries.items()))})

        return announce

    @contextlib.contextmanager
    def file(self, name=None, mode="wb"):
        """A file object whose content replaces the file only when the block succeeds."""
        self._prepare(name)
        with atomic_write(self._target(name), mode, before_replace=self._announce(name)) as file:
            yield file
        self._record(name)

    @contextlib.contextmanager
    def staged(self, name=None, suffix=""):
        """A temporary path (ending in `suffix`) that is renamed onto the file when the block succeeds.

        For writers that take a path (Keras insists on `.keras` /
        `.weights.h5`); the temporary name is private to this process.
        """
        self._prepare(name)
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

    def remove(self, name):
        """Delete claimed entry `name` while it holds what keras_vit wrote; anything else is left as it is.

        A file is ours by the digest this directory's marker records; a
        directory (`directories`) by its own marker, holding nothing else.

        Returns:
            True if nothing is left at the name.
        """
        path = self._target(name)
        if name in self.directories:
            if os.path.isdir(path) and not os.path.islink(path) and not foreign_entries(path, self.directories[name]):
                _remove_ours(path)
        else:
            kind, entries = read_marker(self.path)
            if kind == self.kind and owns(self.path, name, entries):
                os.remove(path)
        return not os.path.lexists(path)

    @contextlib.contextmanager
    def new_directory(self, name):
        """Write claimed directory `name` anew: built under a private name, then put in place of the old one.

        For a directory nothing reads while it is written (the backup slot a
        run's pointer does not name): the old one is removed, then the new
        one renamed in, so no exchange is needed and nothing is carried. A
        kill leaves the old directory, a part of it (ours by its marker),
        or the new one, and at most a private staging name the next write
        of `name` removes.

        Yields:
            str. The private directory to write into; on success its files
            are recorded in its marker, flushed to disk, and it takes `name`.
        """
        path, kind = self._target(name), self.directories.get(name)
        if kind is None:
            raise ValueError(f"{name!r} was not claimed as a directory in {quote(self.path)}.")
        os.makedirs(self.path, exist_ok=True)
        _clean_abandoned(path)  # the staging of a killed write of `name`
        staging = os.path.join(self.path, private_name(name, "incoming"))
        try:
            os.mkdir(staging)
            _write_marker(staging, _staging_marker(kind))  # a leftover is recognisably ours
            yield staging
            _write_marker(staging, {"writer": "keras_vit", "kind": kind, "entries": {
                entry: digest_of(os.path.join(staging, entry)) for entry in os.listdir(staging) if entry != MARKER}})
            _flush_tree(staging)
            # Again: time passed since the claim (an epoch), and a file the user put there since is refused by
            # name, never removed.
            check_replaceable(path, kind, self.argument)
            if os.path.lexists(path):
                _remove_ours(path)
            os.rename(staging, path)
            _flush_directory(self.path)
        except BaseException as error:
            if os.path.isdir(staging):
                with contextlib.suppress(OSError):
                    shutil.rmtree(staging)  # all ours: made under our private name by this process
            full = _no_space_error(error, path)
            if full is not None:
                raise full from None
            raise

    @contextlib.contextmanager
    def directory(self):
        """Build the directory under a private staging name, then exchange it with the old one in one step.

        Yields:
            str. The staging directory to write into. When the block
            succeeds, what it holds is recorded as ours (with digests) and
            swapped into place; the user's files of a kind that keeps them
            are carried over; the old content that was ours is removed.
            When it fails, the path keeps its old content.
        """
        if self.kind == FILE or self.names is not None:
            raise ValueError(f"{quote(self.path)} was claimed as a file or for names, not as a "
                             "directory to replace.")
        with _replaced_directory(self.path, self.kind, self.argument, self.reserved) as staging:
            yield staging


# === Writing one file ===


@contextlib.contextmanager
def atomic_write(path, mode="wb", before_replace=None):
    """Open a private temporary file that replaces `path` only when the block succeeds.

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
    # Checked here, when the file is opened: after a claim, the work came between (a directory may have been
    # put at the path since); called alone, this is the only check.
    check_writable(path)
    # A killed earlier write of this path left its private temporary: ours, of an ended process, never the user's.
    _clean_abandoned(path)
    with _staged_path(path, before_replace=before_replace) as temporary:
        with open(temporary, mode.replace("w", "x")) as file:  # created here, never an existing file
            yield file
            file.flush()
            os.fsync(file.fileno())


@contextlib.contextmanager
def _staged_path(path, suffix="", before_replace=None):
    """A private temporary path beside `path`, renamed onto it when the block succeeds.

    `before_replace(temporary)`, if given, runs when the file is complete and
    before it is renamed into place (to record it as ours first).
    """
    directory, base = os.path.split(os.path.abspath(path))
    temporary = os.path.join(directory, private_name(base, "tmp", suffix))
    mode = _new_file_mode(path)
    try:
        yield temporary
        if not os.path.isfile(temporary):
            raise FileNotFoundError(errno.ENOENT, "the writer left no file", temporary)
        # Files made through a temporary name (mkstemp, Keras' zip writer) may not get the umask's mode.
        os.chmod(temporary, mode)
        if before_replace is not None:
            before_replace(temporary)
        os.replace(temporary, path)
    except BaseException as error:
        with contextlib.suppress(OSError):
            os.remove(temporary)
        full = _no_space_error(error, path)
        if full is not None:
            raise full from None
        raise


def save_model(model, destination, weights_only=False):
    """`model.save` (or `save_weights`) to a claimed destination, through a private temporary name.

    A kill leaves the old file or the new one. This process writes: in a job
    of several processes, the caller asks the job's engine which process
    writes (`engines.current().save_for_job`).

    Args:
        model: a `keras.Model`.
        destination: a `Destination` claimed as a file (`claim(path, FILE)`),
            by the command at its start or by the public function the
            user called with a path.
        weights_only: bool. `save_weights` instead of `save`.
    """
    with destination.staged(suffix=".weights.h5" if weights_only else ".keras") as temporary:
        write_model_file(model, temporary, weights_only)


def write_model_file(model, path, weights_only=False):
    """Keras' own save into `path`, a staging path the writer gave (a staging directory or temporary name).

    Raises:
        OSError: `ENOSPC` before anything is written where the disk has
            clearly no room for the file (see `check_room`).
    """
    variables = list(model.weights)
    optimizer = getattr(model, "optimizer", None)
    if not weights_only and optimizer is not None and getattr(optimizer, "built", False):
        variables += list(optimizer.variables)
    check_room(os.path.dirname(os.path.abspath(path)), _saved_size(variables))
    if weights_only:
        model.save_weights(path)
    else:
        model.save(path)


# What HDF5 adds to each variable's bytes (object header, attributes, the group path): about 3 KiB measured
# on Keras 3's weights files (20 to 150 variables); 4 KiB each and 64 KiB for the file, to be safe.
_H5_PER_VARIABLE = 4096
_H5_PER_FILE = 65536


def _saved_size(variables):
    size = _H5_PER_FILE
    for variable in variables:
        count = 1
        for dimension in variable.shape:
            count *= int(dimension)
        itemsize = getattr(getattr(variable, "dtype", None), "itemsize", None)
        if itemsize is None:
            import numpy as np

            itemsize = np.dtype(variable.dtype).itemsize
        size += count * itemsize + _H5_PER_VARIABLE
    return size


def check_room(directory, size):
    """Raise `ENOSPC` before writing `size` bytes into `directory` where its file system has less free.

    HDF5 (under Keras' weights files) does not survive a full disk: its
    file is closed after the failed write and the process dies inside the
    library (a segmentation fault). Where the size is known in advance, the
    writer checks first, so a full disk is a clear error that the writer
    cleans up after.
    """
    try:
        status = os.statvfs(directory)
    except (OSError, AttributeError):  # no statvfs (Windows): nothing to check against
        return
    free = status.f_bavail * status.f_frsize
    if free < size:
        raise OSError(errno.ENOSPC, f"No space left on device: about {size / 2**20:.1f} MiB are needed and "
                      f"{free / 2**20:.1f} MiB are free", directory)




def _no_space_error(error, path):
    """`error` again, naming the user's `path` (not the private name) when it is a full disk or a refusal.

    A staged write fails on keras_vit's hidden staging name; the user knows
    only `path`. A full disk (or quota) and a permission refused (or a
    read-only file system) become one error naming `path`, the cause and
    the fix. Other errors are returned as `None` (raised as they are).
    """
    if not isinstance(error, OSError) or error.errno not in NO_SPACE + NOT_ALLOWED:
        return None
    if error.errno in NO_SPACE:
        fix = "Free some space or write elsewhere, and save again"
    else:
        fix = "Choose a folder you can write to (or fix its permissions), and save again"
    made = PermissionError if error.errno in (errno.EACCES, errno.EPERM) else OSError
    return made(error.errno, f"{os.strerror(error.errno)} while writing it; nothing was changed (the previous "
                f"content, if any, is kept). {fix}", path)


def discarded_copy(write, name):
    """`write(path)` for a `path` in a private scratch directory that is deleted at once.

    What a process other than 0 does where saving is collective (a JAX or
    TensorFlow job of several processes): Keras needs every process to take
    part in the save, and only process 0's file is kept.
    """
    with tempfile.TemporaryDirectory(prefix="keras_vit-discarded-") as scratch:
        write(os.path.join(scratch, name))


def write_json_file(path, value, **options):
    """A JSON file written whole (for a file inside a staging directory, or one claimed file)."""
    with atomic_write(path, "w") as file:
        json.dump(value, file, **options)


# === Replacing a directory in one step ===

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


def _staging_marker(kind, carried=()):
    return {"writer": "keras_vit", "kind": kind, "entries": {}, "staging": {"pid": os.getpid(),
                                                                           "carried": sorted(carried)}}


@contextlib.contextmanager
def _replaced_directory(path, kind, argument=None, reserved=()):
    parent, base = os.path.split(path)
    os.makedirs(parent, exist_ok=True)
    recover_abandoned(path)
    # Again, on purpose: the claim was made at the command's start and the work came between; a file the user
    # put into the directory since is refused here, before anything of it is replaced.
    check_replaceable(path, kind, argument, names=reserved)
    staging = os.path.join(parent, private_name(base, "incoming"))
    try:
        os.mkdir(staging)  # mode 0o777 & ~umask
        _write_marker(staging, _staging_marker(kind))  # a leftover is recognisably ours, and what in it is ours
        yield staging
        entries = {name: digest_of(os.path.join(staging, name)) for name in os.listdir(staging) if name != MARKER}
        carried = []
        if kind in KEEPS_USERS_FILES and os.path.isdir(path):
            carried = foreign_entries(path, kind)
            # Again, after the work: a directory the user made meanwhile is refused, never copied.
            check_no_users_directories(path, carried, argument)
            for name in carried:
                if name in entries:
                    raise ArgumentError(f"{{name}} {quote(path)} holds {name}, which keras_vit did not write; it "
                                        "would overwrite it. Move it away and save again.", argument)
            _write_marker(staging, _staging_marker(kind, carried))
            for name in carried:  # the same file under two names until the old directory goes
                os.link(os.path.join(path, name), os.path.join(staging, name), follow_symlinks=False)
        # From here the staging directory's marker is the new directory's: what it holds of ours, by digest
        # (a leftover's entries not listed, the user's, go back to `path`).
        _write_marker(staging, {"writer": "keras_vit", "kind": kind, "entries": entries})
        if os.path.isdir(path):
            _keep_modes(path, staging, skip=carried)
        if not os.path.isdir(path):
            os.rename(staging, path)
            return
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
            _remove_retired(retired, path)
        except OSError as error:  # the new content is in place; the next save of `path` removes the rest
            warnings.warn(f"{quote(path)} was saved, but its old content could not be removed ({error}); the "
                          "next save of it removes it.", UserWarning, stacklevel=3)
    except BaseException as error:
        if staging is not None and os.path.isdir(staging):
            # What cannot be removed now is of an ended process after this one: the next save of `path` removes it.
            with contextlib.suppress(OSError):
                _remove_retired(staging, path)
        full = _no_space_error(error, path)
        if full is not None:
            raise full from None
        raise


def _keep_modes(old, new, skip=()):
    """Give directory `new` the mode of `old`, and each regular file of `new` the mode of its namesake in `old`.

    A replaced file keeps its mode: a preset kept private (0o700, files
    0o600) stays private after a save.
    """
    os.chmod(new, stat.S_IMODE(os.stat(old).st_mode))
    for name in os.listdir(new):
        if name in skip:
            continue
        try:
            before, after = os.lstat(os.path.join(old, name)), os.lstat(os.path.join(new, name))
        except OSError:
            continue
        if stat.S_ISREG(before.st_mode) and stat.S_ISREG(after.st_mode):
            os.chmod(os.path.join(new, name), stat.S_IMODE(before.st_mode))


def _remove_retired(directory, path):
    """Remove what keras_vit wrote in a staging or retired `directory`; keep the rest (the user's).

    An entry goes when it is ours by the directory's marker (its digest
    matches), when the marker says the directory was staging and the entry
    was not carried from the user, or when the same file is at `path` (a
    carried hard link). Anything else is the user's: moved back to `path`
    when its name is free there, else left, with the directory.
    """
    marker = {}
    with contextlib.suppress(OSError, ValueError):
        with open(os.path.join(directory, MARKER), encoding="utf-8") as file:
            marker = json.load(file)
    marker = marker if isinstance(marker, dict) and marker.get("writer") == "keras_vit" else {}
    staging = marker.get("staging") if isinstance(marker.get("staging"), dict) else None
    carried = set(staging.get("carried", [])) if staging else set()
    _, entries = read_marker(directory)
    kept = []
    for name in os.listdir(directory):
        if name == MARKER:
            continue
        entry = os.path.join(directory, name)
        twin = os.path.join(path, name)
        ours = ((staging is not None and name not in carried) or owns(directory, name, entries)
                or abandoned_private(name))
        same = os.path.lexists(twin) and _same_file(entry, twin)
        if ours or same:
            if os.path.isdir(entry) and not os.path.islink(entry):
                # Renamed first: a private name of an ended process is ours wherever it is found, so a kill inside
                # the removal leaves only that.
                doomed = os.path.join(directory, name if abandoned_private(name) else private_name(name, "old"))
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
        elif os.path.isdir(path) and not os.path.lexists(twin):
            os.rename(entry, twin)
        else:
            kept.append(name)
    if kept:
        warnings.warn(f"{quote(directory)} keeps {', '.join(sorted(kept))}, which keras_vit did not write; "
                      "move them back where they belong.", UserWarning, stacklevel=3)
        return
    with contextlib.suppress(FileNotFoundError):
        os.remove(os.path.join(directory, MARKER))
    os.rmdir(directory)


def _same_file(first, second):
    try:
        a, b = os.lstat(first), os.lstat(second)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _remove_ours(directory):
    """Remove a directory keras_vit wrote whole, its marker last: a kill leaves a part of it that is still ours."""
    for name in os.listdir(directory):
        if name != MARKER:
            entry = os.path.join(directory, name)
            if os.path.isdir(entry) and not os.path.islink(entry):
                shutil.rmtree(entry)
            else:
                os.remove(entry)
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


def recover_abandoned(path):
    """Clean what a killed save of `path` left beside it: only private names of ended processes on this host.

    Where the system has no atomic exchange, a swap moves the old directory
    aside before moving the new one in; a kill between leaves no directory
    at `path`, and this moves the newest retired one back (only keras_vit's:
    a directory with our marker, never a link). Called by saves of `path`,
    never by a load.
    """
    path = os.path.abspath(os.fspath(path))
    parent, base = os.path.split(path)
    if not os.path.isdir(parent):
        return
    leftovers = [os.path.join(parent, name) for name in os.listdir(parent) if abandoned_copy(name, base)]
    retired = interrupted_save(path)
    if retired is not None:
        os.rename(retired, path)
        leftovers.remove(retired)
    for entry in leftovers:
        if os.path.isdir(entry) and not os.path.islink(entry):
            _remove_retired(entry, path)
        elif os.path.lexists(entry):
            os.remove(entry)  # a temporary file: never a user's name


def killed_save_copies(path):
    """What a killed save of a missing `path` left beside it: `(restorable, not_ours)`.

    Where the system has no atomic exchange, a save moves the old directory
    aside (`.NAME.keras_vit-HOST-PID-RANDOM.old`) before moving the new one
    in; a kill between the two leaves `path` missing. Only entries under
    that name of an ended process on this host (and PID namespace) count.

    Returns:
        `restorable`: the newest such copy that is keras_vit's (a directory,
        not a link, with a keras_vit marker), or `None`. `not_ours`: the
        entries under such a name that are not (a symbolic link, a file, a
        directory without a marker): never read, followed or moved.
    """
    path = os.path.abspath(os.fspath(path))
    parent, base = os.path.split(path)
    if os.path.lexists(path) or not os.path.isdir(parent):
        return None, []
    restorable, not_ours = [], []
    for name in sorted(os.listdir(parent)):
        if not (abandoned_copy(name, base) and name.endswith(".old")):
            continue
        entry = os.path.join(parent, name)
        if os.path.isdir(entry) and not os.path.islink(entry) and read_marker(entry)[0] is not None:
            restorable.append(entry)
        else:
            not_ours.append(entry)
    return (max(restorable, key=os.path.getmtime) if restorable else None), not_ours


def interrupted_save(path):
    """The old copy, keras_vit's, that a killed save left beside a missing `path`, or `None`.

    A save of `path` moves it back before it swaps in the new directory
    (`recover_abandoned`); a load never moves it: it names it, with the `mv`
    that restores it (`keras_vit.presets.handles`).
    """
    return killed_save_copies(path)[0]


def _clean_abandoned(path):
    with contextlib.suppress(OSError):
        recover_abandoned(path)


@contextlib.contextmanager
def atomic_directory(path, kind="output"):
    """Build a directory under a private staging name and swap it into place (`claim(path, kind).directory()`)."""
    with claim(path, kind).directory() as staging:
        yield staging
