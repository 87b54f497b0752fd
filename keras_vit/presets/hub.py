"""Downloads from the Hugging Face hub into a cache under the Keras home directory.

Every file of a preset goes through `fetch()`, which:

1. returns the cached copy when its completion record says it is whole;
2. otherwise downloads the file into a staging folder with
   `huggingface_hub` (the only network call, in `_download_file`, the one
   seam tests replace with a local mirror in the hub's file layout);
3. checks the file (size, and SHA-256 where the registry pins one), moves it
   into place atomically and writes the completion record last.

A cached file without a completion record, or whose size disagrees with it,
was half written by an interrupted run: it is reported and fetched again.

The cache root is `$KERAS_VIT_CACHE` if set, else `<Keras home>/keras_vit/hub`,
with the Keras home directory `$KERAS_HOME` or `~/.keras` (as Keras itself
picks it). Layout: `<root>/<org>/<repo>/<revision>/<file>` plus
`<file>.complete` records.
"""

import hashlib
import json
import os
import re
import shutil
import tempfile
import warnings

_REPO_PATTERN = re.compile(r"^[\w.-]+/[\w.-]+$")
_CHUNK = 1 << 20


def keras_home():
    """The Keras home directory: `$KERAS_HOME`, else `~/.keras` (`/tmp/.keras` if home is read-only)."""
    if "KERAS_HOME" in os.environ:
        return os.path.expanduser(os.environ["KERAS_HOME"])
    base = os.path.expanduser("~")
    if not os.access(base, os.W_OK):
        base = "/tmp"
    return os.path.join(base, ".keras")


def cache_dir():
    """Root of the preset download cache."""
    if os.environ.get("KERAS_VIT_CACHE"):
        return os.path.expanduser(os.environ["KERAS_VIT_CACHE"])
    return os.path.join(keras_home(), "keras_vit", "hub")


def parse_hub_handle(handle):
    """Split `hf://org/repo[@revision]` into `(repo_id, revision)`.

    Raises:
        ValueError: if the handle is not of that form.
    """
    if not isinstance(handle, str) or not handle.startswith("hf://"):
        raise ValueError(f"A hub handle looks like 'hf://org/repo' or 'hf://org/repo@revision'. Received: {handle!r}")
    repo_id, _, revision = handle[len("hf://"):].partition("@")
    if not _REPO_PATTERN.match(repo_id):
        raise ValueError(
            "A hub handle names a repository as 'hf://org/repo' (letters, digits, '-', '_', '.'). "
            f"Received: {handle!r}"
        )
    return repo_id, (revision or None)


def _download_file(repo_id, filename, revision, target_dir):
    """Download one file of a hub repository into `target_dir`; return its path.

    This is the only function that touches the network. Tests replace it to
    serve files from a local mirror laid out as `<mirror>/<org>/<repo>/<file>`.
    """
    try:
        from huggingface_hub import hf_hub_download
    except ImportError as error:
        raise ImportError(
            "Downloading presets needs the `huggingface_hub` package, which is not installed. "
            "Install it with `pip install huggingface_hub` (or `pip install 'keras3-vit[hub]'`), or pass "
            "the path of a checkpoint already on disk instead of a preset name."
        ) from error
    return hf_hub_download(repo_id=repo_id, filename=filename, revision=revision, local_dir=target_dir)


def _revision_folder(revision):
    # Refs such as "refs/pr/1" become one safe folder name.
    return re.sub(r"[^\w.-]", "_", revision or "main")


def _complete_record(path):
    return path + ".complete"


def _read_record(path):
    try:
        with open(_complete_record(path)) as file:
            return json.load(file)
    except (OSError, ValueError):
        return None


def sha256_of(path):
    """Hex SHA-256 of a file, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for chunk in iter(lambda: file.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _translate_error(error, repo_id, filename, revision):
    """Turn a huggingface_hub / network error into one that says what to do."""
    url = f"https://huggingface.co/{repo_id}"
    where = f"'{filename}' of {url}" + (f" at revision {revision!r}" if revision else "")
    names = {cls.__name__ for cls in type(error).__mro__}
    response = getattr(error, "response", None)
    status = getattr(response, "status_code", None)
    login = ("log in with `hf auth login` (or set the HF_TOKEN environment variable) using an "
             "account that has access")
    if "GatedRepoError" in names:
        return PermissionError(
            f"Access to {url} is restricted (HTTP {status or 403}: gated repository). Accept its terms on "
            f"{url} and {login}. Could not download {where}."
        )
    if "RevisionNotFoundError" in names:
        return ValueError(f"The revision {revision!r} does not exist in {url}. Could not download {where}.")
    if "RemoteEntryNotFoundError" in names:
        return FileNotFoundError(
            f"{url} has no file '{filename}'" + (f" at revision {revision!r}" if revision else "")
            + ". Check that the repository holds a keras_vit, Hugging Face or timm checkpoint."
        )
    if status in (401, 403) or "RepositoryNotFoundError" in names:
        return PermissionError(
            f"The hub refused access to {url} (HTTP {status or 401}): the repository does not exist, is "
            f"private, or needs authentication. Check the name; if it is private, {login}. "
            f"Could not download {where}."
        )
    if status is not None:
        return ConnectionError(f"The Hugging Face hub answered HTTP {status} while downloading {where}. "
                               "Try again later.")
    if "OfflineModeIsEnabled" in names:
        return ConnectionError(
            f"Cannot download {where}: HF_HUB_OFFLINE is set and the file is not in the keras_vit cache "
            f"({cache_dir()}). Unset HF_HUB_OFFLINE, or pass the path of a checkpoint already on disk."
        )
    if isinstance(error, (ConnectionError, TimeoutError)) or names & {
        "LocalEntryNotFoundError", "HTTPError", "TransportError", "ConnectError", "TimeoutException",
        "NetworkError",
    }:
        return ConnectionError(
            f"Could not reach the Hugging Face hub to download {where} ({type(error).__name__}: {error}). "
            "Check your internet connection or proxy (HF_ENDPOINT, HTTPS_PROXY), or download the files "
            "yourself and pass their local path to `from_preset`."
        )
    return None


def fetch(repo_id, filename, revision=None, sha256=None, force_download=False):
    """Path of `filename` from hub repo `repo_id`, downloading it if it is not cached.

    Args:
        repo_id: str. `"org/repo"`.
        filename: str. File inside the repository.
        revision: str or `None`. Branch, tag, ref or commit; `None` is `main`.
        sha256: str or `None`. Expected SHA-256 of the file, checked after
            download.
        force_download: bool. Download even if a complete copy is cached.

    Returns:
        The local path of the verified file.

    Raises:
        ConnectionError: the hub could not be reached.
        PermissionError: HTTP 401/403, private or gated repository.
        FileNotFoundError: the repository has no such file.
        ValueError: the downloaded file fails its checksum.
    """
    folder = os.path.join(cache_dir(), *repo_id.split("/"), _revision_folder(revision))
    path = os.path.join(folder, filename)
    record = _read_record(path)
    if os.path.exists(path) and not force_download:
        if record is not None and record.get("size") == os.path.getsize(path):
            return path
        warnings.warn(
            f"The cached file {path} is incomplete (an earlier download was interrupted or the file was "
            "changed); removing it and downloading it again.",
            stacklevel=3,
        )
        _remove(path)
    elif record is not None:
        _remove(path)

    os.makedirs(folder, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=".incoming-", dir=folder)
    try:
        try:
            downloaded = _download_file(repo_id, filename, revision, staging)
        except ImportError:
            raise
        except Exception as error:  # translated into a message that says what to do
            translated = _translate_error(error, repo_id, filename, revision)
            if translated is None:
                raise
            raise translated from error
        size = os.path.getsize(downloaded)
        digest = sha256_of(downloaded) if sha256 else None
        if sha256 and digest != sha256.lower():
            raise ValueError(
                f"Checksum mismatch for '{filename}' of https://huggingface.co/{repo_id}"
                + (f" at revision {revision!r}" if revision else "")
                + f": expected SHA-256 {sha256}, got {digest} ({size:,} bytes). The file on the hub changed "
                "or the download was corrupted; the file was not cached. Try again, or load another revision."
            )
        os.makedirs(os.path.dirname(path), exist_ok=True)
        os.replace(downloaded, path)
        # The record is written last: a file without one is known to be half written.
        with open(_complete_record(path), "w") as file:
            json.dump({"size": size, "sha256": digest, "revision": revision}, file)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return path


def _remove(path):
    for stale in (path, _complete_record(path)):
        if os.path.exists(stale):
            os.remove(stale)
