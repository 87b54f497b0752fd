"""The parameter count each layer gives for itself, before building, equals Keras' count after building.

`ViTBackbone` refuses an absurd config (`MAX_PARAMETERS`) from the layers'
own `parameter_count` methods before any weight exists; that sum must be the
model's real size. The reference here is `count_params()` of the built model,
which Keras computes from the variables themselves.

The variants are built inside a `StatelessScope` that skips variable
initialisation: a count is the variables' shapes, and drawing ViT-B's 86M
random weights per variant cost seconds for nothing. The shapes are Keras'
on every backend, so the variant sweep runs in one pass; every pass still
builds real models and counts them against timm (test_parameter_counts.py).
"""

import keras
import pytest

from keras_vit.models.variants import PATCH_SIZES, parse_variant
from keras_vit.models.vit_backbone import ViTBackbone

# The Ti, S and B rows of Table 1 with every patch size, each on a 2 x 2 patch grid. ViT-L and
# ViT-H (0.3 and 0.6 billion weights) are left out: building them costs seconds and gigabytes per
# backend, and their rows differ from these only in the widths the formula takes as numbers.
VARIANTS = [f"ViT-{size}/{patch}" for size in ("Ti", "S", "B") for patch in PATCH_SIZES]
OPTIONS = {
    "registers": dict(num_register_tokens=4),
    "registers_no_embed_class": dict(num_register_tokens=2, prefix_position_embedding=False),
    "layer_scale": dict(layer_scale_init=1e-5),
    "no_qkv_bias": dict(use_qkv_bias=False),
    "no_class_token": dict(use_class_token=False),
    "sincos": dict(position_embedding="sincos2d"),
    "no_position_embedding": dict(position_embedding="none"),
    "no_final_norm": dict(final_norm=False),
    "rectangular": dict(image_size=(32, 48), patch_size=(8, 16), num_channels=1),
}
TINY = dict(image_size=32, patch_size=8, hidden_dim=24, num_layers=2, num_heads=3, mlp_dim=48)


def _pre_build_count(backbone, feature_channels=None):
    """The sum the constructor checked, recomputed from the built model's own layers (stem excluded)."""
    channels = feature_channels or backbone.num_channels
    patch_features = backbone.patch_size[0] * backbone.patch_size[1] * channels
    encoder = backbone.get_layer("patch_encoder").parameter_count(patch_features)
    blocks = sum(backbone.get_layer(f"transformer_block_{i}").parameter_count(backbone.hidden_dim)
                 for i in range(backbone.num_layers))
    return encoder + blocks + (2 * backbone.hidden_dim if backbone.final_norm else 0)


@pytest.mark.one_backend("a sum of Python integers against the variables' shapes, which Keras makes the same everywhere")
@pytest.mark.parametrize("variant", VARIANTS)
def test_every_variant_counts_its_parameters_before_building(variant):
    size = 2 * parse_variant(variant)["patch_size"]
    with keras.StatelessScope(initialize_variables=False):  # shapes only: the count needs no random weights
        backbone = ViTBackbone.from_variant(variant, image_size=size)
        assert _pre_build_count(backbone) == backbone.count_params()


def test_a_hybrid_counts_everything_but_its_stem_before_building():
    backbone = ViTBackbone.from_variant("R+ViT-Ti/16", image_size=32)
    stem = backbone.stem
    channels = stem.compute_output_shape((1, 32, 32, 3))[-1]
    assert _pre_build_count(backbone, channels) == backbone.count_params() - stem.count_params()


@pytest.mark.parametrize("option", sorted(OPTIONS))
def test_every_option_counts_its_parameters_before_building(option):
    backbone = ViTBackbone(**{**TINY, **OPTIONS[option]})
    assert _pre_build_count(backbone) == backbone.count_params()


def test_the_bound_uses_the_same_count(monkeypatch):
    """The constructor refuses exactly above MAX_PARAMETERS, from the layers' count, before building."""
    import keras_vit.models.vit_backbone as module

    size = ViTBackbone(**TINY).count_params()
    monkeypatch.setattr(module, "MAX_PARAMETERS", size)
    ViTBackbone(**TINY)  # exactly at the bound: built
    monkeypatch.setattr(module, "MAX_PARAMETERS", size - 1)
    with pytest.raises(ValueError, match="would have about"):
        ViTBackbone(**TINY)
