"""MaskedPatchPredictor: targets, loss and metric against numpy, seeding, fit and .keras round trips."""

import keras
import numpy as np
import pytest
from keras import ops

import keras_vit
from keras_vit.layers.patch_corruption import KEEP


def _backbone(image_size=8, patch_size=2, num_channels=3, **overrides):
    config = dict(
        image_size=image_size, patch_size=patch_size, num_channels=num_channels,
        hidden_dim=16, num_layers=1, num_heads=2, mlp_dim=32,
    )
    return keras_vit.ViTBackbone(**{**config, **overrides})


def _images(batch=8, size=8, channels=3, seed=0):
    rng = np.random.default_rng(seed)
    images = rng.uniform(0, 255, size=(batch, size, size, channels)).astype("float32")
    # Edge cases of the quantisation: a saturated patch, and pixels outside the
    # input range (clipped to [0, 1] after pixel_scale).
    images[0, :4, :4] = 255.0
    images[1, :4, :4] = -30.0
    images[2, 4:, 4:] = 300.0
    return images


# --- numpy reference --------------------------------------------------------


def _quantise(colour, bits):
    levels = 2**bits
    label = 0
    for value in colour:  # first channel most significant
        label = label * levels + min(int(np.floor(value * levels)), levels - 1)
    return label


def reference_targets(images, patch, target, bits=3, scale=1 / 255, mean=0.5, std=0.5):
    """Per-patch targets by slicing the image directly (no Patches layer)."""
    batch, height, width, _ = images.shape
    unit = np.clip(images.astype(np.float64) * scale, 0.0, 1.0)
    normalised = (images.astype(np.float64) * scale - mean) / std
    out = []
    for b in range(batch):
        row = []
        for top in range(0, height, patch):
            for left in range(0, width, patch):
                block = unit[b, top : top + patch, left : left + patch]
                if target == "mean_color":
                    row.append(_quantise(block.mean(axis=(0, 1)), bits))
                elif target == "mean_color_4x4":
                    cell = patch // 4
                    row.append([
                        _quantise(block[i * cell : (i + 1) * cell, j * cell : (j + 1) * cell].mean(axis=(0, 1)), bits)
                        for i in range(4) for j in range(4)
                    ])
                else:
                    row.append(normalised[b, top : top + patch, left : left + patch].reshape(-1))
        out.append(row)
    return np.asarray(out)


def _log_softmax(logits):
    logits = logits.astype(np.float64)
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def reference_loss(predictions, targets, mode, target):
    corrupted = mode != KEEP
    if target == "pixels":
        per_patch = ((predictions.astype(np.float64) - targets) ** 2).mean(axis=-1)
    else:
        nll = -np.take_along_axis(_log_softmax(predictions), targets[..., None], axis=-1)[..., 0]
        per_patch = nll.mean(axis=-1) if target == "mean_color_4x4" else nll
    return per_patch[corrupted].mean()


# --- tests --------------------------------------------------------------------


@pytest.mark.parametrize(
    "target, patch_size, num_channels, bits",
    [("mean_color", 2, 3, 3), ("mean_color", 4, 1, 2), ("mean_color_4x4", 4, 3, 3), ("pixels", 2, 3, 3)],
)
def test_targets_match_numpy(target, patch_size, num_channels, bits):
    predictor = keras_vit.MaskedPatchPredictor(
        _backbone(patch_size=patch_size, num_channels=num_channels), target=target, color_bits=bits, seed=0
    )
    images = _images(channels=num_channels)
    expected = reference_targets(images, patch_size, target, bits)
    got = ops.convert_to_numpy(predictor.compute_targets(images))
    assert got.shape == expected.shape
    if target == "pixels":
        np.testing.assert_allclose(got, expected, atol=1e-5)
    else:
        np.testing.assert_array_equal(got, expected)
        assert predictor.num_classes == 2 ** (bits * num_channels)
        # The saturated and negative patches land in the top and bottom classes.
        first = got[0, 0] if target == "mean_color" else got[0, 0, 0]
        assert first == predictor.num_classes - 1
        assert (got[1, 0] if target == "mean_color" else got[1, 0, 0]) == 0


@pytest.mark.parametrize("target", ["mean_color", "pixels"])
def test_targets_stay_float32_under_mixed_precision(target):
    images = _images()
    expected = reference_targets(images, 2, target)
    previous = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        predictor = keras_vit.MaskedPatchPredictor(_backbone(), target=target, seed=0)
        got = ops.convert_to_numpy(predictor.compute_targets(images))
    finally:
        keras.mixed_precision.set_global_policy(previous)
    if target == "pixels":
        assert got.dtype == np.float32
        np.testing.assert_allclose(got, expected, atol=1e-5)  # bfloat16 would be off by ~1e-2
    else:
        np.testing.assert_array_equal(got, expected)


def _random_plan(batch, num_patches, rng):
    """A corruption plan drawn in numpy: half of each image's patches corrupted."""
    mode = np.zeros((batch, num_patches), "int32")
    for row in mode:
        row[rng.permutation(num_patches)[: num_patches // 2]] = rng.integers(1, 4, size=num_patches // 2)
    return mode


@pytest.mark.parametrize("target, patch_size", [("mean_color", 2), ("mean_color_4x4", 4), ("pixels", 2)])
def test_loss_and_accuracy_on_corrupted_patches_only(target, patch_size):
    predictor = keras_vit.MaskedPatchPredictor(_backbone(patch_size=patch_size), target=target, seed=2)
    images = _images()
    targets = reference_targets(images, patch_size, target)
    rng = np.random.default_rng(3)
    width = predictor.patch_features if target == "pixels" else predictor.num_classes
    shape = targets.shape[:2] + ((16,) if target == "mean_color_4x4" else ()) + (width,)
    predictions = rng.normal(scale=3.0, size=shape).astype("float32")
    mode = _random_plan(*targets.shape[:2], rng)

    def loss_of(values):
        y_pred = {"predictions": ops.convert_to_tensor(values), "mode": ops.convert_to_tensor(mode)}
        return float(ops.convert_to_numpy(predictor.compute_loss(x=images, y_pred=y_pred)))

    loss = loss_of(predictions)
    np.testing.assert_allclose(loss, reference_loss(predictions, targets, mode, target), rtol=1e-5)

    # Scrambling the predictions of uncorrupted patches leaves the loss as it is ...
    noise = rng.normal(scale=50.0, size=predictions.shape).astype("float32")
    keep = (mode == KEEP).reshape(mode.shape + (1,) * (predictions.ndim - 2))
    np.testing.assert_allclose(loss_of(np.where(keep, noise, predictions)), loss, rtol=1e-6)
    # ... and scrambling the corrupted ones does not.
    assert abs(loss_of(np.where(keep, predictions, noise)) - loss) > 1e-3

    y_pred = {"predictions": ops.convert_to_tensor(predictions), "mode": ops.convert_to_tensor(mode)}
    logs = predictor.compute_metrics(images, None, y_pred)
    if target == "pixels":
        assert "accuracy" not in logs
    else:
        correct = predictions.argmax(axis=-1) == targets
        if target == "mean_color_4x4":
            correct = correct.mean(axis=-1)
        expected = correct[mode != KEEP].mean()
        np.testing.assert_allclose(float(ops.convert_to_numpy(logs["accuracy"])), expected, rtol=1e-6)


@pytest.mark.parametrize("target", ["mean_color", "mean_color_4x4"])
def test_rows_of_weight_zero_count_in_neither_loss_nor_accuracy(target):
    # A JAX job pads a global batch with rows of sample weight 0; the numbers must be those of the real rows.
    patch_size = 4 if target == "mean_color_4x4" else 2
    predictor = keras_vit.MaskedPatchPredictor(_backbone(patch_size=patch_size), target=target, seed=2)
    images = _images()
    targets = reference_targets(images, patch_size, target)
    rng = np.random.default_rng(5)
    shape = targets.shape[:2] + ((16,) if target == "mean_color_4x4" else ()) + (predictor.num_classes,)
    predictions = rng.normal(scale=3.0, size=shape).astype("float32")
    mode = _random_plan(*targets.shape[:2], rng)
    real = np.arange(len(images)) < len(images) - 1  # the last row is padding
    hits = np.eye(predictor.num_classes, dtype="float32")[targets] * 100.0  # each patch predicted exactly right
    predictions[real, ::3] = hits[real, ::3]  # a third of the real rows' patches right, so the expected share is > 0
    predictions[~real] = hits[~real]  # the padding all right: counted, it would lift the accuracy
    y_pred = {"predictions": ops.convert_to_tensor(predictions), "mode": ops.convert_to_tensor(mode)}
    weight = ops.convert_to_tensor(real.astype("float32"))
    logs = predictor.compute_metrics(images, None, y_pred, sample_weight=weight)
    correct = predictions.argmax(axis=-1) == targets
    if target == "mean_color_4x4":
        correct = correct.mean(axis=-1)
    expected = correct[real][mode[real] != KEEP].mean()
    np.testing.assert_allclose(float(ops.convert_to_numpy(logs["accuracy"])), expected, rtol=1e-6)
    loss = float(ops.convert_to_numpy(predictor.compute_loss(x=images, y_pred=y_pred, sample_weight=weight)))
    np.testing.assert_allclose(loss, reference_loss(predictions[real], targets[real], mode[real], target), rtol=1e-5)


def test_same_seed_same_corruption_in_the_model():
    images = _images()
    keras.utils.set_random_seed(0)
    first = keras_vit.MaskedPatchPredictor(_backbone(), seed=5)
    keras.utils.set_random_seed(1)  # different weights, same corruption seed
    second = keras_vit.MaskedPatchPredictor(_backbone(), seed=5)
    other = keras_vit.MaskedPatchPredictor(_backbone(), seed=6)
    a, b, c = first(images), second(images), other(images)
    for key in ("mode", "source"):
        np.testing.assert_array_equal(ops.convert_to_numpy(a[key]), ops.convert_to_numpy(b[key]))
    assert np.any(ops.convert_to_numpy(a["mode"]) != ops.convert_to_numpy(c["mode"]))
    assert tuple(a["predictions"].shape) == (8, 16, 512)  # RGB at 3 bits
    # Exactly half of the 16 patches of every image are corrupted.
    np.testing.assert_array_equal((ops.convert_to_numpy(a["mode"]) != KEEP).sum(axis=1), 8)


def test_composes_the_backbone_and_shares_its_weights():
    backbone = _backbone()
    predictor = keras_vit.MaskedPatchPredictor(backbone, seed=0)
    assert predictor.backbone is backbone
    backbone_ids = {id(v) for v in backbone.weights}
    assert backbone_ids <= {id(v) for v in predictor.weights}
    own = [v.path for v in predictor.trainable_weights if id(v) not in backbone_ids]
    assert sorted(own) == ["corruption/mask_token", "head/bias", "head/kernel"]


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="target"):
        keras_vit.MaskedPatchPredictor(_backbone(), target="colour")
    with pytest.raises(ValueError, match="multiple of 4"):
        keras_vit.MaskedPatchPredictor(_backbone(patch_size=2), target="mean_color_4x4")
    with pytest.raises(ValueError, match="color_bits"):
        keras_vit.MaskedPatchPredictor(_backbone(), color_bits=0)
    with pytest.raises(ValueError, match="remove the `loss`"):
        keras_vit.MaskedPatchPredictor(_backbone()).compile(loss="mse")


def test_save_load_then_classifier_from_its_backbone(tmp_path):
    # Training with `fit` is covered by tests/mpp/test_pretrain_cli.py.
    keras.utils.set_random_seed(0)
    predictor = keras_vit.MaskedPatchPredictor(_backbone(), seed=3)
    images = _images()
    predictor(images)  # advance the seed generator, as training would

    path = str(tmp_path / "mpp.keras")
    predictor.save(path)
    loaded = keras.saving.load_model(path)
    assert isinstance(loaded, keras_vit.MaskedPatchPredictor)
    assert loaded.get_config() == predictor.get_config()
    for saved, restored in zip(predictor.weights, loaded.weights):
        assert saved.path == restored.path
        np.testing.assert_array_equal(ops.convert_to_numpy(saved), ops.convert_to_numpy(restored))
    # The seed generator's state is not a weight: a loaded model draws its
    # corruptions from `seed` again, like a freshly built one with the same
    # weights.
    fresh = keras_vit.MaskedPatchPredictor.from_config(predictor.get_config())
    fresh.set_weights(predictor.get_weights())
    a, b = fresh(images), loaded(images)
    np.testing.assert_array_equal(ops.convert_to_numpy(a["mode"]), ops.convert_to_numpy(b["mode"]))
    np.testing.assert_array_equal(ops.convert_to_numpy(a["source"]), ops.convert_to_numpy(b["source"]))
    np.testing.assert_allclose(
        ops.convert_to_numpy(a["predictions"]), ops.convert_to_numpy(b["predictions"]), atol=1e-5
    )

    classifier = keras_vit.ViTClassifier(backbone=loaded.backbone, num_classes=3)
    for source, copy in zip(loaded.backbone.weights, classifier.get_layer(loaded.backbone.name).weights):
        np.testing.assert_array_equal(ops.convert_to_numpy(source), ops.convert_to_numpy(copy))
    probabilities = ops.convert_to_numpy(classifier(images))
    np.testing.assert_allclose(probabilities, 1 / 3, atol=1e-6)  # zero-initialised head
