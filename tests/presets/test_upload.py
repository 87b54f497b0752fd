"""`keras_vit.upload_preset` against a fake hub (no network): what is checked, the card, the files sent."""

import json
import os
import shutil

import numpy as np
import pytest

import keras_vit
from keras_vit.presets import upload
from tests.presets.preset_helpers import http_response, images, tiny_classifier, to_numpy


class FakeHub:
    """Records create_repo / create_commit like huggingface_hub.HfApi; keeps the files a commit sends."""

    def __init__(self, root):
        self.root = root
        self.repos = {}
        self.commits = []
        self.fail = None

    def create_repo(self, repo_id, repo_type="model", private=False, exist_ok=False):
        assert repo_type == "model" and exist_ok
        self.repos.setdefault(repo_id, {"private": private})

    def create_commit(self, repo_id, operations, commit_message=None, repo_type="model"):
        if self.fail is not None:
            raise self.fail
        assert repo_id in self.repos, "create_commit before create_repo"
        sent = {}
        for operation in operations:  # huggingface_hub's CommitOperationAdd, read as the hub library reads it
            with operation.as_file() as file:
                sent[operation.path_in_repo] = file.read()
        oid = f"{len(self.commits) + 1:040x}"
        self.commits.append({"repo_id": repo_id, "files": sent, "message": commit_message, "oid": oid})
        return type("CommitInfo", (), {"oid": oid})()


@pytest.fixture
def fake_hub(tmp_path, monkeypatch):
    hub = FakeHub(tmp_path / "hub")
    monkeypatch.setattr(upload, "_hub_api", lambda token=None: hub)
    return hub


def saved(tmp_path, **metadata):
    model = tiny_classifier()
    directory = tmp_path / "my_vit"
    model.save_to_preset(directory, **metadata)
    return model, directory


def test_upload_sends_the_preset_and_a_model_card(fake_hub, tmp_path):
    model, directory = saved(tmp_path, class_names=["cat", "dog", "bird", "fish", "frog"], dataset="pets-5",
                             epochs=3, learning_rate=0.001, license="apache-2.0")
    (directory / "checkpoint-epoch-2.weights.h5").write_bytes(b"not part of the preset")
    handle = keras_vit.upload_preset(directory, "hf://me/tiny-vit", private=True, commit_message="first")
    assert handle == "hf://me/tiny-vit@" + "0" * 39 + "1"
    assert fake_hub.repos == {"me/tiny-vit": {"private": True}}
    (commit,) = fake_hub.commits
    assert commit["message"] == "first"
    assert sorted(commit["files"]) == ["README.md", "config.json", "metadata.json", "model.weights.h5"]
    for name in ("config.json", "metadata.json", "model.weights.h5"):
        assert commit["files"][name] == (directory / name).read_bytes()
    card = commit["files"]["README.md"].decode()
    assert card == (directory / "README.md").read_text()  # written beside the preset: there was none
    front = card.split("---\n")[1]
    assert "library_name: keras_vit\n" in front and "license: apache-2.0\n" in front
    assert "pipeline_tag: image-classification\n" in front
    # TINY: width 24, 2 layers, 2 heads, MLP 32, 8x8 patches of 32x32 images, 5 classes; counted by hand.
    width, mlp = 24, 32
    params = (8 * 8 * 3 * width + width) + width + 17 * width + 2 * (
        4 * width + 3 * width * width + 3 * width + width * width + width + 2 * width * mlp + mlp + width
    ) + 2 * width + (width * 5 + 5)
    assert f"| Parameters | {params:,} |" in card
    assert "| Image size | 32x32 |" in card and "| Patch size | 8x8 |" in card
    assert "| Width / layers / heads / MLP | 24 / 2 / 2 / 32 |" in card and "| Classes | 5 |" in card
    assert "5 classes: `cat`, `dog`, `bird`, `fish`, `frog`." in card
    assert "- dataset: pets-5" in card and "- epochs: 3" in card and "- learning rate: 0.001" in card
    assert 'keras_vit.ViTClassifier.from_preset("hf://me/tiny-vit")' in card


def test_upload_sends_the_files_themselves_and_copies_nothing(fake_hub, tmp_path, monkeypatch):
    # 3da728a: a private copy of the preset was made in TMPDIR for every upload (one more mechanism: staged,
    # cleaned after a kill, named when TMPDIR was full). Now the files are sent as opened, without following links.
    import tempfile

    _, directory = saved(tmp_path)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    made, mkdir = [], os.mkdir
    monkeypatch.setattr(os, "mkdir", lambda path, *args, **kwargs: made.append(path) or mkdir(path, *args, **kwargs))
    keras_vit.upload_preset(directory, "hf://me/tiny-vit")
    assert not [path for path in made if str(path).startswith(str(scratch))] and os.listdir(scratch) == []
    (commit,) = fake_hub.commits
    assert commit["files"]["model.weights.h5"] == (directory / "model.weights.h5").read_bytes()


def test_upload_keeps_an_existing_card_and_names_the_variant(fake_hub, tmp_path):
    model = keras_vit.ViTBackbone.from_variant("ViT-Ti/16", image_size=32)
    directory = tmp_path / "backbone"
    model.save_to_preset(directory)
    card = upload.model_card(model, json.loads((directory / "config.json").read_text()),
                             json.loads((directory / "metadata.json").read_text()), "me/ti16")
    assert "ViT-Ti/16, 5," in card and "pipeline_tag: image-feature-extraction" in card
    assert "license:" not in card and "| License | not stated |" in card
    assert "Not recorded in the preset's metadata.json." in card
    (directory / "README.md").write_text("my own card\n")
    keras_vit.upload_preset(directory, "hf://me/ti16")
    assert fake_hub.commits[0]["files"]["README.md"] == b"my own card\n"


def test_what_is_uploaded_loads_back(fake_hub, tmp_path, mirror):
    model, directory = saved(tmp_path)
    keras_vit.upload_preset(directory, "hf://me/tiny-vit")
    served = mirror.repo("me/tiny-vit")
    for name, content in fake_hub.commits[0]["files"].items():
        with open(os.path.join(served, name), "wb") as file:
            file.write(content)
    loaded = keras_vit.ViTClassifier.from_preset("hf://me/tiny-vit")
    np.testing.assert_array_equal(to_numpy(loaded(images())), to_numpy(model(images())))


def test_not_a_preset_is_refused_before_anything_is_sent(fake_hub, tmp_path):
    _, directory = saved(tmp_path)
    with pytest.raises(ValueError, match="is not a directory"):
        keras_vit.upload_preset(directory / "config.json", "hf://me/x")
    partial = tmp_path / "partial"
    shutil.copytree(directory, partial)
    os.remove(partial / "metadata.json")
    with pytest.raises(ValueError, match=r"is not a keras_vit preset: it lacks metadata.json"):
        keras_vit.upload_preset(partial, "hf://me/x")
    bad_config = tmp_path / "bad_config"
    shutil.copytree(directory, bad_config)
    document = json.loads((bad_config / "config.json").read_text())
    document["config"]["num_classes"] = 0
    (bad_config / "config.json").write_text(json.dumps(document))
    with pytest.raises(ValueError, match="`num_classes` must be a positive int"):
        keras_vit.upload_preset(bad_config, "hf://me/x")
    other = tmp_path / "other"
    tiny_classifier(num_classes=7).save_to_preset(other)
    mixed = tmp_path / "mixed"  # config of one model, weights of another
    shutil.copytree(directory, mixed)
    shutil.copy(other / "model.weights.h5", mixed / "model.weights.h5")
    with pytest.raises(ValueError, match="do not fit the model"):
        keras_vit.upload_preset(mixed, "hf://me/x")
    for handle in ("hf://../..", "me/x", "hf://me/x@main"):
        with pytest.raises(ValueError, match="hf://"):
            keras_vit.upload_preset(directory, handle)
    assert not fake_hub.repos and not fake_hub.commits
    assert not any((path / "README.md").exists() for path in (partial, bad_config, mixed))


def test_upload_errors_say_what_to_do(fake_hub, tmp_path, monkeypatch):
    from huggingface_hub import errors

    _, directory = saved(tmp_path)
    fake_hub.fail = errors.HfHubHTTPError("403 Forbidden", response=http_response(403, "me/x"))
    with pytest.raises(PermissionError, match=r"refused the upload to https://huggingface.co/me/x \(HTTP 403\).*write access"):
        keras_vit.upload_preset(directory, "hf://me/x")
    fake_hub.fail = __import__("httpx2").ConnectError("[Errno -2] Name or service not known")
    with pytest.raises(ConnectionError, match="Could not reach the Hugging Face hub to upload"):
        keras_vit.upload_preset(directory, "hf://me/x")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ConnectionError, match="^Offline: HF_HUB_OFFLINE is set"):
        keras_vit.upload_preset(directory, "hf://me/x")


def test_the_card_upload_writes_is_ours_so_the_preset_can_be_saved_again(fake_hub, tmp_path):
    model, directory = saved(tmp_path)
    keras_vit.upload_preset(directory, "hf://me/tiny-vit")
    assert (directory / "README.md").exists()
    model.save_to_preset(directory)  # not refused: keras_vit wrote every file there, the card included
    (directory / "README.md").write_text("my own card")  # a card the user wrote is theirs
    keras_vit.upload_preset(directory, "hf://me/tiny-vit")
    assert (directory / "README.md").read_text() == "my own card"
