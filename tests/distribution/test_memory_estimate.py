"""The README's ViT-H/14 memory estimate, recomputed from the real model.

The README does the arithmetic by hand; this test recounts it from the
weights of an actual ViT-H/14 (built without allocating, see test_layout.py)
and the layout map on a 2x4 mesh, so a change to the model, the layout map
or the text's numbers shows up here. The activation count per image is
checked against XLA by `measure_activation_memory.py` (a script, not a
test: it compiles ViT-H-wide blocks).
"""

import math

import keras

from keras_vit import ViTClassifier
from keras_vit.distribution import layout_map

GIB = 2**30
MODEL_PARALLELISM = 4
# The numbers as printed in the README's "Scale-out" section.
README = {
    "total_params": 632_045_800,
    "replicated_params": 249_320,
    "params_per_device": 158_198_440,
    "weights_gib": 0.589,
    "weights_grads_adamw_gib": 2.357,
    "data_parallel_weights_grads_adamw_gib": 9.418,
    "activations_per_image_per_block": 6_320_144,
    "activations_per_image_per_block_sharded": 2_566_916,
    "activations_per_image_gib": 0.306,
    "activations_16_images_gib": 4.896,
    "total_16_images_gib": 7.253,
    # Calibrated with XLA's measured 1.53 x the count (measure_activation_memory.py).
    "xla_factor": 1.53,
    "calibrated_total_16_images_gib": 9.848,
    "data_parallel_calibrated_total_4_images_gib": 14.029,
}


def _vit_h14_specs():
    with keras.StatelessScope(initialize_variables=False):
        model = ViTClassifier.from_variant("ViT-H/14", num_classes=1000)
        specs = [(weight.path, tuple(weight.shape)) for weight in model.weights]
        config = model.backbone
        dims = {
            "tokens": config.grid_size[0] * config.grid_size[1] + config.num_prefix_tokens,
            "width": config.hidden_dim, "heads": config.num_heads, "mlp": config.mlp_dim,
            "layers": config.num_layers,
        }
    keras.utils.clear_session(free_memory=False)
    return specs, dims


def test_weights_and_optimizer_state_per_device():
    specs, _ = _vit_h14_specs()
    mesh = keras.distribution.DeviceMesh((2, MODEL_PARALLELISM), ("batch", "model"), [f"cpu:{i}" for i in range(8)])
    layouts = layout_map(mesh)
    total = per_device = replicated = 0
    for path, shape in specs:
        size = math.prod(shape)
        layout = layouts[path]
        split = MODEL_PARALLELISM if layout is not None and "model" in layout.axes else 1
        total += size
        per_device += size // split
        replicated += size if split == 1 else 0
    assert total == README["total_params"]
    assert replicated == README["replicated_params"]
    assert per_device == README["params_per_device"]
    assert round(per_device * 4 / GIB, 3) == README["weights_gib"]
    # float32 weights + gradients + AdamW's two moments = 16 bytes per parameter.
    assert round(per_device * 16 / GIB, 3) == README["weights_grads_adamw_gib"]
    assert round(total * 16 / GIB, 3) == README["data_parallel_weights_grads_adamw_gib"]


def test_activation_count():
    _, dims = _vit_h14_specs()
    t, d, h, f = dims["tokens"], dims["width"], dims["heads"], dims["mlp"]
    assert (t, d, h, f, dims["layers"]) == (257, 1280, 16, 5120, 32)
    # Saved for the backward pass of one block, per image: the block input,
    # LN1 output, q|k|v, attention probabilities, attention output (before
    # proj), residual, LN2 output, fc1 output and GELU output.
    per_block = t * d + t * d + 3 * t * d + h * t * t + t * d + t * d + t * d + t * f + t * f
    assert per_block == README["activations_per_image_per_block"]
    # With the model axis of 4: the LN inputs/outputs and residual (4 x T x D)
    # stay whole; q|k|v, the per-head probabilities, the attention output and
    # the MLP hidden activations are split.
    sharded = 4 * t * d + (3 * t * d + h * t * t + t * d + 2 * t * f) // MODEL_PARALLELISM
    assert sharded == README["activations_per_image_per_block_sharded"]
    per_image_gib = sharded * dims["layers"] * 4 / GIB
    assert round(per_image_gib, 3) == README["activations_per_image_gib"]
    assert round(16 * per_image_gib, 3) == README["activations_16_images_gib"]
    assert round(16 * per_image_gib + README["weights_grads_adamw_gib"], 3) == README["total_16_images_gib"]
    factor = README["xla_factor"]
    assert round(factor * 16 * per_image_gib + README["weights_grads_adamw_gib"], 3) == (
        README["calibrated_total_16_images_gib"])
    # Data parallelism alone on the same 8 devices and global batch: 4 images
    # per device, nothing split.
    unsharded_image_gib = per_block * dims["layers"] * 4 / GIB
    assert round(factor * 4 * unsharded_image_gib + README["data_parallel_weights_grads_adamw_gib"], 3) == (
        README["data_parallel_calibrated_total_4_images_gib"])
