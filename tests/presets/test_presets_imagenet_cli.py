"""decode_predictions, the ImageNet class file, and the `keras-vit presets` / `keras-vit predict` commands."""

import numpy as np
import pytest

import keras_vit
from keras_vit.cli import main
from keras_vit.presets import imagenet_classes
from tests.presets.preset_helpers import tiny_classifier

# Well-known ImageNet-1k indices (the order of every 1000-class ViT head), from the ILSVRC-2012 devkit order.
KNOWN = {0: ("n01440764", "tench"), 1: ("n01443537", "goldfish"), 207: ("n02099601", "golden retriever"),
         281: ("n02123045", "tabby"), 999: ("n15075141", "toilet tissue")}


def test_class_file():
    classes = imagenet_classes()
    assert len(classes) == 1000 and len({synset for synset, _ in classes}) == 1000
    synsets = [synset for synset, _ in classes]
    assert synsets == sorted(synsets)  # ILSVRC-2012 class indices follow the sorted WordNet ids
    for index, (synset, name) in KNOWN.items():
        assert classes[index][0] == synset and classes[index][1].split(",")[0] == name


def test_decode_predictions():
    scores = np.full((2, 1000), 1e-4, dtype="float32")
    scores[0, [207, 281, 0]] = [0.7, 0.2, 0.05]
    scores[1, 999] = 0.9
    decoded = keras_vit.decode_predictions(scores, top=3)
    assert [(s, n) for s, n, _ in decoded[0]] == [KNOWN[207], KNOWN[281], KNOWN[0]]
    assert decoded[0][0][2] == pytest.approx(0.7) and decoded[1][0][:2] == KNOWN[999]
    assert len(keras_vit.decode_predictions(scores[0])[0]) == 5  # one image, default top-5
    with pytest.raises(ValueError, match=r"expects scores of shape \(batch, 1000\).*Received: predictions of shape \(2, 10\)"):
        keras_vit.decode_predictions(np.zeros((2, 10)))
    with pytest.raises(ValueError, match="`top` must be an int in"):
        keras_vit.decode_predictions(scores, top=0)


def test_presets_command(capsys):
    assert main(["presets", "--backbones", "--verbose"]) == 0
    out = capsys.readouterr().out
    assert "vit_h14_in21k" in out and "630,764,800" in out and "hf://google/vit-huge-patch14-224-in21k" in out
    assert "vit_b16_in21k_ft_in1k " not in out  # has a head
    assert main(["presets"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in keras_vit.presets.list()) and f"{len(keras_vit.presets.list())} presets" in out


def test_predict_command(tmp_path, capsys):
    from PIL import Image

    model = tiny_classifier(num_classes=1000, seed=3)
    bias = np.zeros(1000, dtype="float32")
    bias[207] = 50.0  # the head says "golden retriever" whatever the image
    head = model.get_layer("head")
    head.set_weights([np.zeros_like(head.get_weights()[0]), bias])
    model.save_to_preset(tmp_path / "preset")
    image = tmp_path / "photo.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (50, 70, 3), dtype=np.uint8)).save(image)
    assert main(["predict", str(image), "--preset", str(tmp_path / "preset"), "--top", "2"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0] == f"{image}:" and lines[1].startswith("  1. golden retriever (n02099601): 1.0000")
    assert len(lines) == 3
    assert main(["predict", str(tmp_path / "missing.jpg"), "--preset", str(tmp_path / "preset")]) == 2
    assert "no such image file" in capsys.readouterr().err
