"""Exported graphs run in their own runtime and match the Keras model; errors name the fix."""

import importlib.util
import json
import os

import keras
import numpy as np
import pytest

from keras_vit import cli
from keras_vit.workflows import export
from keras_vit.workflows.export import UNSUPPORTED, export_model, required_modules, run_exported
from tests.deploy.conftest import CLASS_NAMES, images, tiny_classifier

BACKEND = keras.backend.backend()


def _skip_unless_exportable(format):
    reason = UNSUPPORTED.get((format, BACKEND))
    if reason:
        pytest.skip(f"Keras 3.15 cannot export {format} from {BACKEND}: {reason}")
    missing = [name for name in required_modules(format, BACKEND) if importlib.util.find_spec(name) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed (the export extra)")


@pytest.mark.parametrize("format", ["saved_model", "onnx", "litert"])
def test_exported_classifier_matches_keras_at_any_batch_size(format, classifier, tmp_path):
    _skip_unless_exportable(format)
    out = str(tmp_path / "export")
    document = export_model(classifier, out, format=format)
    assert document["max_difference"] <= 1e-4
    # A batch size the export's own check did not use: the batch dimension is free.
    x = images(5, seed=7)
    got = run_exported(out, format, x)
    np.testing.assert_allclose(got, np.asarray(classifier.predict(x, verbose=0)), atol=1e-4)
    with open(os.path.join(out, "export.json")) as file:
        saved = json.load(file)
    assert saved["class_names"] == CLASS_NAMES
    assert saved["input"]["shape"] == [None, 16, 16, 3]
    assert saved["input"]["pixel_range"] == [0.0, 255.0]


@pytest.mark.parametrize("format", ["saved_model", "onnx"])
def test_exported_backbone_matches_keras(format, classifier, tmp_path):
    _skip_unless_exportable(format)
    out = str(tmp_path / "backbone")
    document = export_model(classifier.backbone, out, format=format)
    assert document["outputs"] == "tokens" and document["class_names"] is None
    x = images(2, seed=3)
    np.testing.assert_allclose(run_exported(out, format, x), np.asarray(classifier.backbone.predict(x, verbose=0)),
                               atol=1e-4)


def test_unsupported_backend_names_the_backend_that_exports():
    unsupported = [format for (format, backend) in UNSUPPORTED if backend == BACKEND]
    if not unsupported:
        pytest.skip(f"every format exports from {BACKEND}")
    with pytest.raises(ValueError, match="KERAS_BACKEND=tensorflow"):
        export.check_export(unsupported[0])


def _exportable_format():
    format = next((f for f in ("onnx", "saved_model", "litert") if (f, BACKEND) not in UNSUPPORTED), None)
    if format is None:
        pytest.skip(f"Keras 3.15 exports no format from {BACKEND} (UNSUPPORTED), so no extra is asked for")
    return format


def test_missing_runtime_names_the_export_extra(monkeypatch):
    format = _exportable_format()
    needed = required_modules(format, BACKEND)[-1]
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == needed else real(name, *a))
    with pytest.raises(ImportError, match=r'keras3-vit\[export\]'):
        export.check_export(format)


def test_existing_user_directory_is_never_replaced(classifier, tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    with pytest.raises(ValueError, match="did not write there"):
        export.check_export_directory(str(tmp_path / "mine"))
    if (format := next((f for f in export.EXPORT_FORMATS if (f, BACKEND) not in UNSUPPORTED), None)):
        with pytest.raises(ValueError, match="did not write there"):
            export_model(classifier, str(tmp_path / "mine"), format=format, check=False)
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"


def test_cli_refuses_a_user_directory_before_loading(tmp_path, capsys):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    # The model does not exist: the output path is refused first, with the flag that named it.
    assert cli.main(["export", "missing.keras", "--format", "onnx", "--out", str(tmp_path / "mine")]) == 2
    assert "--out" in capsys.readouterr().err
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"


def test_cli_unknown_format_exits_2_naming_the_choices(tmp_path, capsys):
    assert cli.main(["export", "model.keras", "--format", "tflite", "--out", str(tmp_path / "x")]) == 2
    error = capsys.readouterr().err
    assert "saved_model" in error and "onnx" in error and "litert" in error


def test_cli_missing_extra_names_it(tmp_path, capsys, monkeypatch):
    format = _exportable_format()
    needed = required_modules(format, BACKEND)[-1]
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == needed else real(name, *a))
    path = str(tmp_path / "tiny.keras")
    tiny_classifier().save(path)
    assert cli.main(["export", path, "--format", format, "--out", str(tmp_path / "x")]) == 1
    assert 'pip install "keras3-vit[export]"' in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "x")


@pytest.mark.slow  # exports and quantizes through the command line
def test_cli_exports_and_quantizes_a_keras_file(tmp_path, capsys):
    path = str(tmp_path / "tiny.keras")
    model = tiny_classifier()
    model.save(path)
    assert cli.main(["quantize", path, "--out", str(tmp_path / "int8.keras")]) == 0
    loaded = keras.saving.load_model(str(tmp_path / "int8.keras"))
    assert loaded.get_layer("head").quantization_mode == "int8"
    format = next((f for f in ("onnx", "saved_model") if (f, BACKEND) not in UNSUPPORTED), None)
    if format is None:
        return
    _skip_unless_exportable(format)
    assert cli.main(["export", str(tmp_path / "int8.keras"), "--format", format, "--out", str(tmp_path / "g")]) == 0
    x = images(2)
    np.testing.assert_allclose(run_exported(str(tmp_path / "g"), format, x),
                               np.asarray(loaded.predict(x, verbose=0)), atol=1e-4)
