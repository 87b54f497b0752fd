"""What keras_vit may write, decided before any work: ownership, identity, private names, names and places.

The writer's read-only half (`keras_vit.writer.files` writes):

- **Ownership by content.** A directory keras_vit writes carries a marker,
  `.keras_vit.json`, naming its kind and each entry keras_vit wrote with the
  SHA-256 of what it wrote. An entry is ours only while its content is what
  we wrote; a file keras_vit cannot prove it wrote (no digest, as in markers
  written before content hashes, or another digest) is the user's.
- **Identity, not spelling.** Two paths are compared by the device and inode
  numbers of the file and of every directory above it, so a symbolic link,
  `..`, a hard link or a bind mount cannot hide that an output is, holds or
  lies inside an input.
- **Private names.** Staging, retired and temporary names are
  `.NAME.keras_vit-HOST-PID-RANDOM.ROLE` (HOST: a tag of the hostname and
  the PID namespace); one whose process ended on this host, in this PID
  namespace, is abandoned: keras_vit's, to clean, never a user's file.
- **Checks before the work**: only a regular file or a directory keras_vit
  owns is written over; a name must leave room for its private name; an
  output's parent must be writable.
"""

import errno
import hashlib
import json
import os
import re
import secrets
import socket
import stat

from keras_vit.utils.errors import ArgumentError, quote  # noqa: F401 (the writer's messages)

MARKER = ".keras_vit.json"
# Directory kinds whose replacement keeps the user's plain files in them (hard links in the new directory;
# a user's directory there is refused); the others refuse a directory that holds anything keras_vit did not
# write there.
KEEPS_USERS_FILES = ("huggingface",)
CHUNK = 1 << 20  # bytes read at a time
# The failures of a write that name their cause and fix for the user: a full disk (or quota), and a refusal.
NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
NOT_ALLOWED = (errno.EACCES, errno.EPERM, errno.EROFS)


# === Names, processes ===


def _pid_namespace():
    """The PID namespace this process sees PIDs in (the inode of `/proc/self/ns/pid`), or `""` where unknown."""
    try:
        return str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        return ""


def _host_tag():
    """A tag of where a PID means one process: the hostname and the PID namespace.

    Two containers sharing a hostname and a folder (or TMPDIR) see each
    other's PIDs as ended; with the namespace in the tag, another
    namespace's private names are never taken for an ended process's.
    """
    return hashlib.sha256(f"{socket.gethostname()}\0{_pid_namespace()}".encode()).hexdigest()[:8]


_PRIVATE = re.compile(r"^\.(?P<base>.+)\.keras_vit-(?P<host>[0-9a-f]{8})-(?P<pid>\d+)-[0-9a-f]{8}\."
                      r"(?P<role>incoming|old|tmp)(?:\..*)?$")


def private_name(base, role, suffix=""):
    """`.BASE.keras_vit-HOST-PID-RANDOM.ROLE[SUFFIX]`: a name no user picks and no other process shares."""
    return f".{base}.keras_vit-{_host_tag()}-{os.getpid()}-{secrets.token_hex(4)}.{role}{suffix}"


def _process_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


def abandoned_copy(name, base):
    """True if `name` is a private name of ours for `base` whose process, on this host, has ended."""
    match = _PRIVATE.match(name)
    if match is None or match["base"] != base or match["host"] != _host_tag():
        return False
    pid = int(match["pid"])
    return pid != os.getpid() and not _process_alive(pid)


def abandoned_private(name):
    """True if `name` is any private name of ours (staging, retired, temporary) whose process, here, has ended.

    Such an entry is keras_vit's, never the user's, wherever it is found
    (inside a directory a killed save was writing): it is removed, never
    kept or carried as a user's file.
    """
    match = _PRIVATE.match(name)
    if match is None or match["host"] != _host_tag():
        return False
    pid = int(match["pid"])
    return pid != os.getpid() and not _process_alive(pid)


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
                relative = os.path.relpath(entry, path)
                if name == MARKER and directory == path:
                    continue
                part = "link" if os.path.islink(entry) else ("dir" if os.path.isdir(entry) else digest_of(entry))
                digest.update(f"{relative}\0{part}\0".encode())
        return "tree:" + digest.hexdigest()
    with open(path, "rb") as file:
        for chunk in iter(lambda: file.read(CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def read_marker(directory):
    """`(kind, entries)` of the marker in `directory` (entries: `{name: digest}`), or `(None, {})`.

    A marker written before content hashes lists names only: each gets the
    digest `None`, and is not ours (keras_vit cannot prove it wrote what is
    there now: a model card the user edited since).
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
    """True if `directory/name` holds what keras_vit recorded writing there."""
    if name not in entries:
        return False
    path = os.path.join(directory, name)
    recorded = entries[name]
    if recorded is None:  # an old marker's name without a digest: nothing proves the content is ours
        return False
    # A list: a file being replaced, recorded before it is put in place (its old content or its new one).
    accepted = recorded if isinstance(recorded, list) else [recorded]
    try:
        return digest_of(path) in accepted
    except OSError:
        return False


def foreign_entries(directory, kind):
    """Entries of an existing `directory` that keras_vit did not write there as a `kind` directory.

    An entry we wrote whose content changed since (an edited model card) is
    the user's, and is listed.
    """
    names = {name for name in os.listdir(directory) if name != MARKER and not abandoned_private(name)}
    marked_kind, entries = read_marker(directory)
    if marked_kind != kind:
        return sorted(names)
    return sorted(name for name in names if not owns(directory, name, entries))


# === Checks made before any work ===


def check_not_nested(output, others, argument=None):
    """Refuse an output that is, contains, or lies inside one of `others` (`{what: path or paths}`).

    Links and `..` are resolved first, so `./sub/../m.keras` and a link to
    `m.keras` are `m.keras`.

    Raises:
        ArgumentError: e.g. "`output` ... is the model ...".
    """
    if output is None:
        return
    for what, paths in dict(others).items():
        for other in [paths] if isinstance(paths, (str, os.PathLike)) or paths is None else paths:
            relation = None if other is None else path_relation(output, other)
            if relation is None:
                continue
            raise ArgumentError(f"{{name}} {quote(output)} {relation} the {what} {quote(other)}; writing it would "
                                "replace or mix with what the command reads. Choose a path outside it.", argument)


# What the writer writes for an output path, by the ending of the name the user gave it; any other name is a
# directory (a preset, a Hugging Face or an export directory). The one place a command's output format is named.
OUTPUT_FILE_FORMATS = {".keras": "keras", ".weights.h5": "weights", ".safetensors": "safetensors"}


def output_format(path):
    """The format of file an output path names: `"keras"`, `"weights"`, `"safetensors"`, or `None` (a directory)."""
    lower = os.fspath(path).lower()
    return next((found for ending, found in OUTPUT_FILE_FORMATS.items() if lower.endswith(ending)), None)


def path_relation(path, other):
    """How `path` stands to `other`, by the identity of each file and directory on their paths.

    Two names of one file or directory (a symbolic link, `..`, a hard link,
    a bind mount) are the same: `realpath` cannot see a bind mount, but the
    device and inode numbers (`st_dev`, `st_ino`) of the directory are the
    same under either name. Parts of a path that do not exist yet are
    compared by their resolved spelling.

    Returns:
        `"is"`, `"contains"`, `"lies inside"`, or `None` when neither holds
        any part of the other.
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
    """The identities of `path` and of every directory above it, nearest first.

    An existing entry is its `(st_dev, st_ino)`; a missing one, its resolved
    absolute spelling.
    """
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


def check_replaceable(path, kind, argument=None, names=()):
    """Refuse, before any work, to replace directory `path` where that would replace a user's file.

    A missing path or an empty directory may be written; so may a directory
    whose marker says it is a `kind` directory and that holds nothing else.
    For a kind that keeps the user's files (`KEEPS_USERS_FILES`), only the
    `names` the new directory needs must be free or ours, and none of the
    user's entries may be a directory (`check_no_users_directories`).

    Raises:
        ArgumentError: naming the path, the files that are not ours, and
            the argument to change.
    """
    path = os.fspath(path)
    if not os.path.lexists(path):
        return
    if not os.path.isdir(path) or os.path.islink(path):
        raise ArgumentError(f"{{name}} {quote(path)} exists and is not a directory; keras_vit writes a directory "
                            "there. Choose another path.", argument)
    foreign = foreign_entries(path, kind)
    if kind in KEEPS_USERS_FILES:
        check_no_users_directories(path, foreign, argument)
        taken = [name for name in foreign if name in names]
        if taken:
            raise ArgumentError(
                f"{{name}} {quote(path)} already holds {', '.join(taken)}, which keras_vit did not write; it would "
                "overwrite them. Choose another directory, or move those files away.", argument)
        return
    if foreign and _written_by_keras_hub(path, foreign):
        raise ArgumentError(
            f"{{name}} {quote(path)} holds keras-hub's task files ({', '.join(foreign)}): keras-hub's "
            "`Task.save_to_preset` is saving a task whose backbone is a keras_vit model, and keras-hub cannot "
            "load a keras_vit backbone from a preset. Save the whole task as one file instead: "
            "`task.save('task.keras')` (it loads with `keras.saving.load_model('task.keras')` once keras_vit and "
            "keras_hub are imported), or the backbone alone with `keras_vit`: "
            "`task.backbone.save_to_preset(another_directory)`.", argument)
    if foreign:
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        raise ArgumentError(
            f"{{name}} {quote(path)} holds files keras_vit did not write there ({shown}); writing the {kind} "
            "there would replace them. Choose a new or empty directory.", argument)


def check_no_users_directories(path, foreign, argument=None):
    """Refuse a directory to replace whole that holds directories of the user's (of `foreign`), naming each.

    The user's plain files are kept in the new directory as hard links (the
    same file, never a copy); a directory cannot be linked, and a copy is a
    second version (a save into the original during the export is lost, a
    hard link splits, another user's directory changes owner, a mount point
    is moved). So none is copied, moved or read: refused before any work.

    Raises:
        ArgumentError: naming the path, each directory and the fix.
    """
    directories = [name for name in foreign if stat.S_ISDIR(_lstat_mode(os.path.join(path, name)))]
    if directories:
        shown = ", ".join(directories[:5]) + (f" and {len(directories) - 5} more" if len(directories) > 5 else "")
        raise ArgumentError(
            f"{{name}} {quote(path)} holds directories keras_vit did not write ({shown}); keras_vit replaces this "
            "directory whole and keeps only your plain files in it, never a directory (it would have to copy "
            f"it). Move them out of {quote(path)}, or export to another directory.", argument)


def _lstat_mode(path):
    try:
        return os.lstat(path).st_mode
    except OSError:
        return 0


# The file keras-hub's `PresetSaver.save_task` writes before it calls the backbone's `save_to_preset`.
_KERAS_HUB_TASK_FILE = "task.json"


def _written_by_keras_hub(directory, foreign):
    """True if `foreign` holds keras-hub's `task.json` (a Keras object registered as `keras_hub>...`)."""
    if _KERAS_HUB_TASK_FILE not in foreign:
        return False
    try:
        with open(os.path.join(directory, _KERAS_HUB_TASK_FILE), encoding="utf-8") as file:
            document = json.load(file)
    except (OSError, ValueError):
        return False
    return isinstance(document, dict) and str(document.get("registered_name", "")).startswith("keras_hub>")


def check_writable_names(directory, names, kind, argument=None):
    """Refuse, before any work, to write `names` into `directory` where one of them is not ours.

    Other files in the directory are left alone: only the names keras_vit is
    about to write must be free, or hold what keras_vit wrote there (as a
    `kind` directory).

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
    """Refuse, by name, an existing `path` that is neither a regular file nor a directory (nor a link to one).

    keras_vit replaces only regular files and directories: writing over a
    device such as `/dev/null`, a FIFO or a socket would replace something
    the system or another program uses.

    Raises:
        ArgumentError: naming the path, what it is and the fix.
    """
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
    """Fail at once if file `path` cannot be written, before any long work.

    Raises:
        ArgumentError: `path` is a directory, or its parent directory is
            missing or not writable; the message names the path and the fix.
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
    """Refuse, before any work, a name too long for the private name the writer first writes it under.

    The file system allows names of `NAME_MAX` bytes (usually 255); the
    writer builds each output under a longer private name beside it, so the
    output's own name must leave room for it.

    Raises:
        ArgumentError: naming the user's path, its length and the limit.
    """
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


def check_parent_writable(path, argument):
    parent = os.path.dirname(path)
    while parent and not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if parent and not os.access(parent, os.W_OK):
        raise ArgumentError(f"Cannot create {{name}} {quote(path)}: {quote(parent)} is not writable.", argument)
