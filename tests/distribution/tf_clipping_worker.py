"""Child process of test_tf_distribution.py: clipped and accumulated training, one device against two replicas.

TensorFlow fixes its logical devices when it first touches the CPU, so this
runs in its own interpreter with two logical CPU devices. It trains the same
small ViT from the same initial weights on the same batches on one device
and under `tf.distribute.MirroredStrategy` over the two devices, with
keras_vit's optimizers (which must match) and Keras' own (which do not), and
prints one JSON line: per run the epoch losses, the final weights' largest
distance from the one-device run, or the error it raised; and how far the
first batch's gradient is above each clipping threshold (so clipping bites).
"""

import contextlib
import json
import os
import sys

os.environ["KERAS_BACKEND"] = "tensorflow"

import tensorflow as tf  # noqa: E402

_cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(_cpu, [tf.config.LogicalDeviceConfiguration()] * 2)

import keras  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from keras_vit import ViTClassifier  # noqa: E402
from keras_vit import optimizers  # noqa: E402

BATCH_SIZE = 8
CONFIG = {"image_size": 8, "patch_size": 2, "num_channels": 1, "hidden_dim": 32, "num_layers": 1, "num_heads": 4,
          "mlp_dim": 64, "num_classes": 10, "dropout": 0.0}
# Far below the gradients' norms and values (the report says how far), so
# every step clips.
GLOBAL_CLIPNORM, CLIPNORM, CLIPVALUE = 0.1, 0.05, 0.01

# name -> (optimizer factory, epochs). The same factory is trained on one
# device and on two replicas.
RUNS = {
    # The paper recipe's optimizer: SGD with momentum, global-norm clipping, accumulation.
    "sgd_global_clipnorm_accumulated": (
        lambda module: module.SGD(0.1, momentum=0.9, global_clipnorm=GLOBAL_CLIPNORM, gradient_accumulation_steps=2),
        2),
    "adamw_global_clipnorm": (lambda module: module.AdamW(1e-2, global_clipnorm=GLOBAL_CLIPNORM), 2),
    "sgd_clipnorm": (lambda module: module.SGD(0.1, momentum=0.9, clipnorm=CLIPNORM), 1),
    "sgd_clipvalue": (lambda module: module.SGD(0.1, momentum=0.9, clipvalue=CLIPVALUE), 1),
}

# The runs trained with Keras' own optimizer as well, to show the comparison can fail.
KERAS_CONTROLS = ("sgd_global_clipnorm_accumulated", "adamw_global_clipnorm")


def train(make_optimizer, epochs, initial_weights, images, labels, strategy):
    with strategy.scope() if strategy is not None else contextlib.nullcontext():
        model = ViTClassifier.from_variant("ViT-Ti/16", **CONFIG)
        model.set_weights(initial_weights)
        model.compile(optimizer=make_optimizer(), loss="sparse_categorical_crossentropy")
        history = model.fit(images, labels, batch_size=BATCH_SIZE, epochs=epochs, shuffle=False, verbose=0)
    return [float(loss) for loss in history.history["loss"]], [np.asarray(weight) for weight in model.get_weights()]


def distance(weights, reference):
    return max(float(np.max(np.abs(a - b))) for a, b in zip(weights, reference))


def first_gradient(initial_weights, images, labels):
    """Norms of the first batch's gradient at the initial weights: global, largest per variable, largest value."""
    model = ViTClassifier.from_variant("ViT-Ti/16", **CONFIG)
    model.set_weights(initial_weights)
    loss_fn = keras.losses.SparseCategoricalCrossentropy()
    with tf.GradientTape() as tape:
        loss = loss_fn(labels[:BATCH_SIZE], model(images[:BATCH_SIZE], training=True))
    grads = tape.gradient(loss, model.trainable_variables)
    return {"global_norm": float(tf.linalg.global_norm(grads)),
            "largest_norm": max(float(tf.norm(g)) for g in grads),
            "largest_value": max(float(tf.reduce_max(tf.abs(g))) for g in grads)}


def main():
    rng = np.random.default_rng(0)
    images = rng.uniform(0.0, 255.0, size=(32, 8, 8, 1)).astype("float32")
    labels = rng.integers(0, 10, size=32)
    keras.utils.set_random_seed(0)
    initial_weights = [np.asarray(w) for w in ViTClassifier.from_variant("ViT-Ti/16", **CONFIG).get_weights()]
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    report = {"num_replicas": strategy.num_replicas_in_sync,
              "gradient": first_gradient(initial_weights, images, labels),
              "thresholds": {"global_clipnorm": GLOBAL_CLIPNORM, "clipnorm": CLIPNORM, "clipvalue": CLIPVALUE}}
    for name, (make, epochs) in RUNS.items():
        losses, weights = train(lambda: make(optimizers), epochs, initial_weights, images, labels, None)
        mirrored_losses, mirrored = train(lambda: make(optimizers), epochs, initial_weights, images, labels, strategy)
        report[name] = {"one_device": losses, "mirrored": mirrored_losses, "distance": distance(mirrored, weights)}
        # Keras' own optimizer, same settings, on the two replicas: it must not match. Only for the recipes'
        # global-norm clipping (the settings `finetune` uses); per-variable clipping fails Keras the same way.
        if name not in KERAS_CONTROLS:
            continue
        try:
            keras_losses, keras_weights = train(lambda: make(keras.optimizers), epochs, initial_weights, images,
                                                labels, strategy)
        except Exception as error:  # Keras' accumulation under a strategy
            report[name]["keras"] = {"error": f"{type(error).__name__}: {error}"[:400]}
        else:
            report[name]["keras"] = {"mirrored": keras_losses, "distance": distance(keras_weights, weights)}
    print("RESULT " + json.dumps(report))


if __name__ == "__main__":
    main()
