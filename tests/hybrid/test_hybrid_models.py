"""Hybrid ViTs: variants and parameter counts, stems from keras.applications / keras-cv, training, saving."""

import tempfile

import keras
import numpy as np
import pytest

from keras_vit import ViTBackbone, ViTClassifier, parse_variant
from keras_vit.models import applications_stem, bit_resnet_stem, keras_cv_resnet_v2_stem, set_stem_trainable
from keras_vit.models.variants import hybrid_variant_names
from tests.helpers import assert_same_outputs_after_reload, save_and_reload

TINY_VIT = {"hidden_dim": 16, "num_layers": 1, "num_heads": 2, "mlp_dim": 32}


def test_parse_hybrid_variants():
    assert parse_variant("R50+ViT-B/16") == {
        "hidden_dim": 768, "num_layers": 12, "num_heads": 12, "mlp_dim": 3072, "patch_size": 1,
        "stem": {"stage_depths": (3, 4, 9)},
    }
    assert parse_variant("r26+s/32")["stem"] == {"stage_depths": (2, 2, 2, 2)}
    assert parse_variant("R+ViT-Ti/16")["patch_size"] == 8
    assert set(hybrid_variant_names()) == {"R50+ViT-B/16", "R50+ViT-L/32", "R26+ViT-S/32", "R+ViT-Ti/16"}
    with pytest.raises(ValueError, match="R50\\+ViT-B/16"):
        parse_variant("R101+ViT-B/16")


# timm 1.0.31 parameter counts (random init, sum(p.numel())): vit_base_r50_s16_224 (no head), vit_base_r50_s16_384,
# vit_tiny_r_s16_p8_224, vit_small_r26_s32_224, vit_large_r50_s32_224 (1000-class heads). Built
# for real, but without initialising the variables (as tests/models/test_parameter_counts.py).
@pytest.mark.parametrize(
    "variant,kwargs,expected",
    [
        ("R50+ViT-B/16", {}, 97_890_112),
        ("R50+ViT-B/16", {"image_size": 384, "num_classes": 1000}, 98_950_952),
        ("R+ViT-Ti/16", {"num_classes": 1000}, 6_337_704),
        ("R26+ViT-S/32", {"num_classes": 1000}, 36_431_912),
        ("R50+ViT-L/32", {"num_classes": 1000}, 328_994_856),
    ],
)
def test_parameter_counts_match_timm(variant, kwargs, expected):
    with keras.StatelessScope(initialize_variables=False):
        if "num_classes" in kwargs:
            model = ViTClassifier.from_variant(variant, **kwargs)
        else:
            model = ViTBackbone.from_variant(variant, **kwargs)
        assert model.count_params() == expected
    keras.utils.clear_session(free_memory=False)


def test_hybrid_variant_shapes_at_small_size():
    backbone = ViTBackbone.from_variant("R50+ViT-B/16", image_size=(32, 48), num_channels=1, **TINY_VIT)
    assert backbone.grid_size == (2, 3)  # output stride 16, 1x1 patches
    assert backbone.get_layer("bit_resnet").output.shape == (None, 2, 3, 1024)
    stem_only = ViTBackbone.from_variant("R+ViT-Ti/16", image_size=64, **TINY_VIT)
    assert stem_only.grid_size == (2, 2)  # stride 4 root, 8x8 patches
    assert stem_only.get_layer("patches").output.shape == (None, 4, 8 * 8 * 64)


def _tiny_data(size, channels=3, n=4):
    rng = np.random.default_rng(0)
    return rng.uniform(0, 255, size=(n, size, size, channels)).astype("float32"), np.arange(n) % 3


def _fit_save_reload(model, x, y):
    model.compile(optimizer=keras.optimizers.SGD(0.01))  # no optimizer slots: small .keras files
    # Two steps: the zero-initialised head passes no gradient back on the first.
    history = model.fit(x, y, epochs=1, batch_size=len(x) // 2, verbose=0)
    assert np.isfinite(history.history["loss"][0])
    expected = keras.ops.convert_to_numpy(model(x))
    with tempfile.TemporaryDirectory() as directory:
        restored = save_and_reload(model, directory)
    assert_same_outputs_after_reload(keras.ops.convert_to_numpy(restored(x)), expected)
    return restored


def test_bit_stem_trains_saves_and_reloads():
    keras.utils.set_random_seed(0)
    stem = bit_resnet_stem((1, 1), width=8, num_groups=4, group_norm_epsilon=1e-6)
    model = ViTClassifier(ViTBackbone(image_size=16, patch_size=1, stem=stem, **TINY_VIT), num_classes=3)
    x, y = _tiny_data(16)
    before = keras.ops.convert_to_numpy(stem.get_layer("root").conv.kernel).copy()
    restored = _fit_save_reload(model, x, y)
    assert not np.array_equal(before, keras.ops.convert_to_numpy(stem.get_layer("root").conv.kernel))
    restored_root = restored.backbone.stem.get_layer("root")
    assert restored_root.norm.epsilon == 1e-6 and restored_root.conv.epsilon == 1e-8


def test_keras_applications_resnet50v2_stem():
    # ResNet50V2, the default (random weights), on 32x32 images: a 1x1x2048 feature map, one token.
    stem = applications_stem(freeze=True)
    assert stem.name == "resnet50v2" and not stem.trainable
    backbone = ViTBackbone(image_size=32, patch_size=1, stem=stem, **TINY_VIT)
    assert backbone.grid_size == (1, 1) and stem.output_shape[-1] == 2048


@pytest.mark.slow
def test_a_frozen_keras_applications_stem_trains_saves_and_reloads():
    # What the stem does in training, saving and reloading is the same for any keras.applications CNN:
    # MobileNet at a quarter width (0.2 M weights, BatchNormalization after each convolution, output
    # stride 32: one token at 32x32) checks it in a tenth of ResNet50V2's time (23.6 M weights: a
    # 94 MB .keras file written and read back on each backend).
    keras.utils.set_random_seed(0)
    stem = applications_stem("MobileNet", freeze=True, alpha=0.25)
    model = ViTClassifier(ViTBackbone(image_size=32, patch_size=1, stem=stem, **TINY_VIT), num_classes=3)
    assert model.backbone.grid_size == (1, 1)
    assert any(isinstance(layer, keras.layers.BatchNormalization) for layer in stem.layers)
    x, y = _tiny_data(32)
    stem_before = [keras.ops.convert_to_numpy(w).copy() for w in stem.weights]
    head_before = keras.ops.convert_to_numpy(model.get_layer("head").kernel).copy()
    restored = _fit_save_reload(model, x, y)
    # Frozen: the stem (BatchNorm statistics included) is untouched, the ViT learns.
    assert all(np.array_equal(b, keras.ops.convert_to_numpy(w)) for b, w in zip(stem_before, stem.weights))
    assert not np.array_equal(head_before, keras.ops.convert_to_numpy(model.get_layer("head").kernel))
    assert not restored.backbone.stem.trainable
    set_stem_trainable(model, True)
    assert stem.trainable and len(model.trainable_weights) > len(restored.trainable_weights)


def test_keras_cv_resnet_v2_stem():
    pytest.importorskip("keras_cv", reason="keras-cv (the `cv` extra) is not installed")
    keras.utils.set_random_seed(0)
    stem = keras_cv_resnet_v2_stem(stackwise_filters=(8,), stackwise_blocks=(2,), stackwise_strides=(2,))
    model = ViTClassifier(ViTBackbone(image_size=32, patch_size=1, stem=stem, **TINY_VIT), num_classes=3)
    assert model.backbone.grid_size == (4, 4)  # root stride 4, one stride-2 stack
    x, y = _tiny_data(32)
    _fit_save_reload(model, x, y)


def test_user_cnn_stem_and_errors():
    stem = keras.Sequential([keras.layers.Conv2D(8, 3, strides=4, padding="same")], name="my_cnn")
    backbone = ViTBackbone(image_size=16, patch_size=2, stem=stem, **TINY_VIT)
    assert backbone.grid_size == (2, 2)
    with pytest.raises(ValueError, match="no CNN stem"):
        set_stem_trainable(ViTBackbone(image_size=16, patch_size=8, **TINY_VIT))
    with pytest.raises(ValueError, match="stage_depths"):
        bit_resnet_stem((3, 0))
    with pytest.raises(ValueError, match="Unknown keras.applications"):
        applications_stem("ResNet49")
