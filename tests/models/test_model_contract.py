"""The model contract (tests/models/contract.py) for every model kind, on the current backend."""

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit.models.hybrid import bit_resnet_stem
from tests.models.contract import run_model_contract, run_model_options_contract, vit_parameter_count

# One block: the contract is about the model kind (its config, files, fit, options), which one block
# carries as two do; each block more is tracing and compiling in every fit and predict below (issue 50).
# Several blocks' names, files and counts are test_vit_models.py's and test_parameter_counts.py's.
LAYERS = 1
TINY = dict(hidden_dim=16, num_layers=LAYERS, num_heads=2, mlp_dim=32)
IMAGES = np.random.default_rng(0).uniform(0, 255, (4, 16, 16, 3)).astype("float32")
LABELS = np.array([0, 1, 2, 0])


def _seeded(make):
    def build(dtype=None):
        keras.utils.set_random_seed(0)
        return make(dtype)
    return build


def _randomise_head(model):
    # The fine-tuning head starts at zero; a random one makes the round trips compare real outputs.
    head = model.get_layer("head")
    head.kernel.assign(np.random.default_rng(1).normal(0, 1, head.kernel.shape).astype("float32"))
    return model


CASES = {
    "backbone": (
        lambda dtype: keras_vit.ViTBackbone(image_size=16, patch_size=4, dtype=dtype, **TINY),
        None, vit_parameter_count(16, LAYERS, 32, num_patches=16, patch_features=48)),
    "backbone_registers": (
        lambda dtype: keras_vit.ViTBackbone(image_size=16, patch_size=8, num_register_tokens=2, dtype=dtype, **TINY),
        # timm's rule: without `no_embed_class` the position embedding has a row for every prefix token,
        # the class token and the registers alike.
        None, vit_parameter_count(16, LAYERS, 32, num_patches=4, patch_features=192, num_register_tokens=2,
                                  num_prefix_tokens=3)),
    "backbone_hybrid": (
        lambda dtype: keras_vit.ViTBackbone(
            image_size=16, patch_size=1, dtype=dtype,
            stem=bit_resnet_stem(stage_depths=(1,), width=8, num_groups=4, dtype=dtype), **TINY),
        None, None),  # hybrid counts are checked against timm's in test_parameter_counts.py
    "classifier": (
        lambda dtype: _randomise_head(keras_vit.ViTClassifier(
            keras_vit.ViTBackbone(image_size=16, patch_size=4, dtype=dtype, **TINY), num_classes=3, dtype=dtype)),
        LABELS, vit_parameter_count(16, LAYERS, 32, num_patches=16, patch_features=48, num_classes=3)),
    "classifier_gap": (
        lambda dtype: _randomise_head(keras_vit.ViTClassifier(
            keras_vit.ViTBackbone(image_size=16, patch_size=4, dtype=dtype, **TINY), num_classes=3, pooling="gap",
            pooled_norm=True, dtype=dtype)),
        LABELS, vit_parameter_count(16, LAYERS, 32, num_patches=16, patch_features=48, num_classes=3, gap_norm=True)),
    "masked_patch_predictor": (
        lambda dtype: keras_vit.MaskedPatchPredictor(
            keras_vit.ViTBackbone(image_size=16, patch_size=4, dtype=dtype, **TINY), seed=0, dtype=dtype),
        "images", vit_parameter_count(16, LAYERS, 32, num_patches=16, patch_features=48)
        + 16  # the learned [mask] embedding
        + 16 * 512 + 512),  # the head: 3-bit mean colour, 512 classes
}


@pytest.mark.slow  # builds, saves and reloads each model kind several times: a few seconds each
@pytest.mark.parametrize("case", sorted(CASES))
def test_model_contract(case):
    make, targets, expected_params = CASES[case]
    if isinstance(targets, str):  # the masked patch predictor trains on images alone
        targets = None
        loss = None
    else:
        loss = "sparse_categorical_crossentropy" if targets is not None else "mse"
        if targets is None:  # a backbone: fit its tokens to zeros
            targets = np.zeros((len(IMAGES),) + tuple(make(None).output_shape[1:]), "float32")
    deterministic = None
    if case == "masked_patch_predictor":
        # Its predict corrupts patches drawn anew each call; compare its backbone and head on clean tokens.
        def deterministic(model, images):
            tokens = model.backbone(images)
            return model.head(tokens[:, model.num_prefix_tokens:])
    run_model_contract(_seeded(make), IMAGES, targets=targets, loss=loss, expected_params=expected_params,
                       deterministic=deterministic)


@pytest.mark.slow  # quantizes, adapts and rebuilds each model kind: a few seconds each
@pytest.mark.parametrize("case", sorted(CASES))
def test_model_options_contract(case):
    make, targets, _ = CASES[case]
    loss = "sparse_categorical_crossentropy"
    if isinstance(targets, str):
        targets, loss = None, None
    elif targets is None:
        targets, loss = np.zeros((len(IMAGES),) + tuple(make(None).output_shape[1:]), "float32"), "mse"
    deterministic = None
    if case == "masked_patch_predictor":
        def deterministic(model, images):
            tokens = model.backbone(images)
            return model.head(tokens[:, model.num_prefix_tokens:])
    run_model_options_contract(_seeded(make), IMAGES, targets=targets, loss=loss, deterministic=deterministic)
