"""ViTBackbone.feature_extractor: every block's tokens and attention, as a model.

Values are checked against the independent numpy ViT (tests/numpy_reference.py)
and, for attention, against softmax(q k^T / sqrt(d)) computed in numpy from
each block's own weights.
"""

import math
import os
import tempfile

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit.models import bit_resnet_stem
from tests import numpy_reference as ref
from tests.models.model_helpers import block_weights, randomise, reference_weights, to_numpy

TINY = dict(hidden_dim=8, num_layers=2, num_heads=2, mlp_dim=16)


def _images(shape, seed=1):
    return np.random.default_rng(seed).uniform(0, 255, size=shape).astype("float32")


def _numpy_attention(tokens, block, num_heads, epsilon):
    """softmax(q k^T / sqrt(d)) per head, from the definition, in float64.

    tokens: (B, T, D), the block's input; block: its weights as a dict.
    Returns (B, H, T, T).
    """
    tokens = tokens.astype("float64")
    mean = tokens.mean(-1, keepdims=True)
    normed = (tokens - mean) / np.sqrt(tokens.var(-1, keepdims=True) + epsilon) * block["ln1_g"] + block["ln1_b"]
    q = normed @ block["wq"] + block["bq"]
    k = normed @ block["wk"] + block["bk"]
    batch, length, width = q.shape
    d = width // num_heads
    q = q.reshape(batch, length, num_heads, d).transpose(0, 2, 1, 3)
    k = k.reshape(batch, length, num_heads, d).transpose(0, 2, 1, 3)
    logits = q @ k.transpose(0, 1, 3, 2) / math.sqrt(d)
    logits -= logits.max(-1, keepdims=True)
    e = np.exp(logits)
    return e / e.sum(-1, keepdims=True)


@pytest.mark.parametrize(
    "config",
    [
        dict(image_size=8, patch_size=4),
        # A non-square grid of non-square patches, with registers.
        dict(image_size=(8, 12), patch_size=(4, 2), num_register_tokens=2),
    ],
    ids=["square", "registers-nonsquare"],
)
def test_intermediates_equal_the_numpy_reference(config):
    backbone = keras_vit.ViTBackbone(**config, **TINY, pixel_mean=(0.4, 0.5, 0.6), pixel_std=(0.2, 0.3, 0.25))
    randomise(backbone)
    image_size = backbone.image_size
    images = _images((2,) + image_size + (3,))
    expected = ref.vit_forward(
        images, reference_weights(backbone), patch=config["patch_size"], num_heads=2, epsilon=1e-6,
        mean=(0.4, 0.5, 0.6), std=(0.2, 0.3, 0.25), scale=1 / 255, intermediates=True,
    )
    got = backbone.feature_extractor(attention_scores=True).predict(images, verbose=0)

    assert set(got) == {"embeddings", "block_0", "block_1", "attention_0", "attention_1", "output"}
    tokens = backbone.num_prefix_tokens + backbone.grid_size[0] * backbone.grid_size[1]
    assert got["block_0"].shape == (2, tokens, 8)
    assert got["attention_1"].shape == (2, 2, tokens, tokens)
    np.testing.assert_allclose(got["embeddings"], expected["embeddings"], atol=1e-4)
    for i in range(2):
        np.testing.assert_allclose(got[f"block_{i}"], expected["blocks"][i], atol=1e-4)
        np.testing.assert_allclose(got[f"attention_{i}"], expected["attention"][i], atol=1e-5)
    np.testing.assert_allclose(got["output"], expected["output"], atol=1e-4)
    np.testing.assert_allclose(got["output"], backbone.predict(images, verbose=0), atol=1e-5)


@pytest.mark.parametrize("hybrid", [False, True], ids=["vit", "hybrid"])
def test_every_blocks_attention_is_softmax_of_its_own_queries_and_keys(hybrid):
    if hybrid:
        stem = bit_resnet_stem((), width=8, num_groups=4)  # the BiT root: output stride 4
        backbone = keras_vit.ViTBackbone(image_size=16, patch_size=1, stem=stem, num_register_tokens=1, **TINY)
        images = _images((2, 16, 16, 3))
    else:
        backbone = keras_vit.ViTBackbone(image_size=(8, 12), patch_size=4, **TINY)
        images = _images((2, 8, 12, 3))
    randomise(backbone, seed=4)
    got = backbone.feature_extractor(attention_scores=True).predict(images, verbose=0)
    for i in range(backbone.num_layers):
        block_input = got["embeddings"] if i == 0 else got[f"block_{i - 1}"]
        block = backbone.get_layer(f"transformer_block_{i}")
        expected = _numpy_attention(block_input, block_weights(block), 2, 1e-6)
        np.testing.assert_allclose(got[f"attention_{i}"], expected, atol=1e-5)
        np.testing.assert_allclose(got[f"attention_{i}"].sum(-1), 1.0, atol=1e-5)
    np.testing.assert_allclose(got["output"], backbone.predict(images, verbose=0), atol=1e-5)


def test_requested_blocks_negative_indices_and_errors():
    backbone = keras_vit.ViTBackbone(image_size=8, patch_size=4, **{**TINY, "num_layers": 3})
    extractor = backbone.feature_extractor(blocks=[-1, 0], attention_scores=True)
    assert set(extractor.output) == {"embeddings", "block_0", "block_2", "attention_0", "attention_2", "output"}
    assert set(backbone.feature_extractor(blocks=1).output) == {"embeddings", "block_1", "output"}
    # Shared layers: the extractor owns no weights of its own.
    assert {id(w) for w in extractor.weights} == {id(w) for w in backbone.weights}
    with pytest.raises(ValueError, match=r"blocks.*-3 to 2.*Received: blocks=\[3\]"):
        backbone.feature_extractor(blocks=[3])


def _extractor_and_images():
    backbone = keras_vit.ViTBackbone(image_size=8, patch_size=4, num_register_tokens=1, **TINY)
    randomise(backbone)
    return backbone.feature_extractor(blocks=[-1], attention_scores=True), _images((3, 8, 8, 3))


# torch.compile takes over a minute on a small CPU; the test still runs in `make test`.
SLOW_ON_TORCH = pytest.mark.slow if keras.backend.backend() == "torch" else pytest.mark.usefixtures()


@SLOW_ON_TORCH
def test_extractor_jit_compiles():
    extractor, images = _extractor_and_images()
    extractor.compile(jit_compile=True)
    compiled = extractor.predict(images, verbose=0, batch_size=3)
    eager = extractor(images)
    assert set(compiled) == set(eager)
    for key in compiled:
        np.testing.assert_allclose(compiled[key], to_numpy(eager[key]), atol=1e-5)


def test_extractor_saves_and_loads():
    extractor, images = _extractor_and_images()
    eager = extractor(images)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "extractor.keras")
        extractor.save(path)
        loaded = keras.saving.load_model(path)
    reloaded = loaded(images)
    assert set(reloaded) == set(eager)
    for key in eager:
        np.testing.assert_allclose(to_numpy(reloaded[key]), to_numpy(eager[key]), atol=1e-6)
