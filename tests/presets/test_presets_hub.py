"""The download path, offline: a local mirror in the hub's layout served through the one network seam."""

import hashlib
import os
import shutil
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

import keras_vit
from keras_vit.presets import hub
from keras_vit.presets.registry import PRESETS
from tests.presets.preset_helpers import http_response, images, tiny_classifier, to_numpy

REAL_DOWNLOAD = hub._download_file  # before the fixtures replace it
TIMM_FIXTURE = os.path.join(os.path.dirname(__file__), "..", "fixtures", "timm", "cls_token")


def softmax(logits):
    e = np.exp(logits - logits.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def register(monkeypatch, name, source, fmt, num_classes, params, image_size=16, sha256=None, revision=None):
    entry = {
        "description": "test entry", "variant": "ViT-Ti/16", "image_size": image_size, "config": {},
        "num_classes": num_classes, "class_names": None, "pixel_mean": 0.5, "pixel_std": 0.5,
        "source": source, "format": fmt, "revision": revision, "sha256": sha256, "license": "apache-2.0",
        "params": params,
    }
    monkeypatch.setitem(PRESETS, name, entry)
    return entry


@pytest.fixture
def timm_repo(mirror):
    """timm's tiny ViT (made by timm 1.0.31, tests/fixtures/timm) published as timm/<arch>.<tag>."""
    repo = mirror.repo("timm/vit_tiny_test.augreg_in21k_ft_in1k")
    for name in ("config.json", "model.safetensors"):
        shutil.copy(os.path.join(TIMM_FIXTURE, name), repo)
    return repo


# A 2-block, width-16, 4x4-patch ViT on 16x16 images with 5 classes: parameters by arithmetic.
TIMM_TINY_PARAMS = (4 * 4 * 3 * 16 + 16) + 16 + 17 * 16 + 2 * (
    4 * 16 + 3 * 16 * 16 + 3 * 16 + 16 * 16 + 16 + 2 * 16 * 32 + 32 + 16) + 2 * 16 + (16 * 5 + 5)


def test_timm_checkpoint_through_the_mirror_matches_timm(monkeypatch, mirror, timm_repo, isolated_cache):
    register(monkeypatch, "vit_test_timm", "hf://timm/vit_tiny_test.augreg_in21k_ft_in1k", "timm", 5,
             TIMM_TINY_PARAMS)
    reference = np.load(os.path.join(TIMM_FIXTURE, "reference.npz"), allow_pickle=False)
    model = keras_vit.ViTClassifier.from_preset("vit_test_timm")
    x = reference["images"].astype("float32")
    np.testing.assert_allclose(to_numpy(model(x)), softmax(reference["logits"]), atol=1e-5)
    assert {call[1] for call in mirror.calls} == {"config.json", "model.safetensors"}
    # In the Hugging Face cache's layout, where `hf cache` tools see it.
    from huggingface_hub import scan_cache_dir

    (repo,) = scan_cache_dir(isolated_cache).repos
    assert repo.repo_id == "timm/vit_tiny_test.augreg_in21k_ft_in1k" and set(repo.refs) == {"main"}
    assert {file.file_name for file in next(iter(repo.revisions)).files} == {"config.json", "model.safetensors"}

    # Second load: served from the cache, no download.
    calls = len(mirror.calls)
    bigger = keras_vit.ViTClassifier.from_preset("vit_test_timm", image_size=24)
    assert len(mirror.calls) == calls
    resampled = np.load(os.path.join(TIMM_FIXTURE, "reference_24x24.npz"), allow_pickle=False)
    # timm resampled the same checkpoint to 24x24 (resample_abs_pos_embed): same logits.
    np.testing.assert_allclose(to_numpy(bigger(resampled["images"].astype("float32"))),
                               softmax(resampled["logits"]), atol=1e-5)

    backbone = keras_vit.ViTBackbone.from_preset("hf://timm/vit_tiny_test.augreg_in21k_ft_in1k")
    np.testing.assert_allclose(to_numpy(backbone(x)), reference["features"], atol=1e-5)


@pytest.mark.slow  # imports torch and transformers
def test_huggingface_checkpoint_through_the_mirror_matches_transformers(monkeypatch, mirror):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.ViTConfig(image_size=32, patch_size=8, hidden_size=24, num_hidden_layers=2,
                                    num_attention_heads=2, intermediate_size=32, num_labels=1000)
    reference = transformers.ViTForImageClassification(config).eval()
    with torch.no_grad():  # a random, non-zero head so the comparison means something
        reference.classifier.weight.normal_(0, 0.2)
    reference.save_pretrained(mirror.repo("google/vit-test-patch8-32"))
    backbone_reference = transformers.ViTModel(config, add_pooling_layer=True).eval()
    backbone_reference.save_pretrained(mirror.repo("google/vit-test-patch8-32-in21k"))

    # 2 blocks of width 24, MLP 32, 16 patches of 8x8x3; + a 1000-class head. By arithmetic.
    width, mlp = 24, 32
    body = (8 * 8 * 3 * width + width) + width + 17 * width + 2 * (
        4 * width + 3 * width * width + 3 * width + width * width + width + 2 * width * mlp + mlp + width) + 2 * width
    register(monkeypatch, "vit_test_hf", "hf://google/vit-test-patch8-32", "huggingface", 1000,
             body + width * 1000 + 1000, image_size=32)
    register(monkeypatch, "vit_test_hf_in21k", "hf://google/vit-test-patch8-32-in21k", "huggingface", None,
             body, image_size=32)

    x = images(2, 32)
    pixels = torch.tensor((x / 255.0 - 0.5) / 0.5).permute(0, 3, 1, 2)  # the HF processor's normalisation
    with torch.no_grad():
        logits = reference(pixel_values=pixels).logits.numpy()
        hidden = backbone_reference(pixel_values=pixels).last_hidden_state.numpy()

    model = keras_vit.ViTClassifier.from_preset("vit_test_hf")
    assert model.backbone.layer_norm_epsilon == config.layer_norm_eps
    np.testing.assert_allclose(to_numpy(model(x)), softmax(logits), atol=1e-5)
    backbone = keras_vit.ViTBackbone.from_preset("vit_test_hf_in21k")
    np.testing.assert_allclose(to_numpy(backbone(x)), hidden, atol=1e-4)
    # An ImageNet-21k backbone preset takes a new head for fine-tuning.
    fine_tune = keras_vit.ViTClassifier.from_preset("vit_test_hf_in21k", num_classes=10)
    np.testing.assert_allclose(to_numpy(fine_tune(x)), np.full((2, 10), 0.1), atol=1e-6)


def test_keras_vit_preset_on_the_hub(mirror):
    model = tiny_classifier()
    model.save_to_preset(mirror.repo("someone/tiny-vit"))
    loaded = keras_vit.ViTClassifier.from_preset("hf://someone/tiny-vit@v1")
    x = images()
    np.testing.assert_array_equal(to_numpy(loaded(x)), to_numpy(model(x)))
    assert sorted(call[1] for call in mirror.calls) == ["config.json", "metadata.json", "model.weights.h5"]
    # The config at the revision asked for; the other files at the commit it resolved to.
    first, *rest = mirror.calls
    assert first[1:] == ("config.json", "v1")
    assert {call[2] for call in rest} == {hub.commit_of(hub.fetch("someone/tiny-vit", "config.json", "v1"))}


def test_checksum_mismatch_and_match(monkeypatch, mirror, timm_repo, isolated_cache):
    register(monkeypatch, "vit_test_bad_sum", "hf://timm/vit_tiny_test.augreg_in21k_ft_in1k", "timm", 5,
             TIMM_TINY_PARAMS, sha256="0" * 64)
    with pytest.raises(ValueError, match=r"Checksum mismatch for 'model.safetensors' .*expected SHA-256 0{64}, got"
                       r".*the repository changed"):
        keras_vit.ViTClassifier.from_preset("vit_test_bad_sum")

    with open(os.path.join(timm_repo, "model.safetensors"), "rb") as file:
        digest = hashlib.sha256(file.read()).hexdigest()  # what the hub's LFS pointer publishes
    register(monkeypatch, "vit_test_good_sum", "hf://timm/vit_tiny_test.augreg_in21k_ft_in1k", "timm", 5,
             TIMM_TINY_PARAMS, sha256=digest)
    assert keras_vit.ViTClassifier.from_preset("vit_test_good_sum").num_classes == 5


def test_damaged_cached_file_is_removed_and_downloaded_again(mirror, timm_repo):
    repo_id = "timm/vit_tiny_test.augreg_in21k_ft_in1k"
    with open(os.path.join(timm_repo, "model.safetensors"), "rb") as file:
        good = file.read()
    digest = hashlib.sha256(good).hexdigest()
    path = hub.fetch(repo_id, "model.safetensors", sha256=digest)
    # The cache names the blob by the SHA-256 the hub announced; damage its bytes on disk.
    blob = os.path.realpath(path)
    assert os.path.basename(blob) == digest
    with open(blob, "wb") as file:
        file.write(good[:-7])
    with pytest.raises(ValueError, match="the cached copy is damaged; it was removed from the cache"):
        hub.fetch(repo_id, "model.safetensors", sha256=digest)
    assert not os.path.lexists(path) and not os.path.exists(blob)
    again = hub.fetch(repo_id, "model.safetensors", sha256=digest)
    assert open(again, "rb").read() == good and len(mirror.calls) == 2


def test_checkpoint_that_does_not_match_its_registry_entry(monkeypatch, mirror, timm_repo):
    register(monkeypatch, "vit_test_changed", "hf://timm/vit_tiny_test.augreg_in21k_ft_in1k", "timm", 5,
             TIMM_TINY_PARAMS + 1)
    with pytest.raises(ValueError, match=f"has {TIMM_TINY_PARAMS:,} parameters where the registry expects {TIMM_TINY_PARAMS + 1:,}"):
        keras_vit.ViTClassifier.from_preset("vit_test_changed")


def _hub_error(name, status):
    from huggingface_hub import errors

    return getattr(errors, name)(f"{status} Client Error", response=http_response(status, "timm/x"))


DOWNLOAD_FAILURES = [
    (lambda: __import__("httpx2").ConnectError("[Errno 101] Network is unreachable"), ConnectionError,
     "Could not reach the Hugging Face hub to download 'config.json' of https://huggingface.co/timm/x"),
    (lambda: __import__("huggingface_hub").errors.LocalEntryNotFoundError("connection error"), ConnectionError,
     "Check your internet connection or proxy"),
    (lambda: _hub_error("RepositoryNotFoundError", 401), PermissionError,
     r"refused access to https://huggingface.co/timm/x \(HTTP 401\).*hf auth login"),
    (lambda: _hub_error("HfHubHTTPError", 403), PermissionError, r"HTTP 403"),
    (lambda: _hub_error("GatedRepoError", 403), PermissionError, r"restricted \(HTTP 403: gated repository\)"),
    (lambda: _hub_error("HfHubHTTPError", 503), ConnectionError, "answered HTTP 503"),
]


def test_download_failures_say_what_to_do(mirror):
    for failure, kind, message in DOWNLOAD_FAILURES:
        mirror.fail = failure()
        with pytest.raises(kind, match=message):
            keras_vit.ViTClassifier.from_preset("hf://timm/x")


def test_missing_file_and_missing_repo(mirror):
    mirror.repo("someone/empty")
    with pytest.raises(FileNotFoundError, match="https://huggingface.co/someone/empty has no file 'config.json'"):
        keras_vit.ViTClassifier.from_preset("hf://someone/empty")
    with pytest.raises(PermissionError, match="does not exist, is private, or needs authentication"):
        keras_vit.ViTClassifier.from_preset("hf://someone/nothing-here")


def test_missing_huggingface_hub_is_explained(monkeypatch):
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # `import huggingface_hub` now fails
    with pytest.raises(ImportError, match=r"needs the `huggingface_hub` package.*pip install huggingface_hub"):
        keras_vit.ViTClassifier.from_preset("hf://timm/x")




# === Cache location ===


def test_cache_is_the_hugging_face_cache(monkeypatch, tmp_path):
    monkeypatch.delenv("KERAS_VIT_CACHE")
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    # huggingface_hub resolves its cache when imported: ask a fresh process (the reference).
    theirs = subprocess.run([sys.executable, "-c", "from huggingface_hub import constants; print(constants.HF_HUB_CACHE)"],
                            capture_output=True, text=True, check=True).stdout.strip()
    assert hub.cache_dir() == theirs == str(tmp_path / "hf" / "hub")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "elsewhere"))
    assert hub.cache_dir() == str(tmp_path / "elsewhere")
    monkeypatch.setenv("KERAS_VIT_CACHE", str(tmp_path / "mine"))
    assert keras_vit.presets.cache_dir() == hub.cache_dir() == str(tmp_path / "mine")


def test_cache_that_cannot_be_written_is_named(mirror, monkeypatch, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("KERAS_VIT_CACHE", str(blocker / "cache"))
    mirror.repo("someone/tiny-vit")
    with pytest.raises(PermissionError, match=rf"the cache directory {blocker}/cache cannot be written .*"
                                              r"Set KERAS_VIT_CACHE to a writable directory"):
        keras_vit.ViTClassifier.from_preset("hf://someone/tiny-vit")
    assert not mirror.requests


# === Handles: nothing outside the cache ===

HOSTILE_HANDLES = [
    "hf://../..", "hf://../..@..", "hf://org/..", "hf://../repo", "hf://./repo", "hf://org/repo@../../x",
    "hf://org/repo@/etc", "hf://org/repo@a/../../b", "hf://org/repo@.hidden", "hf://org/repo@a//b",
    "hf://org/repo@a/", "hf://org/repo@", "hf://org/repo@a b", "hf://org/repo@-x", "hf://org/repo@x.lock",
    "hf:///etc/passwd", "hf://org/repo/extra", "hf://org\\..\\..", "hf://org/re\\po", "hf://org/",
    "hf:///repo", "hf://", "hf://org//repo", "hf://org/repo@a@b", "hf://org/repo@main?x=1", "hf://-org/repo",
    "hf://org/repo.", "hf://org/re--po", "hf://org/re..po", "hf://org/" + "r" * 97, "hf://org/rep\x00o",
    "hf://org/répo", "hf:// org/repo", "hf://org/repo@C:\\x", "hf://C:/repo",
]


@pytest.mark.parametrize("handle", HOSTILE_HANDLES)
def test_hostile_handles_are_refused_before_any_file_is_touched(handle, no_network, tmp_path, monkeypatch):
    monkeypatch.setenv("KERAS_VIT_CACHE", str(tmp_path / "a" / "b" / "cache"))
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    with pytest.raises(ValueError, match="hf://org/repo|hub revision|ends with '@'"):
        keras_vit.ViTClassifier.from_preset(handle)
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before


def test_preset_planted_outside_the_cache_does_not_load(monkeypatch, tmp_path):
    # Where the old cache layout (<root>/<org>/<repo>/<revision>) put `hf://../..@..`.
    cache = tmp_path / "a" / "b" / "cache"
    monkeypatch.setenv("KERAS_VIT_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    tiny_classifier().save_to_preset(tmp_path / "a")
    for handle in ("hf://../..@..", "hf://../..", "hf://..@..", "hf://../../a"):
        with pytest.raises(ValueError, match="hf://org/repo"):
            keras_vit.ViTClassifier.from_preset(handle)
    with pytest.raises(ValueError, match="without '..'"):
        hub.fetch("org/repo", "../../config.json")


@pytest.mark.parametrize("handle, repo_id, revision", [
    ("hf://timm/vit_base_patch16_224.augreg2_in21k_ft_in1k", "timm/vit_base_patch16_224.augreg2_in21k_ft_in1k", None),
    ("hf://google/vit-base-patch16-224@refs/pr/1", "google/vit-base-patch16-224", "refs/pr/1"),
    ("hf://some_one/my.model@v1.0", "some_one/my.model", "v1.0"),
    ("hf://a/b@feature/new-head", "a/b", "feature/new-head"),
    ("hf://a/b@" + "0123456789abcdef" * 2 + "01234567", "a/b", "0123456789abcdef" * 2 + "01234567"),
])
def test_valid_handles_parse(handle, repo_id, revision):
    assert hub.parse_hub_handle(handle) == (repo_id, revision)


# === Offline ===


def load_once_online(mirror):
    model = tiny_classifier()
    model.save_to_preset(mirror.repo("someone/tiny-vit"))
    keras_vit.ViTClassifier.from_preset("hf://someone/tiny-vit")
    return model


def test_hf_hub_offline_serves_the_cache_and_says_offline_for_the_rest(mirror, monkeypatch):
    model = load_once_online(mirror)
    calls = len(mirror.requests)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(socket, "create_connection", no_connection)
    mirror.fail = AssertionError("offline: no download may be attempted")
    x = images()
    # Through the mirror (which answers offline requests with huggingface_hub itself) and
    # through the real seam: both read huggingface_hub's cache, neither touches the network.
    for seam in (mirror.download, REAL_DOWNLOAD):
        monkeypatch.setattr(hub, "_download_file", seam)
        loaded = keras_vit.ViTClassifier.from_preset("hf://someone/tiny-vit")
        np.testing.assert_array_equal(to_numpy(loaded(x)), to_numpy(model(x)))
        with pytest.raises(ConnectionError, match=r"^Offline: HF_HUB_OFFLINE is set, so nothing is downloaded, and "
                                                  r"'config.json' of https://huggingface.co/someone/other is not in"):
            keras_vit.ViTClassifier.from_preset("hf://someone/other")
    assert len(mirror.requests) == calls


def no_connection(*args, **kwargs):
    raise AssertionError(f"unexpected connection: {args}")


def closed_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_unreachable_hub_fails_at_once_and_cached_files_still_load(mirror, monkeypatch):
    model = load_once_online(mirror)
    monkeypatch.setattr(hub, "_download_file", REAL_DOWNLOAD)
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{closed_port()}")  # refused: an offline machine
    monkeypatch.setattr(hub, "_probes", {})

    def no_retries(seconds):
        raise AssertionError(f"huggingface_hub retried (sleep {seconds})")

    monkeypatch.setattr(time, "sleep", no_retries)
    with pytest.raises(ConnectionError, match=r"^Offline: the Hugging Face hub cannot be reached from this machine "
                                              r"\(127.0.0.1:\d+: .*\), and 'config.json' of http://127.0.0.1:\d+/"
                                              r"someone/other is not in the Hugging Face cache.*HF_HUB_OFFLINE=1"):
        # The address named is the HF_ENDPOINT that was tried, not huggingface.co.
        keras_vit.ViTClassifier.from_preset("hf://someone/other")
    loaded = keras_vit.ViTClassifier.from_preset("hf://someone/tiny-vit")
    x = images()
    np.testing.assert_array_equal(to_numpy(loaded(x)), to_numpy(model(x)))


def test_files_of_one_load_share_a_snapshot(mirror):
    load_once_online(mirror)
    config = hub.fetch("someone/tiny-vit", "config.json")
    weights = hub.fetch("someone/tiny-vit", "model.weights.h5", revision=hub.commit_of(config))
    assert os.path.dirname(config) == os.path.dirname(weights) and len(hub.commit_of(config)) == 40
