"""Attention of converted timm models equals what timm computes (fixtures by scripts/make_attention_fixtures.py)."""

import json
import os

import numpy as np
import pytest

from keras_vit import inspection
from keras_vit.convert import load_checkpoint

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures", "inspection")


def test_manifest_records_timm():
    with open(os.path.join(FIXTURES, "MANIFEST.json")) as file:
        manifest = json.load(file)
    assert manifest["timm_version"].startswith("1.")
    assert set(manifest["fixtures"]) == {"registers_nonsquare", "gap_no_class_token"}


@pytest.mark.parametrize("name", ["registers_nonsquare", "gap_no_class_token"])
def test_attention_equals_timm(name):
    reference = np.load(os.path.join(FIXTURES, name, "attention.npz"), allow_pickle=False)
    model = load_checkpoint(os.path.join(FIXTURES, name))
    maps = inspection.attention_maps(model, reference["images"])
    assert maps.num_prefix_tokens == int(reference["num_prefix_tokens"])
    assert maps.grid_size == tuple(reference["grid_size"])
    assert maps.scores.shape == reference["attention"].shape
    assert np.max(np.abs(maps.scores - reference["attention"])) <= 1e-5
    # Far from uniform: a wrong token order or head split would show.
    assert reference["attention"].max() > 0.5
