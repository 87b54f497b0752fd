"""Promise: every converter refuses a checkpoint with one tensor replaced by a scalar, a vector or
an integer copy with a `ValueError` (no IndexError / TypeError from deep inside, no silent load).

One test per source format sweeps every tensor of a small real checkpoint of that format.
"""

import json

import numpy as np
import pytest

from keras_vit.convert import export_huggingface, from_huggingface, from_npz, from_timm, read_npz, read_safetensors
from tests.convert.helpers import fixture_path
from tests.reliability.helpers import tiny_classifier

MUTATIONS = {
    "scalar": lambda value: np.float32(1.0),
    "vector": lambda value: np.ones(3, np.float32),
    "integer copy": lambda value: np.asarray(value).astype(np.int32),
}


def _sources():
    import os

    hybrid = os.path.join(os.path.dirname(fixture_path()), "hybrid")
    return {
        "timm": (lambda: read_safetensors(fixture_path("cls_token", "model.safetensors")),
                 lambda d: from_timm(d, config=json.load(open(fixture_path("cls_token", "config.json"))))),
        "google npz": (lambda: read_npz(fixture_path("google_vit.npz")), from_npz),
        "big_vision npz": (lambda: read_npz(fixture_path("big_vision_gap.npz")), from_npz),
        "timm hybrid": (lambda: read_safetensors(os.path.join(hybrid, "tiny_r50_vit.safetensors")),
                        lambda d: from_timm(d, num_groups=4, num_heads=4)),
        "google hybrid npz": (lambda: read_npz(os.path.join(hybrid, "tiny_r50_vit_google.npz")),
                              lambda d: from_npz(d, num_groups=4)),
    }


def _sweep(tensors, convert):
    convert(dict(tensors))  # the intact checkpoint loads
    loaded = []
    for key in sorted(tensors):
        for mutation, change in MUTATIONS.items():
            mutated = {**tensors, key: change(tensors[key])}
            if np.shape(mutated[key]) == np.shape(tensors[key]) and mutation != "integer copy":
                continue  # not a change for this tensor
            try:
                convert(mutated)
                loaded.append(f"{key} ({mutation})")
            except ValueError:
                pass
    return loaded


@pytest.mark.parametrize(
    "source",
    # The hybrids build a ResNet stem per mutation that passes the early checks: slow (48 s and 34 s on the
    # TensorFlow pass). Whether a mutation is refused is decided by the strict name map's shape and dtype checks
    # on numpy arrays (convert/model_map.py), the same on every backend: they run in the torch pass only.
    [pytest.param(name, marks=[pytest.mark.slow, pytest.mark.one_backend(
        "the name map checks numpy arrays; the backend only builds the stem")]) if "hybrid" in name else name
     for name in _sources()],
)
def test_every_tensor_mutation_is_refused(source):
    read, convert = _sources()[source]
    assert _sweep(read(), convert) == []


def test_huggingface_every_tensor_mutation_is_refused(tmp_path):
    export_huggingface(tiny_classifier(), tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    tensors = read_safetensors(tmp_path / "model.safetensors")
    assert _sweep(tensors, lambda d: from_huggingface(config, d)) == []
