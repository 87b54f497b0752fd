"""One process of a JAX training job: `python jax_processes_worker.py MODES PROCESS COUNT PORT FOLDER OUT`.

MODES is a comma-separated list of `data` (Keras' DataParallel) and `model`
(ModelParallel with keras_vit's layout map, a (batch 2, model 2) mesh); the
process trains once per mode, one after the other, so a test that checks both
starts JAX and joins the job once. The job has 4 CPU devices in all: 4 in one
process, or 2 in each of 2 processes joined over loopback with
`keras.distribution.initialize` (gloo collectives). Each process feeds `fit`
only its share of every global batch of an image folder
(`ImageFolderDataset(shard=...)`), so the job computes what one process on
the global batch computes. Process 0 writes each mode's losses and final
weights (gathered from every process) to `OUT-MODE.npz`.

`train(FOLDER)` imported (not run as a script) is the same training on one
device without a distribution: the test's own reference, in its process.
"""

import contextlib
import os
import sys


def train(folder, mode=None, shard=None):
    """Fit the same model from the same seed under `mode`'s distribution (`None`: none, one device).

    Returns the epochs' losses and the final weights, `{path: array}` (gathered from every process).
    """
    import keras
    import numpy as np

    import keras_vit
    from keras_vit import distribution as vit_distribution
    from keras_vit.data import AugmentPolicy, image_folder_datasets

    keras.utils.clear_session()  # the same layer names (weight paths) for every mode
    if mode == "data":
        distribution = keras.distribution.DataParallel(devices=keras.distribution.list_devices(),
                                                       auto_shard_dataset=False)
    elif mode == "model":
        distribution = vit_distribution.model_parallel(model_parallelism=2)
        distribution.auto_shard_dataset = False
    else:
        distribution = None

    dataset, _ = image_folder_datasets(folder, 8, batch_size=8, validation_split=0, seed=0, workers=1,
                                       augment=AugmentPolicy(), shard=shard)
    with distribution.scope() if distribution is not None else contextlib.nullcontext():
        keras.utils.set_random_seed(0)
        model = keras_vit.ViTClassifier.from_variant(
            "ViT-Ti/16", image_size=8, patch_size=4, hidden_dim=16, num_layers=2, num_heads=4, mlp_dim=32,
            num_classes=2, dropout=0.0)
        model.compile(optimizer=keras.optimizers.SGD(learning_rate=0.1, momentum=0.9),
                      loss="sparse_categorical_crossentropy")
        history = model.fit(dataset, epochs=2, shuffle=False, verbose=0,
                            callbacks=[keras_vit.data.EpochSync(dataset)])
    if distribution is None:
        weights = {w.path: keras.ops.convert_to_numpy(w.value) for w in model.weights}
    else:
        from jax.experimental import multihost_utils

        weights = {w.path: np.asarray(multihost_utils.process_allgather(w.value, tiled=True)) for w in model.weights}
    return np.asarray(history.history["loss"]), weights


def main(modes, process, count, port, folder, out):
    process, count = int(process), int(count)
    os.environ["KERAS_BACKEND"] = "jax"
    # The test passes' compile-time flags (tests/conftest.py) first, then this worker's devices.
    os.environ["XLA_FLAGS"] = " ".join([os.environ.get("KERAS_VIT_TEST_XLA_FLAGS", ""),
                                        f"--xla_force_host_platform_device_count={4 // count}"]).strip()

    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")

    import keras
    import numpy as np

    if count > 1:
        keras.distribution.initialize(job_addresses=f"127.0.0.1:{port}", num_processes=count, process_id=process)
    assert jax.device_count() == 4 and jax.process_count() == count

    for mode in modes.split(","):
        losses, weights = train(folder, mode, shard=(process, count) if count > 1 else None)
        if process == 0:
            np.savez(f"{out}-{mode}.npz", losses=losses, **weights)
        print(f"process {process} of {count}, {mode}: losses {losses.tolist()}", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:7])
