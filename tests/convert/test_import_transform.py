"""Issue 47: a converted model takes its source's evaluation transform from the source's own config files.

Each test writes the source's config file as the source library writes it (timm's hub `config.json` with
`pretrained_cfg`, transformers' `preprocessor_config.json`, keras-hub's `image_converter.json`), loads the
checkpoint with `load_checkpoint`, and checks the model's `image_transform`. The expected values are the
source libraries' documented rules (timm 1.0.31 `resolve_data_config` / `transforms_imagenet_eval`,
transformers 5.23's image processor classes, keras-hub's `ImageConverter`), written out by hand here.
"""

import json
import os
import shutil

import numpy as np
import pytest

import keras_vit
from keras_vit.convert import export_huggingface, load_checkpoint
from keras_vit.convert.huggingface import huggingface_image_transform
from keras_vit.convert.model_map import model_to_timm
from keras_vit.convert.timm import timm_image_transform
from keras_vit.utils.image_resize import ImageTransform, image_transform

TINY = dict(image_size=16, patch_size=8, hidden_dim=16, num_layers=1, num_heads=2, mlp_dim=32)
FIXTURES = os.path.join(os.path.dirname(__file__), "..", "fixtures", "kerashub")


def _tiny_classifier():
    return keras_vit.ViTClassifier(keras_vit.ViTBackbone(**TINY), num_classes=3)


def _timm_hub_directory(directory, pretrained_cfg):
    from safetensors.numpy import save_file

    state_dict, _, _ = model_to_timm(_tiny_classifier())
    os.makedirs(directory)
    save_file({key: np.ascontiguousarray(value) for key, value in state_dict.items()},
              os.path.join(directory, "model.safetensors"))
    config = {"architecture": "vit_tiny_patch8_16", "num_classes": 3, "num_features": 16,
              "model_args": {"img_size": 16, "patch_size": 8, "embed_dim": 16, "depth": 1, "num_heads": 2},
              "pretrained_cfg": {"input_size": [3, 16, 16], "mean": [0.5] * 3, "std": [0.5] * 3, **pretrained_cfg}}
    with open(os.path.join(directory, "config.json"), "w") as handle:
        json.dump(config, handle)
    return str(directory)


@pytest.mark.parametrize("pretrained_cfg, expected", [
    # timm's ViT default cfg (vision_transformer.py `_cfg`): crop_pct 0.9, bicubic, centre.
    ({"crop_pct": 0.9, "interpolation": "bicubic"}, ImageTransform("center_crop", 0.9, "bicubic", "drop")),
    # A 384 AugReg checkpoint: crop_pct 1.0.
    ({"crop_pct": 1.0, "interpolation": "bicubic", "crop_mode": "center"},
     ImageTransform("center_crop", 1.0, "bicubic", "drop")),
    # "squash" resizes both sides to size / crop_pct, then crops.
    ({"crop_pct": 0.95, "interpolation": "bilinear", "crop_mode": "squash"},
     ImageTransform("stretch", 0.95, "bilinear", "drop")),
    # Fields left out take resolve_data_config's defaults: crop_pct 0.875, bicubic, centre.
    ({}, ImageTransform("center_crop", 0.875, "bicubic", "drop")),
], ids=["augreg_224", "augreg_384", "squash", "timm_defaults"])
def test_a_timm_hub_checkpoint_takes_its_pretrained_cfg(tmp_path, pretrained_cfg, expected):
    model = load_checkpoint(_timm_hub_directory(tmp_path / "timm", pretrained_cfg))
    assert image_transform(model) == expected
    # A user's override wins over the config (crop_fraction, resize_mode and alpha through load_checkpoint).
    changed = load_checkpoint(str(tmp_path / "timm"), crop_fraction=0.8, alpha="white")
    assert (image_transform(changed).crop_fraction, image_transform(changed).alpha) == (0.8, "white")


@pytest.mark.one_backend("reads a config dict; no model is built")
def test_timm_crop_modes_keras_vit_cannot_express_are_refused_unless_overridden():
    with pytest.raises(ValueError, match=r"crop_mode='border'.*Pass resize_mode="):
        timm_image_transform({"crop_mode": "border", "crop_pct": 1.0})
    assert "resize_mode" not in timm_image_transform({"crop_mode": "border"}, skip={"resize_mode": "stretch"})
    with pytest.warns(UserWarning, match="interpolation='lanczos'.*bicubic"):
        assert timm_image_transform({"interpolation": "lanczos"})["interpolation"] == "bicubic"
    # A bare state dict (no pretrained_cfg): the resize is unknown and stays keras_vit's; alpha as timm reads files.
    assert timm_image_transform(None) == {"alpha": "drop"}


# transformers 5.23's processors, as `save_pretrained` writes their configs (the fields that matter).
PROCESSORS = {
    "vit": ({"image_processor_type": "ViTImageProcessor", "size": {"height": 224, "width": 224}, "resample": 2},
            ImageTransform("stretch", 1.0, "bilinear", "drop")),
    "vit_old_feature_extractor": ({"feature_extractor_type": "ViTFeatureExtractor", "size": 224, "resample": 2},
                                  ImageTransform("stretch", 1.0, "bilinear", "drop")),
    "siglip": ({"image_processor_type": "SiglipImageProcessor", "size": {"height": 384, "width": 384}},
               ImageTransform("stretch", 1.0, "bicubic", "drop")),
    "clip": ({"image_processor_type": "CLIPImageProcessor", "size": {"shortest_edge": 256}, "do_center_crop": True,
              "crop_size": {"height": 224, "width": 224}, "resample": 3},
             ImageTransform("center_crop", 0.875, "bicubic", "drop")),
    "dinov2_bit": ({"image_processor_type": "BitImageProcessor", "size": {"shortest_edge": 256},
                    "crop_size": {"height": 224, "width": 224}, "do_center_crop": True, "resample": 3},
                   ImageTransform("center_crop", 0.875, "bicubic", "drop")),
    "convnext_224": ({"image_processor_type": "ConvNextImageProcessor", "size": {"shortest_edge": 224},
                      "crop_pct": 0.875, "resample": 3}, ImageTransform("center_crop", 0.875, "bicubic", "drop")),
    "convnext_384": ({"image_processor_type": "ConvNextImageProcessor", "size": {"shortest_edge": 384},
                      "crop_pct": 0.875, "resample": 3}, ImageTransform("stretch", 1.0, "bicubic", "drop")),
    "deit": ({"image_processor_type": "DeiTImageProcessor", "size": {"height": 256, "width": 256},
              "do_center_crop": True, "crop_size": {"height": 224, "width": 224}, "resample": 3},
             ImageTransform("stretch", 0.875, "bicubic", "drop")),
    "fast_vit_nearest": ({"image_processor_type": "ViTImageProcessorFast", "size": {"height": 224, "width": 224},
                          "resample": 0}, ImageTransform("stretch", 1.0, "nearest", "drop")),
    "none": (None, ImageTransform("stretch", 1.0, "bilinear", "drop")),
}


@pytest.mark.one_backend("reads a config dict; no model is built")
@pytest.mark.parametrize("name", sorted(PROCESSORS))
def test_each_hugging_face_image_processor_config_gives_its_transform(name):
    config, expected = PROCESSORS[name]
    assert ImageTransform(**huggingface_image_transform(config)) == expected


def test_a_hugging_face_directory_takes_its_preprocessor_config(tmp_path):
    directory = tmp_path / "hf"
    export_huggingface(_tiny_classifier(), str(directory))
    config, expected = PROCESSORS["clip"]
    with open(directory / "preprocessor_config.json", "w") as handle:
        json.dump({**config, "image_mean": [0.5] * 3, "image_std": [0.5] * 3}, handle)
    assert image_transform(load_checkpoint(str(directory))) == expected
    assert image_transform(load_checkpoint(str(directory), resize_mode="stretch")).resize_mode == "stretch"


def test_a_keras_hub_preset_takes_its_image_converter(tmp_path):
    # The fixture's converter: crop_to_aspect_ratio true, bilinear (keras-hub 0.32.0's defaults).
    model = load_checkpoint(os.path.join(FIXTURES, "vit_classifier"))
    assert image_transform(model) == ImageTransform("center_crop", 1.0, "bilinear", "drop")
    changed = tmp_path / "stretched"
    shutil.copytree(os.path.join(FIXTURES, "vit_classifier"), changed)
    converter = json.loads((changed / "image_converter.json").read_text())
    converter["config"].update(crop_to_aspect_ratio=False, interpolation="nearest")
    (changed / "image_converter.json").write_text(json.dumps(converter))
    assert image_transform(load_checkpoint(str(changed))) == ImageTransform("stretch", 1.0, "nearest", "drop")


def test_a_google_npz_takes_the_papers_evaluation(tmp_path):
    # google-research/vision_transformer's input_pipeline.py evaluates on tf.image.resize(im, [crop, crop]):
    # the whole image stretched to the model's size, bilinear.
    from keras_vit.convert.google import NPZ_EVALUATION

    assert timm_image_transform(NPZ_EVALUATION) == {"resize_mode": "stretch", "crop_fraction": 1.0,
                                                    "interpolation": "bilinear", "alpha": "drop"}


@pytest.mark.one_backend("reads the registry's data; nothing is built")
def test_the_registry_carries_each_sources_transform():
    from keras_vit.presets.registry import PRESETS

    for name, entry in PRESETS.items():
        transform = ImageTransform(**{key: entry["config"][key] for key in ImageTransform().config()})
        if entry["format"] == "huggingface":  # google/vit-*: ViTImageProcessor, 224 or 384, bilinear
            assert transform == ImageTransform("stretch", 1.0, "bilinear", "drop"), name
        elif entry.get("family", "vit") != "vit":  # issue 48's families: tests/presets/test_presets_registry.py
            continue
        else:  # timm 1.0.31's pretrained_cfg: crop_pct 0.9 at 224, 1.0 at 384, bicubic, centre
            expected = 0.9 if entry["image_size"] == 224 else 1.0
            assert transform == ImageTransform("center_crop", expected, "bicubic", "drop"), name


def test_set_image_transform_changes_only_the_transform_and_is_saved(tmp_path):
    model = _tiny_classifier()
    weights = [np.array(w) for w in model.get_weights()]
    model.set_image_transform(crop_fraction=0.9, alpha="drop")
    assert image_transform(model) == ImageTransform("center_crop", 0.9, "bicubic", "drop")
    assert all(np.array_equal(a, b) for a, b in zip(weights, model.get_weights()))
    with pytest.raises(ValueError, match=r"crop_fraction"):
        model.set_image_transform(crop_fraction=0)
    with pytest.raises(ValueError, match=r"set_image_transform` takes"):
        model.set_image_transform(crop=0.9)
    model.save_to_preset(str(tmp_path / "preset"))
    assert image_transform(keras_vit.ViTClassifier.from_preset(str(tmp_path / "preset"))).crop_fraction == 0.9
