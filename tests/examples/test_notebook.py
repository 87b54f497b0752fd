"""examples/colab_presets.ipynb, executed top to bottom in a Jupyter kernel, offline and small.

The notebook runs as a user runs it, with three changes made here and nowhere
in the notebook: the backend line names this test's backend; one cell added
after it serves the presets the notebook loads from tiny stand-ins through the
hub's download seam (tests/examples/offline_hub.py); and CIFAR-10 is 64
random training images and 32 test images instead of a 170 MB download. A cell
that raises fails the test with the cell and its traceback. It runs in one
pass (the torch one), like the example scripts: what it checks is the
notebook, not a backend.
"""

import os
import re

import keras
import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
NOTEBOOK = os.path.join(ROOT, "examples", "colab_presets.ipynb")
BACKEND_LINE = re.compile(r'^os\.environ\["KERAS_BACKEND"\] = "\w+"', re.M)

OFFLINE = """\
# Added by tests/examples/test_notebook.py: presets from a local mirror, a small CIFAR-10.
import numpy as np

from tests.examples.offline_hub import serve_presets

serve_presets({mirror!r}, {presets!r})


def _small_cifar10(rng=np.random.default_rng(0)):
    def split(n):
        return rng.integers(0, 256, (n, 32, 32, 3), dtype="uint8"), rng.integers(0, 10, (n, 1), dtype="uint8")
    return split(64), split(32)


keras.datasets.cifar10.load_data = _small_cifar10
"""


def _prepared(nbformat, mirror):
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    backend_cells = [cell for cell in code if BACKEND_LINE.search(cell.source)]
    assert len(backend_cells) == 1, "the notebook sets KERAS_BACKEND in one cell"
    backend_cell = backend_cells[0]
    backend_cell.source = BACKEND_LINE.sub(f'os.environ["KERAS_BACKEND"] = "{keras.backend.backend()}"',
                                           backend_cell.source)
    presets = sorted({name for cell in code for name in re.findall(r'from_preset\(\s*"(vit_\w+)"', cell.source)})
    assert presets, "the notebook loads presets"
    offline = nbformat.v4.new_code_cell(OFFLINE.format(mirror=str(mirror), presets=presets))
    notebook.cells.insert(notebook.cells.index(backend_cell) + 1, offline)
    return notebook


def _text(cell):
    return "".join(output.get("text", "") for output in cell.get("outputs", []) if output.get("output_type") == "stream")


@pytest.mark.slow  # a kernel, two tiny presets and three epochs of fine-tuning (~20 s)
@pytest.mark.one_backend("runs the notebook in a kernel of its own; the presets, predict and fit it calls are tested "
                         "on each backend (tests/presets, tests/models, tests/finetune), as for the example scripts")
def test_colab_notebook_runs_top_to_bottom(tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    notebook = _prepared(nbformat, tmp_path / "mirror")
    work = tmp_path / "work"
    work.mkdir()
    # The kernel is a child process: it inherits these.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([ROOT, *filter(None, [os.environ.get("PYTHONPATH")])]))
    monkeypatch.setenv("KERAS_BACKEND", keras.backend.backend())
    monkeypatch.setenv("KERAS_VIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))  # the user's Hugging Face cache stays untouched
    client = nbclient.NotebookClient(notebook, timeout=300, kernel_name="python3",
                                     resources={"metadata": {"path": str(work)}})
    client.execute()  # raises CellExecutionError, naming the cell, if any cell fails

    outputs = [_text(cell) for cell in notebook.cells if cell.cell_type == "code"]
    everything = "\n".join(outputs)
    assert f"on {keras.backend.backend()}" in everything  # the backend cell ran on this test's backend
    # The registry listing, one line per preset.
    from keras_vit.presets import list as preset_names

    assert sum(name in everything for name in preset_names()) == len(preset_names())
    # Top-5 ImageNet classes of the photo: five lines "score  name  (synset)".
    assert len(re.findall(r"^\s*[\d.]+%\s+.+\s+\(n\d{8}\)$", everything, re.M)) == 5
    assert "held-out accuracy:" in everything
    assert "identical predictions: True" in everything
    assert sorted(os.listdir(work / "cifar10_vit_ti16")) == [".keras_vit.json", "config.json", "metadata.json",
                                                             "model.weights.h5"]
