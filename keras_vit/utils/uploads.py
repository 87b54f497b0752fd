"""Reading a directory for upload: a private copy of named files, links refused, never followed."""

import contextlib
import errno
import os
import shutil
import stat
import tempfile

from keras_vit.utils.ownership import CHUNK, quote

@contextlib.contextmanager
def staged_upload(directory, names, required=()):
    """A private copy of `names` from `directory` for an upload; links are refused, never followed.

    Each file is opened without following links and must be a regular file
    inside `directory`; the copy (hard links where possible) is what the
    upload reads, so a file swapped for a link after the check is not sent.

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
    for name in names:
        _check_not_a_link(directory, name)
    staging = tempfile.mkdtemp(prefix="keras_vit-upload-")
    try:
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
        yield staging
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _check_not_a_link(directory, name):
    if os.path.islink(os.path.join(directory, name)):
        raise _link_error(directory, name)


def _link_error(directory, name):
    return ValueError(f"{quote(os.path.join(directory, name))} is a symbolic link; keras_vit never follows a link "
                      "out of a directory it uploads (it could send a file from elsewhere, such as a key). Replace "
                      "the link with the file itself.")


def check_no_links(directory, names):
    """Refuse, naming it, any of `names` in `directory` that is a symbolic link."""
    for name in names:
        _check_not_a_link(os.path.abspath(os.fspath(directory)), name)
