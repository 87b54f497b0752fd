"""The later families' registry entries, each exercised through the registry's own path with a local stand-in.

A stand-in (tests/fixtures/presets/standins, made by scripts/make_preset_standins.py with timm 1.0.31) is the
timm architecture and pretrained tag an entry downloads, shrunk and randomly initialised, with the
`config.json` timm writes for its hub repositories. It is served from a local mirror at the entry's own hub
address, so `from_preset(NAME)` resolves, downloads, detects, converts and checks as it does for the real
weights; only the parameter count is the stand-in's. The outputs are compared with timm's.
"""

import json
import os

import numpy as np
import pytest

import keras_vit
from keras_vit.presets.registry import PRESETS
from tests.presets.preset_helpers import to_numpy

STANDINS = os.path.join(os.path.dirname(__file__), "..", "fixtures", "presets", "standins")
with open(os.path.join(STANDINS, "MANIFEST.json")) as _file:
    MANIFEST = json.load(_file)["standins"]


def serve(monkeypatch, mirror, name):
    """Publish the stand-in of registry entry `name` at the entry's hub address; return timm's reference."""
    import shutil

    entry = PRESETS[name]
    repo = mirror.repo(entry["source"].removeprefix("hf://"))
    for file in ("config.json", "model.safetensors"):
        shutil.copy(os.path.join(STANDINS, name, file), repo)
    # Everything else is the registry's: source, format, revision, config, mean and std.
    monkeypatch.setitem(PRESETS, name, {**entry, "params": MANIFEST[name]["num_params"] - _dropped_head(name)})
    return np.load(os.path.join(STANDINS, name, "reference.npz"), allow_pickle=False)


def _dropped_head(name):
    classes = MANIFEST[name]["model_args"]["num_classes"]  # a head the registry leaves out (CLIP's projection)
    return classes * MANIFEST[name]["model_args"]["embed_dim"] + classes if PRESETS[name]["num_classes"] is None else 0


def _agrees_with_entry(backbone, entry):
    """What the reader inferred from timm's files is what the registry says (and builds without weights)."""
    config = backbone.get_config()
    for key, value in entry["config"].items():
        assert config[key] == pytest.approx(value), key
    np.testing.assert_allclose(np.broadcast_to(config["pixel_mean"], 3), np.broadcast_to(entry["pixel_mean"], 3))
    np.testing.assert_allclose(np.broadcast_to(config["pixel_std"], 3), np.broadcast_to(entry["pixel_std"], 3))


def test_siglip_entry_loads_its_checkpoint_and_pools_as_timm(monkeypatch, mirror):
    reference = serve(monkeypatch, mirror, "siglip_b16_webli")
    backbone = keras_vit.ViTBackbone.from_preset("siglip_b16_webli")
    assert not backbone.use_class_token and backbone.attention_pooling and backbone.num_prefix_tokens == 0
    _agrees_with_entry(backbone, PRESETS["siglip_b16_webli"])
    x = reference["images"].astype("float32")
    np.testing.assert_allclose(to_numpy(backbone(x)), reference["features"], atol=1e-4)
    # The image feature is the attention-pooled embedding, timm's `forward_head(pre_logits=True)`.
    np.testing.assert_allclose(to_numpy(backbone.pooled_model()(x)), reference["pooled"], atol=1e-4)
    # No released head: a classifier needs num_classes, and pools with the MAP head.
    with pytest.raises(ValueError, match="without a classification head"):
        keras_vit.ViTClassifier.from_preset("siglip_b16_webli")
    assert keras_vit.ViTClassifier.from_preset("siglip_b16_webli", num_classes=3).pooling == "map"
    assert {call[1] for call in mirror.calls} == {"config.json", "model.safetensors"}


def test_dinov2_entry_loads_its_checkpoint_with_registers_as_timm(monkeypatch, mirror):
    reference = serve(monkeypatch, mirror, "dinov2_s14_reg4_lvd142m")
    backbone = keras_vit.ViTBackbone.from_preset("dinov2_s14_reg4_lvd142m")
    assert backbone.num_register_tokens == 4 and backbone.num_prefix_tokens == 5
    _agrees_with_entry(backbone, PRESETS["dinov2_s14_reg4_lvd142m"])
    x = reference["images"].astype("float32")
    tokens = to_numpy(backbone(x))
    np.testing.assert_allclose(tokens, reference["features"], atol=1e-4)
    np.testing.assert_allclose(tokens[:, 0], reference["pooled"], atol=1e-4)  # the class token is the feature


def test_clip_entry_gives_the_reader_quick_gelu(monkeypatch, mirror):
    # timm's hub config names the exact-GELU architecture; OpenAI's weights compute with quick-GELU.
    reference = serve(monkeypatch, mirror, "clip_b16_openai")
    backbone = keras_vit.ViTBackbone.from_preset("clip_b16_openai")
    assert backbone.mlp_activation == "quick_gelu" and backbone.pre_norm
    _agrees_with_entry(backbone, PRESETS["clip_b16_openai"])
    x = reference["images"].astype("float32")
    np.testing.assert_allclose(to_numpy(backbone(x))[:, 0], reference["pooled"], atol=1e-4)
    # Without the registry's word, the files alone give exact GELU, and another feature.
    monkeypatch.setitem(PRESETS, "clip_b16_openai",
                        {k: v for k, v in PRESETS["clip_b16_openai"].items() if k != "registry_decides"})
    guessed = keras_vit.ViTBackbone.from_preset("clip_b16_openai")
    assert guessed.mlp_activation == "gelu"
    assert np.abs(to_numpy(guessed(x))[:, 0] - reference["pooled"]).max() > 1e-3
