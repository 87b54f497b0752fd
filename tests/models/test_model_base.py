"""The model base: arguments, dtype policy, bounds, new heads and sizes, class names, logits rule."""

import json
import os

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit.models import bit_resnet_stem
from tests.models.model_helpers import randomise, to_numpy

TINY = dict(image_size=16, patch_size=4, hidden_dim=8, num_layers=1, num_heads=2, mlp_dim=16)


def _images(size=16, count=2, seed=1):
    return np.random.default_rng(seed).uniform(0, 255, size=(count, size, size, 3)).astype("float32")


# === Arguments ===


def test_misspelled_arguments_are_refused_with_the_valid_ones():
    with pytest.raises(ValueError, match=r"Unknown argument for ViTClassifier: dropuot\. Valid arguments: .*dropout"):
        keras_vit.ViTClassifier.from_variant("ViT-Ti/16", dropuot=0.1)
    with pytest.raises(ValueError, match=r"Unknown argument for ViTBackbone: hiden_dim\. Valid arguments: .*hidden_dim"):
        keras_vit.ViTBackbone(**TINY, hiden_dim=8)
    backbone = keras_vit.ViTBackbone(**TINY, trainable=False)  # Keras' own arguments still work
    assert not backbone.trainable
    with pytest.raises(ValueError, match=r"Unknown argument for MaskedPatchPredictor: mask_ratio"):
        keras_vit.MaskedPatchPredictor(keras_vit.ViTBackbone(**TINY), mask_ratio=0.5)


def test_wrong_backbone_and_stem_types_are_clear_errors():
    with pytest.raises(ValueError, match=r"`backbone` must be a keras_vit.ViTBackbone.*Received: backbone=Dense"):
        keras_vit.ViTClassifier(keras.layers.Dense(3), num_classes=3)
    with pytest.raises(ValueError, match=r"`backbone` must be a keras_vit.ViTBackbone"):
        keras_vit.MaskedPatchPredictor(keras.layers.Dense(3))
    with pytest.raises(ValueError, match=r"`stem` must be a Keras layer.*from_variant\('R50\+ViT-B/16'\).*'resnet'"):
        keras_vit.ViTBackbone(**TINY, stem="resnet")


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(hidden_dim=10**9), r"`hidden_dim` of ViTBackbone is at most 65536.*Received: hidden_dim=1000000000"),
        (dict(num_layers=20000), r"`num_layers` of ViTBackbone is at most 1000.*Received: num_layers=20000"),
        (dict(image_size=10**6), r"`image_size` of ViTBackbone is at most 8192"),
        (dict(hidden_dim=16384, mlp_dim=65536, num_heads=16, num_layers=400), r"about 1\.29e\+12 parameters, more than keras_vit builds"),
        (dict(image_size=4096, patch_size=8), r"`tokens` of ViTBackbone is at most 65536"),
    ],
)
def test_sizes_past_the_limits_fail_before_any_variable_is_created(overrides, message):
    # The constructor checks these before it creates any layer (so no variable exists yet).
    with pytest.raises(ValueError, match=message):
        keras_vit.ViTBackbone(**{**TINY, **overrides})


def test_head_too_large_fails_at_once():
    backbone = keras_vit.ViTBackbone(**{**TINY, "hidden_dim": 4096, "num_heads": 8})
    with pytest.raises(ValueError, match="ViTClassifier head config would have about"):
        keras_vit.ViTClassifier(backbone, num_classes=10**6)


# === dtype policy ===


def _policies(model):
    """Every layer's dtype policy name, in layer order.

    Input layers hold the input dtype, and the classifier's `predictions`
    activation is float32 by design (a stable loss); both are left out.
    """
    assert model.get_layer("predictions").dtype_policy.name == "float32"
    return [(layer.name, type(layer).__name__, layer.dtype_policy.name) for layer in model._flatten_layers()
            if not isinstance(layer, keras.layers.InputLayer) and layer.name != "predictions"]


@pytest.mark.parametrize("hybrid", [False, True], ids=["vit", "hybrid"])
def test_mixed_bfloat16_survives_keras_and_preset_round_trips(tmp_path, hybrid):
    stem = bit_resnet_stem((), width=8, num_groups=4, dtype="mixed_bfloat16") if hybrid else None
    backbone = keras_vit.ViTBackbone(
        **{**TINY, "patch_size": 1 if hybrid else 4}, stem=stem, dtype="mixed_bfloat16"
    )
    model = keras_vit.ViTClassifier(backbone, num_classes=3, dtype="mixed_bfloat16", class_names=["a", "b", "c"])
    before = _policies(model)
    # A keras.Sequential stem container takes no dtype (its layers do, and it casts nothing itself).
    assert {policy for _, kind, policy in before if kind != "Sequential"} == {"mixed_bfloat16"}
    assert len(before) > 10
    model.save(tmp_path / "model.keras")
    model.save_to_preset(tmp_path / "preset")
    # Loaded under the default float32 global policy: the saved policy must win.
    assert keras.config.dtype_policy().name == "float32"
    for loaded in (keras.saving.load_model(tmp_path / "model.keras"),
                   keras_vit.ViTClassifier.from_preset(str(tmp_path / "preset"))):
        assert _policies(loaded) == before
        assert loaded.class_names == ["a", "b", "c"]
        np.testing.assert_allclose(
            to_numpy(loaded.predict(_images(), verbose=0)), to_numpy(model.predict(_images(), verbose=0)), atol=1e-6
        )


# === New head, new resolution ===


def test_with_head_copies_the_backbone_and_zeroes_the_new_head():
    model = keras_vit.ViTClassifier(keras_vit.ViTBackbone(**TINY), num_classes=3, representation_size=4)
    randomise(model)
    new = model.with_head(5, class_names=list("vwxyz"))
    assert new.num_classes == 5 and new.class_names == list("vwxyz") and model.num_classes == 3
    head_kernel, head_bias = new.get_layer("head").get_weights()
    assert not head_kernel.any() and not head_bias.any()
    for name in ("pre_logits",):
        for a, b in zip(new.get_layer(name).get_weights(), model.get_layer(name).get_weights()):
            np.testing.assert_array_equal(a, b)
    np.testing.assert_allclose(
        to_numpy(new.backbone(_images())), to_numpy(model.backbone(_images())), atol=1e-6
    )
    assert new.backbone is not model.backbone  # a new model: training it leaves this one as it is
    np.testing.assert_allclose(to_numpy(new.predict(_images(), verbose=0)), 0.2, atol=1e-6)  # uniform


def _numpy_bicubic_1d(old, new):
    """torch's antialiased bicubic weights (a=-0.5), from the definition, for one axis."""
    scale = old / new
    support = 2.0 * max(scale, 1.0)
    weights = np.zeros((new, old))
    for i in range(new):
        center = (i + 0.5) * scale
        for j in range(old):
            x = (j + 0.5 - center) / max(scale, 1.0)
            a = -0.5
            x = abs(x)
            w = ((a + 2) * x - (a + 3)) * x * x + 1 if x <= 1 else ((a * x - 5 * a) * x + 8 * a) * x - 4 * a if x < 2 else 0
            weights[i, j] = w if abs(j + 0.5 - center) < support else 0.0
        weights[i] /= weights[i].sum()
    return weights


def test_with_image_size_resamples_the_grid_and_keeps_prefix_rows():
    backbone = keras_vit.ViTBackbone(**{**TINY, "image_size": (8, 12)}, num_register_tokens=1)
    randomise(backbone)
    model = keras_vit.ViTClassifier(backbone, num_classes=3, class_names=["a", "b", "c"])
    bigger = model.with_image_size((16, 12))
    assert bigger.backbone.grid_size == (4, 3) and bigger.class_names == ["a", "b", "c"]
    old = to_numpy(backbone.get_layer("patch_encoder").position_embedding_table)[0]
    new = to_numpy(bigger.backbone.get_layer("patch_encoder").position_embedding_table)[0]
    np.testing.assert_array_equal(new[:2], old[:2])  # class token and register rows kept
    grid = old[2:].reshape(2, 3, -1)
    expected = np.einsum("ir,rcd->icd", _numpy_bicubic_1d(2, 4), grid).reshape(12, -1)  # rows 2 -> 4, cols kept
    np.testing.assert_allclose(new[2:], expected, atol=1e-5)
    assert bigger.predict(_images(count=1)[:, :, :12], verbose=0).shape == (1, 3)
    for name in ("head",):
        for a, b in zip(bigger.get_layer(name).get_weights(), model.get_layer(name).get_weights()):
            np.testing.assert_array_equal(a, b)


def test_with_image_size_rebuilds_a_hybrid_stem():
    stem = bit_resnet_stem((), width=8, num_groups=4)
    backbone = keras_vit.ViTBackbone(**{**TINY, "patch_size": 1}, stem=stem)
    randomise(backbone)
    bigger = backbone.with_image_size(32)
    assert bigger.grid_size == (8, 8) and bigger.stem is not backbone.stem
    for a, b in zip(bigger.stem.weights, backbone.stem.weights):
        np.testing.assert_array_equal(to_numpy(a), to_numpy(b))
    assert bigger.predict(_images(size=32, count=1), verbose=0).shape == (1, 65, 8)


# === Class names ===


def test_class_names_are_checked():
    backbone = keras_vit.ViTBackbone(**TINY)
    with pytest.raises(ValueError, match="`class_names` must hold one name per class: 3 names for num_classes=3"):
        keras_vit.ViTClassifier(backbone, num_classes=3, class_names=["a", "b"])
    with pytest.raises(ValueError, match="'imagenet-1k' names 1000 classes but the model has num_classes=3"):
        keras_vit.ViTClassifier(backbone, num_classes=3, class_names="imagenet-1k")
    with pytest.raises(ValueError, match="`class_names` must be a list of str"):
        keras_vit.ViTClassifier(backbone, num_classes=2, class_names=[1, 2])


def test_decode_predictions_for_any_class_list():
    model = keras_vit.ViTClassifier(keras_vit.ViTBackbone(**TINY), num_classes=3, class_names=["cat", "dog", "eel"])
    scores = np.array([[0.1, 0.7, 0.2], [0.5, 0.2, 0.3]])
    assert keras_vit.decode_predictions(scores, model, top=2) == [
        [("1", "dog", 0.7), ("2", "eel", 0.2)], [("0", "cat", 0.5), ("2", "eel", 0.3)]]
    assert keras_vit.decode_predictions(scores, ["x", "y", "z"], top=1) == [[("1", "y", 0.7)], [("0", "x", 0.5)]]
    unnamed = keras_vit.ViTClassifier(keras_vit.ViTBackbone(**TINY), num_classes=3)
    assert keras_vit.decode_predictions(scores, unnamed, top=1)[0] == [("1", "class 1", 0.7)]
    with pytest.raises(ValueError, match="`class_names` has 2 names but the predictions score 3 classes"):
        keras_vit.decode_predictions(scores, ["x", "y"])


def test_class_names_given_at_save_name_the_classes(tmp_path):
    model = keras_vit.ViTClassifier(keras_vit.ViTBackbone(**TINY), num_classes=2)
    # Metadata class names name the classes of a model saved without them (written into its config).
    model.save_to_preset(tmp_path / "again", class_names=["off", "on"])
    assert keras_vit.ViTClassifier.from_preset(str(tmp_path / "again")).class_names == ["off", "on"]
    assert json.loads((tmp_path / "again" / "config.json").read_text())["config"]["class_names"] == ["off", "on"]


# === Logits or probabilities: one rule ===


def test_every_classifier_outputs_probabilities_unless_activation_none(tmp_path):
    made = keras_vit.ViTClassifier.from_variant("ViT-Ti/16", **TINY, num_classes=3)
    assert made.activation == "softmax"
    from keras_vit.convert import export_timm, load_checkpoint

    randomise(made)
    export_timm(made, tmp_path / "model.safetensors")
    converted = load_checkpoint(tmp_path / "model.safetensors", num_heads=2)
    logits = load_checkpoint(tmp_path / "model.safetensors", num_heads=2, activation=None)
    assert converted.activation == "softmax" and logits.activation is None
    images = _images()
    raw = to_numpy(logits.predict(images, verbose=0)).astype("float64")
    softmax = np.exp(raw - raw.max(-1, keepdims=True))
    softmax /= softmax.sum(-1, keepdims=True)
    np.testing.assert_allclose(to_numpy(converted.predict(images, verbose=0)), softmax, atol=1e-6)
    np.testing.assert_allclose(to_numpy(made.predict(images, verbose=0)), softmax, atol=1e-5)
    made.save_to_preset(tmp_path / "preset")
    assert keras_vit.ViTClassifier.from_preset(str(tmp_path / "preset")).activation == "softmax"


# === MaskedPatchPredictor presets ===


def test_masked_patch_predictor_preset_round_trip(tmp_path):
    predictor = keras_vit.MaskedPatchPredictor(keras_vit.ViTBackbone(**TINY), seed=3, target="pixels")
    randomise(predictor)
    predictor.save_to_preset(tmp_path)
    loaded = keras_vit.MaskedPatchPredictor.from_preset(str(tmp_path))
    assert loaded.target == "pixels" and loaded.seed == 3
    for a, b in zip(loaded.weights, predictor.weights):
        np.testing.assert_array_equal(to_numpy(a), to_numpy(b))
    backbone = keras_vit.ViTBackbone.from_preset(str(tmp_path))  # its pre-trained encoder
    np.testing.assert_allclose(to_numpy(backbone(_images())), to_numpy(predictor.backbone(_images())), atol=1e-6)


# === Bad input checked before tracing ===


def test_a_wrong_shaped_batch_leaves_the_model_usable():
    model = keras_vit.ViTClassifier(keras_vit.ViTBackbone(**TINY), num_classes=3)
    # A tensor of another size is refused (numpy batches of raw images are resized by predict).
    for call in (lambda x: model.predict(x, verbose=0), lambda x: model.backbone.predict(x, verbose=0)):
        with pytest.raises(ValueError, match=r"takes batches of images shaped \(batch, 16, 16, 3\).*\(2, 20, 20, 3\)"):
            call(keras.ops.convert_to_tensor(_images(size=20)))
        assert call(_images()).shape[0] == 2  # on JAX a traced failure used to purge the variables
    assert model.predict(_images(size=20), verbose=0).shape == (2, 3)
    model.compile()
    with pytest.raises(ValueError, match=r"\(batch, 16, 16, 3\).*\(2, 8, 8, 3\).*with_image_size"):
        model.evaluate(_images()[:, :8, :8], np.zeros(2), verbose=0)
    with pytest.raises(ValueError, match=r"rank 3 with shape \(2, 8, 8\)"):
        model.evaluate(_images()[:, :8, :8, 0], np.zeros(2), verbose=0)


def test_one_hot_labels_with_the_default_loss_are_a_clear_error():
    model = keras_vit.ViTClassifier(keras_vit.ViTBackbone(**TINY), num_classes=3)
    model.compile()
    with pytest.raises(ValueError, match="look one-hot.*loss='categorical_crossentropy'"):
        model.fit(_images(), np.eye(3)[[0, 2]], verbose=0)
    model.fit(_images(), np.array([0, 2]), verbose=0)  # integer labels train
    model.compile(loss="categorical_crossentropy")
    model.fit(_images(), np.eye(3)[[0, 2]].astype("float32"), verbose=0)


# === int8 through Keras' DTypePolicyMap ===


def _quantized_classifier():
    keras.utils.set_random_seed(0)
    model = keras_vit.ViTClassifier(keras_vit.ViTBackbone(**TINY), num_classes=3)
    randomise(model)
    model.quantize("int8")
    return model


def _serialized_class_names(config):
    """Every `class_name` in a serialized config, nested ones included."""
    if isinstance(config, dict):
        return [config.get("class_name")] + [name for value in config.values()
                                             for name in _serialized_class_names(value)]
    if isinstance(config, list):
        return [name for value in config for name in _serialized_class_names(value)]
    return []


def test_int8_model_saves_its_quantized_layers_in_a_dtype_policy_map(tmp_path):
    # One quantized model saved both ways (a `.keras` file and a preset; two parametrized cases, each
    # building and predicting with its own model, until issue 50).
    model = _quantized_classifier()
    expected = to_numpy(model.predict(_images(), verbose=0))
    config = model.get_config()
    assert "quantized_layers" not in json.dumps(config)
    assert config["dtype"]["class_name"] == "DTypePolicyMap"
    assert config["backbone"]["config"]["dtype"]["class_name"] == "DTypePolicyMap"
    model.save(str(tmp_path / "int8.keras"))
    model.save_to_preset(str(tmp_path / "int8"))
    with open(tmp_path / "int8" / "config.json") as file:
        assert "DTypePolicyMap" in _serialized_class_names(json.load(file))
    for save, loaded in [("keras", keras.saving.load_model(str(tmp_path / "int8.keras"), compile=False)),
                         ("preset", keras_vit.ViTClassifier.from_preset(str(tmp_path / "int8")))]:
        assert loaded.quantized_layers() == model.quantized_layers(), save
        assert loaded.get_layer("head").quantization_mode == "int8", save
        np.testing.assert_array_equal(to_numpy(loaded.predict(_images(), verbose=0)), expected, err_msg=save)


# === One qkv column order ===


def test_a_config_with_qkv_layout_is_refused():
    config = keras_vit.ViTBackbone(**TINY).get_config()
    assert "qkv_layout" not in config
    with pytest.raises(ValueError, match=r"qkv_layout"):
        keras_vit.ViTBackbone.from_config({**config, "qkv_layout": "timm"})
    with pytest.raises(ValueError, match=r"qkv_layout"):
        keras_vit.layers.MultiHeadSelfAttention(num_heads=2, qkv_layout="heads")
    block = keras_vit.layers.TransformerBlock(num_heads=2, mlp_dim=8)
    with pytest.raises((TypeError, ValueError), match=r"qkv_layout"):  # Keras wraps a layer's refusal in TypeError
        keras_vit.layers.TransformerBlock.from_config({**block.get_config(), "qkv_layout": "timm"})
