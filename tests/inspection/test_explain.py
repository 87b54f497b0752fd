"""`keras-vit explain`, run in-process."""

import json
import os
import sys

import numpy as np
import pytest
from PIL import Image

import keras_vit
from keras_vit import cli
from keras_vit.commands import explain
from tests.inspection.helpers import TINY


def write_images(directory, count, size=(20, 30)):
    rng = np.random.default_rng(0)
    paths = []
    for index in range(count):
        path = os.path.join(directory, f"photo{index}.png")
        Image.fromarray(rng.integers(0, 256, size=size + (3,), dtype=np.uint8)).save(path)
        paths.append(path)
    return paths


@pytest.fixture(scope="module")
def saved_models(tmp_path_factory):
    directory = tmp_path_factory.mktemp("models")
    classifier = keras_vit.ViTClassifier(
        backbone=keras_vit.ViTBackbone(image_size=(8, 12), patch_size=4, num_register_tokens=1, **TINY), num_classes=3
    )
    gray = keras_vit.ViTBackbone(image_size=8, patch_size=2, use_class_token=False, num_channels=1, **TINY)
    paths = {"classifier": str(directory / "classifier.keras"), "gray": str(directory / "gray_backbone.keras")}
    classifier.save(paths["classifier"])
    gray.save(paths["gray"])
    return paths


def parse(argv):
    return cli.build_parser("explain").parse_args(["explain", *argv])


def test_explain_writes_every_figure(saved_models, tmp_path, capsys):
    images = write_images(tmp_path, 3)
    out = tmp_path / "figures"
    assert cli.main(["explain", *images, "--model", saved_models["classifier"], "--out", str(out),
                     "--batch-size", "2"]) == 0
    printed = capsys.readouterr().out
    expected = sorted([f"{i:03d}_photo{i}_{kind}.png" for i in range(3) for kind in ("rollout", "attention")]
                      + ["figure7.png", "figure7.json"])
    # No temporary files left behind; the marker records what explain wrote, so a rerun may replace it.
    assert sorted(os.listdir(out)) == [".keras_vit.json", *expected]
    assert f"Wrote 8 files to {out}" in printed
    assert "3/3" in printed  # the progress bar
    assert "first block" in printed and "last block" in printed
    for name in [e for e in expected if e.endswith(".png")]:
        with open(out / name, "rb") as file:
            assert file.read(8) == b"\x89PNG\r\n\x1a\n"
    numbers = json.loads((out / "figure7.json").read_text())
    assert np.shape(numbers["mean_attention_distance_pixels"]) == (2, 2)
    assert numbers["images"] == images


def test_explain_grayscale_backbone_one_image(saved_models, tmp_path, capsys):
    images = write_images(tmp_path, 1, size=(8, 8))
    out = tmp_path / "existing"
    out.mkdir()
    (out / "notes.txt").write_text("kept")
    assert cli.main(["explain", *images, "--model", saved_models["gray"], "--out", str(out)]) == 0
    assert sorted(os.listdir(out)) == [".keras_vit.json", "000_photo0_attention.png", "000_photo0_rollout.png",
                                       "figure7.json", "figure7.png", "notes.txt"]
    assert "1/1" not in capsys.readouterr().out  # no progress bar for one image


def test_out_is_checked_before_any_work(saved_models, tmp_path, monkeypatch):
    images = write_images(tmp_path, 1)

    def no_work(args):
        raise AssertionError("the model was loaded before --out was checked")

    monkeypatch.setattr(explain, "_load_model", no_work)
    blocker = tmp_path / "file.txt"
    blocker.write_text("x")
    with pytest.raises(ValueError, match="not a directory"):
        explain.run(parse([*images, "--model", saved_models["classifier"], "--out", str(blocker)]))
    with pytest.raises(ValueError, match="does not exist"):
        explain.run(parse([*images, "--model", saved_models["classifier"], "--out", str(tmp_path / "a" / "b")]))
    with pytest.raises(ValueError, match="no such image file: .*missing.png"):
        explain.run(parse([str(tmp_path / "missing.png"), "--model", saved_models["classifier"], "--out", "x"]))
    with pytest.raises(ValueError, match="Unrecognised checkpoint or model file .*file.txt"):  # the one reader's refusal
        explain.run(parse([*images, "--model", str(blocker), "--out", str(tmp_path / "o")]))
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(ValueError, match=r"pip install matplotlib"):
        explain.run(parse([*images, "--model", saved_models["classifier"], "--out", str(tmp_path / "o")]))
    assert not (tmp_path / "o").exists()


def test_usage_needs_a_model_and_out(capsys):
    with pytest.raises(SystemExit):
        parse(["image.png", "--out", "x"])
    with pytest.raises(SystemExit):
        parse(["image.png", "--preset", "p", "--model", "m.keras", "--out", "x"])


def test_explain_a_converted_checkpoint_by_preset_path(tmp_path, capsys):
    fixture = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures", "inspection",
                           "gap_no_class_token")
    images = write_images(tmp_path, 2, size=(16, 16))
    out = tmp_path / "out"
    assert cli.main(["explain", *images, "--preset", fixture, "--out", str(out)]) == 0
    assert len(os.listdir(out)) == 7  # six figures and files, and the writer's marker
    numbers = json.loads((out / "figure7.json").read_text())
    assert numbers["model"] == fixture and numbers["explained_variance_ratio"] is not None


def test_titles_name_the_predicted_class():
    backbone = keras_vit.ViTBackbone(image_size=8, patch_size=4, **TINY)
    named = keras_vit.ViTClassifier(backbone=backbone, num_classes=3, class_names=["cat", "dog", "fox"])
    images = np.zeros((2, 8, 8, 3), "float32")
    # A fresh head is zero: uniform probabilities, and argmax takes the first class.
    assert explain._prediction(named, images) == [("cat", pytest.approx(1 / 3)), ("cat", pytest.approx(1 / 3))]
    logits = keras_vit.ViTClassifier(backbone=backbone, num_classes=3, activation=None)
    assert explain._prediction(logits, images)[0] == ("class 0", pytest.approx(1 / 3))
    assert explain._prediction(backbone, images) is None


def test_explain_a_masked_patch_predictor(tmp_path, capsys, monkeypatch):
    # The help says --model takes a MaskedPatchPredictor; its 512 colour "classes" once went through the
    # classifier's prediction path and crashed with a TypeError.
    backbone = keras_vit.ViTBackbone(image_size=8, patch_size=4, **TINY)
    path = str(tmp_path / "a model dir" / "mpp.keras")
    os.makedirs(os.path.dirname(path))
    keras_vit.MaskedPatchPredictor(backbone, seed=0).save(path)
    titles = []
    plot = keras_vit.inspection.Figure7.plot
    monkeypatch.setattr(keras_vit.inspection.Figure7, "plot",
                        lambda self, title=None, **kw: titles.append(title) or plot(self, title=title, **kw))
    out = tmp_path / "figures"
    assert cli.main(["explain", *write_images(tmp_path, 1), "--model", path, "--out", str(out)]) == 0, \
        capsys.readouterr().err
    assert "figure7.png" in os.listdir(out)
    # The figure names the model file, not the (temporary, absolute) path it was given as.
    assert titles == ["Figure 7 of the ViT paper for mpp.keras (1 image(s))"]


@pytest.mark.one_backend("the package's import wiring: `import keras_vit` binds its submodules on any backend")
def test_inspection_is_an_attribute_of_the_package():
    # The package docstring's own example: keras_vit.inspection.attention_maps(model, images). A fresh
    # process, since this one imported keras_vit.inspection already. The other passes import the same
    # module in every test of this file that calls keras_vit.inspection. The fresh process runs JAX: its
    # import takes 4 CPU s, PyTorch's 9 (the binding is the same import on every backend).
    import subprocess

    code = "import keras_vit; print(keras_vit.inspection.attention_maps.__name__)"
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                               env={**os.environ, "KERAS_BACKEND": "jax",
                                    "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))})
    assert completed.returncode == 0, completed.stderr[-2000:]
    assert completed.stdout.strip() == "attention_maps"

