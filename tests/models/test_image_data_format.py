"""Models and layers take (batch, height, width, channels) images whatever `image_data_format` says.

`keras.config.set_image_data_format("channels_first")` (or keras.json) must
change nothing: every model kind gives the same outputs on the same NHWC
images when it was built under one global setting and is called, or loaded
from `.keras`, under the other, and when it is built and called under
`channels_first`. The configurations (head, image height and width,
channels, seed) are drawn from one seeded generator, once for each model
kind and each kind of hybrid stem (the BiT root alone, the BiT ResNet, a
`keras.applications`-style CNN).
"""

import os

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit import layers
from keras_vit.data import AugmentPolicy, resize_images
from keras_vit.layers import fused
from keras_vit.models import applications_stem
from keras_vit.models.variants import hybrid_variant_names, parse_variant

FORMATS = ("channels_last", "channels_first")
TINY = dict(hidden_dim=16, num_layers=1, num_heads=2, mlp_dim=32)
# The layout is what is tested, not the size: narrow BiT stems with the variant's number of stages, one unit
# each (a first unit with a projection, and every later stage's stride 2).
NARROW_STEM = dict(width=8, num_groups=4)
PLAIN_KINDS = ("classifier", "backbone", "features", "masked_patch_predictor")
APPLICATION = "applications_stem"
SEED = 41


def to_numpy(x):
    return np.asarray(keras.ops.convert_to_numpy(x))


@pytest.fixture
def image_data_format():
    """`set(format)` for the test; the global format from before comes back afterwards, pass or fail."""
    previous = keras.config.image_data_format()
    try:
        yield keras.config.set_image_data_format
    finally:
        keras.config.set_image_data_format(previous)


def _tiny_application(include_top=False, weights=None, input_shape=None, name="tiny_cnn"):
    """A stand-in for a `keras.applications` constructor, small enough to build in a test.

    Like those, it builds Keras layers that take their layout from the global
    image data format when they are constructed (Conv2D, MaxPooling2D), and
    picks the BatchNormalization axis from it as ResNet50V2 does. Output
    stride 4.
    """
    assert not include_top and weights is None
    channel_axis = 3 if keras.config.image_data_format() == "channels_last" else 1
    inputs = keras.Input(input_shape)
    x = keras.layers.Conv2D(8, 3, strides=2, padding="same", name="conv")(inputs)
    x = keras.layers.BatchNormalization(axis=channel_axis, name="bn")(x)
    x = keras.layers.MaxPooling2D(2, name="pool")(keras.layers.Activation("relu")(x))
    return keras.Model(inputs, x, name=name)


def _stem_kinds(rng):
    """One hybrid variant per kind of BiT stem: the root alone, and the root with stages (drawn among them).

    With one unit per stage, R26, R50+ViT-B/16 and R50+ViT-L/32 differ only in their number of stages (3 or
    4), which runs no other code: one of them per run keeps the test cheap.
    """
    root_alone = [name for name in sorted(hybrid_variant_names()) if not parse_variant(name)["stem"]["stage_depths"]]
    staged = [name for name in sorted(hybrid_variant_names()) if name not in root_alone]
    return (str(rng.choice(root_alone)), str(rng.choice(staged)))


# Each group of cases shares one drawn image size and channel count: JAX compiles every new shape of an
# operation (and of a random initializer) once, so kinds that share shapes cost one compilation, not one each.
# Every ViT here has the same width.
_RNG = np.random.default_rng(SEED)
# Sizes from 6 up (a 4 x 4 image of 4 channels would look channels-first to the input checks), height and
# width drawn apart: a height/width swap would show.
PLAIN_PATCH = int(_RNG.choice([2, 4]))
PLAIN_IMAGES = (tuple(int(s) for s in _RNG.choice(range(2 * PLAIN_PATCH, 17, PLAIN_PATCH), 2)), int(_RNG.choice([1, 3, 4])))
# A multiple of the largest output stride of the stems, 32.
STEM_IMAGES = (tuple(int(s) for s in _RNG.choice([32, 64], 2)), int(_RNG.choice([1, 3, 4])))


def _draw_model_cases(rng):
    """One drawn configuration per model kind: each plain kind, each kind of stem (with a drawn head)."""
    cases = []
    for kind in PLAIN_KINDS:
        cases.append(dict(kind=kind, head=kind, image_size=PLAIN_IMAGES[0], patch_size=PLAIN_PATCH,
                          num_channels=PLAIN_IMAGES[1], seed=int(rng.integers(2**16))))
    # The stems' heads in a drawn order, each head once over the three stems.
    heads = rng.permutation(["classifier", "backbone", "features"]).tolist()
    for kind, head in zip((APPLICATION,) + _stem_kinds(rng), heads):
        cases.append(dict(kind=kind, head=head, image_size=STEM_IMAGES[0], patch_size=None,
                          num_channels=STEM_IMAGES[1], seed=int(rng.integers(2**16))))
    return cases


MODEL_CASES = _draw_model_cases(_RNG)


def _build(case):
    """The model of `case`, its weights drawn from `case["seed"]` (zero-initialised heads included)."""
    keras.utils.set_random_seed(case["seed"])
    common = dict(image_size=case["image_size"], num_channels=case["num_channels"], **TINY)
    if case["kind"] in PLAIN_KINDS:
        backbone = keras_vit.ViTBackbone(patch_size=case["patch_size"], pixel_mean=0.4, pixel_std=0.3, **common)
    elif case["kind"] == APPLICATION:
        stem = applications_stem(_tiny_application, num_channels=case["num_channels"])
        backbone = keras_vit.ViTBackbone(patch_size=2, stem=stem, **common)
    else:
        stem = {"stage_depths": (1,) * len(parse_variant(case["kind"])["stem"]["stage_depths"]), **NARROW_STEM}
        backbone = keras_vit.ViTBackbone.from_variant(case["kind"], stem=stem, **common)
    head = case["head"]
    if head == "classifier":
        model = keras_vit.ViTClassifier(backbone=backbone, num_classes=3)
    elif head == "features":
        model = backbone.feature_extractor(attention_scores=True)
    elif head == "masked_patch_predictor":
        model = keras_vit.MaskedPatchPredictor(backbone, color_bits=2, seed=case["seed"])
    else:
        model = backbone
    rng = np.random.default_rng(case["seed"])
    for weight in model.trainable_weights:
        weight.assign(rng.normal(scale=0.3, size=weight.shape).astype("float32"))
    return model


def _outputs(model, case, images, predict=False):
    """Everything the model computes from NHWC `images`, as numpy arrays by name.

    The plain classifier also classifies raw images of another size: with
    `predict`, through `predict` (which resizes them itself, and traces
    anew under the format of the moment in a model that has not predicted
    yet); otherwise called on them resized by `keras_vit.data.resize_images`,
    the resizing `predict` documents. (`predict` once: it compiles the
    whole model on JAX and TensorFlow.)
    """
    if case["head"] == "masked_patch_predictor":
        # The corruption plan comes from the layer's seed generator: start each call from the seed's state.
        model.corruption.seed_generator.state.assign(np.array([case["seed"], 0], "uint32"))
        outputs = model(images)
        outputs = {**outputs, "targets": model.compute_targets(images)}
    else:
        outputs = model(images)
    if not isinstance(outputs, dict):
        outputs = {"output": outputs}
    if case["kind"] == "classifier":
        height, width = case["image_size"]
        larger = np.random.default_rng(case["seed"]).uniform(0, 255, (2, height + 5, width + 9, case["num_channels"]))
        larger = larger.astype("float32")
        if predict:
            outputs["resized"] = model.predict(larger, verbose=0)
        else:
            outputs["resized"] = model(resize_images(larger, (height, width)))
    return {name: to_numpy(value) for name, value in outputs.items()}


def _assert_same(got, expected, what):
    assert got and set(got) <= set(expected), what
    for name in got:
        np.testing.assert_allclose(got[name], expected[name], rtol=1e-6, atol=1e-6, err_msg=f"{what}: {name}")


@pytest.mark.parametrize("case", MODEL_CASES, ids=lambda case: f"{case['kind']}-{case['head']}")
def test_model_outputs_do_not_depend_on_the_global_image_data_format(case, image_data_format, tmp_path):
    images = np.random.default_rng(case["seed"] + 1).uniform(
        0, 255, (2, *case["image_size"], case["num_channels"])).astype("float32")
    image_data_format("channels_last")
    model = _build(case)
    expected = _outputs(model, case, images)
    path = os.path.join(tmp_path, "model.keras")
    model.save(path)

    image_data_format("channels_first")
    _assert_same(_outputs(model, case, images), expected, "built channels_last, called channels_first")
    loaded = keras.saving.load_model(path)
    _assert_same(_outputs(loaded, case, images, predict=True), expected, "saved channels_last, loaded channels_first")
    rebuilt = _build(case)
    rebuilt.set_weights(model.get_weights())
    _assert_same(_outputs(rebuilt, case, images), expected, "built and called channels_first")

    image_data_format("channels_last")
    _assert_same(_outputs(rebuilt, case, images), expected, "built channels_first, called channels_last")


# === The layers that touch images, one drawn configuration each ===


def _draw_layer_cases(rng):
    size = lambda: int(rng.integers(5, 13))  # noqa: E731 - odd and even sizes: SAME pads asymmetrically on even
    patch = int(rng.choice([2, 3]))
    channels = int(rng.choice([1, 3, 4]))
    # The BiT root and a first unit of a stage as the stems above have them (the same shapes: compiled once).
    (height, width), stem_channels = STEM_IMAGES
    stage = int(rng.integers(2))  # the first stage keeps the resolution, the second halves it
    unit = dict(filters=32 * 2**stage, strides=1 + stage, bottleneck_filters=8 * 2**stage, num_groups=4)
    return {
        "patches": (layers.Patches, dict(patch_size=patch), (2, patch * 3, patch * 2, channels)),
        "std_conv_same": (
            layers.StdConv2D,
            dict(filters=int(rng.integers(2, 6)), kernel_size=int(rng.choice([1, 3, 7])), strides=int(rng.choice([1, 2])),
                 use_bias=True),
            (2, size(), size(), channels),
        ),
        "std_conv_valid": (layers.StdConv2D, dict(filters=3, kernel_size=3, strides=int(rng.choice([1, 2])),
                                                  padding="valid"), (2, size(), size(), channels)),
        "bit_root": (layers.BiTRoot, dict(filters=8, num_groups=4), (2, height, width, stem_channels)),
        "bit_unit": (layers.BiTBottleneckUnit, unit, (2, height // 4, width // 4, 8 * 4**stage)),
        "image_normalization": (
            layers.ImageNormalization,
            dict(mean=[float(v) for v in rng.uniform(0.3, 0.6, 3)], std=[float(v) for v in rng.uniform(0.2, 0.3, 3)],
                 num_channels=3),
            (2, size(), size(), 3),
        ),
    }


LAYER_CASES = _draw_layer_cases(_RNG)


@pytest.mark.parametrize("name", sorted(LAYER_CASES))
def test_layer_outputs_do_not_depend_on_the_global_image_data_format(name, image_data_format):
    layer_class, kwargs, shape = LAYER_CASES[name]
    rng = np.random.default_rng(len(name))
    images = rng.uniform(0, 255, shape).astype("float32")
    image_data_format("channels_last")
    layer = layer_class(**kwargs)
    layer.build(shape)
    for weight in layer.weights:
        weight.assign(rng.normal(0.2, 0.5, size=weight.shape).astype("float32"))
    expected = to_numpy(layer(images))

    image_data_format("channels_first")
    np.testing.assert_allclose(to_numpy(layer(images)), expected, rtol=1e-6, atol=1e-6)
    rebuilt = layer_class.from_config(layer.get_config())
    rebuilt.build(shape)
    rebuilt.set_weights(layer.get_weights())
    np.testing.assert_allclose(to_numpy(rebuilt(images)), expected, rtol=1e-6, atol=1e-6)


def test_fused_conv2d_takes_channels_last_under_either_format(image_data_format):
    rng = np.random.default_rng(SEED)
    x = rng.normal(size=(2, 9, 8, 3)).astype("float32")
    kernel = rng.normal(size=(3, 3, 3, 4)).astype("float32")
    results = []
    for data_format in FORMATS:
        image_data_format(data_format)
        results.append(to_numpy(fused.conv2d(x, kernel, 2)))
    assert results[0].shape == (2, 4, 3, 4)
    np.testing.assert_allclose(results[1], results[0], rtol=1e-6, atol=1e-6)


@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="only a TensorFlow graph has unknown image sizes")
def test_bit_layers_of_unknown_size_take_channels_last_under_channels_first(image_data_format):
    # Without a static height and width, StdConv2D and the root's pool fall back to the backend's SAME padding.
    import tensorflow as tf

    root = layers.BiTRoot(filters=8, num_groups=4)
    root.build((None, 16, 12, 3))
    images = np.random.default_rng(SEED).uniform(0, 255, (2, 16, 12, 3)).astype("float32")
    traced = tf.function(root.call, input_signature=[tf.TensorSpec((None, None, None, 3), "float32")])
    image_data_format("channels_last")
    expected = to_numpy(traced(images))
    image_data_format("channels_first")
    traced = tf.function(root.call, input_signature=[tf.TensorSpec((None, None, None, 3), "float32")])
    np.testing.assert_allclose(to_numpy(traced(images)), expected, rtol=1e-6, atol=1e-6)


@pytest.mark.one_backend("the layout that keras_vit passes to Keras' image layers")
def test_augment_policy_layers_take_channels_last_under_either_format(image_data_format):
    # RandAugment and CutMix move pixels along height and width: under channels_first they would take the
    # width for channels unless told the layout.
    rng = np.random.default_rng(SEED)
    images = rng.uniform(0, 255, (4, 12, 10, 3)).astype("float32")
    labels = np.eye(3, dtype="float32")[rng.integers(3, size=4)]
    results = {}
    for policy in (AugmentPolicy(randaugment=True), AugmentPolicy(cutmix=1.0)):
        for data_format in FORMATS:
            image_data_format(data_format)
            results[data_format] = policy.apply_layers(images, labels, num_classes=3, seed=SEED)
        for got, expected in zip(results["channels_first"], results["channels_last"]):
            assert got.shape == expected.shape
            np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)
