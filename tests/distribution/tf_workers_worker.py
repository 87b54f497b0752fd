"""One TensorFlow worker: `python tf_workers_worker.py INDEX PORTS OUT` (PORTS empty: one process alone).

With two ports, two workers on 127.0.0.1 form a `MultiWorkerMirroredStrategy`
job (TF_CONFIG, gRPC) and `fit` a small ViT on a `tf.data` pipeline sharded
by data; alone, one process fits the same model on the same global batches.
It fits once per optimizer in `RUNS`, each time from the same initial
weights: Keras' SGD unclipped, keras_vit's SGD as the paper recipe uses it
(global-norm clipping, accumulation) and keras_vit's AdamW with global-norm
clipping.
Worker 0 writes each run's losses and final weights to OUT as `.npz`
(`RUN/losses`, `RUN/WEIGHT_PATH`), worker `i > 0` to OUT with `-i` before
`.npz` (so a test can check the workers agree).
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
from keras_vit.distribution import engines  # noqa: E402

rng = np.random.default_rng(0)
images = rng.uniform(0, 255, (32, 8, 8, 3)).astype("float32")
labels = rng.integers(0, 2, 32)
dataset = tf.data.Dataset.from_tensor_slices((images, labels)).batch(GLOBAL_BATCH)
if COUNT > 1:
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    dataset = dataset.with_options(options)
# Far below the gradient's global norm, so every step clips: Keras' AdamW
# with it, which clips each worker's part, ended 0.086 from one process in a
# manual run (keras_vit's 1.2e-6).
CLIP = 0.05
RUNS = {
    "sgd": lambda: keras.optimizers.SGD(0.1, momentum=0.9),
    "sgd_clipped_accumulated": lambda: keras_vit.optimizers.SGD(0.1, momentum=0.9, global_clipnorm=CLIP,
                                                                gradient_accumulation_steps=2),
    "adamw_clipped": lambda: keras_vit.optimizers.AdamW(1e-2, global_clipnorm=CLIP),
}
results = {}
for run, make_optimizer in RUNS.items():
    with strategy.scope() if strategy is not None else contextlib.nullcontext():
        keras.utils.set_random_seed(0)
        model = keras_vit.ViTClassifier.from_variant(
            "ViT-Ti/16", image_size=8, patch_size=4, hidden_dim=16, num_layers=1, num_heads=2, mlp_dim=32,
            num_classes=2, dropout=0.0)
        model.compile(optimizer=make_optimizer(), loss="sparse_categorical_crossentropy")
        # The TensorFlow engine applies the workarounds Keras' trainer needs across workers.
        callbacks = engines.current().prepare(model)
        history = model.fit(dataset, epochs=2, verbose=0, callbacks=callbacks)
    results[f"{run}/losses"] = np.asarray(history.history["loss"])
    results.update({f"{run}/{w.path}": np.asarray(w.value) for w in model.weights})
    print(f"worker {INDEX} of {COUNT}, {run}: losses {history.history['loss']}", flush=True)
path = OUT if INDEX == 0 else OUT[: -len(".npz")] + f"-{INDEX}.npz"
np.savez(path, **results)
