"""Which process of a multi-process job this is, on any backend.

A TPU pod slice, a multi-GPU box under `torchrun` and a multi-node cluster
all run one Python process per host or per device. The training workflows ask
these functions, never an engine directly, so that the same code reads its
share of the data, and only process 0 (the chief) prints progress and writes
checkpoints, logs and models.

On PyTorch the job is `torch.distributed`'s process group (started by
`keras_vit.distribution.torch_processes.initialize()` under `torchrun`); on
JAX it is `jax.distributed` (started by `keras.distribution.initialize()`);
on TensorFlow it is the `MultiWorkerMirroredStrategy` of the workers that
`TF_CONFIG` names (`keras_vit.distribution.tf_workers`). A single process is
process 0 of 1.
"""

import json

import keras


def _torch_group():
    """`torch.distributed` when a process group is running, else `None`."""
    if keras.backend.backend() != "torch":
        return None
    import torch.distributed

    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed
    return None


def _tf_job():
    """`(index, count)` in a multi-worker TensorFlow job, or `None` (another backend, or one process)."""
    if keras.backend.backend() != "tensorflow":
        return None
    from keras_vit.distribution import tf_workers

    return tf_workers.job()


def _job():
    """`(index, count)` of this process in its job: torch.distributed's group, JAX's processes,
    TensorFlow's workers, or (0, 1)."""
    group = _torch_group()
    if group is not None:
        return group.get_rank(), group.get_world_size()
    if keras.backend.backend() == "jax":
        import jax

        return jax.process_index(), jax.process_count()
    return _tf_job() or (0, 1)


def process_count():
    """The number of processes in the job (1 when nothing was initialised)."""
    return _job()[1]


def process_index():
    """This process's index in the job, `0 <= index < process_count()`."""
    return _job()[0]


def is_chief():
    """True on process 0: the one that prints progress and writes files."""
    return process_index() == 0


def barrier(name="keras_vit"):
    """Wait until every process of the job reaches this point (nothing to wait for alone)."""
    if process_count() == 1:
        return
    group = _torch_group()
    if group is not None:
        group.barrier()
        return
    if _tf_job() is not None:
        from keras_vit.distribution import tf_workers

        tf_workers.barrier()
        return
    from jax.experimental import multihost_utils

    multihost_utils.sync_global_devices(name)


def saving_is_collective():
    """True when every process must take part in saving a model (a multi-process JAX or TensorFlow job).

    Keras reads a JAX array that spans the devices of several processes
    through collectives: process 0 cannot save alone, the others call the
    same save and discard what they wrote (`discarded_directory`).
    TensorFlow workers follow the same rule, TensorFlow's own convention for
    multi-worker saving: inside the strategy's scope (all of `fit`, its
    callbacks included) Keras' saving creates a variable the first time
    (`saving_lib.get_attr_skipset` builds a reference optimizer), which the
    strategy makes with a broadcast from worker 0; saved by worker 0 alone,
    it is met by the other workers' next collective instead ("Collective
    instance ... expected type 0 ... but got type 1") and the job fails.
    """
    return keras.backend.backend() in ("jax", "tensorflow") and process_count() > 1


def discarded_directory():
    """A temporary directory, deleted on exit, for a save whose output only process 0 keeps."""
    import tempfile

    return tempfile.TemporaryDirectory(prefix="keras_vit-discarded-")


def broadcast_json(value):
    """The chief's `value` (any JSON value) on every process: each returns what process 0 passed.

    Sent as UTF-8 JSON bytes, never pickled.
    """
    if process_count() == 1:
        return value
    import numpy as np

    payload = np.frombuffer(json.dumps(value).encode("utf-8"), dtype=np.uint8) if is_chief() else None
    group = _torch_group()
    if group is not None:
        import torch

        length = torch.tensor([0 if payload is None else len(payload)], dtype=torch.int64)
        group.broadcast(length, src=0)
        buffer = torch.zeros(int(length.item()), dtype=torch.uint8)
        if payload is not None:
            buffer.copy_(torch.from_numpy(payload.copy()))
        group.broadcast(buffer, src=0)
        return json.loads(buffer.numpy().tobytes().decode("utf-8"))
    if _tf_job() is not None:
        from keras_vit.distribution import tf_workers

        return tf_workers.broadcast_json(value, is_chief())
    from jax.experimental import multihost_utils

    length = int(multihost_utils.broadcast_one_to_all(np.int32(0 if payload is None else len(payload))))
    buffer = np.zeros(length, np.uint8) if payload is None else payload
    buffer = np.asarray(multihost_utils.broadcast_one_to_all(buffer))
    return json.loads(buffer.tobytes().decode("utf-8"))


JAX_JOB_VARIABLES = ("KERAS_DISTRIBUTION_JOB_ADDRESSES", "KERAS_DISTRIBUTION_NUM_PROCESSES",
                     "KERAS_DISTRIBUTION_PROCESS_ID")


def initialize_jax_processes():
    """Join a multi-process JAX job described by Keras' environment variables; return the process count.

    Every process of the job sets `KERAS_DISTRIBUTION_JOB_ADDRESSES` (the
    address of process 0, `host:port`), `KERAS_DISTRIBUTION_NUM_PROCESSES`
    and its own `KERAS_DISTRIBUTION_PROCESS_ID`, and this calls
    `keras.distribution.initialize()` before any computation. CPU devices
    exchange data over gloo. Without those variables nothing happens (one
    process; on a TPU pod slice call `keras.distribution.initialize()`
    yourself, it reads the TPU's own environment).
    """
    import os

    if not os.environ.get("KERAS_DISTRIBUTION_NUM_PROCESSES"):
        return process_count()
    import jax

    if jax.distributed.is_initialized():
        return jax.process_count()
    # CPU devices of different processes reach each other through gloo (the default has no transport).
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    keras.distribution.initialize()
    return jax.process_count()


def batch_shards():
    """How many ways the current JAX distribution splits every batch (1 without one, or off JAX)."""
    if keras.backend.backend() != "jax":
        return 1
    distribution = keras.distribution.distribution()
    mesh = getattr(distribution, "device_mesh", None)
    if mesh is None:
        return 1
    return mesh.shape[list(mesh.axis_names).index(distribution.batch_dim_name)]


def shard_for_processes(dataset):
    """Give `dataset` this process's share of every global batch; return it.

    `ImageFolderDataset` and `ArrayBatches` take a `shard=(index, count)`:
    each process reads only its rows of every batch (no image twice per step,
    none skipped in an epoch). Under a JAX distribution whose batch axis has
    `n` devices, each batch is also cut to a multiple of `n` rows, because
    JAX splits every batch evenly: the last batch of an epoch loses up to
    `n - 1` rows (other images each epoch for shuffled training data).
    Alone, or for another kind of data, the dataset is returned unchanged.

    Raises:
        ValueError: several processes, and a dataset that cannot be sharded
            (every process would train on every batch), or a batch size that
            the batch axis does not divide.
    """
    shards = batch_shards()
    if shards > 1 and hasattr(dataset, "batch_multiple"):
        if dataset.batch_size % shards:
            raise ValueError(
                f"The batch size must be divisible by the {shards} devices of the mesh's batch axis: JAX splits "
                f"every batch evenly over them. Received: batch_size={dataset.batch_size}")
        dataset.batch_multiple = shards
    count = process_count()
    if count == 1:
        return dataset
    if not hasattr(dataset, "shard"):
        raise ValueError(
            f"{count} processes need data that each process reads a share of: an ImageFolderDataset or "
            f"ArrayBatches (keras_vit.data), which take `shard=(index, count)`. Received: {type(dataset).__name__}"
        )
    dataset.shard = (process_index(), count)
    return dataset


def fit_input(dataset):
    """What `fit` and `evaluate` take for `dataset` in this job: the dataset itself, except on TensorFlow workers.

    A sharded dataset (`shard_for_processes`) handed to `fit` under a
    multi-worker TensorFlow strategy would be split by the strategy once
    more; there it becomes the job's distributed dataset of each worker's
    own batches (`tf_workers.worker_batches`). Keep the dataset itself for
    `EpochSync` and the like.
    """
    if getattr(dataset, "shard", None) is None or _tf_job() is None:
        return dataset
    from keras_vit.distribution import tf_workers

    return tf_workers.worker_batches(dataset)
