"""One process of a JAX training job: `python jax_processes_worker.py MODE PROCESS COUNT PORT FOLDER OUT`.

MODE is `data` (Keras' DataParallel) or `model` (ModelParallel with
keras_vit's layout map, a (batch 2, model 2) mesh). The job has 4 CPU devices
in all: 4 in one process, or 2 in each of 2 processes joined over loopback
with `keras.distribution.initialize` (gloo collectives). Each process feeds
`fit` only its share of every global batch of an image folder
(`ImageFolderDataset(shard=...)`), so the job computes what one process on
the global batch computes. Process 0 writes the losses and the final weights
(gathered from every process) to OUT as `.npz`.
"""

import os
import sys

MODE, PROCESS, COUNT, PORT, FOLDER, OUT = sys.argv[1:7]
PROCESS, COUNT = int(PROCESS), int(COUNT)
os.environ["KERAS_BACKEND"] = "jax"
os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={4 // COUNT}"

import jax  # noqa: E402

jax.config.update("jax_cpu_collectives_implementation", "gloo")

import keras  # noqa: E402
import numpy as np  # noqa: E402

if COUNT > 1:
    keras.distribution.initialize(job_addresses=f"127.0.0.1:{PORT}", num_processes=COUNT, process_id=PROCESS)

import keras_vit  # noqa: E402
from keras_vit import distribution as vit_distribution  # noqa: E402
from keras_vit.data import AugmentPolicy, image_folder_datasets  # noqa: E402

assert jax.device_count() == 4 and jax.process_count() == COUNT
if MODE == "data":
    distribution = keras.distribution.DataParallel(devices=keras.distribution.list_devices(),
                                                   auto_shard_dataset=False)
else:
    distribution = vit_distribution.model_parallel(model_parallelism=2)
    distribution.auto_shard_dataset = False

train, _ = image_folder_datasets(FOLDER, 8, batch_size=8, validation_split=0, seed=0, workers=1,
                                 augment=AugmentPolicy(), shard=(PROCESS, COUNT) if COUNT > 1 else None)
with distribution.scope():
    keras.utils.set_random_seed(0)
    model = keras_vit.ViTClassifier.from_variant(
        "ViT-Ti/16", image_size=8, patch_size=4, hidden_dim=16, num_layers=2, num_heads=4, mlp_dim=32,
        num_classes=2, dropout=0.0)
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=0.1, momentum=0.9),
                  loss="sparse_categorical_crossentropy")
    history = model.fit(train, epochs=2, shuffle=False, verbose=0,
                        callbacks=[keras_vit.data.EpochSync(train)])

from jax.experimental import multihost_utils  # noqa: E402

weights = {w.path: np.asarray(multihost_utils.process_allgather(w.value, tiled=True)) for w in model.weights}
if PROCESS == 0:
    np.savez(OUT, losses=np.asarray(history.history["loss"]), **weights)
print(f"process {PROCESS} of {COUNT}: losses {history.history['loss']}", flush=True)
