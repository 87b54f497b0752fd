"""The README's user install line, from the built wheel into a fresh venv, runs the quick start offline.

A new user runs `pip install "keras3-vit[jax]"` and then the README's quick
start. This test does the same with the wheel `python -m build` makes: a
fresh virtual environment (no system packages), exactly the README's install
argument (pip is pointed at the built wheel and pinned to the project's
constraints, as the package is not on the index yet), then, offline, the
README's Python quick start and its `predict`, `finetune`, `predict --preset
MY_VIT` and `fewshot` commands, with presets served through the hub's download
seam (`tests/examples/offline_hub.py`), in a process of that environment.
A missing dependency (Pillow, huggingface_hub, safetensors) fails it.
"""

import os
import re
import subprocess
import sys
import textwrap

import pytest

from tests.examples.test_packaging import ROOT, _source_copy

pytestmark = [
    pytest.mark.slow,  # builds a wheel and a fresh venv with jax: about a minute with pip's cache warm
    # The fresh venv installs and runs the README's jax line whatever backend the suite's pass is on.
    pytest.mark.one_backend("packaging walk (it installs the README's jax line in a fresh venv)"),
]


def readme_install_argument():
    """The first `pip install "..."` of the README's Install section, e.g. `keras3-vit[jax]`."""
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as file:
        section = file.read().split("## Install", 1)[1]
    return re.search(r'pip install "([^"]+)"', section).group(1)


DRIVER = textwrap.dedent("""
    import os, sys
    import numpy as np
    from PIL import Image
    from offline_hub import serve_presets

    work = sys.argv[1]
    serve_presets(os.path.join(work, "mirror"), ["vit_b16_augreg2_in21k_ft_in1k", "vit_b16_augreg_in21k"])

    import keras_vit
    from keras_vit import cli

    # The README's "Load a preset and predict", in Python.
    model = keras_vit.ViTClassifier.from_preset("vit_b16_augreg2_in21k_ft_in1k")
    images = np.random.default_rng(0).uniform(0, 255, (2, 224, 224, 3)).astype("float32")
    top = keras_vit.decode_predictions(model.predict(images, verbose=0), top=5)
    assert len(top) == 2 and len(top[0]) == 5, top

    # A photo and a small folder of the user's own images.
    rng = np.random.default_rng(1)
    photo = os.path.join(work, "photo.jpg")
    Image.fromarray(rng.integers(0, 256, (300, 400, 3), dtype=np.uint8)).save(photo)
    photos = os.path.join(work, "photos")
    for label, channel in (("cat", 0), ("dog", 2)):
        os.makedirs(os.path.join(photos, label))
        for index in range(8):
            pixels = np.zeros((40, 48, 3)); pixels[..., channel] = 200
            pixels = np.clip(pixels + rng.normal(0, 30, pixels.shape), 0, 255).astype(np.uint8)
            Image.fromarray(pixels).save(os.path.join(photos, label, f"{index}.png"))

    my_vit = os.path.join(work, "my_vit")
    commands = [
        ["predict", photo, "--preset", "vit_b16_augreg2_in21k_ft_in1k"],
        ["finetune", photos, "--preset", "vit_b16_augreg_in21k", "--image-size", "32", "--epochs", "1",
         "--output", my_vit],
        ["predict", photo, "--preset", my_vit],
        ["fewshot", photos, "--preset", "vit_b16_augreg_in21k", "--image-size", "32", "--shots", "1,5"],
    ]
    for argv in commands:
        code = cli.main(argv)
        print(f"QUICKSTART {argv[0]} -> {code}", flush=True)
        assert code == 0, argv
    print("QUICKSTART OK")
""")


def test_readme_user_line_runs_the_quick_start_from_the_wheel(tmp_path):
    pytest.importorskip("build")
    argument = readme_install_argument()
    assert argument == "keras3-vit[jax]"  # the one-backend line a user is told to run first

    # The user's shell: no PYTHONPATH (a checkout on it makes pip see the source tree's egg-info as
    # "keras3-vit, already installed" and skip the wheel), no backend chosen, and Python's default of writing
    # the bytecode it compiles (the install below leaves that to the first process that imports a module).
    env = {key: value for key, value in os.environ.items()
           if key not in ("PYTHONPATH", "KERAS_BACKEND", "PYTHONDONTWRITEBYTECODE")}
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--wheel", "--outdir", str(dist),
                    str(_source_copy(tmp_path / "src"))], check=True, capture_output=True, text=True, timeout=600)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300, env=env)
    python = str(venv / "bin" / "python")
    # --no-compile: pip's byte-compiling of every installed file (jaxlib, scipy, ...) was two thirds of the
    # install's CPU time; the quick start compiles what it imports, as Python does for any module without one.
    install = subprocess.run(
        [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-compile", "--find-links",
         str(dist),
         "-c", os.path.join(ROOT, "requirements", "constraints.txt"), argument],
        capture_output=True, text=True, timeout=1200, env=env,
    )
    assert install.returncode == 0, install.stdout[-3000:] + install.stderr[-3000:]

    # Neither TensorFlow nor torch came with it: the quick start runs on what the line installed.
    listed = subprocess.run([python, "-m", "pip", "list", "--format=freeze"], capture_output=True, text=True,
                            check=True, env=env).stdout.lower()
    assert "keras3-vit==" in listed and "jax==" in listed
    assert "tensorflow" not in listed and "torch==" not in listed

    env.update(HF_HUB_CACHE=str(tmp_path / "hf-cache"), KERAS_HOME=str(tmp_path / "keras-home"))
    command = os.path.join(str(venv / "bin"), "keras-vit")
    # KERAS_BACKEND unset: the command picks the installed backend and says so.
    version = subprocess.run([command, "presets"], capture_output=True, text=True, env=env, timeout=300)
    assert version.returncode == 0, version.stderr[-3000:]
    assert "using the jax backend" in version.stderr and "vit_b16_augreg2_in21k_ft_in1k" in version.stdout

    work = tmp_path / "work"
    work.mkdir()
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    run = subprocess.run([python, str(driver), str(work)], capture_output=True, text=True, timeout=900,
                         env={**env, "KERAS_BACKEND": "jax", "PYTHONPATH": os.path.join(ROOT, "tests", "examples")},
                         cwd=str(work))
    assert run.returncode == 0 and "QUICKSTART OK" in run.stdout, run.stdout[-4000:] + run.stderr[-4000:]
    # The fine-tuned preset prints the user's class names.
    assert re.search(r"\b(cat|dog)\b", run.stdout.split("QUICKSTART finetune")[1])
