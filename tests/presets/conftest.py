"""Fixtures of the preset tests: an isolated cache and a local hub mirror."""

import hashlib
import os
import re
import shutil

import pytest

from keras_vit.presets import hub
from tests.presets.preset_helpers import http_response


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path, monkeypatch):
    """Every test gets its own empty download cache."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("KERAS_VIT_CACHE", str(cache))
    return cache


class Mirror:
    """A local stand-in for the hub: `<root>/<org>/<repo>/<file>`, served through the download seam.

    Files are written into the cache in the Hugging Face hub cache's layout
    (`models--org--repo/blobs/<sha256>`, `snapshots/<commit>/<file>` linking to
    the blob, `refs/<revision>` holding the commit), so the real
    `hf_hub_download(local_files_only=True)` finds them: offline requests are
    answered by huggingface_hub itself. `fail` can hold an exception to raise
    instead of serving (network or HTTP failures); `requests` records every
    `(repo_id, filename, revision)` asked for online, `calls` those whose
    bytes were transferred (a blob already in the cache is not sent again).
    """

    def __init__(self, root):
        self.root = root
        self.calls = []
        self.requests = []
        self.fail = None

    def repo(self, repo_id):
        path = os.path.join(self.root, *repo_id.split("/"))
        os.makedirs(path, exist_ok=True)
        return path

    def download(self, repo_id, filename, revision, cache_root, local_files_only=False):
        if local_files_only:
            from huggingface_hub import hf_hub_download

            return hf_hub_download(repo_id, filename, revision=revision, cache_dir=cache_root, local_files_only=True)
        self.requests.append((repo_id, filename, revision))
        if self.fail is not None:
            raise self.fail
        from huggingface_hub.errors import RemoteEntryNotFoundError, RepositoryNotFoundError

        folder = os.path.join(self.root, *repo_id.split("/"))
        if not os.path.isdir(folder):
            raise RepositoryNotFoundError("404 Repository Not Found", response=http_response(404, repo_id))
        source = os.path.join(folder, filename)
        if not os.path.exists(source):
            raise RemoteEntryNotFoundError("404 Entry Not Found", response=http_response(404, repo_id, filename))
        revision = revision or "main"
        commit = revision if re.fullmatch("[0-9a-f]{40}", revision) else hashlib.sha1(
            f"{repo_id}@{revision}".encode()).hexdigest()
        storage = os.path.join(cache_root, "models--" + repo_id.replace("/", "--"))
        with open(source, "rb") as file:
            blob = os.path.join(storage, "blobs", hashlib.sha256(file.read()).hexdigest())
        os.makedirs(os.path.dirname(blob), exist_ok=True)
        if not os.path.exists(blob):  # as huggingface_hub: a blob already held is not fetched again
            self.calls.append((repo_id, filename, revision))
            shutil.copyfile(source, blob)
        if commit != revision:
            ref = os.path.join(storage, "refs", revision)
            os.makedirs(os.path.dirname(ref), exist_ok=True)
            with open(ref, "w") as file:
                file.write(commit)
        target = os.path.join(storage, "snapshots", commit, filename)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if os.path.lexists(target):
            os.remove(target)
        os.symlink(os.path.relpath(blob, os.path.dirname(target)), target)
        return target


@pytest.fixture
def mirror(tmp_path, monkeypatch):
    served = Mirror(str(tmp_path / "mirror"))
    monkeypatch.setattr(hub, "_download_file", served.download)
    return served


@pytest.fixture
def no_network(monkeypatch):
    """Fail the test if anything tries to download."""

    def refuse(*args, **kwargs):
        raise AssertionError(f"unexpected download: {args}")

    monkeypatch.setattr(hub, "_download_file", refuse)
