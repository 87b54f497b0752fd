"""ViTBackbone and ViTClassifier: numerics, round trips, training, errors."""

import os
import tempfile

import keras
import numpy as np
import pytest

import keras_vit
from tests import numpy_reference as ref
from tests.models.model_helpers import randomise, reference_weights, to_numpy
from tests.helpers import save_and_reload

TINY = dict(image_size=8, patch_size=4, hidden_dim=8, num_layers=2, num_heads=2, mlp_dim=16)


def test_backbone_matches_numpy_reference_forward_pass():
    backbone = keras_vit.ViTBackbone(**TINY, pixel_mean=(0.4, 0.5, 0.6), pixel_std=(0.2, 0.3, 0.25))
    randomise(backbone)
    images = np.random.default_rng(1).uniform(0, 255, size=(3, 8, 8, 3)).astype("float32")
    got = to_numpy(backbone.predict(images, verbose=0))
    expected = ref.vit_forward(
        images, reference_weights(backbone), patch=4, num_heads=2, epsilon=1e-6,
        mean=(0.4, 0.5, 0.6), std=(0.2, 0.3, 0.25), scale=1 / 255,
    )
    np.testing.assert_allclose(got, expected, atol=1e-4)


def test_classifier_matches_numpy_reference_token_and_gap_pooling():
    images = np.random.default_rng(2).uniform(0, 255, size=(2, 8, 8, 3)).astype("float32")
    for pooling in ("token", "gap"):
        backbone = keras_vit.ViTBackbone(**TINY)
        model = keras_vit.ViTClassifier(backbone, num_classes=5, pooling=pooling, representation_size=6, activation=None)
        randomise(model, seed=3)
        tokens = ref.vit_forward(images, reference_weights(backbone), 4, 2, 1e-6, 0.5, 0.5, 1 / 255)
        pooled = tokens[:, 0] if pooling == "token" else tokens[:, 1:].mean(1)
        pre_w, pre_b = [to_numpy(w) for w in model.get_layer("pre_logits").weights]
        head_w, head_b = [to_numpy(w) for w in model.get_layer("head").weights]
        expected = np.tanh(pooled @ pre_w + pre_b) @ head_w + head_b
        np.testing.assert_allclose(to_numpy(model(images)), expected, atol=1e-4)


def test_fresh_head_is_zero_and_predicts_uniform():
    model = keras_vit.ViTClassifier.from_variant("Ti/16", **TINY, num_classes=4)
    head_kernel, head_bias = model.get_layer("head").weights
    assert not np.any(to_numpy(head_kernel)) and not np.any(to_numpy(head_bias))
    probabilities = to_numpy(model(np.zeros((2, 8, 8, 3), "float32")))
    np.testing.assert_allclose(probabilities, 0.25, atol=1e-6)


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"num_register_tokens": 2, "layer_scale_init": 0.1, "prefix_position_embedding": False},
        {"use_class_token": False, "position_embedding": "sincos2d", "image_size": (8, 12)},
    ],
    ids=["plain", "registers_layerscale", "gap_sincos_nonsquare"],
)
def test_keras_save_and_load_is_exact(overrides):
    config = {**TINY, **overrides}
    pooling = "token" if config.get("use_class_token", True) else "gap"
    model = keras_vit.ViTClassifier(keras_vit.ViTBackbone(**config), num_classes=3, pooling=pooling)
    randomise(model, seed=4)
    images = np.random.default_rng(5).uniform(0, 255, size=(2,) + tuple(np.broadcast_to(config["image_size"], 2)) + (3,))
    expected = to_numpy(model(images.astype("float32")))
    with tempfile.TemporaryDirectory() as directory:
        restored = save_and_reload(model, directory)
    assert isinstance(restored, keras_vit.ViTClassifier)
    assert restored.backbone.get_config() == model.backbone.get_config()
    np.testing.assert_array_equal(to_numpy(restored(images.astype("float32"))), expected)


def test_backbone_config_round_trip_and_variants():
    backbone = keras_vit.ViTBackbone.from_variant("vit-s/32", image_size=64, num_layers=1)
    assert (backbone.hidden_dim, backbone.num_heads, backbone.mlp_dim, backbone.patch_size) == (384, 6, 1536, (32, 32))
    rebuilt = keras_vit.ViTBackbone.from_config(backbone.get_config())
    assert rebuilt.get_config() == backbone.get_config()
    assert keras_vit.parse_variant("B/16") == keras_vit.parse_variant("ViT-B/16")
    # Table 1's five sizes and SigLIP's So400m shape, each at patch 8, 14, 16 and 32.
    assert len(keras_vit.variant_names()) == 24 and "ViT-So400m/14" in keras_vit.variant_names()


def test_fit_trains_and_reduces_loss():
    keras.utils.set_random_seed(0)
    model = keras_vit.ViTClassifier.from_variant("Ti/16", **TINY, num_classes=2, num_channels=1)
    rng = np.random.default_rng(6)
    labels = rng.integers(0, 2, size=64)
    # Bright top half for class 1, bright bottom half for class 0.
    images = rng.uniform(0, 60, size=(64, 8, 8, 1)).astype("float32")
    images[labels == 1, :4] += 180
    images[labels == 0, 4:] += 180
    model.compile(optimizer=keras.optimizers.Adam(3e-3))
    history = model.fit(images, labels, epochs=15, batch_size=16, verbose=0)
    losses = history.history["loss"]
    assert losses[-1] < 0.5 * losses[0]
    assert history.history["accuracy"][-1] > 0.9


def test_mixed_bfloat16_trains_without_nan():
    keras.config.set_dtype_policy("mixed_bfloat16")
    model = keras_vit.ViTClassifier.from_variant("Ti/16", **TINY, num_classes=3, drop_path_rate=0.1)
    assert model.get_layer("vit_backbone").get_layer("transformer_block_0").attention.qkv.compute_dtype == "bfloat16"
    images = np.random.default_rng(7).uniform(0, 255, size=(16, 8, 8, 3)).astype("float32")
    labels = np.arange(16) % 3
    model.compile(optimizer="adamw")
    history = model.fit(images, labels, epochs=2, batch_size=8, verbose=0)
    assert np.all(np.isfinite(history.history["loss"]))
    outputs = model(images)
    assert keras.backend.standardize_dtype(outputs.dtype) == "float32"
    assert np.all(np.isfinite(to_numpy(outputs)))


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda: keras_vit.ViTBackbone(**{**TINY, "image_size": 10}), "not divisible by the patch"),
        (lambda: keras_vit.ViTBackbone(**{**TINY, "num_heads": 3}), "divisible by `num_heads`"),
        (lambda: keras_vit.ViTBackbone.from_variant("ViT-X/16"), "Unknown ViT variant 'ViT-X/16'"),
        (lambda: keras_vit.ViTBackbone.from_variant("ViT-B/15"), "Known variants: ViT-Ti/8"),
        (lambda: keras_vit.ViTBackbone(**TINY, position_embedding="rope"), "Unknown `position_embedding`"),
        (lambda: keras_vit.ViTClassifier(keras_vit.ViTBackbone(**TINY), 3, pooling="max"), "Unknown `pooling`"),
        (lambda: keras_vit.ViTClassifier(keras_vit.ViTBackbone(**TINY), 0), "num_classes=0"),
    ],
)
def test_bad_configuration_errors_name_the_fix(build, message):
    with pytest.raises(ValueError, match=message):
        build()


@pytest.mark.parametrize(
    "shape, message",
    [
        ((2, 8, 8, 1), "expects images with 3 channel"),
        ((8, 8, 3), "rank 3"),
        ((2, 12, 12, 3), "not divisible|size"),
    ],
)
def test_bad_images_errors_name_the_fix(shape, message):
    model = keras_vit.ViTClassifier(keras_vit.ViTBackbone(**TINY), num_classes=3)
    with pytest.raises(ValueError, match=message):  # a tensor: predict resizes numpy batches of raw images only
        model.predict(keras.ops.convert_to_tensor(np.zeros(shape, "float32")), verbose=0)


def test_loaded_classifier_resumes_training_with_its_optimizer(tmp_path):
    model = keras_vit.ViTClassifier.from_variant("Ti/16", **TINY, num_classes=3)
    model.compile(optimizer=keras.optimizers.AdamW(1e-3))
    images = np.random.default_rng(8).uniform(0, 255, size=(4, 8, 8, 3)).astype("float32")
    model.fit(images, np.arange(4) % 3, epochs=2, verbose=0)
    restored = save_and_reload(model, str(tmp_path))
    assert int(to_numpy(restored.optimizer.iterations)) == int(to_numpy(model.optimizer.iterations)) == 2
    restored.fit(images, np.arange(4) % 3, epochs=1, verbose=0)
