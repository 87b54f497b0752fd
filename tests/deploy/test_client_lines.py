"""docs/deploy.md's client lines (Pillow + numpy, then onnxruntime) feed an exported graph as keras_vit does.

The lines are taken from the page itself, as tests/examples/test_readme.py
reads the README, and run on photo files; the answer is compared with
`ViTClassifier.predict` of the same files through keras_vit's reader.

In the TensorFlow pass only, the one whose graph the page's onnxruntime lines
run: what the page's preprocessing reads (export.json, written by
`describe_transform` whatever the backend) and does (Pillow and numpy) does
not depend on the backend, and that a graph exported from JAX (a SavedModel
through jax2tf) answers as keras_vit is tests/deploy/test_export.py's check in
the JAX pass (the JAX pass here fed that graph the page's preprocessing
through `run_exported`, never the page's run lines, and cost a TensorFlow
import for it).
"""

import importlib.util
import os
import re

import keras
import numpy as np
import pytest

from keras_vit.workflows.export import UNSUPPORTED, export_model, required_modules
from tests.deploy.photos import PHOTOS, assert_same_answer, keras_vit_answer, tiny_classifier, write_photo
from tests.package_source import ROOT

pytest.importorskip("skimage")
BACKEND = keras.backend.backend()
# The page's run lines feed an ONNX graph, which TensorFlow exports.
FORMAT = {"tensorflow": "onnx"}.get(BACKEND)
TRANSFORMS = {"center_crop": {}, "crop_0.875_bilinear": {"crop_fraction": 0.875, "interpolation": "bilinear"}}
NAMES = [f"class_{i}" for i in range(10)]


def _doc_blocks():
    """The two Python blocks of docs/deploy.md's "Feeding the graph from a client": preprocess, and the run."""
    with open(os.path.join(os.path.dirname(ROOT), "docs", "deploy.md"), encoding="utf-8") as file:
        page = file.read()
    section = page.split("### Feeding the graph from a client", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) == 2, "docs/deploy.md's client section should hold the preprocess block and the run block"
    return blocks


def _skip_unless_exportable():
    if FORMAT is None or UNSUPPORTED.get((FORMAT, BACKEND)):
        pytest.skip(f"the page's client runs the ONNX graph that TensorFlow exports, not {BACKEND}'s")
    missing = [name for name in required_modules(FORMAT, BACKEND) if importlib.util.find_spec(name) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed (the export extra)")


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    directory = tmp_path_factory.mktemp("photos")
    return {name: write_photo(name, directory) for name in PHOTOS}


@pytest.mark.parametrize("transform", sorted(TRANSFORMS))
def test_the_documented_client_answers_as_keras_vit(transform, photos, tmp_path):
    _skip_unless_exportable()
    preprocess_block, run_block = _doc_blocks()
    model = tiny_classifier(class_names=NAMES, **TRANSFORMS[transform])
    export_dir = str(tmp_path / "exported")
    export_model(model, export_dir, format=FORMAT)
    namespace = {}
    exec(compile(preprocess_block, "docs/deploy.md", "exec"), namespace)  # noqa: S102 - the page's own lines
    for name, path in photos.items():
        expected = keras_vit_answer(model, path)
        # The page's onnxruntime lines, with this test's export and photo for its example paths.
        lines = run_block.replace("vit_onnx", export_dir).replace("cat.jpg", str(path))
        exec(compile(lines, "docs/deploy.md", "exec"), namespace)  # noqa: S102
        got = namespace["probabilities"]
        assert namespace["spec"]["class_names"] == NAMES
        assert_same_answer(got, expected, f"{transform}, {name}, {FORMAT}")
