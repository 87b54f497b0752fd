"""ViTBackbone / ViTClassifier with the parts of SigLIP, CLIP, DINOv2, DeiT and qk-norm ViTs (issue 48).

Each configuration goes through the model contract (config, `.keras` and preset
round trips with identical outputs, a fit step, mixed precision) with a
parameter count made from the architecture's definition below, not from
keras_vit's code. The full-size counts against timm are in
test_parameter_counts.py.
"""

import keras
import numpy as np
import pytest

import keras_vit
from tests.models.contract import run_model_contract, vit_parameter_count

# One block (issue 50): the parts are per block or around the blocks, and one block carries them as two
# do; each block more is tracing and compiling in every fit and predict of the contract.
LAYERS = 1
TINY = dict(image_size=16, patch_size=4, hidden_dim=16, num_layers=LAYERS, num_heads=2, mlp_dim=32)
IMAGES = np.random.default_rng(0).uniform(0, 255, (4, 16, 16, 3)).astype("float32")
LABELS = np.array([0, 1, 2, 0])
D, PATCHES, FEATURES, HEAD_DIM = 16, 16, 48, 8


def _map_head_count(d=D, mlp_dim=32):
    # probe, q, kv, proj (with biases), LayerNorm, MLP
    return d + (d * d + d) + (d * 2 * d + 2 * d) + (d * d + d) + 2 * d + (d * mlp_dim + mlp_dim + mlp_dim * d + d)


def _seeded(make):
    def build(dtype=None):
        keras.utils.set_random_seed(0)
        model = make(dtype)
        # Heads start at zero; random ones make the round trips compare real outputs.
        for name in ("head", "head_distillation"):
            if isinstance(model, keras_vit.ViTClassifier) and any(layer.name == name for layer in model.layers):
                kernel = model.get_layer(name).kernel
                kernel.assign(np.random.default_rng(1).normal(0, 1, kernel.shape).astype("float32"))
        return model
    return build


CASES = {
    # SigLIP: no class token, attention pooling, tanh GELU; the classifier pools with the backbone's MAP head.
    "siglip_map_classifier": (
        lambda dtype: keras_vit.ViTClassifier(
            keras_vit.ViTBackbone(**TINY, use_class_token=False, attention_pooling=True, mlp_activation="gelu_tanh",
                                  dtype=dtype),
            num_classes=3, pooling="map", dtype=dtype),
        LABELS,
        vit_parameter_count(D, LAYERS, 32, PATCHES, FEATURES, num_prefix_tokens=0, class_token=False, num_classes=3)
        + _map_head_count()),
    # CLIP: a LayerNorm before the blocks, no patch-projection bias, quick-GELU.
    "clip_backbone": (
        lambda dtype: keras_vit.ViTBackbone(**TINY, pre_norm=True, mlp_activation="quick_gelu", dtype=dtype),
        None, vit_parameter_count(D, LAYERS, 32, PATCHES, FEATURES) + 2 * D - D),
    # qk-norm: a LayerNorm over the head width on q and on k in every block.
    "qk_norm_classifier": (
        lambda dtype: keras_vit.ViTClassifier(keras_vit.ViTBackbone(**TINY, qk_norm=True, dtype=dtype),
                                              num_classes=3, dtype=dtype),
        LABELS, vit_parameter_count(D, LAYERS, 32, PATCHES, FEATURES, num_classes=3) + LAYERS * (2 * 2 * HEAD_DIM)),
    # DeiT distilled: a second prefix token with its own position row, and a second head.
    "deit_distilled_classifier": (
        lambda dtype: keras_vit.ViTClassifier(keras_vit.ViTBackbone(**TINY, use_distillation_token=True, dtype=dtype),
                                              num_classes=3, dtype=dtype),
        LABELS, vit_parameter_count(D, LAYERS, 32, PATCHES, FEATURES, num_prefix_tokens=2, num_classes=3)
        + D + (D * 3 + 3)),
}


@pytest.mark.slow  # builds, saves and reloads each model several times: a few seconds each
@pytest.mark.parametrize("case", sorted(CASES))
def test_model_contract_with_the_new_parts(case):
    make, targets, expected_params = CASES[case]
    if targets is None:
        targets = np.zeros((len(IMAGES),) + tuple(make(None).output_shape[1:]), "float32")
        loss = "mse"
    else:
        loss = "sparse_categorical_crossentropy"
    run_model_contract(_seeded(make), IMAGES, targets=targets, loss=loss, expected_params=expected_params)


def test_every_part_is_a_config_field_that_round_trips():
    backbone = keras_vit.ViTBackbone(**TINY, pre_norm=True, mlp_activation="quick_gelu", qk_norm=True,
                                     use_distillation_token=True, attention_pooling=True)
    config = backbone.get_config()
    assert {key: config[key] for key in ("pre_norm", "mlp_activation", "qk_norm", "use_distillation_token",
                                         "attention_pooling")} == {
        "pre_norm": True, "mlp_activation": "quick_gelu", "qk_norm": True, "use_distillation_token": True,
        "attention_pooling": True}
    rebuilt = keras_vit.ViTBackbone.from_config(config)
    assert rebuilt.get_config() == config
    assert [w.path for w in rebuilt.weights] == [w.path for w in backbone.weights]


def test_siglip_pooled_embedding_needs_no_head():
    """The MAP head belongs to the backbone: the pooled image embedding comes without a classifier."""
    keras.utils.set_random_seed(0)
    backbone = keras_vit.ViTBackbone(**TINY, use_class_token=False, attention_pooling=True)
    pooled = backbone.pooled_model()
    assert pooled.output_shape == (None, D)
    embedding = keras.ops.convert_to_numpy(pooled(IMAGES))
    tokens = backbone(IMAGES)
    np.testing.assert_allclose(embedding, keras.ops.convert_to_numpy(backbone.pool(tokens)), atol=1e-6)
    # The classifier's pooled vector is the same one (its head reads it).
    classifier = keras_vit.ViTClassifier(backbone, num_classes=3, pooling="map", activation=None)
    head = classifier.get_layer("head")
    head.kernel.assign(np.eye(D, 3, dtype="float32"))
    np.testing.assert_allclose(keras.ops.convert_to_numpy(classifier(IMAGES)), embedding[:, :3], atol=1e-5)
    assert classifier.count_params() == backbone.count_params() + D * 3 + 3  # the MAP head counted once


def test_few_shot_features_of_a_siglip_backbone_are_its_pooled_embedding():
    from keras_vit.workflows.fewshot import extract_features

    keras.utils.set_random_seed(0)
    backbone = keras_vit.ViTBackbone(**TINY, use_class_token=False, attention_pooling=True)
    expected = keras.ops.convert_to_numpy(backbone.pool(backbone(IMAGES)))
    np.testing.assert_allclose(extract_features(backbone, IMAGES), expected, atol=1e-5)


def test_deit_heads_are_averaged_and_each_readable():
    keras.utils.set_random_seed(0)
    model = _seeded(CASES["deit_distilled_classifier"][0])(None)
    model = keras_vit.ViTClassifier(model.backbone, num_classes=3, activation=None)
    rng = np.random.default_rng(3)
    for name in ("head", "head_distillation"):
        model.get_layer(name).kernel.assign(rng.normal(0, 1, (D, 3)).astype("float32"))
    heads = {k: keras.ops.convert_to_numpy(v) for k, v in model.head_outputs_model()(IMAGES).items()}
    tokens = keras.ops.convert_to_numpy(model.backbone(IMAGES))
    for name, token in (("head", 0), ("head_distillation", 1)):
        layer = model.get_layer(name)
        expected = tokens[:, token] @ keras.ops.convert_to_numpy(layer.kernel) + keras.ops.convert_to_numpy(layer.bias)
        np.testing.assert_allclose(heads[name], expected, atol=1e-5)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(model(IMAGES)),
                               (heads["head"] + heads["head_distillation"]) / 2, atol=1e-5)


@pytest.mark.one_backend("argument checks run before any weight exists")
def test_parts_that_do_not_fit_are_refused_with_the_fix():
    with pytest.raises(ValueError, match="attention_pooling=True"):
        keras_vit.ViTClassifier(keras_vit.ViTBackbone(**TINY), num_classes=3, pooling="map")
    with pytest.raises(ValueError, match="pooling='token'"):
        keras_vit.ViTClassifier(keras_vit.ViTBackbone(**TINY, use_distillation_token=True), num_classes=3,
                                pooling="gap")
    with pytest.raises(ValueError, match="mlp_activation"):
        keras_vit.ViTBackbone(**TINY, mlp_activation="relu")
    with pytest.raises(ValueError, match="attention_pooling=True"):
        keras_vit.ViTBackbone(**TINY).pool(np.zeros((1, 17, D), "float32"))


def test_from_variant_knows_so400m_and_map_pooling():
    with keras.StatelessScope(initialize_variables=False):
        model = keras_vit.ViTClassifier.from_variant("ViT-So400m/14", image_size=224, use_class_token=False,
                                                     pooling="map", num_classes=10)
        backbone = model.backbone
        assert (backbone.hidden_dim, backbone.num_layers, backbone.num_heads, backbone.mlp_dim) == (1152, 27, 16, 4304)
        assert backbone.patch_size == (14, 14) and backbone.attention_pooling
    keras.utils.clear_session(free_memory=False)
