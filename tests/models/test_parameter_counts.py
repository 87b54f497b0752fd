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


# Issue 48's architectures, counted by scripts/timm_parameter_counts.py (timm 1.0.31, random init,
# `sum(p.numel() for p in model.parameters())`); the timm name and arguments are beside each number.
LATER_FAMILIES = {
    "siglip_b16_no_head": (  # vit_base_patch16_siglip_224, num_classes=0
        lambda: keras_vit.ViTBackbone.from_variant("ViT-B/16", use_class_token=False, attention_pooling=True),
        92_884_224),
    "siglip_b16_1000_classes": (  # vit_base_patch16_siglip_224, num_classes=1000
        lambda: keras_vit.ViTClassifier.from_variant("ViT-B/16", use_class_token=False, pooling="map",
                                                     num_classes=1000),
        93_653_224),
    # timm's 384 px So400m/14 has a 27x27 grid (its patch conv drops the last 6 pixels); keras_vit builds the same
    # weights at 378 px, the size that grid covers (it refuses an image size the patch size does not divide).
    "siglip_so400m14_384": (  # vit_so400m_patch14_siglip_384, num_classes=0
        lambda: keras_vit.ViTBackbone.from_variant("ViT-So400m/14", image_size=378, use_class_token=False,
                                                   attention_pooling=True),
        428_225_600),
    "siglip_so400m14_224": (  # vit_so400m_patch14_siglip_224, num_classes=0
        lambda: keras_vit.ViTBackbone.from_variant("ViT-So400m/14", use_class_token=False, attention_pooling=True),
        427_680_704),
    "siglip_gap_b16": (  # vit_base_patch16_siglip_gap_224, num_classes=0
        lambda: keras_vit.ViTBackbone.from_variant("ViT-B/16", use_class_token=False),
        85_797_120),
    "clip_quickgelu_b16": (  # vit_base_patch16_clip_quickgelu_224, num_classes=0
        lambda: keras_vit.ViTBackbone.from_variant("ViT-B/16", pre_norm=True, mlp_activation="quick_gelu",
                                                   layer_norm_epsilon=1e-5),
        85_799_424),
    "qk_norm_s16": (  # vit_small_patch16_224, qk_norm=True
        lambda: keras_vit.ViTClassifier.from_variant("ViT-S/16", qk_norm=True, num_classes=1000),
        22_053_736),
    "dinov2_reg4_s14": (  # vit_small_patch14_reg4_dinov2 (518 px), num_classes=0
        lambda: keras_vit.ViTBackbone.from_variant("ViT-S/14", image_size=518, num_register_tokens=4,
                                                   prefix_position_embedding=False, layer_scale_init=1e-5),
        22_057_344),
    "dinov2_reg4_b14": (  # vit_base_patch14_reg4_dinov2 (518 px), num_classes=0
        lambda: keras_vit.ViTBackbone.from_variant("ViT-B/14", image_size=518, num_register_tokens=4,
                                                   prefix_position_embedding=False, layer_scale_init=1e-5),
        86_582_016),
    "deit_s16": (  # deit_small_patch16_224
        lambda: keras_vit.ViTClassifier.from_variant("ViT-S/16", num_classes=1000),
        22_050_664),
    "deit_s16_distilled": (  # deit_small_distilled_patch16_224
        lambda: keras_vit.ViTClassifier.from_variant("ViT-S/16", use_distillation_token=True, num_classes=1000),
        22_436_432),
    "deit_b16_distilled": (  # deit_base_distilled_patch16_224
        lambda: keras_vit.ViTClassifier.from_variant("ViT-B/16", use_distillation_token=True, num_classes=1000),
        87_338_192),
}


@pytest.mark.parametrize("case", sorted(LATER_FAMILIES))
def test_later_family_parameter_count_equals_timms(case):
    build, expected = LATER_FAMILIES[case]
    with shapes_only():
        assert build().count_params() == expected
