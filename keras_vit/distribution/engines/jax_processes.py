"""The engine of a JAX job: `jax.distributed`'s processes, trained under one `keras.distribution`.

Every process runs the same command with Keras' three variables
(`KERAS_DISTRIBUTION_JOB_ADDRESSES`, `..._NUM_PROCESSES`, `..._PROCESS_ID`);
`join()` starts `jax.distributed` from them. The distribution's mesh spans
the devices of every process: each process feeds its rows of every global
batch (`shard`), JAX splits each batch evenly over the mesh's batch axis
(so every batch is cut to a multiple of it), and the gradients, losses and
metrics of `fit` and `evaluate` are computed over the whole global batch.
Saving reads arrays that span processes through collectives: every process
saves, and only process 0's file is kept.
"""

import json
import os

import keras

from keras_vit.distribution.engines import joining
from keras_vit.distribution.engines.base import Engine

JOB_VARIABLES = ("KERAS_DISTRIBUTION_JOB_ADDRESSES", "KERAS_DISTRIBUTION_NUM_PROCESSES",
                 "KERAS_DISTRIBUTION_PROCESS_ID")


def running():
    """True when this process is one of several `jax.distributed` processes."""
    import jax

    return jax.process_count() > 1


def join(join_timeout=None):
    """Join the multi-process JAX job Keras' variables describe; return the process count.

    Without `KERAS_DISTRIBUTION_NUM_PROCESSES` nothing happens (one
    process; on a TPU pod slice call `keras.distribution.initialize()`
    yourself, it reads the TPU's own environment). CPU devices exchange data
    over gloo. `jax.distributed.initialize` is called as
    `keras.distribution.initialize()` calls it, with a bound on the wait for
    the other processes (`KERAS_VIT_JOIN_TIMEOUT`, default 60 s); set a
    random seed (the workflows do) for the same initial weights everywhere.

    Raises:
        TimeoutError: a process did not join in time (the error names it and the address).
    """
    import jax

    if not os.environ.get("KERAS_DISTRIBUTION_NUM_PROCESSES"):
        return jax.process_count()
    if jax.distributed.is_initialized():
        return jax.process_count()
    seconds = joining.join_timeout() if join_timeout is None else float(join_timeout)
    address = os.environ.get("KERAS_DISTRIBUTION_JOB_ADDRESSES", "").split(",")[0]
    count = int(os.environ["KERAS_DISTRIBUTION_NUM_PROCESSES"])
    index = int(os.environ.get("KERAS_DISTRIBUTION_PROCESS_ID", 0))
    # Meet first, with a bounded wait that can be caught: JAX's own wait ends the process from C++.
    joining.rendezvous(index, count, address, seconds)
    # CPU devices of different processes reach each other through gloo (the default has no transport).
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    try:
        jax.distributed.initialize(coordinator_address=address, num_processes=count, process_id=index,
                                   initialization_timeout=max(1, int(round(seconds))))
    except Exception as error:  # jaxlib's XlaRuntimeError: DEADLINE_EXCEEDED or UNAVAILABLE
        missing = [other for other in range(count) if other != index] if index == 0 else [0]
        raise TimeoutError(joining.missing_message(index, count, missing, address, seconds, str(error))) from None
    return jax.process_count()


class JaxProcesses(Engine):
    """The processes of a `jax.distributed` job (or one JAX process under a `keras.distribution`)."""

    name = "JAX processes (keras.distribution)"

    def process_index(self):
        import jax

        return jax.process_index()

    def process_count(self):
        import jax

        return jax.process_count()

    def barrier(self, name="keras_vit"):
        if self.process_count() > 1:
            from jax.experimental import multihost_utils

            multihost_utils.sync_global_devices(name)

    def broadcast_json(self, value):
        if self.process_count() == 1:
            return value
        import numpy as np
        from jax.experimental import multihost_utils

        payload = np.frombuffer(json.dumps(value).encode("utf-8"), dtype=np.uint8) if self.is_chief() else None
        length = int(multihost_utils.broadcast_one_to_all(np.int32(0 if payload is None else len(payload))))
        buffer = np.zeros(length, np.uint8) if payload is None else payload
        buffer = np.asarray(multihost_utils.broadcast_one_to_all(buffer))
        return json.loads(buffer.tobytes().decode("utf-8"))

    def batch_multiple(self):
        """The devices of the current distribution's batch axis (JAX splits every batch evenly over them)."""
        distribution = keras.distribution.distribution()
        mesh = getattr(distribution, "device_mesh", None)
        if mesh is None:
            return 1
        return mesh.shape[list(mesh.axis_names).index(distribution.batch_dim_name)]

    def scope(self):
        distribution = keras.distribution.distribution()
        return super().scope() if distribution is None else distribution.scope()

    def saving_is_collective(self):
        # Keras reads a JAX array that spans the devices of several processes through collectives:
        # process 0 cannot save alone.
        return self.process_count() > 1
