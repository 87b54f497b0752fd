"""Parameter counts equal timm's for the paper's variants (STYLE.md table).

The expected numbers are timm 1.0.31's, counted from randomly initialised
timm models (reference figures in shared/STYLE.md), not from keras_vit.
"""

import gc

import keras
import pytest

import keras_vit

WITH_1000_CLASS_HEAD = {
    "ViT-Ti/16": 5_717_416,
    "ViT-S/16": 22_050_664,
    "ViT-S/32": 22_878_952,
    "ViT-B/16": 86_567_656,
    "ViT-B/32": 88_224_232,
    "ViT-B/8": 86_576_872,
}
WITHOUT_HEAD = {
    "ViT-L/32": 305_510_400,
    "ViT-H/14": 630_764_800,
}


@pytest.mark.parametrize("variant", sorted(WITH_1000_CLASS_HEAD))
def test_classifier_parameter_count(variant):
    model = keras_vit.ViTClassifier.from_variant(variant, num_classes=1000)
    assert model.count_params() == WITH_1000_CLASS_HEAD[variant]


@pytest.mark.slow
def test_vit_l16_parameter_count():
    model = keras_vit.ViTClassifier.from_variant("ViT-L/16", num_classes=1000)
    assert model.count_params() == 304_326_632
    del model
    gc.collect()


@pytest.mark.slow
@pytest.mark.parametrize("variant", sorted(WITHOUT_HEAD))
def test_backbone_parameter_count(variant):
    backbone = keras_vit.ViTBackbone.from_variant(variant)
    assert backbone.count_params() == WITHOUT_HEAD[variant]
    del backbone
    keras.utils.clear_session()
    gc.collect()
