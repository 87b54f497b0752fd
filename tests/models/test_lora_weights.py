"""LoRA factors saved and loaded on the model (`save_lora_weights` / `load_lora_weights`).

Expected outputs come from numpy: every adapted Dense computes
`x (W + (alpha / rank) A B) + b` with the base kernel `W` it had before LoRA.
"""

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit.utils.seeds import set_random_seed

RANK, ALPHA = 2, 6.0


def tiny_classifier(seed=0, num_layers=2):
    set_random_seed(seed)
    return keras_vit.ViTClassifier.from_variant(
        "ViT-Ti/16", image_size=16, patch_size=8, hidden_dim=16, num_layers=num_layers, num_heads=2, mlp_dim=32,
        num_classes=3)


def numpy_of(tensor):
    return np.asarray(keras.ops.convert_to_numpy(tensor))


def adapted(model, seed=1):
    """LoRA on `model` with random A and B (B starts at zero: random makes the update count)."""
    model.enable_lora(RANK, alpha=ALPHA)
    rng = np.random.default_rng(seed)
    for layer in model.lora_layers():
        layer.lora_kernel_a.assign(rng.normal(0, 0.3, layer.lora_kernel_a.shape).astype("float32"))
        layer.lora_kernel_b.assign(rng.normal(0, 0.3, layer.lora_kernel_b.shape).astype("float32"))
    return model


def images(count=3):
    return np.random.default_rng(2).uniform(0, 255, (count, 16, 16, 3)).astype("float32")


def test_lora_weights_round_trip_computes_kernel_plus_scaled_product(tmp_path):
    base = tiny_classifier()
    base_kernels = [numpy_of(layer.kernel) for layer in base.lora_layers()]
    model = adapted(tiny_classifier())
    expected = numpy_of(model.predict(images(), verbose=0))
    path = str(tmp_path / "adapter.lora.npz")
    model.save_lora_weights(path)

    loaded = tiny_classifier()  # the same base weights, no LoRA yet: the file brings rank and alpha
    loaded.load_lora_weights(path)
    assert loaded.lora_enabled
    np.testing.assert_allclose(numpy_of(loaded.predict(images(), verbose=0)), expected, atol=1e-6, rtol=0)
    # Each adapted Dense against numpy: x (W + alpha / rank A B) + b, W the kernel before LoRA.
    x = np.random.default_rng(3).normal(size=(2, 16)).astype("float32")
    for layer, kernel, original in zip(loaded.lora_layers(), base_kernels, model.lora_layers()):
        a, b = numpy_of(original.lora_kernel_a), numpy_of(original.lora_kernel_b)
        if layer.kernel.shape[0] != 16:
            continue  # fc2 takes mlp_dim features
        want = x.astype("float64") @ (kernel + ALPHA / RANK * (a.astype("float64") @ b)) + numpy_of(layer.bias)
        np.testing.assert_allclose(numpy_of(layer(x)), want, atol=1e-5, rtol=0)
        np.testing.assert_array_equal(numpy_of(layer.lora_kernel_a), a)
        np.testing.assert_array_equal(numpy_of(layer.lora_kernel_b), b)


def test_lora_weights_over_merged_kernels_restore_the_run(tmp_path):
    # What a resumed run does: the weights file holds kernels with LoRA merged (Keras' Dense saves them so),
    # and the LoRA file puts A and B back and takes their product out of the kernels.
    model = adapted(tiny_classifier())
    expected = numpy_of(model.predict(images(), verbose=0))
    model.save_weights(str(tmp_path / "run.weights.h5"))
    model.save_lora_weights(str(tmp_path / "run.lora.npz"))

    resumed = tiny_classifier(seed=5)
    resumed.enable_lora(RANK, alpha=ALPHA)
    resumed.load_weights(str(tmp_path / "run.weights.h5"))
    resumed.load_lora_weights(str(tmp_path / "run.lora.npz"), kernels_merged=True)
    np.testing.assert_allclose(numpy_of(resumed.predict(images(), verbose=0)), expected, atol=1e-5, rtol=0)
    for got, want in zip(resumed.lora_layers(), model.lora_layers()):
        np.testing.assert_array_equal(numpy_of(got.lora_kernel_b), numpy_of(want.lora_kernel_b))
        np.testing.assert_allclose(numpy_of(got.kernel), numpy_of(want.kernel), atol=1e-6, rtol=0)
    # The base kernel is the one before merging: zeroing B gives the un-adapted model back.
    for layer in resumed.lora_layers():
        layer.lora_kernel_b.assign(np.zeros(layer.lora_kernel_b.shape, "float32"))
    base = tiny_classifier()
    np.testing.assert_allclose(numpy_of(resumed.lora_layers()[0].kernel), numpy_of(base.lora_layers()[0].kernel),
                               atol=1e-5, rtol=0)


def test_a_lora_file_that_does_not_fit_is_refused_with_the_fix(tmp_path):
    model = adapted(tiny_classifier())
    path = str(tmp_path / "adapter.lora.npz")
    model.save_lora_weights(path)

    other_rank = tiny_classifier()
    other_rank.enable_lora(RANK + 1)
    with pytest.raises(ValueError, match=r"rank 2.*rank 3.*enable_lora\(2"):
        other_rank.load_lora_weights(path)
    fewer_blocks = tiny_classifier(num_layers=1)
    with pytest.raises(ValueError, match=r"does not fit this model.*transformer_block_1"):
        fewer_blocks.load_lora_weights(path)
    assert not fewer_blocks.lora_enabled  # nothing changed on a refusal
    not_lora = tmp_path / "weights.npz"
    np.savez(not_lora, kernel=np.zeros(3))
    with pytest.raises(ValueError, match=r"not a LoRA weights file.*save_lora_weights"):
        tiny_classifier().load_lora_weights(str(not_lora))
    with pytest.raises(ValueError, match=r"LoRA is not enabled.*enable_lora"):
        tiny_classifier().save_lora_weights(str(tmp_path / "none.lora.npz"))
    # The file is an .npz archive whatever its name: written under exactly the name given, and it loads.
    model.save_lora_weights(str(tmp_path / "adapter.bin"))
    assert (tmp_path / "adapter.bin").exists() and not (tmp_path / "adapter.bin.npz").exists()
    tiny_classifier().load_lora_weights(str(tmp_path / "adapter.bin"))
