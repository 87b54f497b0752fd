"""Parameter counts equal timm's for the paper's variants.

Provenance of the expected numbers: timm 1.0.31, `timm/models/vision_transformer.py`
and `vision_transformer_hybrid.py`, each model created with
`timm.create_model(name, pretrained=False)` (random init) and counted with
`sum(p.numel() for p in model.parameters())`; the timm name is beside each
number. They are not computed from keras_vit.
Models are built for real but inside a `StatelessScope` that skips variable
initialisation, so ViT-H/14's 630M weights cost no memory or RNG time.
"""

import contextlib

import keras
import pytest

import keras_vit


@contextlib.contextmanager
def shapes_only():
    with keras.StatelessScope(initialize_variables=False):
        yield
    keras.utils.clear_session(free_memory=False)


WITH_1000_CLASS_HEAD = {
    "ViT-Ti/16": 5_717_416,  # vit_tiny_patch16_224
    "ViT-S/16": 22_050_664,  # vit_small_patch16_224
    "ViT-S/32": 22_878_952,  # vit_small_patch32_224
    "ViT-B/16": 86_567_656,  # vit_base_patch16_224
    "ViT-B/32": 88_224_232,  # vit_base_patch32_224
    "ViT-B/8": 86_576_872,  # vit_base_patch8_224
}
WITHOUT_HEAD = {
    "ViT-L/32": 305_510_400,  # vit_large_patch32_224, num_classes=0
    "ViT-H/14": 630_764_800,  # vit_huge_patch14_224, num_classes=0
}


@pytest.mark.parametrize("variant", sorted(WITH_1000_CLASS_HEAD))
def test_classifier_parameter_count(variant):
    with shapes_only():
        model = keras_vit.ViTClassifier.from_variant(variant, num_classes=1000)
        assert model.count_params() == WITH_1000_CLASS_HEAD[variant]


def test_vit_l16_parameter_count():
    with shapes_only():
        model = keras_vit.ViTClassifier.from_variant("ViT-L/16", num_classes=1000)
        assert model.count_params() == 304_326_632  # vit_large_patch16_224


@pytest.mark.parametrize("variant", sorted(WITHOUT_HEAD))
def test_backbone_parameter_count(variant):
    with shapes_only():
        backbone = keras_vit.ViTBackbone.from_variant(variant)
        assert backbone.count_params() == WITHOUT_HEAD[variant]


def test_initialised_small_model_counts_the_same():
    # The shapes-only build must agree with an ordinary one.
    model = keras_vit.ViTClassifier.from_variant("ViT-Ti/16", num_classes=1000)
    assert model.count_params() == WITH_1000_CLASS_HEAD["ViT-Ti/16"]
