"""Measure what XLA keeps per image per ViT-H/14 block in a training step.

Not a test (it compiles ViT-H-wide models, ~1 minute): run it to check the
activation count of the README's memory estimate against XLA's buffer
assignment for the gradient of the loss, on one device.

    KERAS_BACKEND=jax PYTHONPATH=. python tests/distribution/measure_activation_memory.py

Compiling for 1 and 2 blocks at batch 2 and 4 and differencing cancels the
weights, their gradients and everything outside the blocks, leaving the
memory one more image costs in one more block.
"""

import os

os.environ["KERAS_BACKEND"] = "jax"

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import keras  # noqa: E402

from keras_vit import ViTClassifier  # noqa: E402

COUNTED = 6_320_144  # elements per image per block, README / test_memory_estimate.py


def temp_bytes(num_layers, batch_size):
    keras.utils.clear_session()
    model = ViTClassifier.from_variant("ViT-H/14", num_layers=num_layers, num_classes=1000, activation=None)
    trainable = [v.value for v in model.trainable_variables]
    non_trainable = [v.value for v in model.non_trainable_variables]

    def loss(trainable, images, labels):
        logits, _ = model.stateless_call(trainable, non_trainable, images, training=True)
        return keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True).mean()

    images = jax.ShapeDtypeStruct((batch_size, 224, 224, 3), jnp.float32)
    labels = jax.ShapeDtypeStruct((batch_size,), jnp.int32)
    compiled = jax.jit(jax.grad(loss)).lower(trainable, images, labels).compile()
    return compiled.memory_analysis().temp_size_in_bytes


def main():
    sizes = {(layers, batch): temp_bytes(layers, batch) for layers in (1, 2) for batch in (2, 4)}
    per_image_per_block = ((sizes[2, 4] - sizes[2, 2]) - (sizes[1, 4] - sizes[1, 2])) / 2
    counted = COUNTED * 4
    print(f"XLA ({jax.default_backend()}): {per_image_per_block / 2**20:.1f} MiB per image per block; "
          f"counted: {counted / 2**20:.1f} MiB; ratio {per_image_per_block / counted:.2f}")


if __name__ == "__main__":
    main()
