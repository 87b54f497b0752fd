"""Distilled DeiT both ways with Hugging Face: `DeiTForImageClassificationWithTeacher` and `DeiTModel`.

transformers builds each with random weights (no download); keras_vit reads
the saved directory with `load_checkpoint`, and its export is reloaded with
transformers' `AutoModel*` classes. Both directions give the source's outputs
within 1e-4: the averaged logits of the two heads, each head's own logits,
and the encoder's tokens.
"""

import keras
import numpy as np
import pytest

from keras_vit import ViTBackbone, ViTClassifier
from keras_vit.convert import export_huggingface, load_checkpoint, read_safetensors
from tests.convert.helpers import TOLERANCE, max_abs_diff, predict

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
# 12x20 pixels in 4x4 patches: a non-square grid (3x5), as the source's own interpolation is not involved.
IMAGES = np.random.default_rng(7).integers(0, 256, size=(2, 12, 20, 3)).astype(np.uint8)


def _deit(model_class, seed, **kwargs):
    torch.manual_seed(seed)
    config = transformers.DeiTConfig(hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=32, image_size=[12, 20], patch_size=4, **kwargs)
    model = model_class(config).eval()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # norms, biases and tokens random too: every tensor matters
        for parameter in model.parameters():
            parameter.add_(0.1 * torch.randn(parameter.shape, generator=generator))
    return model


def _pixels(images):
    x = (images.astype(np.float32) / 255.0 - np.asarray(MEAN, np.float32)) / np.asarray(STD, np.float32)
    return torch.from_numpy(x.transpose(0, 3, 1, 2).copy())


def _save(model, directory):
    model.save_pretrained(directory)
    # The model's own normalisation of model-size images: a stretch at that size changes no pixel.
    processor = transformers.ViTImageProcessor(do_resize=True, size={"height": 12, "width": 20}, resample=2,
                                               image_mean=list(MEAN), image_std=list(STD))
    processor.save_pretrained(directory)
    return str(directory)


@pytest.fixture(scope="module")
def teacher_pair(tmp_path_factory):
    source = _deit(transformers.DeiTForImageClassificationWithTeacher, 0, num_labels=3)
    directory = _save(source, tmp_path_factory.mktemp("deit") / "source")
    classifier = load_checkpoint(directory, activation=None)
    return source, classifier


def test_deit_with_teacher_reads_with_both_heads(teacher_pair):
    source, classifier = teacher_pair
    assert isinstance(classifier, ViTClassifier) and classifier.backbone.use_distillation_token
    with torch.no_grad():
        expected = source(pixel_values=_pixels(IMAGES))
    assert max_abs_diff(predict(classifier, IMAGES), expected.logits.numpy()) <= TOLERANCE
    # Each head on its own: timm's `head` is transformers' cls_classifier, `head_dist` its distillation_classifier.
    outputs = classifier.head_outputs_model().predict(IMAGES.astype("float32"), verbose=0)
    assert max_abs_diff(outputs["head"], expected.cls_logits.numpy()) <= TOLERANCE
    assert max_abs_diff(outputs["head_distillation"], expected.distillation_logits.numpy()) <= TOLERANCE


def test_deit_with_teacher_exports_and_reloads_in_transformers(teacher_pair, tmp_path):
    source, classifier = teacher_pair
    config = export_huggingface(classifier, tmp_path / "exported")
    assert config["model_type"] == "deit"
    assert config["architectures"] == ["DeiTForImageClassificationWithTeacher"]
    # save_pretrained's names exactly: nothing missing or unexpected when transformers loads it.
    source.save_pretrained(tmp_path / "saved")
    assert sorted(read_safetensors(tmp_path / "exported" / "model.safetensors")) == sorted(
        read_safetensors(tmp_path / "saved" / "model.safetensors"))
    reloaded = transformers.AutoModelForImageClassification.from_pretrained(tmp_path / "exported").eval()
    assert type(reloaded).__name__ == "DeiTForImageClassificationWithTeacher"
    with torch.no_grad():
        result = reloaded(pixel_values=_pixels(IMAGES))
    assert max_abs_diff(predict(classifier, IMAGES), result.logits.numpy()) <= TOLERANCE


def test_deit_model_backbone_both_ways(tmp_path):
    source = _deit(transformers.DeiTModel, 1)  # its tanh pooler is not part of the backbone (ignored, as for ViT)
    with torch.no_grad():
        expected = source(pixel_values=_pixels(IMAGES)).last_hidden_state.numpy()
    backbone = load_checkpoint(_save(source, tmp_path / "source"))
    assert isinstance(backbone, ViTBackbone) and backbone.use_distillation_token
    tokens = predict(backbone, IMAGES)
    assert max_abs_diff(tokens, expected) <= TOLERANCE
    config = export_huggingface(backbone, tmp_path / "exported")
    assert config["architectures"] == ["DeiTModel"]
    reloaded = transformers.AutoModel.from_pretrained(tmp_path / "exported").eval()
    with torch.no_grad():
        again = reloaded(pixel_values=_pixels(IMAGES)).last_hidden_state.numpy()
    assert max_abs_diff(tokens, again) <= TOLERANCE


@pytest.mark.one_backend("refused from the state dict's names, before any model is built")
def test_deit_with_one_head_is_refused_naming_include_head(tmp_path):
    source = _deit(transformers.DeiTForImageClassification, 2, num_labels=3)
    with pytest.raises(ValueError, match=r"one classifier.*include_head=False"):
        load_checkpoint(_save(source, tmp_path / "source"))
