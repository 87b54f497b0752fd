"""`keras-vit convert SRC DST`."""

import numpy as np

import keras
from keras_vit import cli
from keras_vit.convert import load_checkpoint
from tests.convert.helpers import TOLERANCE, fixture_path, max_abs_diff, predict


def test_convert_to_keras_and_weights(tmp_path, capsys):
    reference = np.load(fixture_path("nonsquare", "reference.npz"), allow_pickle=False)
    assert cli.main(["convert", fixture_path("nonsquare"), str(tmp_path / "model.keras")]) == 0
    model = keras.saving.load_model(tmp_path / "model.keras")
    assert max_abs_diff(predict(model, reference["images"]), reference["logits"]) <= TOLERANCE

    assert cli.main(["convert", fixture_path("nonsquare"), str(tmp_path / "model.weights.h5")]) == 0
    rebuilt = load_checkpoint(fixture_path("nonsquare"), image_size=(12, 20))
    for variable in rebuilt.weights:
        variable.assign(np.zeros(variable.shape, "float32"))
    rebuilt.load_weights(tmp_path / "model.weights.h5")
    for restored, saved in zip(rebuilt.weights, model.weights):
        np.testing.assert_array_equal(restored.numpy(), saved.numpy(), err_msg=restored.path)


def test_convert_resampled_timm_file_and_errors(tmp_path, capsys):
    out = tmp_path / "resampled.safetensors"
    assert cli.main(["convert", fixture_path("cls_token"), str(out), "--image-size", "24"]) == 0
    reference = np.load(fixture_path("cls_token", "reference_24x24.npz"), allow_pickle=False)
    assert max_abs_diff(predict(load_checkpoint(out), reference["images"]), reference["logits"]) <= TOLERANCE

    (tmp_path / "model.bin").write_bytes(b"\x80\x04K\x01.")
    assert cli.main(["convert", str(tmp_path / "model.bin"), str(tmp_path / "x.keras")]) == 1
    assert "never unpickles" in capsys.readouterr().err
    assert cli.main(["convert", fixture_path("cls_token"), str(tmp_path / "x.unknown")]) == 2  # a usage error
    assert "--to huggingface" in capsys.readouterr().err
