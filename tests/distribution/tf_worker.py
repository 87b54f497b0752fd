"""Child process of test_tf_distribution.py: fit on one and on two logical CPUs.

TensorFlow fixes its logical devices when it first touches the CPU, so
this runs in its own interpreter. It trains the same small ViT from the same
initial weights on one device and under `tf.distribute.MirroredStrategy`
over two logical CPU devices, and prints one JSON line with the losses and
how the variables are held; then (under "clipping") the clipped and
accumulated runs: keras_vit's optimizers (which must match one device) and
Keras' own (which do not), per run the epoch losses, the final weights'
largest distance from the one-device run or the error it raised, and how
far the first batch's gradient is above each clipping threshold (so
clipping bites).

Every mirrored run uses the one strategy object: two `MirroredStrategy`
objects in one process collide in TensorFlow's collectives ("Shape mismatch
in the collective instance"), which is why this was once two processes.
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
from keras_vit import MaskedPatchPredictor, ViTBackbone, ViTClassifier  # noqa: E402
from keras_vit import distribution as vit_distribution  # noqa: E402
from keras_vit import optimizers  # noqa: E402

EPOCHS = 3
BATCH_SIZE = 16
CONFIG = {"image_size": 8, "patch_size": 2, "num_channels": 1, "hidden_dim": 32, "num_layers": 1,
          "num_heads": 4, "mlp_dim": 64, "num_classes": 10}


def train(initial_weights, images, labels, strategy):
    with strategy.scope() if strategy is not None else contextlib.nullcontext():
        model = ViTClassifier.from_variant("ViT-Ti/16", **CONFIG)
        model.set_weights(initial_weights)
        model.compile(optimizer=keras.optimizers.AdamW(learning_rate=1e-2))
        history = model.fit(images, labels, batch_size=BATCH_SIZE, epochs=EPOCHS, shuffle=False, verbose=0)
    return {
        "losses": [float(loss) for loss in history.history["loss"]],
        "variable_types": sorted({type(variable.value).__name__ for variable in model.weights}),
        # Where the copies of each variable live (one per replica).
        "replica_devices": sorted(
            {component.device for variable in model.weights
             for component in (strategy or tf.distribute.get_strategy()).experimental_local_results(variable.value)}
        ),
    }


def pretrain(initial_weights, images, strategy):
    """Masked patch prediction with every patch masked: no random draw, so two replicas must train what one does."""
    with strategy.scope() if strategy is not None else contextlib.nullcontext():
        backbone_config = {key: value for key, value in CONFIG.items() if key != "num_classes"}
        model = MaskedPatchPredictor(ViTBackbone(**backbone_config), corruption_rate=1.0, mask_rate=1.0,
                                     random_rate=0.0, seed=0)
        model(images[:1])
        model.set_weights(initial_weights)
        model.compile(optimizer=keras.optimizers.SGD(learning_rate=0.1))
        history = model.fit(images, batch_size=BATCH_SIZE, epochs=EPOCHS, shuffle=False, verbose=0)
        held_out = model.evaluate(images[:24], batch_size=BATCH_SIZE, verbose=0, return_dict=True)
    return {"losses": [float(loss) for loss in history.history["loss"]], "held_out_loss": float(held_out["loss"]),
            "weights": [np.asarray(w).tolist() for w in model.get_weights()[:2]]}


CLIPPING_BATCH_SIZE = 8
CLIPPING_CONFIG = {**CONFIG, "dropout": 0.0}
# The clipped runs (`clipping_report`): thresholds far below the gradients' norms and values (the report
# says how far), so every step clips.
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


def train_clipped(make_optimizer, epochs, initial_weights, images, labels, strategy):
    with strategy.scope() if strategy is not None else contextlib.nullcontext():
        model = ViTClassifier.from_variant("ViT-Ti/16", **CLIPPING_CONFIG)
        model.set_weights(initial_weights)
        model.compile(optimizer=make_optimizer(), loss="sparse_categorical_crossentropy")
        history = model.fit(images, labels, batch_size=CLIPPING_BATCH_SIZE, epochs=epochs, shuffle=False, verbose=0)
    return [float(loss) for loss in history.history["loss"]], [np.asarray(weight) for weight in model.get_weights()]


def distance(weights, reference):
    return max(float(np.max(np.abs(a - b))) for a, b in zip(weights, reference))


def first_gradient(initial_weights, images, labels):
    """Norms of the first batch's gradient at the initial weights: global, largest per variable, largest value."""
    model = ViTClassifier.from_variant("ViT-Ti/16", **CLIPPING_CONFIG)
    model.set_weights(initial_weights)
    loss_fn = keras.losses.SparseCategoricalCrossentropy()
    with tf.GradientTape() as tape:
        loss = loss_fn(labels[:CLIPPING_BATCH_SIZE], model(images[:CLIPPING_BATCH_SIZE], training=True))
    grads = tape.gradient(loss, model.trainable_variables)
    return {"global_norm": float(tf.linalg.global_norm(grads)),
            "largest_norm": max(float(tf.norm(g)) for g in grads),
            "largest_value": max(float(tf.reduce_max(tf.abs(g))) for g in grads)}


def clipping_report(strategy):
    """The clipped and accumulated runs on one device, and on `strategy`'s two replicas."""
    rng = np.random.default_rng(0)
    images = rng.uniform(0.0, 255.0, size=(32, 8, 8, 1)).astype("float32")
    labels = rng.integers(0, 10, size=32)
    keras.utils.set_random_seed(0)
    initial_weights = [np.asarray(w) for w in ViTClassifier.from_variant("ViT-Ti/16", **CLIPPING_CONFIG).get_weights()]
    report = {"num_replicas": strategy.num_replicas_in_sync,
              "gradient": first_gradient(initial_weights, images, labels),
              "thresholds": {"global_clipnorm": GLOBAL_CLIPNORM, "clipnorm": CLIPNORM, "clipvalue": CLIPVALUE}}
    for name, (make, epochs) in RUNS.items():
        losses, weights = train_clipped(lambda: make(optimizers), epochs, initial_weights, images, labels, None)
        mirrored_losses, mirrored = train_clipped(lambda: make(optimizers), epochs, initial_weights, images, labels,
                                                  strategy)
        report[name] = {"one_device": losses, "mirrored": mirrored_losses, "distance": distance(mirrored, weights)}
        # Keras' own optimizer, same settings, on the two replicas: it must not match. Only for the recipes'
        # global-norm clipping (the settings `finetune` uses); per-variable clipping fails Keras the same way.
        if name not in KERAS_CONTROLS:
            continue
        try:
            keras_losses, keras_weights = train_clipped(lambda: make(keras.optimizers), epochs, initial_weights,
                                                        images, labels, strategy)
        except Exception as error:  # Keras' accumulation under a strategy
            report[name]["keras"] = {"error": f"{type(error).__name__}: {error}"[:400]}
        else:
            report[name]["keras"] = {"mirrored": keras_losses, "distance": distance(keras_weights, weights)}
    return report


def main():
    rng = np.random.default_rng(0)
    # 40 images: the last batch of 8 is smaller than the others, as in real data.
    images = rng.uniform(0.0, 255.0, size=(40, 8, 8, 1)).astype("float32")
    labels = rng.integers(0, 10, size=40)
    keras.utils.set_random_seed(0)
    initial_weights = [np.asarray(w) for w in ViTClassifier.from_variant("ViT-Ti/16", **CONFIG).get_weights()]
    strategy = vit_distribution.tensorflow_strategy(devices=["/cpu:0", "/cpu:1"])
    backbone_config = {key: value for key, value in CONFIG.items() if key != "num_classes"}
    predictor = MaskedPatchPredictor(ViTBackbone(**backbone_config), corruption_rate=1.0, mask_rate=1.0,
                                     random_rate=0.0, seed=0)
    predictor(images[:1])
    pretraining_weights = [np.asarray(w) for w in predictor.get_weights()]
    report = {
        "logical_cpus": len(tf.config.list_logical_devices("CPU")),
        "num_replicas": strategy.num_replicas_in_sync,
        "one_device": train(initial_weights, images, labels, None),
        "mirrored": train(initial_weights, images, labels, strategy),
        "pretraining_one_device": pretrain(pretraining_weights, images, None),
        "pretraining_mirrored": pretrain(pretraining_weights, images, strategy),
        "clipping": clipping_report(strategy),
    }
    print("RESULT " + json.dumps(report))


if __name__ == "__main__":
    main()
