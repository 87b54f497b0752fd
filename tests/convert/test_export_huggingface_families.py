"""Export of SigLIP, CLIP and DINOv2 backbones as their Hugging Face vision towers, reloaded by transformers.

Each family's source is a transformers model built in the test with random
weights; it is converted to keras_vit, exported with `export_huggingface`,
and the export is reloaded with `transformers.AutoModel` and
`AutoImageProcessor`: the processor's pixels through the reloaded model give
keras_vit's outputs on the raw images (within 1e-4).
"""

import json

import keras
import numpy as np
import pytest

from keras_vit import ViTBackbone, ViTClassifier
from keras_vit.convert import export_huggingface, read_safetensors
from tests.convert.helpers import TOLERANCE, max_abs_diff, predict
from tests.convert.test_convert_huggingface_families import CLIP_MEAN, CLIP_STD, IMAGES, _build, _convert

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

DINO_MEAN, DINO_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def _families():
    return {
        "siglip": (lambda: _build(transformers.SiglipVisionConfig, transformers.SiglipVisionModel, 10,
                                  intermediate_size=32), (0.5,) * 3, (0.5,) * 3, "SiglipVisionModel"),
        "siglip_no_head": (lambda: _build(transformers.SiglipVisionConfig, transformers.SiglipVisionModel, 14,
                                          intermediate_size=32, vision_use_head=False),
                           (0.5,) * 3, (0.5,) * 3, "SiglipVisionModel"),
        "clip": (lambda: _build(transformers.CLIPVisionConfig, transformers.CLIPVisionModel, 11,
                                intermediate_size=32), CLIP_MEAN, CLIP_STD, "CLIPVisionModel"),
        "dinov2": (lambda: _build(transformers.Dinov2Config, transformers.Dinov2Model, 12, mlp_ratio=2),
                   DINO_MEAN, DINO_STD, "Dinov2Model"),
        "dinov2_registers": (lambda: _build(transformers.Dinov2WithRegistersConfig,
                                            transformers.Dinov2WithRegistersModel, 13, mlp_ratio=2,
                                            num_register_tokens=2),
                             DINO_MEAN, DINO_STD, "Dinov2WithRegistersModel"),
    }


@pytest.mark.parametrize("family", ["siglip", "siglip_no_head", "clip", "dinov2", "dinov2_registers"])
def test_export_reloads_in_transformers_with_the_same_outputs(family, tmp_path):
    build, mean, std, class_name = _families()[family]
    source = build()
    backbone = _convert(source, mean, std)
    # A stretch at the model's size leaves model-size images as they are, so the processor's pixels are the
    # model's own normalisation of them.
    backbone.set_image_transform(resize_mode="stretch", crop_fraction=1.0)
    config = export_huggingface(backbone, tmp_path / "exported")
    assert config["architectures"] == [class_name]
    assert config.get("vision_use_head", False) == (family == "siglip")
    # save_pretrained's names: transformers loads the file without a missing or unexpected key.
    source.save_pretrained(tmp_path / "saved")
    assert sorted(read_safetensors(tmp_path / "exported" / "model.safetensors")) == sorted(
        read_safetensors(tmp_path / "saved" / "model.safetensors"))
    reloaded = transformers.AutoModel.from_pretrained(tmp_path / "exported").eval()
    assert type(reloaded).__name__ == class_name
    processor = transformers.AutoImageProcessor.from_pretrained(tmp_path / "exported")
    pixels = processor(images=list(IMAGES), return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        result = reloaded(pixel_values=pixels)
    tokens = predict(backbone, IMAGES)
    if family == "clip":
        # CLIP normalises the class token only (pooler_output); last_hidden_state is the last block's.
        assert max_abs_diff(tokens[:, 0], result.pooler_output.numpy()) <= TOLERANCE
        last_block = backbone.feature_extractor(blocks=[-1])
        before_norm = keras.ops.convert_to_numpy(last_block(IMAGES.astype("float32"))["block_1"])
        assert max_abs_diff(before_norm, result.last_hidden_state.numpy()) <= TOLERANCE
    else:
        assert max_abs_diff(tokens, result.last_hidden_state.numpy()) <= TOLERANCE
    if family == "siglip":
        assert max_abs_diff(predict(backbone.pooled_model(), IMAGES), result.pooler_output.numpy()) <= TOLERANCE


def _tiny(**kwargs):
    return ViTBackbone(**{"image_size": 16, "patch_size": 4, "hidden_dim": 16, "num_layers": 2, "num_heads": 2,
                          "mlp_dim": 32, **kwargs})


@pytest.mark.one_backend("the export refuses before it writes anything: no backend op")
@pytest.mark.parametrize("parts, message", [
    (dict(qk_norm=True), r"qk_norm=True.*export_timm"),
    (dict(use_distillation_token=True), r"distillation token.*export_timm"),
    (dict(attention_pooling=True, use_class_token=False, image_size=(12, 20)),
     r"SiglipVisionModel because its image \(12x20\).*export_timm"),
])
def test_parts_transformers_lacks_are_refused_naming_the_timm_export(parts, message, tmp_path):
    with pytest.raises(ValueError, match=message):
        export_huggingface(_tiny(**parts), tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.one_backend("the export refuses before it writes anything: no backend op")
def test_a_family_classifier_is_refused_naming_the_backbone_export(tmp_path):
    classifier = ViTClassifier(_tiny(attention_pooling=True, use_class_token=False), num_classes=3, pooling="map")
    with pytest.raises(ValueError, match=r"SiglipVisionModel.*model\.backbone.*export_timm"):
        export_huggingface(classifier, tmp_path / "out")


@pytest.mark.one_backend("reads the written config: no backend op")
def test_registers_without_layer_scale_export_as_dinov2_with_identity_scales(tmp_path):
    backbone = _tiny(num_register_tokens=3, prefix_position_embedding=False)
    config = export_huggingface(backbone, tmp_path / "out")
    assert config["model_type"] == "dinov2_with_registers" and config["num_register_tokens"] == 3
    written = read_safetensors(tmp_path / "out" / "model.safetensors")
    np.testing.assert_array_equal(written["encoder.layer.0.layer_scale1.lambda1"], np.ones(16, np.float32))
    assert json.loads((tmp_path / "out" / "config.json").read_text())["architectures"] == ["Dinov2WithRegistersModel"]
