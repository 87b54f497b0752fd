"""Whole heads per device: the per-head qkv column order under model parallelism, and its refusals.

This test looks at layouts only and runs on every backend (fake device
names: nothing is placed on them). The refusals on 8 real JAX devices (models
built under `model_parallel()`, the command line's refusal and the fix it
names, a converted preset split over whole heads) need a child process with
`--xla_force_host_platform_device_count=8`: the one test_jax_distribution.py
starts makes them too (`test_model_parallel_refuses_split_heads_and_splits_whole_heads`
there), so JAX starts with 8 devices once for both files.
"""

import keras

from keras_vit import ViTBackbone
from keras_vit.distribution import layout_errors, layout_map


def _mesh(model_parallelism, data_parallelism=2):
    count = model_parallelism * data_parallelism
    return keras.distribution.DeviceMesh((data_parallelism, model_parallelism), ("batch", "model"),
                                         devices=[f"cpu:{i}" for i in range(count)])


def _backbone(**overrides):
    return ViTBackbone(**{"image_size": 8, "patch_size": 4, "hidden_dim": 48, "num_layers": 2, "num_heads": 6,
                          "mlp_dim": 96, **overrides})


def test_layout_errors_name_a_model_axis_that_cuts_heads():
    model = _backbone()
    assert layout_errors(model, layout_map(_mesh(2))) == []
    assert layout_errors(model, layout_map(_mesh(3))) == []
    errors = layout_errors(model, layout_map(_mesh(4)))  # 8 devices, model axis 4; 6 heads
    assert len(errors) == 2, errors  # one per block
    assert "transformer_block_0/attention" in errors[0] and "transformer_block_1/attention" in errors[1]
    # The valid sizes divide both the 6 heads and the 8 devices.
    assert "does not divide the 6 attention heads" in errors[0] and "Use a model axis of 1 or 2 " in errors[0]
    three_heads = layout_errors(_backbone(hidden_dim=24, num_heads=3, num_layers=1), layout_map(_mesh(2)))
    assert len(three_heads) == 1 and "Use a model axis of 1 " in three_heads[0]
    assert "data_parallel()" in three_heads[0]
    # Paths and shapes alone carry no head count: only the weight checks run.
    assert layout_errors([(w.path, w.shape) for w in model.weights], layout_map(_mesh(4))) == []

