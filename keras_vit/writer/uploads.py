"""Reading a directory for upload: a private copy of named files, links refused, never followed."""

import contextlib
import errno
import os
import shutil
import stat
import tempfile

from keras_vit.utils.errors import quote
from keras_vit.writer.ownership import CHUNK, NO_SPACE, NOT_ALLOWED, abandoned, private_name

# The private copies' base name: `.keras_vit-upload.keras_vit-HOST-PID-RANDOM.tmp` in the temporary folder.
_COPY_BASE = "keras_vit-upload"


@contextlib.contextmanager
def staged_upload(directory, names, required=()):
    """A private copy of `names` from `directory` for an upload; links are refused, never followed.

    Each file is opened without following links and must be a regular file
    inside `directory`; the copy is what the upload reads, so a file swapped
    for a link after the caller's `check_no_links` is not sent.

    Args:
        directory: str. The directory to upload from.
        names: list of str. The files to send (missing ones are skipped).
        required: names that must be present.

    Yields:
        str. The staging directory (removed afterwards).

    Raises:
        ValueError: a name is a link, or not a regular file.
    """
    directory = os.path.abspath(os.fspath(directory))
    scratch = tempfile.gettempdir()
    _remove_abandoned_copies(scratch)
    staging = os.path.join(scratch, private_name(_COPY_BASE, "tmp"))
    try:
        try:
            os.mkdir(staging, 0o700)  # a copy of the model: private to this user
            _copy_files(directory, names, required, staging)
        except OSError as error:
            raise _copy_error(error, directory, scratch) from None
        yield staging
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _remove_abandoned_copies(scratch):
    """Delete the private copies that killed uploads left: of ended processes on this host only."""
    with contextlib.suppress(OSError):
        for name in os.listdir(scratch):
            if abandoned(name, _COPY_BASE):
                shutil.rmtree(os.path.join(scratch, name), ignore_errors=True)


def _copy_error(error, directory, scratch):
    """A full or refused temporary folder, named for the user's `directory`; an unreadable source stays as it is."""
    if error.filename is not None and not os.fspath(error.filename).startswith(scratch + os.sep):
        return error
    if error.errno in NO_SPACE:
        fix = "free some space there, or set TMPDIR to a folder with room"
    elif error.errno in NOT_ALLOWED:
        fix = "set TMPDIR to a folder you can write to"
    else:
        return error
    return type(error)(error.errno, f"{os.strerror(error.errno)} while making the upload's private copy in "
                       f"{quote(scratch)}; nothing was sent and the copy is removed. To upload it, {fix}",
                       directory)


def _copy_files(directory, names, required, staging):
    """Copy each of `names` (a regular file, opened without following links) into `staging`."""
    for name in names:
        source = os.path.join(directory, name)
        if not os.path.lexists(source):
            if name in required:
                raise ValueError(f"{quote(source)} is missing.")
            continue
        flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0)
        try:
            handle = os.open(source, flags)
        except OSError as error:
            if error.errno == errno.ELOOP:
                raise _link_error(directory, name) from None
            raise
        with os.fdopen(handle, "rb") as reader:
            if not stat.S_ISREG(os.fstat(reader.fileno()).st_mode):
                raise ValueError(f"{quote(source)} is not a regular file; only files are uploaded.")
            with open(os.path.join(staging, name), "wb") as copy:
                shutil.copyfileobj(reader, copy, CHUNK)


def _link_error(directory, name):
    return ValueError(f"{quote(os.path.join(directory, name))} is a symbolic link; keras_vit never follows a link "
                      "out of a directory it uploads (it could send a file from elsewhere, such as a key). Replace "
                      "the link with the file itself.")


def check_no_links(directory, names):
    """Refuse, naming it, any of `names` in `directory` that is a symbolic link."""
    directory = os.path.abspath(os.fspath(directory))
    for name in names:
        if os.path.islink(os.path.join(directory, name)):
            raise _link_error(directory, name)
