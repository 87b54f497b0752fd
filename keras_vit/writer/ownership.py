"""What keras_vit may write, decided before any work. This module reads; it never writes.

Ownership markers and digests (an entry is ours only while it holds what we
wrote), identity of paths (device and inode, not spelling), private names
and whether their process ended, and a claim's checks (`check_output`).
`keras_vit.writer.files` writes. The rules and why: docs/reliability.md, "The writer".
"""

import errno
import hashlib
import json
import os
import re
import secrets
import socket
import stat

from keras_vit.utils.errors import ArgumentError, quote

MARKER = ".keras_vit.json"
# What keras_vit writes at a path: `FILE` (one file, whatever its format: its name says which,
# `keras_vit.commands.arguments.output_format`), or the kind of directory its marker records ("preset", "run", "huggingface", ...).
FILE = "file"
CHUNK = 1 << 20  # bytes read at a time
# The failures of a write that name their cause and fix for the user: a full disk (or quota), and a refusal.
NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
NOT_ALLOWED = (errno.EACCES, errno.EPERM, errno.EROFS)


# === Private names ===


def _pid_namespace():
    """The PID namespace this process sees PIDs in (the inode of `/proc/self/ns/pid`), or `""` where unknown."""
    try:
        return str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        return ""


def _host_tag():
    """Where a PID means one process: the hostname and the PID namespace (two containers may share a hostname)."""
    return hashlib.sha256(f"{socket.gethostname()}\0{_pid_namespace()}".encode()).hexdigest()[:8]


_PRIVATE = re.compile(r"^\.(?P<base>.+)\.keras_vit-(?P<host>[0-9a-f]{8})-(?P<pid>\d+)-[0-9a-f]{8}\."
                      r"(?P<role>incoming|old|tmp)(?:\..*)?$")


def private_name(base, role, suffix=""):
    """`.BASE.keras_vit-HOST-PID-RANDOM.ROLE[SUFFIX]`: a name no user picks and no other process shares."""
    return f".{base}.keras_vit-{_host_tag()}-{os.getpid()}-{secrets.token_hex(4)}.{role}{suffix}"


def abandoned(name, base=None):
    """True if `name` is a private name of ours (for `base`, if given) whose process, on this host, has ended."""
    match = _PRIVATE.match(name)
    if match is None or match["host"] != _host_tag() or base is not None and match["base"] != base:
        return False
    pid = int(match["pid"])
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, another user's
        return False
    return False


# === Ownership ===


def digest_of(path):
    """SHA-256 of a regular file, or of a directory tree (names, entry types, contents); `None` for a link."""
    if os.path.islink(path):
        return None
    digest = hashlib.sha256()
    if os.path.isdir(path):
        for directory, directories, files in os.walk(path):
            directories.sort()
            for name in sorted(directories + files):
                entry = os.path.join(directory, name)
                if name == MARKER and directory == path:
                    continue
                part = "link" if os.path.islink(entry) else ("dir" if os.path.isdir(entry) else digest_of(entry))
                digest.update(f"{os.path.relpath(entry, path)}\0{part}\0".encode())
        return "tree:" + digest.hexdigest()
    with open(path, "rb") as file:
        for chunk in iter(lambda: file.read(CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def read_marker(directory):
    """`(kind, entries)` of the marker in `directory` (entries: `{name: digest}`), or `(None, {})`.

    A marker written before content hashes lists names only: each gets the
    digest `None`, and is not ours (nothing proves what is there now is).
    """
    try:
        with open(os.path.join(directory, MARKER), encoding="utf-8") as file:
            marker = json.load(file)
    except (OSError, ValueError):
        return None, {}
    if not isinstance(marker, dict) or marker.get("writer") != "keras_vit":
        return None, {}
    entries = marker.get("entries", {})
    if isinstance(entries, list):
        entries = {name: None for name in entries if isinstance(name, str)}
    elif not isinstance(entries, dict):
        entries = {}
    return marker.get("kind"), entries


def owns(directory, name, entries):
    """True if `directory/name` holds what keras_vit recorded writing there (`entries` of its marker)."""
    recorded = entries.get(name)
    if recorded is None:  # not recorded, or an old marker's name without a digest
        return False
    # A list: a file being replaced, recorded before it is put in place (its old content or its new one).
    try:
        return digest_of(os.path.join(directory, name)) in (recorded if isinstance(recorded, list) else [recorded])
    except OSError:
        return False


def foreign_entries(directory, kind):
    """Entries of an existing `directory` that keras_vit did not write there as a `kind` directory (edited ones too)."""
    names = {name for name in os.listdir(directory) if name != MARKER and not abandoned(name)}
    marked_kind, entries = read_marker(directory)
    if marked_kind != kind:
        return sorted(names)
    return sorted(name for name in names if not owns(directory, name, entries))


# === Identity ===


def path_relation(path, other):
    """How `path` stands to `other`: `"is"`, `"contains"`, `"lies inside"`, or `None`.

    Compared by the identity (`st_dev`, `st_ino`) of each file and directory
    on the two paths, which a link, `..`, a hard link or a bind mount cannot
    change; parts that do not exist yet by their resolved spelling.
    """
    mine, theirs = _identity_chain(path), _identity_chain(other)
    if mine[0] == theirs[0]:
        return "is"
    if mine[0] in theirs[1:]:
        return "contains"
    if theirs[0] in mine[1:]:
        return "lies inside"
    return None


def _identity_chain(path):
    """The identities of `path` and of every directory above it, nearest first."""
    current = os.path.realpath(os.fspath(path))
    chain = []
    while True:
        try:
            status = os.stat(current)
            chain.append((status.st_dev, status.st_ino))
        except OSError:
            chain.append(current)
        parent = os.path.dirname(current)
        if parent == current:
            return chain
        current = parent


def check_not_nested(output, others, argument=None):
    """Refuse an output that is, contains, or lies inside one of `others` (`{what: path or paths}`), under any name.

    Raises:
        ArgumentError: e.g. "`output` ... is the model ...".
    """
    for what, paths in dict(others).items():
        for other in [paths] if isinstance(paths, (str, os.PathLike)) or paths is None else paths:
            relation = None if other is None else path_relation(output, other)
            if relation is not None:
                raise ArgumentError(f"{{name}} {quote(output)} {relation} the {what} {quote(other)}; writing it "
                                    "would replace or mix with what the command reads. Choose a path outside it.",
                                    argument)


# === A claim's checks, before any work ===


def check_output(path, kind, *, given=None, argument=None, inputs=None, names=None, directories=None,
                 make_parents=True):
    """Refuse, before any work, an output (as `keras_vit.writer.files.claim` takes it) that would lose a user's file or fail after the work.

    Raises:
        ArgumentError: naming the path, the problem, the fix and the argument.
    """
    given = path if given is None else given
    if not make_parents and not os.path.isdir(os.path.dirname(path)):
        raise ArgumentError(f"Cannot write {{name}} {quote(given)}: the directory {quote(os.path.dirname(path))} "
                            "does not exist. Create it first.", argument)
    if inputs:
        check_not_nested(given, inputs, argument)
    for target in [path] if names is None else [os.path.join(path, name) for name in names]:
        check_name_length(target, argument, shown=given if target == path else None)
    if names is None and os.path.lexists(path) and os.path.ismount(path):
        raise ArgumentError(
            f"{{name}} {quote(given)} is a mount point; keras_vit replaces an output by renaming a new one into "
            "its place, which a mount point does not allow. Write into it, not over it: give a path inside it, "
            f"such as {quote(os.path.join(given, 'model'))}.", argument)
    if kind == FILE:
        check_writable(given, argument)
    elif names is not None:
        check_writable_names(path, [name for name in names if name not in (directories or {})], kind, argument)
        for name, entry_kind in (directories or {}).items():
            check_replaceable(os.path.join(path, name), entry_kind, argument)
        _check_parent_writable(os.path.join(path, names[0] if names else "."), argument)  # what exists above
    else:
        check_replaceable(path, kind, argument)
        _check_parent_writable(path, argument)  # the new directory is built beside it (a read-only mount)


def check_replaceable(path, kind, argument=None):
    """Refuse to replace directory `path` where that would replace a user's file.

    A missing path, an empty directory or one that holds only what
    keras_vit wrote there as a `kind` directory may be replaced; anything
    else in it (a README, a `notes/` folder) is named, never carried,
    copied or moved.

    Raises:
        ArgumentError: naming the path, the entries that are not ours and the argument.
    """
    path = os.fspath(path)
    if not os.path.lexists(path):
        return
    if not os.path.isdir(path) or os.path.islink(path):
        raise ArgumentError(f"{{name}} {quote(path)} exists and is not a directory; keras_vit writes a directory "
                            "there. Choose another path.", argument)
    foreign = foreign_entries(path, kind)
    if foreign:
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        raise ArgumentError(
            f"{{name}} {quote(path)} holds files keras_vit did not write there ({shown}); keras_vit replaces this "
            f"directory whole, so writing the {kind} there would replace them. Choose a new or empty directory, "
            f"or move {'them' if len(foreign) > 1 else quote(foreign[0])} out of {quote(path)}.", argument)


def check_writable_names(directory, names, kind, argument=None):
    """Refuse to write `names` into `directory` where one is not free, nor what keras_vit wrote there as `kind`.

    Raises:
        ArgumentError: naming the directory, the names taken and the argument.
    """
    directory = os.fspath(directory)
    if not os.path.lexists(directory):
        return
    if not os.path.isdir(directory):
        raise ArgumentError(f"{{name}} {quote(directory)} exists and is not a directory; give a directory.", argument)
    for name in names:
        check_regular(os.path.join(directory, name), argument)
    marked_kind, entries = read_marker(directory)
    taken = sorted(name for name in names if os.path.lexists(os.path.join(directory, name))
                   and not (marked_kind == kind and owns(directory, name, entries)))
    if taken:
        raise ArgumentError(
            f"{{name}} {quote(directory)} already holds {', '.join(taken)}, which keras_vit did not write; it would "
            "overwrite them. Choose another directory, or move those files away.", argument)


_NODE_TYPES = {stat.S_IFIFO: "a FIFO (named pipe)", stat.S_IFSOCK: "a socket", stat.S_IFCHR: "a character device",
               stat.S_IFBLK: "a block device"}


def check_regular(path, argument=None):
    """Refuse an existing `path` that is neither a regular file nor a directory (a device, a FIFO, a socket)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:  # missing, or a dangling link (replaced by the file, never followed)
        return
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return
    what = _NODE_TYPES.get(stat.S_IFMT(mode), "a special file")
    label = "{name} " if argument else ""
    raise ArgumentError(f"{label}{quote(path)} is {what}, not a regular file; keras_vit writes only over a regular "
                        "file or a directory it wrote. Choose another path.", argument)


def check_writable(path, argument=None):
    """Refuse, before any long work, a file `path` that cannot be written (a directory, a missing or read-only parent).

    Raises:
        ArgumentError: naming the path and the fix.
    """
    path = os.fspath(path)
    label = "{name} " if argument else ""
    if os.path.isdir(path):
        raise ArgumentError(f"{label}{quote(path)} is a directory; give a file name to write to.", argument)
    check_regular(path, argument)
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise ArgumentError(f"Cannot write {label}{quote(path)}: the directory {quote(parent)} does not exist. "
                            "Create it first.", argument)
    if not os.access(parent, os.W_OK):
        raise ArgumentError(f"Cannot write {label}{quote(path)}: the directory {quote(parent)} is not writable.",
                            argument)


# The longest private name the writer makes beside a file `NAME`, minus `NAME` itself: a dot, the tag
# `.keras_vit-HOST-PID-RANDOM` (a process id of at most 7 digits), a role and a suffix (`.tmp.weights.h5`).
_PRIVATE_OVERHEAD = len(".") + len(".keras_vit-") + 8 + 1 + 7 + 1 + 8 + max(len(".incoming"), len(".tmp.weights.h5"))


def check_name_length(path, argument=None, shown=None):
    """Refuse a name too long for the private name it is first written under (`NAME_MAX` less the overhead)."""
    parent = os.path.dirname(os.path.abspath(path))
    while parent != os.path.dirname(parent) and not os.path.isdir(parent):
        parent = os.path.dirname(parent)
    try:
        name_max = os.pathconf(parent, "PC_NAME_MAX")
    except (OSError, ValueError):
        name_max = 255
    name = os.path.basename(os.path.abspath(path))
    length, limit = len(os.fsencode(name)), name_max - _PRIVATE_OVERHEAD
    if length > limit:
        label = "{name} " if argument else ""
        raise ArgumentError(
            f"{label}{quote(shown or path)}: its name {quote(name)} is {length} characters (bytes); keras_vit "
            f"takes names of at most {limit} there (the file system allows {name_max}, and the file is first "
            "written under a longer private name beside it). Choose a shorter name.", argument)


def _check_parent_writable(path, argument):
    parent = os.path.dirname(path)
    while parent and not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if parent and not os.access(parent, os.W_OK):
        raise ArgumentError(f"Cannot create {{name}} {quote(path)}: {quote(parent)} is not writable.", argument)
