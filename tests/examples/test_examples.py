"""Every script in examples/ runs top to bottom as `__main__`, with small settings, and shows its progress.

The scripts run in this process (`runpy`), not in a new interpreter: importing
Keras and three frameworks again would cost more than the script itself.
"""

import os
import re
import runpy
import sys

import keras
import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
EXAMPLES = os.path.join(ROOT, "examples")

# Small settings for each script, and the lines that show its progress, in order.
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
}


def test_every_example_has_small_settings():
    scripts = sorted(name for name in os.listdir(EXAMPLES) if name.endswith(".py"))
    assert scripts == sorted(SMALL), "add each new example script to SMALL with settings that run in seconds"


@pytest.mark.slow  # three tiny fits, each compiled (~10-30 s)
@pytest.mark.parametrize("script", sorted(SMALL))
def test_example_runs_and_shows_progress(script, tmp_path, monkeypatch, capsys):
    arguments, progress = SMALL[script]
    monkeypatch.chdir(tmp_path)  # anything a script writes lands here
    monkeypatch.setattr(sys, "argv", [os.path.join(EXAMPLES, script), *arguments])
    runpy.run_path(os.path.join(EXAMPLES, script), run_name="__main__")
    stdout = capsys.readouterr().out
    lines = stdout.splitlines()
    position = 0
    for pattern in progress:  # each expected line, after the previous one
        matches = [i for i, line in enumerate(lines) if i >= position and re.search(pattern, line)]
        assert matches, f"no line matching {pattern!r} after line {position} of:\n{stdout}"
        position = matches[0] + 1
    assert f"Backend {keras.backend.backend()}:" in stdout
