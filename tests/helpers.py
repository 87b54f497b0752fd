"""The contract every keras_vit layer and model keeps (after Keras' own `run_layer_test`).

`run_layer_contract` checks, for one layer configuration:
  - `get_config` round trip: `from_config(get_config())` rebuilds an
    equivalent layer whose config is identical;
  - symbolic and eager output shapes agree with `compute_output_shape`;
  - the number of trainable weights is the one expected;
  - one `fit` step runs and changes the trainable weights;
  - a `.keras` save and load gives identical outputs.
"""

import os
import tempfile

import keras
import numpy as np


def _as_tuple(shape):
    return tuple(None if d is None else int(d) for d in shape)


def run_layer_contract(
    layer_class,
    init_kwargs,
    input_shape,
    expected_output_shape,
    expected_num_trainable_weights,
    input_range=(-1.0, 1.0),
    call_kwargs=None,
    extra_inputs=None,
    seed=0,
):
    """Check the layer contract; raises AssertionError on the first breach.

    Args:
        layer_class: the layer's class.
        init_kwargs: dict. Constructor arguments.
        input_shape: tuple. Concrete input shape, batch included.
        expected_output_shape: tuple, or a list of tuples for a layer that
            returns several tensors (e.g. outputs and attention scores).
            Concrete shapes, batch included.
        expected_num_trainable_weights: int. Number of trainable variables.
        input_range: tuple. Range of the uniform random inputs.
        call_kwargs: dict. Extra call arguments that are not tensors.
        extra_inputs: dict. Further tensor call arguments by name (e.g.
            `PatchCorruption`'s `mode` and `source`), as numpy arrays; they
            become inputs of their own in the model that is fitted and saved.
        seed: int. Seed of the inputs.
    """
    call_kwargs = call_kwargs or {}
    extra_inputs = extra_inputs or {}
    several = isinstance(expected_output_shape, list)
    expected_shapes = [tuple(s) for s in expected_output_shape] if several else [tuple(expected_output_shape)]
    rng = np.random.default_rng(seed)
    inputs = rng.uniform(*input_range, size=input_shape).astype("float32")

    def as_list(outputs):
        if several:
            assert isinstance(outputs, (tuple, list)) and len(outputs) == len(expected_shapes), (
                f"expected {len(expected_shapes)} outputs, got {type(outputs).__name__}"
            )
            return list(outputs)
        return [outputs]

    # Config round trip.
    layer = layer_class(**init_kwargs)
    config = layer.get_config()
    for key, value in init_kwargs.items():
        assert key in config, f"{layer_class.__name__}.get_config() is missing constructor argument {key!r}"
    rebuilt = layer_class.from_config(config)
    assert rebuilt.get_config() == config, "from_config(get_config()) does not reproduce the config"

    # Symbolic vs eager vs compute_output_shape.
    symbolic_input = keras.Input(batch_shape=input_shape)
    symbolic_extra = {
        name: keras.Input(batch_shape=value.shape, dtype=str(value.dtype), name=name)
        for name, value in extra_inputs.items()
    }
    symbolic_outputs = as_list(layer(symbolic_input, **symbolic_extra, **call_kwargs))
    for output, shape in zip(symbolic_outputs, expected_shapes):
        assert _as_tuple(output.shape) == shape, f"symbolic shape {output.shape} != expected {shape}"
    if not several:
        assert _as_tuple(layer.compute_output_shape(input_shape)) == expected_shapes[0]
    eager_outputs = as_list(layer(inputs, **extra_inputs, **call_kwargs))
    for output, shape in zip(eager_outputs, expected_shapes):
        output = keras.ops.convert_to_numpy(output)
        assert output.shape == shape, f"eager shape {output.shape} != expected {shape}"
        assert np.all(np.isfinite(output))

    assert len(layer.trainable_weights) == expected_num_trainable_weights, (
        f"{len(layer.trainable_weights)} trainable weights, expected {expected_num_trainable_weights}"
    )

    # One fit step through a model wrapping the layer.
    model_inputs = [symbolic_input, *symbolic_extra.values()]
    model = keras.Model(model_inputs if extra_inputs else symbolic_input,
                        symbolic_outputs if several else symbolic_outputs[0])
    data = [inputs, *extra_inputs.values()] if extra_inputs else inputs
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    before = [keras.ops.convert_to_numpy(w).copy() for w in model.trainable_weights]
    targets = [rng.normal(size=shape).astype("float32") for shape in expected_shapes]
    history = model.fit(data, targets if several else targets[0], batch_size=input_shape[0], epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])
    after = [keras.ops.convert_to_numpy(w) for w in model.trainable_weights]
    if expected_num_trainable_weights:
        assert any(not np.array_equal(b, a) for b, a in zip(before, after)), "fit did not change any weight"

    # .keras save and load: identical outputs.
    expected = [keras.ops.convert_to_numpy(output) for output in as_list(model(data))]
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "model.keras")
        model.save(path)
        restored = keras.saving.load_model(path)
    for output, reference in zip(as_list(restored(data)), expected):
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(output), reference)
    return layer


def save_and_reload(model, directory):
    """Save `model` as `.keras` under `directory` and load it back."""
    path = os.path.join(directory, "model.keras")
    model.save(path)
    return keras.saving.load_model(path)


def on_accelerator():
    """Whether Keras computes on a GPU or TPU in this process (the device check runs the tests there).

    A reloaded model is compiled again, and on an accelerator the convolution and matmul kernels are
    chosen anew by autotuning, so its outputs may differ from the saved model's in the last bits; on the
    CPU they are the same kernels and the outputs are identical.
    """
    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        return jax.default_backend() != "cpu"
    if backend == "torch":
        import torch

        return torch.cuda.is_available()
    if backend == "tensorflow":
        import tensorflow as tf

        return bool(tf.config.list_physical_devices("GPU") or tf.config.list_physical_devices("TPU"))
    return False


def assert_same_outputs_after_reload(reloaded, saved):
    """Identical on the CPU; within float32's last bits (1e-6 relative) where kernels are autotuned."""
    if on_accelerator():
        np.testing.assert_allclose(reloaded, saved, rtol=1e-6, atol=1e-6)
    else:
        np.testing.assert_array_equal(reloaded, saved)
