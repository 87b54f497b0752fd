"""The model contract, as Keras' `run_layer_test` is for layers and keras-hub's `run_backbone_test` for backbones.

`run_model_contract(build, images, ...)` checks one keras_vit model kind on
the current backend: its config round trip, `.keras` and preset round trips
with identical outputs, `predict` on a dataset equal to `predict` on arrays,
one `fit` step that trains, the parameter count against an independent count,
and the same model under `mixed_bfloat16` (finite, and its policy kept
through `.keras` and a preset).

`run_model_options_contract(build, images, ...)` checks what a model offers
beyond that: `quantize("int8")` (its `.keras` and preset round trips),
`enable_lora` with `save_lora_weights` / `load_lora_weights`, a fit step of
the adapted model under `set_remat`, and `with_head` / `with_image_size`
where the model has them.
"""

import json
import tempfile

import keras
import numpy as np

from tests.helpers import save_and_reload


def _numpy(x):
    return keras.tree.map_structure(keras.ops.convert_to_numpy, x)


def _assert_same(actual, expected, atol=0.0):
    for got, want in zip(keras.tree.flatten(_numpy(actual)), keras.tree.flatten(_numpy(expected))):
        np.testing.assert_allclose(got, want, atol=atol, rtol=0)


class _Batches(keras.utils.PyDataset):
    """Images only, in batches: what `predict` reads from a dataset."""

    def __init__(self, images, batch_size):
        super().__init__()
        self.images, self.batch_size = images, batch_size

    def __len__(self):
        return -(-len(self.images) // self.batch_size)

    def __getitem__(self, index):
        return self.images[index * self.batch_size:(index + 1) * self.batch_size]


def vit_parameter_count(hidden_dim, num_layers, mlp_dim, num_patches, patch_features, num_prefix_tokens=1,
                        num_register_tokens=0, class_token=True, num_classes=None, gap_norm=False):
    """Parameters of a plain ViT, counted from the paper's architecture (not from keras_vit's code)."""
    d = hidden_dim
    embedding = patch_features * d + d + (d if class_token else 0) + num_register_tokens * d
    position = (num_patches + num_prefix_tokens) * d
    block = 2 * 2 * d + (d * 3 * d + 3 * d) + (d * d + d) + (d * mlp_dim + mlp_dim) + (mlp_dim * d + d)
    total = embedding + position + num_layers * block + 2 * d
    if num_classes:
        total += d * num_classes + num_classes + (2 * d if gap_norm else 0)
    return total


def run_model_contract(build, images, targets=None, loss="mse", expected_params=None, output_atol=0.0,
                       deterministic=None):
    """Check the model contract on the current backend; raises AssertionError on the first breach.

    Args:
        build: callable `build(dtype=None) -> model`, seeded, building the
            model kind under test (the dtype policy passed to the model).
        images: float32 array `(batch, h, w, c)` of [0, 255] pixels.
        targets: array or `None`. `fit` targets; `None` fits on images
            alone (the masked patch predictor's own loss).
        loss: the `compile` loss when `targets` is given.
        expected_params: int or `None`. The independent parameter count.
        output_atol: float. Tolerance of the round trips (0: identical).
        deterministic: callable `(model, images) -> outputs` or `None`. For
            a model whose `predict` draws anew at every call (the masked
            patch predictor corrupts random patches), the outputs the round
            trips compare; `None` compares `predict`.
    """
    def outputs_of(model_):
        if deterministic is not None:
            return deterministic(model_, images)
        # A direct call, not `predict`: `predict` compiles a function for each of the ~8 models built here
        # (TensorFlow traced for most of this contract's time); the compiled paths are `run_model_contract`'s.
        return _numpy(model_(images, training=False))

    model = build()
    expected = outputs_of(model)

    # Config round trip: the same config back, the same outputs with the same weights.
    config = model.get_config()
    rebuilt = type(model).from_config(config)
    assert json.dumps(rebuilt.get_config(), sort_keys=True, default=str) == json.dumps(
        config, sort_keys=True, default=str), "from_config(get_config()) does not reproduce the config"
    rebuilt.set_weights(model.get_weights())
    _assert_same(outputs_of(rebuilt), expected, output_atol)

    # The parameter count, against a count that does not come from the model.
    if expected_params is not None:
        assert model.count_params() == expected_params, (model.count_params(), expected_params)

    # predict on a dataset equals predict on the arrays (for a drawing model: the same structure of outputs).
    from_dataset = model.predict(_Batches(images, 2), verbose=0)
    if deterministic is None:
        _assert_same(from_dataset, expected, 1e-5)
    else:
        from_arrays = model.predict(images, verbose=0)
        assert [np.shape(a) for a in keras.tree.flatten(from_dataset)] == [
            np.shape(a) for a in keras.tree.flatten(from_arrays)]

    # .keras and preset round trips: identical outputs.
    with tempfile.TemporaryDirectory() as directory:
        _assert_same(outputs_of(save_and_reload(model, directory)), expected, output_atol)
        model.save_to_preset(f"{directory}/preset")
        _assert_same(outputs_of(type(model).from_preset(f"{directory}/preset")), expected, output_atol)

    # One fit step trains: a finite loss, and the weights move.
    model.compile(optimizer=keras.optimizers.SGD(0.05), **({} if targets is None else {"loss": loss}))
    before = [np.array(w) for w in _numpy(model.trainable_weights)]
    history = model.fit(images, targets, batch_size=len(images), epochs=1, verbose=0)
    assert np.all(np.isfinite(history.history["loss"]))
    after = _numpy(model.trainable_weights)
    assert any(not np.array_equal(b, a) for b, a in zip(before, after)), "fit changed no weight"

    # mixed_bfloat16: finite outputs, and the policy survives .keras and a preset.
    mixed = build(dtype="mixed_bfloat16")
    # A direct call, as `outputs_of`: a `predict` here compiled one more function per model kind (issue 50);
    # the compiled bfloat16 paths are test_vit_models.py's fit and test_model_base.py's round trips.
    outputs = _numpy(mixed(images, training=False))
    assert all(np.all(np.isfinite(np.asarray(o, dtype="float32"))) for o in keras.tree.flatten(outputs))
    with tempfile.TemporaryDirectory() as directory:
        assert save_and_reload(mixed, directory).dtype_policy.name == "mixed_bfloat16"
        mixed.save_to_preset(f"{directory}/preset")
        assert type(mixed).from_preset(f"{directory}/preset").dtype_policy.name == "mixed_bfloat16"
    return model


def _fit_step(model, images, targets, loss):
    model.compile(optimizer=keras.optimizers.SGD(0.05), **({} if targets is None else {"loss": loss}))
    history = model.fit(images, targets, batch_size=len(images), epochs=1, verbose=0)
    assert np.all(np.isfinite(history.history["loss"]))


def run_model_options_contract(build, images, targets=None, loss="mse", deterministic=None):
    """Check quantize, LoRA, remat, `with_head` and `with_image_size` on the current backend.

    Arguments as `run_model_contract`'s.
    """
    def outputs_of(model_):
        if deterministic is not None:
            return deterministic(model_, images)
        # A direct call, not `predict`: `predict` compiles a function for each of the ~8 models built here
        # (TensorFlow traced for most of this contract's time); the compiled paths are `run_model_contract`'s.
        return _numpy(model_(images, training=False))

    # int8: the quantized layers and the outputs survive .keras and a preset.
    quantized = build()
    quantized.quantize("int8")
    assert quantized.quantized_layers() and set(quantized.quantized_layers().values()) == {"int8"}
    expected = outputs_of(quantized)
    with tempfile.TemporaryDirectory() as directory:
        reloaded = save_and_reload(quantized, directory)
        assert reloaded.quantized_layers() == quantized.quantized_layers()
        _assert_same(outputs_of(reloaded), expected)
        quantized.save_to_preset(f"{directory}/preset")
        from_preset = type(quantized).from_preset(f"{directory}/preset")
        assert from_preset.quantized_layers() == quantized.quantized_layers()
        _assert_same(outputs_of(from_preset), expected)

    # LoRA: the factors saved on one model and loaded on a copy of its base give the same outputs.
    adapted = build()
    base_weights = adapted.get_weights()
    adapted.enable_lora(2)
    assert adapted.lora_enabled and adapted.lora_layers()
    rng = np.random.default_rng(0)
    for layer in adapted.lora_layers():
        layer.lora_kernel_b.assign(rng.normal(0, 0.1, layer.lora_kernel_b.shape).astype("float32"))
    expected = outputs_of(adapted)
    with tempfile.TemporaryDirectory() as directory:
        adapted.save_lora_weights(f"{directory}/adapter.lora.npz")
        copy = build()
        copy.set_weights(base_weights)
        copy.load_lora_weights(f"{directory}/adapter.lora.npz")
        _assert_same(outputs_of(copy), expected, 1e-5)
    # LoRA and remat in one training step: the adapted model trains with its blocks recomputed in the
    # backward pass (they went through keras.remat). One compiled step instead of two (issue 50):
    # `run_model_contract`'s fit trains every weight without remat, and test_remat.py checks that remat
    # trains exactly as without.
    adapted.set_remat(True)
    rematerialised, real_remat = [], keras.remat
    keras.remat = lambda function: rematerialised.append(function) or real_remat(function)
    try:
        _fit_step(adapted, images, targets, loss)
    finally:
        keras.remat = real_remat
    assert rematerialised, "set_remat(True): no block went through keras.remat in the fit step"

    model = build()
    if hasattr(model, "with_image_size"):
        height, width = images.shape[1:3]
        bigger = model.with_image_size((2 * height, 2 * width))
        doubled = np.repeat(np.repeat(images, 2, axis=1), 2, axis=2)
        assert tuple(bigger.image_size if hasattr(bigger, "image_size") else bigger.backbone.image_size) == (
            2 * height, 2 * width)
        outputs = bigger(doubled, training=False)
        assert all(np.all(np.isfinite(o)) for o in keras.tree.flatten(_numpy(outputs)))
        _assert_same(outputs_of(model.with_image_size((height, width))), outputs_of(model))
    if hasattr(model, "with_head"):
        five = model.with_head(5)
        probabilities = _numpy(five(images, training=False))
        assert probabilities.shape == (len(images), 5)
        if model.activation == "softmax":  # a new head is zero: the uniform distribution
            np.testing.assert_allclose(probabilities, 0.2, atol=1e-6)
