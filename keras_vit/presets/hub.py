"""Downloads from the Hugging Face hub, through `huggingface_hub`'s own cache.

Every file of a preset goes through `fetch()`, which:

1. validates the repository id, revision and file name strictly (nothing a
   handle says can name a path outside the cache);
2. asks `huggingface_hub.hf_hub_download` for the file, *without* a
   `local_dir`: the file lands in (or is read from) the Hugging Face cache,
   so revisions, `HF_HUB_OFFLINE`, `HF_HOME` / `HF_HUB_CACHE` and the `hf cache`
   tools all apply, and a file transformers or timm already downloaded is not
   downloaded again. That call lives in `_download_file`, the one network seam
   tests replace with a local mirror;
3. checks the cached file's SHA-256 where the registry pins one, and turns the
   hub's errors into messages that say what to do.

Offline: with `HF_HUB_OFFLINE=1` nothing touches the network; cached files load
and a missing one is reported at once as missing *offline*. Without the
variable, one short connection probe (`_PROBE_TIMEOUT` seconds) decides
whether the hub can be reached, so an offline machine is told so at once
instead of after `huggingface_hub`'s ~25 s of retries; cached files still load.

The cache root is `$KERAS_VIT_CACHE` if set, else the Hugging Face hub cache
(`$HF_HUB_CACHE`, else `$HF_HOME/hub`, else `~/.cache/huggingface/hub`).
"""

import hashlib
import os
import re
import socket
import tempfile
import time
import urllib.parse
import urllib.request

from keras_vit.writer.files import quote

_CHUNK = 1 << 20
# The hub's own repo-id rule (huggingface_hub.utils.validate_repo_id) for each of
# `org` and `repo`, limited to ASCII: word characters, '-' and '.', starting and
# ending with a word character, at most 96 characters, no '--' or '..'.
_REVISION = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-/]{0,199}")
_COMMIT = re.compile(r"[0-9a-f]{40}")
_TRUE = {"1", "ON", "YES", "TRUE"}
# Seconds the connection probe waits; a reachable hub answers a TCP connect in
# milliseconds, an unreachable one is either refused at once or black-holed.
_PROBE_TIMEOUT = 3.0
_PROBE_MEMORY = 30.0  # seconds a probe's verdict is reused (one load fetches several files)
_probes = {}
_verified = {}  # (real path, size, mtime) -> SHA-256, so a file is hashed once per process


class HubUnreachableError(ConnectionError):
    """The hub's host cannot be reached (raised by the probe, before any retry)."""


def cache_dir():
    """Root of the preset download cache: `$KERAS_VIT_CACHE`, else the Hugging Face hub cache."""
    if os.environ.get("KERAS_VIT_CACHE"):
        return os.path.expanduser(os.environ["KERAS_VIT_CACHE"])
    return huggingface_cache_dir()


def huggingface_cache_dir():
    """The Hugging Face hub cache, resolved from the environment as `huggingface_hub` does."""
    for variable in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(variable):
            return os.path.expanduser(os.environ[variable])
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join("~", ".cache"), "huggingface")
    return os.path.join(os.path.expanduser(home), "hub")


def _cache_variable():
    """The environment variable a user changes to move the cache (named in errors)."""
    if os.environ.get("KERAS_VIT_CACHE"):
        return "KERAS_VIT_CACHE"
    return "HF_HUB_CACHE (or HF_HOME, or KERAS_VIT_CACHE for keras_vit alone)"


def offline_mode():
    """True when `HF_HUB_OFFLINE` (or `TRANSFORMERS_OFFLINE`) is set to 1 / on / yes / true.

    Read at call time, so setting the variable after `huggingface_hub` was
    imported still counts.
    """
    return any(os.environ.get(name, "").upper() in _TRUE for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


# === Validation ===


def check_repo_id(repo_id, handle=None):
    """Raise `ValueError` unless `repo_id` is `"org/repo"` by the hub's own rules (`validate_repo_id`)."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    shown = handle if handle is not None else repo_id
    try:
        valid = isinstance(repo_id, str) and repo_id.count("/") == 1 and validate_repo_id(repo_id) is None
    except HFValidationError:
        valid = False
    if not valid:
        raise ValueError(
            "A hub handle names a repository as 'hf://org/repo': two names of letters, digits, '_', '-' and '.', each "
            "starting and ending with a letter, digit or '_', at most 96 characters, without '--' or '..'. "
            f"Received: {shown!r}"
        )


def check_revision(revision, handle=None):
    """Raise `ValueError` unless `revision` is a branch, tag, `refs/pr/N` or commit name that is safe as a path."""
    if revision is None:
        return
    shown = handle if handle is not None else revision
    components = revision.split("/") if isinstance(revision, str) else [""]
    if (not isinstance(revision, str) or not _REVISION.fullmatch(revision) or ".." in revision
            or any(not part or part.startswith(".") or part.endswith(".lock") for part in components)):
        raise ValueError(
            "A hub revision is a branch, tag or commit name ('main', 'v1.0', 'refs/pr/1', a 40-character "
            "commit hash): letters, digits, '_', '-', '.' and single '/' between non-empty parts, without "
            f"'..' and not starting with '.', '-' or '/'. Received: {shown!r}"
        )


def _check_filename(filename):
    parts = filename.split("/") if isinstance(filename, str) else [""]
    if any(part in ("", ".", "..") or "\\" in part for part in parts):
        raise ValueError(f"A file of a hub repository is a relative path without '..'. Received: {filename!r}")


def parse_hub_handle(handle):
    """Split `hf://org/repo[@revision]` into `(repo_id, revision)`.

    Args:
        handle: str. `"hf://org/repo"` or `"hf://org/repo@revision"`.

    Returns:
        `(repo_id, revision)`; `revision` is `None` for the default branch.

    Raises:
        ValueError: if the handle is not of that form, or its names break the
            hub's rules (`..`, absolute paths, backslashes, empty parts...).
    """
    if not isinstance(handle, str) or not handle.startswith("hf://"):
        raise ValueError(f"A hub handle looks like 'hf://org/repo' or 'hf://org/repo@revision'. Received: {handle!r}")
    repo_id, at, revision = handle[len("hf://"):].partition("@")
    check_repo_id(repo_id, handle)
    if at and not revision:
        raise ValueError(f"The hub handle {handle!r} ends with '@' but names no revision. Received: {handle!r}")
    check_revision(revision or None, handle)
    return repo_id, (revision or None)


# === Network seam ===


def endpoint():
    return (os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")


def _probe(endpoint):
    """`None` if a TCP connection to the hub (or the proxy that reaches it) opens, else why not."""
    url = urllib.parse.urlsplit(endpoint)
    host, port = url.hostname, url.port or (443 if url.scheme == "https" else 80)
    proxy = urllib.request.getproxies().get(url.scheme)
    if proxy and not urllib.request.proxy_bypass(host):
        proxy_url = urllib.parse.urlsplit(proxy if "://" in proxy else f"http://{proxy}")
        host, port = proxy_url.hostname, proxy_url.port or 8080
    seen = _probes.get((host, port))
    if seen is not None and time.monotonic() - seen[0] < _PROBE_MEMORY:
        return seen[1]
    try:
        socket.create_connection((host, port), timeout=_PROBE_TIMEOUT).close()
        problem = None
    except OSError as error:
        problem = f"{host}:{port}: {error or type(error).__name__}"
    _probes[(host, port)] = (time.monotonic(), problem)
    return problem


def _download_file(repo_id, filename, revision, cache_root, local_files_only=False):
    """Path of one file of a hub repository in the Hugging Face cache at `cache_root`.

    This is the only function that touches the network. Tests replace it to
    serve files from a local mirror, writing them in the cache's layout.
    """
    try:
        import huggingface_hub
    except ImportError as error:
        raise ImportError(
            "Downloading presets needs the `huggingface_hub` package, which is not installed. "
            "Install it with `pip install huggingface_hub`, or pass "
            "the path of a checkpoint already on disk instead of a preset name."
        ) from error
    import keras_vit

    def download(local_only):
        return huggingface_hub.hf_hub_download(
            repo_id=repo_id, filename=filename, revision=revision, cache_dir=cache_root, endpoint=endpoint(),
            local_files_only=local_only, library_name="keras_vit", library_version=keras_vit.__version__,
        )

    if not local_files_only:
        problem = _probe(endpoint())
        if problem is not None:
            # Unreachable: a cached copy still serves; otherwise say so now rather than
            # after huggingface_hub's retries (~25 s).
            try:
                return download(True)
            except huggingface_hub.errors.LocalEntryNotFoundError:
                raise HubUnreachableError(problem) from None
    return download(local_files_only)


# === Errors ===


def _translate_error(error, repo_id, filename, revision, offline=False):
    """Turn a huggingface_hub / network error into one that says what to do."""
    url = f"{endpoint()}/{repo_id}"  # HF_ENDPOINT, when a mirror serves the hub
    where = f"'{filename}' of {url}" + (f" at revision {revision!r}" if revision else "")
    names = {cls.__name__ for cls in type(error).__mro__}
    response = getattr(error, "response", None)
    status = getattr(response, "status_code", None)
    login = ("log in with `hf auth login` (or set the HF_TOKEN environment variable) using an "
             "account that has access")
    if offline or "OfflineModeIsEnabled" in names:
        return ConnectionError(
            f"Offline: HF_HUB_OFFLINE is set, so nothing is downloaded, and {where} is not in the Hugging Face "
            f"cache ({cache_dir()}). Download it once while online (unset HF_HUB_OFFLINE), or pass the path of "
            "a checkpoint already on disk."
        )
    if isinstance(error, HubUnreachableError):
        return ConnectionError(
            f"Offline: the Hugging Face hub cannot be reached from this machine ({error}), and {where} is not in "
            f"the Hugging Face cache ({cache_dir()}). Check your internet connection or proxy (HTTPS_PROXY, "
            "HF_ENDPOINT), or pass the path of a checkpoint already on disk. Set HF_HUB_OFFLINE=1 to use "
            "cached files without trying the network."
        )
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


def _writable_problem(root):
    """`None` if files can be created under `root` (made if missing), else the OS's reason."""
    try:
        os.makedirs(root, exist_ok=True)
        # `os.access` says yes to root on a read-only mount; a real (nameless) file settles it.
        tempfile.TemporaryFile(dir=root).close()
    except OSError as error:
        return f"{type(error).__name__}: {error.strerror or error}"
    return None


def _remove_damaged_download(path, cache_root):
    """Delete a downloaded file (and the blob a link of the cache points to) whose checksum failed.

    Only files inside `cache_root` (the download cache, which the hub
    library owns) are removed; anything else is refused.
    """
    root = os.path.realpath(cache_root)
    for stale in (path, os.path.realpath(path)):
        if not os.path.realpath(os.path.dirname(os.path.abspath(stale))).startswith(root + os.sep):
            raise ValueError(f"Refusing to remove {quote(stale)}: it is outside the download cache {quote(root)}.")
        if os.path.lexists(stale) and not os.path.isdir(stale):
            os.remove(stale)


# === Fetch ===


def sha256_of(path):
    """Hex SHA-256 of a file, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for chunk in iter(lambda: file.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _inside(path, root):
    return os.path.abspath(path).startswith(os.path.abspath(root).rstrip(os.sep) + os.sep)


def commit_of(path):
    """The commit a file returned by `fetch` belongs to (its snapshot folder), or `None`.

    Passing it as the revision of the next files of the same repository keeps
    them in one snapshot even if the branch moves in between.
    """
    parent = os.path.basename(os.path.dirname(os.path.abspath(path)))
    return parent if _COMMIT.fullmatch(parent) else None


def fetch(repo_id, filename, revision=None, sha256=None):
    """Path of `filename` of hub repo `repo_id` in the Hugging Face cache, downloading it if needed.

    Args:
        repo_id: str. `"org/repo"`.
        filename: str. File inside the repository.
        revision: str or `None`. Branch, tag, ref or commit; `None` is `main`.
        sha256: str or `None`. Expected SHA-256 of the file, checked on the
            cached file (once per process).

    Returns:
        The local path of the verified file (inside `cache_dir()`, in the
        cache's `snapshots/<commit>/` folder, so the files of one revision
        share a folder).

    Raises:
        ConnectionError: offline, or the hub could not be reached.
        PermissionError: HTTP 401/403, private or gated repository; or the
            cache cannot be written.
        FileNotFoundError: the repository has no such file.
        ValueError: a bad name, or the file fails its checksum.
    """
    check_repo_id(repo_id)
    check_revision(revision)
    _check_filename(filename)
    root = cache_dir()
    offline = offline_mode()
    local_only = offline
    if not offline:
        problem = _writable_problem(root)
        if problem is not None:
            local_only = True  # a read-only cache still serves what it holds
    else:
        problem = None
    try:
        path = _download_file(repo_id, filename, revision, root, local_files_only=local_only)
    except ImportError:
        raise
    except Exception as error:  # translated into a message that says what to do
        if problem is not None and "LocalEntryNotFoundError" in {cls.__name__ for cls in type(error).__mro__}:
            raise PermissionError(
                f"Cannot download '{filename}' of {endpoint()}/{repo_id}: the cache directory {root} "
                f"cannot be written ({problem}). Set {_cache_variable()} to a writable directory."
            ) from error
        translated = _translate_error(error, repo_id, filename, revision, offline=offline)
        if translated is None:
            raise
        raise translated from error
    if not _inside(path, root):
        raise ValueError(f"Refusing {path}: the hub download of {repo_id!r} landed outside the cache {root}.")
    if sha256:
        _check_sha256(path, sha256, repo_id, filename, revision, root)
    return path


def _check_sha256(path, expected, repo_id, filename, revision, root):
    real = os.path.realpath(path)
    stat = os.stat(real)
    key = (real, stat.st_size, stat.st_mtime_ns)
    digest = _verified.get(key) or sha256_of(real)
    if digest == expected.lower():
        _verified[key] = digest
        return
    where = f"'{filename}' of {endpoint()}/{repo_id}" + (f" at revision {revision!r}" if revision else "")
    # The cache names a large file's blob by the SHA-256 the hub announced: if that is
    # the expected one, the bytes were damaged on the way or on disk, so drop them.
    if os.path.basename(real) == expected.lower() and _inside(real, root):
        _remove_damaged_download(path, root)
        cause = "the cached copy is damaged; it was removed from the cache. Try again"
    else:
        cause = ("the file on the hub is not the one keras_vit expects (the repository changed). "
                 "Load a pinned revision, or report it")
    raise ValueError(
        f"Checksum mismatch for {where}: expected SHA-256 {expected}, got {digest} ({stat.st_size:,} bytes): "
        f"{cause}."
    )
