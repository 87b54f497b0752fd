"""Fixtures of the preset tests: an isolated cache and a local hub mirror."""

import os
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

    `fail` can hold an exception to raise instead of serving (network or HTTP
    failures); `calls` records every `(repo_id, filename, revision)` asked for.
    """

    def __init__(self, root):
        self.root = root
        self.calls = []
        self.fail = None

    def repo(self, repo_id):
        path = os.path.join(self.root, *repo_id.split("/"))
        os.makedirs(path, exist_ok=True)
        return path

    def download(self, repo_id, filename, revision, target_dir):
        self.calls.append((repo_id, filename, revision))
        if self.fail is not None:
            raise self.fail
        from huggingface_hub.errors import RemoteEntryNotFoundError, RepositoryNotFoundError

        folder = os.path.join(self.root, *repo_id.split("/"))
        if not os.path.isdir(folder):
            raise RepositoryNotFoundError("404 Repository Not Found", response=http_response(404, repo_id))
        source = os.path.join(folder, filename)
        if not os.path.exists(source):
            raise RemoteEntryNotFoundError("404 Entry Not Found", response=http_response(404, repo_id, filename))
        # Same result as hf_hub_download(local_dir=target_dir): the file under target_dir.
        target = os.path.join(target_dir, filename)
        shutil.copyfile(source, target)
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
