"""Every script in examples/ runs top to bottom as a user runs it, with tiny settings, and shows its progress.

Each script runs as `python examples/X.py ...` runs it, as the README tells a
user to: as `__main__`, with its arguments in `sys.argv`, from the test's own
directory; but in the test's process (`runpy`), not a new interpreter, whose
start would import Keras and its backend again for seconds of CPU each. The
one line a new interpreter would run differently, the script's
`os.environ.setdefault("KERAS_BACKEND", "jax")`, does nothing in the suite
either way (each pass sets KERAS_BACKEND). The library each one calls is
tested on every backend by the rest of the suite; what is checked here is that
the script itself runs and says what it did, so one pass runs them.
"""

import os
import re
import runpy
import sys

import numpy as np
import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
EXAMPLES = os.path.join(ROOT, "examples")
TIMM_FIXTURE = os.path.join(ROOT, "tests", "fixtures", "timm", "cls_token")

# Tiny settings for each script (OUT is replaced by the test's output directory), and the lines that show its
# progress, in order.
SMALL = {
    "masked_patch_prediction.py": (
        ["--pretrain-epochs", "1", "--finetune-epochs", "1", "--num-layers", "1"],
        [r"^Backend \w+: 1437 unlabeled training digits, 143 of them labelled, 360 held out\.$",
         r"^1/3 Masked patch prediction .* 1 epochs\.$",
         r"^  pre-training: epoch 1/1, loss \d+\.\d+, accuracy [\d.]+% \(\d+ s\)$",
         r"^Masked patch prediction on held-out digits: [\d.]+% .*\(8 classes\)\.$",
         r"^2/3 Fine-tuning the pre-trained backbone on 143 labelled digits, 1 epochs\.$",
         r"^  fine-tuning: epoch 1/1, ",
         r"^3/3 The same ViT from scratch on the same 143 digits, 1 epochs\.$",
         r"^  from scratch: epoch 1/1, ",
         r"^Held-out accuracy with 143 labels: from scratch [\d.]+%, after masked patch prediction [\d.]+%\.$"],
    ),
    "finetune_folder.py": (
        ["--variant", "ViT-Ti/16", "--image-size", "32", "--epochs", "1", "--output", "OUT"],
        [r"^1/3 Fine-tuning on .*shapes: 3 classes \(circle, square, triangle\)\.$",
         r"^2/3 1 epochs, \d+ updates planned, held-out accuracy [\d.]+%; saved to .*OUT$",
         r"^3/3 The saved model on circle/circle_00\.png: (circle|square|triangle) \([\d.]+%\)$"],
    ),
    "convert_timm_checkpoint.py": (
        [os.path.join(TIMM_FIXTURE, "model.safetensors"), "--output", "OUT"],
        [r"^1/3 Read .*model\.safetensors: ViTClassifier, 2 blocks of width 16, patch 4x4, 16x16 pixels, "
         r"5 classes, [\d,]+ parameters\.$",
         r"^2/3 On a made-up image: class \d [\d.]+%, class \d [\d.]+%, class \d [\d.]+%\.$",
         r"^3/3 Saved to .*OUT; read back, the largest probability difference is 0\.0e\+00\.$"],
    ),
}


def run_example(script, tmp_path, capsys, monkeypatch):
    """The script's stdout, run as `__main__` with its arguments; its exception, if it raises, fails the test."""
    output = str(tmp_path / "out")
    arguments = [output if argument == "OUT" else argument for argument in SMALL[script][0]]
    path = os.path.join(EXAMPLES, script)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", [path, *arguments])
    capsys.readouterr()  # what the test printed before, if anything
    runpy.run_path(path, run_name="__main__")
    return capsys.readouterr().out.replace(output, "OUT")


def check_progress(script, stdout):
    lines = stdout.splitlines()
    position = 0
    for pattern in SMALL[script][1]:  # each expected line, after the previous one
        matches = [i for i, line in enumerate(lines) if i >= position and re.search(pattern, line)]
        assert matches, f"no line matching {pattern!r} after line {position} of:\n{stdout}"
        position = matches[0] + 1


@pytest.mark.one_backend("lists a folder")
def test_every_example_has_small_settings():
    scripts = sorted(name for name in os.listdir(EXAMPLES) if name.endswith(".py"))
    assert scripts == sorted(SMALL), "add each new example script to SMALL with settings that run in seconds"


@pytest.mark.slow  # three tiny fits
@pytest.mark.one_backend("runs the script as a user does; the library it calls is tested on each backend")
def test_masked_patch_prediction_runs_and_shows_progress(tmp_path, capsys, monkeypatch):
    stdout = run_example("masked_patch_prediction.py", tmp_path, capsys, monkeypatch)
    check_progress("masked_patch_prediction.py", stdout)
    assert f"Backend {os.environ.get('KERAS_BACKEND', 'jax')}:" in stdout


@pytest.mark.slow  # one tiny fine-tune
@pytest.mark.one_backend("runs the script as a user does; the library it calls is tested on each backend")
def test_finetune_folder_runs_and_saves_a_preset_with_the_class_names(tmp_path, capsys, monkeypatch):
    check_progress("finetune_folder.py", run_example("finetune_folder.py", tmp_path, capsys, monkeypatch))
    import keras_vit

    model = keras_vit.ViTClassifier.from_preset(str(tmp_path / "out"))
    assert model.class_names == ["circle", "square", "triangle"]
    assert model.input_shape[1:] == (32, 32, 3)


@pytest.mark.one_backend("runs the script as a user does; the library it calls is tested on each backend")
def test_convert_timm_checkpoint_runs_and_its_preset_gives_timms_answer(tmp_path, capsys, monkeypatch):
    check_progress("convert_timm_checkpoint.py",
                   run_example("convert_timm_checkpoint.py", tmp_path, capsys, monkeypatch))
    import keras_vit

    # The preset the script saved against timm's own answer on the fixture's images (committed by
    # scripts/make_timm_fixtures.py): probabilities, as the classifier outputs them.
    reference = np.load(os.path.join(TIMM_FIXTURE, "reference.npz"), allow_pickle=False)
    logits = reference["logits"].astype(np.float64)
    expected = np.exp(logits - logits.max(-1, keepdims=True))
    expected /= expected.sum(-1, keepdims=True)
    model = keras_vit.ViTClassifier.from_preset(str(tmp_path / "out"))
    probabilities = np.asarray(model.predict(reference["images"].astype("float32"), verbose=0))
    np.testing.assert_allclose(probabilities, expected, atol=1e-5)
