"""Constructor arguments of the layers and models: every rule comes from keras_vit.utils.values.

The rules themselves are tested in tests/utils/test_values.py; here, that each layer and model
applies them (numpy ints are sizes, bools are not, strings are not numbers), that a rule two
places need is checked once, and that no layer or model file spells its own integer test.
"""

import ast
import pathlib

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit import layers

PACKAGE = pathlib.Path(keras_vit.__file__).parent
TINY = dict(image_size=8, patch_size=4, hidden_dim=8, num_layers=1, num_heads=2, mlp_dim=8)


def _inline_int_checks(path, root=PACKAGE):
    """`isinstance(x, int)` / `isinstance(x, (int, float))` calls in one file, as `file:line` under `root`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance" and len(node.args) == 2:
            kinds = node.args[1].elts if isinstance(node.args[1], ast.Tuple) else [node.args[1]]
            if any(getattr(kind, "id", None) in ("int", "float") for kind in kinds):
                found.append(f"{path.relative_to(root).as_posix()}:{node.lineno}")
    return found


@pytest.mark.one_backend("reads source files")
def test_no_layer_or_model_spells_its_own_integer_check():
    files = sorted((PACKAGE / "layers").glob("*.py")) + sorted((PACKAGE / "models").glob("*.py"))
    assert len(files) > 15
    found = [hit for path in files for hit in _inline_int_checks(path)]
    assert found == [], f"use keras_vit.utils.values (is_int, check_count, to_pair, ...) instead: {found}"


@pytest.mark.one_backend("reads source files")
def test_the_static_check_finds_the_spellings_it_forbids(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text(
        "def f(x, y):\n"
        "    ok = isinstance(x, str)\n"
        "    return isinstance(x, int) and not isinstance(x, bool) or isinstance(y, (int, float))\n"
    )
    assert _inline_int_checks(sample, root=tmp_path) == ["sample.py:3", "sample.py:3"]


def test_classifier_refuses_a_bool_representation_size():
    backbone = keras_vit.ViTBackbone(**TINY)
    with pytest.raises(ValueError, match=r"`representation_size` must be a positive int or None\. "
                                         r"Received: representation_size=True"):
        keras_vit.ViTClassifier(backbone, num_classes=3, representation_size=True)
    with pytest.raises(ValueError, match=r"Received: num_classes=True"):
        keras_vit.ViTClassifier(backbone, num_classes=True)
    classifier = keras_vit.ViTClassifier(backbone, num_classes=3, representation_size=np.int64(4))
    assert classifier.get_layer("pre_logits").units == 4


def test_heads_that_do_not_share_the_width_are_refused_by_one_rule():
    # The backbone asks its attention layer before any weight exists; both say the same thing.
    with pytest.raises(ValueError) as from_layer:
        layers.MultiHeadSelfAttention(num_heads=3)(np.zeros((1, 4, 10), "float32"))
    with pytest.raises(ValueError) as from_backbone:
        keras_vit.ViTBackbone(**{**TINY, "hidden_dim": 10, "num_heads": 3})
    assert str(from_backbone.value) == str(from_layer.value)
    assert "`hidden_dim` must be divisible by `num_heads`" in str(from_layer.value)
    assert "Received: hidden_dim=10, num_heads=3" in str(from_layer.value)


def test_size_pairs_take_numpy_ints_everywhere_as_to_pair_does():
    assert layers.Patches(np.int64(4)).patch_size == (4, 4)
    assert layers.PatchEncoder(8, grid_size=(np.int32(2), 3)).grid_size == (2, 3)
    conv = layers.StdConv2D(4, kernel_size=np.int64(3), strides=(1, np.int64(2)))
    assert (conv.kernel_size, conv.strides) == ((3, 3), (1, 2))
    assert all(type(v) is int for v in conv.kernel_size + conv.strides)
    with pytest.raises(ValueError, match=r"`strides` must hold positive integers\. Received: strides=\(1, 0\)"):
        layers.StdConv2D(4, kernel_size=3, strides=(1, 0))


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: layers.ImageNormalization(mean="0.5"), "`mean` must be a number or a sequence of numbers"),
        (lambda: layers.ImageNormalization(std=float("nan")), "`std` must hold finite numbers"),
        (lambda: layers.ImageNormalization(std=(0.5, 0.0, 0.5), num_channels=3), "`std` must be positive"),
        (lambda: layers.ImageNormalization(num_channels=0), "`num_channels` must be a positive int or None"),
        (lambda: layers.ImageNormalization(scale="1/255"), "`scale` must be a finite number"),
        (lambda: layers.TokenPooling("gap", num_prefix_tokens=1.5), "`num_prefix_tokens` must be an int >= 0"),
        (lambda: layers.StdConv2D(4, 3, epsilon=True), "`epsilon` must be a number >= 0"),
        (lambda: layers.LayerScale(float("nan")), "`init_value` must be a finite number"),
        (lambda: layers.PatchCorruption(corruption_rate=True), r"`corruption_rate` must be a number in \(0, 1\]"),
        (lambda: layers.PatchCorruption(mask_rate="0.5"), r"`mask_rate` must be a number in \[0, 1\]"),
        (lambda: layers.BiTBottleneckUnit(64.0), "`filters` must be a positive int"),
    ],
)
def test_layers_refuse_what_the_rules_refuse(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_a_single_mean_with_per_channel_stds_normalizes_every_channel():
    pixels = np.array([[[[0.0, 127.5, 255.0]]]], "float32")
    mean, std = 0.5, np.array([0.25, 0.5, 1.0])
    expected = (pixels / 255.0 - mean) / std  # numpy, by the definition
    layer = layers.ImageNormalization(mean=mean, std=tuple(std), num_channels=3)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(layer(pixels)), expected, atol=1e-6)
