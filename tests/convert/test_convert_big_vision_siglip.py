"""big_vision SigLIP `.npz` archives (a ViT with `pool_type='map'`: `MAPHead_0/`), bare and two-tower.

The fixtures (tests/fixtures/timm/parts/big_vision_siglip*.npz, made by
scripts/make_timm_part_fixtures.py) hold the arrays under big_vision's names;
their reference outputs come from timm's own `.npz` loader. A second,
independent check reads the same arrays by big_vision's names into the numpy
ViT of tests/numpy_reference.py (its MAP head included).
"""

import json

import numpy as np
import pytest

from keras_vit import ViTBackbone, ViTClassifier
from keras_vit.convert import load_checkpoint
from tests.convert.helpers import TOLERANCE, fixture_path, max_abs_diff, predict
from tests.numpy_reference import map_head, vit_forward

BARE, TWO_TOWER = "big_vision_siglip", "big_vision_siglip_two_tower"


def _arrays(name):
    with np.load(fixture_path("parts", f"{name}.npz"), allow_pickle=False) as archive:
        return dict(archive)


def _reference(name):
    return np.load(fixture_path("parts", f"{name}_reference.npz"), allow_pickle=False)


@pytest.fixture(scope="module")
def parts_manifest():
    with open(fixture_path("parts", "MANIFEST.json")) as handle:
        return json.load(handle)


@pytest.fixture(scope="module")
def bare_model():
    return load_checkpoint(fixture_path("parts", f"{BARE}.npz"), activation=None)


@pytest.fixture(scope="module")
def tower():
    return load_checkpoint(fixture_path("parts", f"{TWO_TOWER}.npz"))


def test_bare_map_model_matches_timm_npz_loader(bare_model, parts_manifest):
    reference = _reference(BARE)
    assert isinstance(bare_model, ViTClassifier) and bare_model.pooling == "map"
    assert bare_model.count_params() == parts_manifest["fixtures"][BARE]["num_params"]
    assert max_abs_diff(predict(bare_model, reference["images"]), reference["logits"]) <= TOLERANCE
    assert max_abs_diff(predict(bare_model.backbone, reference["images"]), reference["features"]) <= TOLERANCE


def test_two_tower_image_tower_matches_timm_npz_loader(tower, parts_manifest):
    # Only the image tower (params/img/) is read; the text tower's arrays are ignored by name.
    reference = _reference(TWO_TOWER)
    assert isinstance(tower, ViTBackbone) and tower.attention_pooling and not tower.use_class_token
    assert tower.mlp_activation == "gelu_tanh"
    assert tower.count_params() == parts_manifest["fixtures"][TWO_TOWER]["num_params"]
    assert max_abs_diff(predict(tower.pooled_model(), reference["images"]), reference["logits"]) <= TOLERANCE
    assert max_abs_diff(predict(tower, reference["images"]), reference["features"]) <= TOLERANCE


def _attention(arrays, prefix, width):
    """Flax's per-head kernels (D, heads, head_dim) / (heads, head_dim, D) as (D, D) matrices."""
    def get(name):
        return arrays[prefix + name]
    return {"wq": get("query/kernel").reshape(width, width), "bq": get("query/bias").reshape(-1),
            "wk": get("key/kernel").reshape(width, width), "bk": get("key/bias").reshape(-1),
            "wv": get("value/kernel").reshape(width, width), "bv": get("value/bias").reshape(-1),
            "wo": get("out/kernel").reshape(width, width), "bo": get("out/bias")}


def _numpy_weights(arrays, prefix):
    """A scanned big_vision MAP model's arrays, by big_vision's names, as tests/numpy_reference.py's weights."""
    w = {k[len(prefix):]: v.astype(np.float64) for k, v in arrays.items() if k.startswith(prefix)}
    kernel = w["embedding/kernel"]  # (Ph, Pw, C, D): a patch's (row, col, channel) order is patchify's
    width = kernel.shape[-1]
    scanned = "Transformer/encoderblock/"
    blocks = []
    for i in range(w[scanned + "LayerNorm_0/scale"].shape[0]):
        block = {k[len(scanned):]: v[i] for k, v in w.items() if k.startswith(scanned)}
        blocks.append({**_attention(block, "MultiHeadDotProductAttention_0/", width),
                       "ln1_g": block["LayerNorm_0/scale"], "ln1_b": block["LayerNorm_0/bias"],
                       "ln2_g": block["LayerNorm_1/scale"], "ln2_b": block["LayerNorm_1/bias"],
                       "w1": block["MlpBlock_0/Dense_0/kernel"], "b1": block["MlpBlock_0/Dense_0/bias"],
                       "w2": block["MlpBlock_0/Dense_1/kernel"], "b2": block["MlpBlock_0/Dense_1/bias"]})
    vit = {"projection_w": kernel.reshape(-1, width), "projection_b": w["embedding/bias"], "cls": None,
           "pos": w["pos_embedding"][0], "blocks": blocks,
           "norm_g": w["Transformer/encoder_norm/scale"], "norm_b": w["Transformer/encoder_norm/bias"]}
    head = {**_attention(w, "MAPHead_0/MultiHeadDotProductAttention_0/", width),
            "probe": w["MAPHead_0/probe"].reshape(-1),
            "ln_g": w["MAPHead_0/LayerNorm_0/scale"], "ln_b": w["MAPHead_0/LayerNorm_0/bias"],
            "w1": w["MAPHead_0/MlpBlock_0/Dense_0/kernel"], "b1": w["MAPHead_0/MlpBlock_0/Dense_0/bias"],
            "w2": w["MAPHead_0/MlpBlock_0/Dense_1/kernel"], "b2": w["MAPHead_0/MlpBlock_0/Dense_1/bias"]}
    num_heads = w["MAPHead_0/MultiHeadDotProductAttention_0/query/kernel"].shape[1]
    return vit, head, kernel.shape[0], num_heads


def test_two_tower_pooled_embedding_matches_numpy_map_head(tmp_path):
    arrays = _arrays(TWO_TOWER)
    # Larger MLP weights than the fixture's small random ones, so that the tanh GELU big_vision uses (Flax's
    # nn.gelu) and the exact one give pooled embeddings (the MAP head's MLP is not normalised after it) that
    # differ by far more than the tolerance.
    for key in [k for k in arrays if "MlpBlock_0/Dense_" in k and k.endswith("/kernel")]:
        arrays[key] = arrays[key] * (10.0 if "encoderblock" in key and "Dense_1" in key else 30.0)
    np.savez(tmp_path / "scaled.npz", **arrays)
    tower = load_checkpoint(tmp_path / "scaled.npz")
    vit, head, patch, num_heads = _numpy_weights(arrays, "params/img/")
    images = _reference(TWO_TOWER)["images"][:1]
    # big_vision's preprocessing maps [0, 255] to [-1, 1]; its LayerNorms have epsilon 1e-6.
    tokens = vit_forward(images, vit, patch, num_heads, 1e-6, 0.5, 0.5, 1 / 255, activation="gelu_tanh")
    expected = np.stack([map_head(t, head, num_heads, 1e-6, activation="gelu_tanh") for t in tokens])
    exact = vit_forward(images, vit, patch, num_heads, 1e-6, 0.5, 0.5, 1 / 255, activation="gelu")
    exact = np.stack([map_head(t, head, num_heads, 1e-6, activation="gelu") for t in exact])
    assert max_abs_diff(exact, expected) > 20 * TOLERANCE  # the check below tells the two GELUs apart
    assert max_abs_diff(predict(tower, images), tokens) <= TOLERANCE
    assert max_abs_diff(predict(tower.pooled_model(), images), expected) <= TOLERANCE


@pytest.mark.one_backend("the .npz reader refuses before any model is built")
def test_arrays_beside_the_image_tower_are_refused_unless_the_text_tower(tmp_path):
    arrays = _arrays(TWO_TOWER)
    arrays["params/other/kernel"] = np.zeros((2, 2), np.float32)
    np.savez(tmp_path / "extra.npz", **arrays)
    with pytest.raises(ValueError, match=r"cannot place: \['params/other/kernel'\]"):
        load_checkpoint(tmp_path / "extra.npz")


@pytest.mark.one_backend("the .npz reader refuses before any model is built")
def test_an_incomplete_map_head_is_named(tmp_path):
    arrays = _arrays(BARE)
    del arrays["params/MAPHead_0/MlpBlock_0/Dense_1/bias"]
    np.savez(tmp_path / "cut.npz", **arrays)
    with pytest.raises(ValueError, match=r"incomplete MAP head.*params/MAPHead_0/MlpBlock_0/Dense_1/bias"):
        load_checkpoint(tmp_path / "cut.npz")
