"""The evaluation transform is part of the model: four ViTBackbone arguments, saved and checked like mean and std."""

import os

import numpy as np
import pytest

import keras_vit
from keras_vit.utils.image_resize import ImageTransform, image_transform
from tests.helpers import save_and_reload

TINY = dict(image_size=8, patch_size=4, hidden_dim=8, num_layers=1, num_heads=2, mlp_dim=16)
TIMM_LIKE = dict(resize_mode="center_crop", crop_fraction=0.9, interpolation="bilinear", alpha="drop")
SIGLIP_LIKE = dict(resize_mode="stretch", crop_fraction=1.0, interpolation="nearest", alpha="drop")


def test_a_model_built_from_scratch_keeps_todays_transform():
    backbone = keras_vit.ViTBackbone(**TINY)
    assert (backbone.resize_mode, backbone.crop_fraction, backbone.interpolation, backbone.alpha) == (
        "center_crop", 1.0, "bicubic", "white")
    assert image_transform(backbone) == ImageTransform("center_crop", 1.0, "bicubic", "white")


@pytest.mark.parametrize("transform", [TIMM_LIKE, SIGLIP_LIKE], ids=["timm_like", "siglip_like"])
def test_each_field_round_trips_through_config_keras_file_and_preset(transform, tmp_path):
    backbone = keras_vit.ViTBackbone(**TINY, **transform)
    model = keras_vit.ViTClassifier(backbone, num_classes=3)
    config = backbone.get_config()
    assert {key: config[key] for key in transform} == transform
    assert image_transform(keras_vit.ViTBackbone.from_config(config)) == ImageTransform(**transform)
    # The classifier's transform is its backbone's.
    assert image_transform(model) == ImageTransform(**transform)
    reloaded = save_and_reload(model, str(tmp_path))
    assert image_transform(reloaded) == ImageTransform(**transform)
    preset = os.path.join(str(tmp_path), "preset")
    model.save_to_preset(preset)
    from_preset = keras_vit.ViTClassifier.from_preset(preset)
    assert image_transform(from_preset) == ImageTransform(**transform)
    assert image_transform(keras_vit.ViTBackbone.from_preset(preset)) == ImageTransform(**transform)


def test_with_image_size_and_with_head_keep_the_transform():
    model = keras_vit.ViTClassifier(keras_vit.ViTBackbone(**TINY, **TIMM_LIKE), num_classes=3)
    assert image_transform(model.with_image_size(12)) == ImageTransform(**TIMM_LIKE)
    assert image_transform(model.with_head(5)) == ImageTransform(**TIMM_LIKE)


@pytest.mark.parametrize("key, value, words", [
    ("resize_mode", "squash", "Unknown `resize_mode`. Use one of ('center_crop', 'stretch'). Received: "
                              "resize_mode='squash'"),
    ("crop_fraction", 0.0, "`crop_fraction` must be a number in (0, 1]. Received: crop_fraction=0.0"),
    ("crop_fraction", 1.5, "`crop_fraction` must be a number in (0, 1]. Received: crop_fraction=1.5"),
    ("crop_fraction", "0.9", "Received: crop_fraction='0.9'"),
    ("interpolation", "cubic", "Unknown `interpolation`. Use one of ('bicubic', 'bilinear', 'nearest'). "
                               "Received: interpolation='cubic'"),
    ("alpha", "black", "Unknown `alpha`. Use one of ('white', 'drop'). Received: alpha='black'"),
])
def test_bad_values_are_refused_naming_the_argument(key, value, words):
    with pytest.raises(ValueError) as error:
        keras_vit.ViTBackbone(**TINY, **{key: value})
    assert words in str(error.value)
    with pytest.raises(ValueError) as error:
        ImageTransform(**{key: value})
    assert words in str(error.value)


def test_a_preset_whose_config_holds_a_bad_transform_value_is_refused_naming_the_key(tmp_path):
    import json

    preset = os.path.join(str(tmp_path), "preset")
    keras_vit.ViTBackbone(**TINY).save_to_preset(preset)
    config_path = os.path.join(preset, "config.json")
    with open(config_path) as handle:
        document = json.load(handle)
    document["config"]["crop_fraction"] = 2.0
    with open(config_path, "w") as handle:
        json.dump(document, handle)
    with pytest.raises(ValueError, match=r"crop_fraction.*\(at `config.crop_fraction`\)"):
        keras_vit.ViTBackbone.from_preset(preset)


def test_a_preset_written_before_the_transform_existed_loads_with_the_defaults(tmp_path):
    import json

    preset = os.path.join(str(tmp_path), "preset")
    keras_vit.ViTBackbone(**TINY, **TIMM_LIKE).save_to_preset(preset)
    config_path = os.path.join(preset, "config.json")
    with open(config_path) as handle:
        document = json.load(handle)
    for key in TIMM_LIKE:
        del document["config"][key]
    with open(config_path, "w") as handle:
        json.dump(document, handle)
    assert image_transform(keras_vit.ViTBackbone.from_preset(preset)) == ImageTransform()


def test_metadata_describes_the_models_own_transform(tmp_path):
    import json

    preset = os.path.join(str(tmp_path), "preset")
    keras_vit.ViTBackbone(**TINY, **TIMM_LIKE).save_to_preset(preset)
    with open(os.path.join(preset, "metadata.json")) as handle:
        described = json.load(handle)["image_transform"]
    assert {key: described[key] for key in TIMM_LIKE} == TIMM_LIKE
    assert described["resize"] == "shorter side to floor(size / 0.9), then the centre (size x size) cropped"
    np.testing.assert_equal(described["exif_orientation"], True)
