"""One TensorFlow worker: `python tf_workers_worker.py INDEX PORTS OUT` (PORTS empty: one process alone).

With two ports, two workers on 127.0.0.1 form a `MultiWorkerMirroredStrategy`
job (TF_CONFIG, gRPC) and `fit` a small ViT on a `tf.data` pipeline sharded
by data; alone, one process fits the same model on the same global batches.
Worker 0 writes the losses and the final weights to OUT as `.npz`, worker `i > 0`
to OUT with `-i` before `.npz` (so a test can check the workers agree).
"""

import contextlib
import json
import os
import sys

INDEX, PORTS, OUT = int(sys.argv[1]), [p for p in sys.argv[2].split(",") if p], sys.argv[3]
COUNT = max(1, len(PORTS))
GLOBAL_BATCH = 8
os.environ["KERAS_BACKEND"] = "tensorflow"
if COUNT > 1:
    os.environ["TF_CONFIG"] = json.dumps({"cluster": {"worker": [f"127.0.0.1:{port}" for port in PORTS]},
                                          "task": {"type": "worker", "index": INDEX}})

import tensorflow as tf  # noqa: E402

# Made before any other TensorFlow operation, as TensorFlow requires.
strategy = tf.distribute.MultiWorkerMirroredStrategy() if COUNT > 1 else None

import keras  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import keras_vit  # noqa: E402

rng = np.random.default_rng(0)
images = rng.uniform(0, 255, (32, 8, 8, 3)).astype("float32")
labels = rng.integers(0, 2, 32)
dataset = tf.data.Dataset.from_tensor_slices((images, labels)).batch(GLOBAL_BATCH)
if COUNT > 1:
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    dataset = dataset.with_options(options)
with strategy.scope() if strategy is not None else contextlib.nullcontext():
    keras.utils.set_random_seed(0)
    model = keras_vit.ViTClassifier.from_variant(
        "ViT-Ti/16", image_size=8, patch_size=4, hidden_dim=16, num_layers=1, num_heads=2, mlp_dim=32,
        num_classes=2, dropout=0.0)
    model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9), loss="sparse_categorical_crossentropy")
    history = model.fit(dataset, epochs=2, verbose=0)
path = OUT if INDEX == 0 else OUT[: -len(".npz")] + f"-{INDEX}.npz"
np.savez(path, losses=np.asarray(history.history["loss"]), **{w.path: np.asarray(w.value) for w in model.weights})
print(f"worker {INDEX} of {COUNT}: losses {history.history['loss']}", flush=True)
