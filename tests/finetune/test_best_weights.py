"""A fine-tune keeps the weights of its best held-out evaluation and stops when that stops improving.

Before: the run kept its last weights, and on a 30-image folder whose held-out accuracy peaked after about 50
of 520 updates it returned the later, worse ones.
"""

import os

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit import cli
from keras_vit.workflows.finetuning import DEFAULT_PATIENCE
from tests.finetune.helpers import tiny_backbone_file, write_folder, write_misleading_held_out


class WeightsEachEpoch(keras.callbacks.Callback):
    """The model's weights and held-out numbers after every epoch, as the test saw them."""

    def __init__(self):
        super().__init__()
        self.weights, self.scores = {}, {}

    def on_epoch_end(self, epoch, logs=None):
        self.weights[epoch + 1] = [np.array(weight) for weight in self.model.get_weights()]
        self.scores[epoch + 1] = (logs["val_accuracy"], logs["val_loss"])


@pytest.mark.slow
def test_the_output_holds_the_best_held_out_evaluations_weights_and_the_run_stops_early(tmp_path, capsys):
    data = write_folder(str(tmp_path / "data"), classes=3, per_class=6)
    # Every held-out image has the next class's colour: the more the model learns, the worse it scores.
    held_out = write_misleading_held_out(str(tmp_path / "held_out"))
    preset = tiny_backbone_file(str(tmp_path / "tiny.keras"))
    output = str(tmp_path / "out")
    seen = WeightsEachEpoch()
    result = keras_vit.finetune(data, preset=preset, validation_dir=held_out, output=output, recipe="adamw",
                                workers=1, verbose=2, callbacks=[seen])
    out = capsys.readouterr().out
    assert "Stop: after the planned updates, or earlier when the held-out accuracy" in out, out

    # The best evaluation by the rule, found here from the epochs' numbers: highest accuracy, then lowest loss.
    best_epoch = min(seen.scores, key=lambda epoch: (-seen.scores[epoch][0], seen.scores[epoch][1]))
    last_epoch = max(seen.scores)
    assert best_epoch < last_epoch, seen.scores  # the folder does what it is for: the last weights are not the best
    assert result["best"]["epoch"] == best_epoch, (result["best"], seen.scores)
    # Stopped after DEFAULT_PATIENCE evaluations without improvement, before the planned epochs.
    assert result["stopped_early"] == last_epoch == best_epoch + DEFAULT_PATIENCE < result["epochs"], result
    updates_per_epoch = result["updates"] // result["epochs"]
    assert (f"Kept the weights of update {best_epoch * updates_per_epoch} (epoch {best_epoch})") in out, out

    saved = keras_vit.ViTClassifier.from_preset(output).get_weights()
    for kept, wanted, last in zip(saved, seen.weights[best_epoch], seen.weights[last_epoch]):
        np.testing.assert_array_equal(np.asarray(kept), wanted)
    assert any(not np.array_equal(a, b) for a, b in zip(seen.weights[best_epoch], seen.weights[last_epoch]))
    # The held-out numbers returned are those of the weights kept.
    np.testing.assert_allclose(result["accuracy"], seen.scores[best_epoch][0])
    np.testing.assert_allclose(result["loss"], seen.scores[best_epoch][1], rtol=1e-4)
    # The run directory's copy of the best is gone with the backup once the output is written.
    assert sorted(os.listdir(output + ".run")) == [".keras_vit.json", "log.csv"]


@pytest.mark.one_backend("what the command line refuses before any work; no model is built")
def test_contradictory_flags_exit_2_before_any_work(tmp_path, capsys, monkeypatch):
    from keras_vit.workflows import finetuning

    folder = write_folder(str(tmp_path / "photos"), classes=2, per_class=3)
    held_out = write_folder(str(tmp_path / "held_out"), classes=2, per_class=1)

    class Started(BaseException):  # not an Exception: the command line's error handler lets it through
        pass

    def started(*args, **kwargs):
        raise Started

    monkeypatch.setattr(finetuning, "finetune", started)
    common = ["finetune", folder, "--variant", "ViT-Ti/16"]
    for flags, words in ((["--crop-min-area", "0.3", "--no-crop"], "--crop-min-area and --no-crop contradict"),
                         (["--patience", "3", "--no-early-stop"], "--patience and --no-early-stop contradict"),
                         (["--validation-split", "0.3", "--validation-dir", held_out],
                          "--validation-split and --validation-dir contradict"),
                         (["--batch-size", "64", "--effective-batch-size", "32"], "smaller than --batch-size")):
        assert cli.main([*common, *flags]) == 2, flags
        err = capsys.readouterr().err
        assert words in err and "Traceback" not in err, err
    for flags in (["--crop-min-area", "0.3"], ["--no-crop"], ["--patience", "3"], ["--no-early-stop"],
                  ["--validation-dir", held_out], ["--effective-batch-size", "0"]):  # each alone is fine
        with pytest.raises(Started):
            cli.main([*common, *flags])
