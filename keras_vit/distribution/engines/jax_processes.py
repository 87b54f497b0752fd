"""The engine of a JAX job: `jax.distributed`'s processes, trained under one `keras.distribution`.

Every process runs the same command with Keras' three variables
(`KERAS_DISTRIBUTION_JOB_ADDRESSES`, `..._NUM_PROCESSES`, `..._PROCESS_ID`);
`join()` starts `jax.distributed` from them. The distribution's mesh spans
the devices of every process: each process feeds its rows of every global
batch (`shard`), and the gradients, losses and metrics of `fit` and
`evaluate` are computed over the whole global batch. JAX splits each batch
evenly over the mesh's batch axis: a batch whose rows it does not divide is
padded up to a multiple of it with rows of sample weight 0 (`PaddedShare`),
so every image counts once and the padding not at all (`PaddedRows`).
Saving reads arrays that span processes through collectives: every process
saves, and only process 0's file is kept.
"""

import copy
import json
import os

import keras
import numpy as np

from keras_vit.distribution.engines import joining, peer_watch
from keras_vit.distribution.engines.base import Engine

JOB_VARIABLES = ("KERAS_DISTRIBUTION_JOB_ADDRESSES", "KERAS_DISTRIBUTION_NUM_PROCESSES",
                 "KERAS_DISTRIBUTION_PROCESS_ID")


def running():
    """True when this process is one of several `jax.distributed` processes."""
    import jax

    return jax.process_count() > 1


# How a JAX job is described, said in every error about its variables.
_FIX = ("every process of a JAX job sets KERAS_DISTRIBUTION_NUM_PROCESSES (the process count), "
        "KERAS_DISTRIBUTION_PROCESS_ID (its own index, 0 to the count - 1) and KERAS_DISTRIBUTION_JOB_ADDRESSES "
        "(process 0's host:port first) (docs/scale-out.md).")


def job_of_variables(environ=None):
    """`(index, count, address)` of the JAX job Keras' variables describe, or `None` without one.

    `None` when none of the three is set (one process); the others without
    `KERAS_DISTRIBUTION_NUM_PROCESSES` are refused (the process would train
    alone on the job's outputs). Every variable is checked here, before any wait: the count a
    whole number of at least 1, in a job of several this process's index
    set and within it, and process 0's `host:port` (the first of
    `KERAS_DISTRIBUTION_JOB_ADDRESSES`) with a port from 1 to 65535.

    Raises:
        JobError: the variable that is wrong, its value and the fix.
    """
    environ = os.environ if environ is None else environ
    if not environ.get("KERAS_DISTRIBUTION_NUM_PROCESSES", "").strip():
        given = [name for name in JOB_VARIABLES if environ.get(name, "").strip()]
        if given:  # a job described in part: this process would train alone on the job's outputs
            raise joining.JobError(
                f"KERAS_DISTRIBUTION_NUM_PROCESSES is unset, though {' and '.join(given)} "
                f"{'is' if len(given) == 1 else 'are'} set: set it to the job's process count on every process, "
                f"or unset {' and '.join(given)} to train one process; {_FIX}")
        return None
    count = joining.integer(environ, "KERAS_DISTRIBUTION_NUM_PROCESSES", _FIX, 1)
    if count > 1 and not environ.get("KERAS_DISTRIBUTION_PROCESS_ID", "").strip():
        raise joining.JobError(
            f"KERAS_DISTRIBUTION_PROCESS_ID is unset: each process of a job of {count} needs its own index, "
            f"0 to {count - 1}; {_FIX}")
    index = joining.integer(environ, "KERAS_DISTRIBUTION_PROCESS_ID", _FIX, 0, count - 1) if (
        environ.get("KERAS_DISTRIBUTION_PROCESS_ID", "").strip()) else 0
    addresses = environ.get("KERAS_DISTRIBUTION_JOB_ADDRESSES", "")
    if count > 1 and not addresses.strip():
        raise joining.JobError(f"KERAS_DISTRIBUTION_JOB_ADDRESSES is unset: a job of {count} processes meets at "
                               f"process 0's host:port; {_FIX}")
    address = addresses.split(",")[0].strip()
    if count > 1:
        joining.host_and_port(address, "KERAS_DISTRIBUTION_JOB_ADDRESSES", _FIX)
    return index, count, address


def launcher():
    """`(name, variables)`: what starts this engine's processes and the variables it sets (`engines.launched_jobs`)."""
    return "KERAS_DISTRIBUTION_*", JOB_VARIABLES



def launched_job(environ=None):
    """`(count, variables)` when Keras' variables start this process as one of several, else `None`.

    Raises:
        JobError: the variable that is wrong, its value and the fix.
    """
    job = job_of_variables(environ)
    if job is None or job[1] == 1:
        return None
    return job[1], f"KERAS_DISTRIBUTION_NUM_PROCESSES={job[1]}"


def runs_this_process():
    """Always True: the JAX engine runs one process too (it also knows the devices a batch is split over)."""
    return True


def join(join_timeout=None):
    """Join the multi-process JAX job Keras' variables describe; return the process count.

    Without `KERAS_DISTRIBUTION_NUM_PROCESSES` nothing happens (one
    process; on a TPU pod slice call `keras.distribution.initialize()`
    yourself, it reads the TPU's own environment). The variables are
    checked first (`job_of_variables`), before any wait. CPU devices
    exchange data over gloo. `jax.distributed.initialize` is called as
    `keras.distribution.initialize()` calls it, with a bound on the wait for
    the other processes (`KERAS_VIT_JOIN_TIMEOUT`, default 60 s); set a
    random seed (the workflows do) for the same initial weights everywhere.

    Raises:
        JobError: a variable is wrong (named, with the fix).
        TimeoutError: a process did not join in time (the error names it and the address).
    """
    job = job_of_variables()
    seconds = joining.join_timeout() if join_timeout is None else float(join_timeout)
    import jax

    if job is None or job[1] == 1 or jax.distributed.is_initialized():
        return jax.process_count()
    index, count, address = job
    # Meet first, with a bounded wait that can be caught: JAX's own wait ends the process from C++. The
    # connections stay open: a process that dies later stops the others at once, named (`peer_watch`), where
    # gloo and JAX's heartbeat took 100 s and ended in a C++ stack trace.
    peers = joining.rendezvous(index, count, address, seconds, keep=True)
    # Watched from before JAX's start: its "bye" at exit then comes after JAX's shutdown barrier (an atexit
    # handler registered later runs first), so a process that dies while the others wait there is named too.
    peer_watch.start(index, count, peers)
    # CPU devices of different processes reach each other through gloo (the default has no transport).
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    try:
        jax.distributed.initialize(coordinator_address=address, num_processes=count, process_id=index,
                                   initialization_timeout=max(1, int(round(seconds))))
    except Exception as error:  # jaxlib's XlaRuntimeError: DEADLINE_EXCEEDED or UNAVAILABLE
        missing = [other for other in range(count) if other != index] if index == 0 else [0]
        raise TimeoutError(joining.missing_message(index, count, missing, address, seconds, str(error))) from None
    return jax.process_count()


def padded_size(rows, multiple):
    """`rows` rounded up to a multiple of `multiple`."""
    return -(-rows // multiple) * multiple


class PaddedShare(keras.utils.PyDataset):
    """This process's rows of every global batch, padded so the batch axis divides every batch.

    Global batch `i` of `n` rows is padded to `n_p`, the next multiple of
    the mesh's batch axis (`multiple`); process `p` of `count` feeds rows
    `[n_p * p // count, n_p * (p + 1) // count)` of the padded batch (every
    process the same number, as JAX assembles the global batch from equal
    parts). Rows at or past `n` are padding: zero images with sample weight
    0 (their loss counts 0) and, for class indices, label -1, which no
    prediction matches (Keras' `metrics=["accuracy"]` ignore sample
    weights); the real rows have sample weight 1. Each process reads only
    its real rows of the dataset (a copy of it whose `rows` are these).

    Data without labels (pre-training images, batches of `x` alone) gives
    `(x, None, sample weight)` batches, which Keras unpacks as images,
    no labels and sample weights.
    """

    def __init__(self, dataset, index, count, multiple):
        super().__init__(workers=getattr(dataset, "workers", 1),
                         use_multiprocessing=getattr(dataset, "use_multiprocessing", False),
                         max_queue_size=getattr(dataset, "max_queue_size", 10))
        self.index, self.count, self.multiple = index, count, multiple
        self.batch_size = dataset.batch_size
        # Without labels the model's own loss weighs its rows (see `PaddedRows`).
        self.labelled = getattr(dataset, "labels", getattr(dataset, "y", None)) is not None
        self.whole = copy.copy(dataset)
        self.whole.shard, self.whole.batch_multiple = None, 1
        self.global_rows = [self.whole.rows(batch)[1] for batch in range(len(self.whole))]
        self.reader = copy.copy(self.whole)
        # The copy reads this process's real rows of the padded batch: `rows` is what every
        # `keras_vit.data` dataset's `__getitem__` asks for the rows of a batch.
        self.reader.rows = self.rows

    def __len__(self):
        return len(self.global_rows)

    def rows(self, index):
        """`(first, stop)`: the real rows of global batch `index` this process reads."""
        rows = self.global_rows[index]
        padded = padded_size(rows, self.multiple)
        return (min(rows, padded * self.index // self.count), min(rows, padded * (self.index + 1) // self.count))

    def epoch_rows(self):
        """`(padded rows, real rows)` of an epoch: the padded batches' rows and the images."""
        return sum(padded_size(rows, self.multiple) for rows in self.global_rows), sum(self.global_rows)

    def set_epoch(self, epoch):
        if hasattr(self.reader, "set_epoch"):
            self.reader.set_epoch(epoch)

    def __getitem__(self, index):
        if not 0 <= index < len(self):
            raise IndexError(f"batch {index} of {len(self)}")
        batch = self.reader[index]
        padded = padded_size(self.global_rows[index], self.multiple)
        share = padded * (self.index + 1) // self.count - padded * self.index // self.count
        labelled = isinstance(batch, tuple)
        x, y = (np.asarray(value) for value in batch) if labelled else (np.asarray(batch), None)
        missing = share - len(x)
        weights = np.concatenate([np.ones(len(x), "float32"), np.zeros(missing, "float32")])
        if missing:
            x = np.concatenate([x, np.zeros((missing, *x.shape[1:]), x.dtype)])
        if missing and labelled:
            # Class indices: -1 matches no prediction; one-hot rows: zeros (see `PaddedRows`).
            fill = -1 if np.issubdtype(y.dtype, np.integer) and y.ndim == 1 else 0
            y = np.concatenate([y, np.full((missing, *y.shape[1:]), fill, y.dtype)])
        return x, y, weights


class PaddedRows(keras.callbacks.Callback):
    """The training step and the logged losses of padded batches (`PaddedShare`) as one process has them.

    With rows of sample weight 0, Keras' loss of a batch is the sum of the
    real rows' losses divided by all rows, padding included, and its loss
    tracker counts every row: the accuracy (weighted by sample weight) is
    right, the loss is not. Here each step's loss is multiplied by `padded
    rows / real rows` before the gradient (through `optimizer.scale_loss`,
    Keras' hook between the loss and the gradient; the factor comes from
    the batch's sample weights, in a `train_step` wrapped on this one model:
    Keras has no hook that sees both the batch and the loss before the
    gradient), and the epoch's logged
    row means by the epoch's `padded rows / real rows` (`real_means`).

    Data without labels: the one model trained on it
    (`MaskedPatchPredictor`) divides its loss by the sample-weighted count
    of corrupted patches, so the padded rows leave both the sum and the
    count and a step's loss is already one process's (factor 1). Keras'
    epoch loss weighs each step's loss by the batch's padded rows where one
    process weighs it by its real rows: each step's loss is read back from
    the running means Keras hands the batch callbacks (`StepLosses`) and the
    epoch's loss (and `val_loss`) weighed by real rows.
    """

    def __init__(self, model, train, engine):
        super().__init__()
        self.train, self.engine = train, engine
        self.factor = None
        train_step, optimizer = model.train_step, model.optimizer
        scale_loss = optimizer.scale_loss
        # Prepared again (another `fit`): wrap Keras' own methods, not an earlier wrapper.
        self.scale_loss = getattr(scale_loss, "__keras_vit_wrapped__", scale_loss)
        train_step = getattr(train_step, "__keras_vit_wrapped__", train_step)

        def scaled_to_real_rows(loss):
            loss = self.scale_loss(loss)
            return loss if self.factor is None else loss * keras.ops.cast(self.factor, loss.dtype)

        def weighed_train_step(state, data):
            _, _, weights = keras.utils.unpack_x_y_sample_weight(data)
            if weights is not None and train.labelled:
                weights = keras.ops.convert_to_tensor(weights)
                self.factor = keras.ops.divide(keras.ops.cast(keras.ops.shape(weights)[0], "float32"),
                                               keras.ops.maximum(keras.ops.sum(weights), 1.0))
            try:
                return train_step(state, data)
            finally:
                self.factor = None

        scaled_to_real_rows.__keras_vit_wrapped__ = self.scale_loss
        weighed_train_step.__keras_vit_wrapped__ = train_step
        optimizer.scale_loss = scaled_to_real_rows
        model.train_step = weighed_train_step

    def on_epoch_begin(self, epoch, logs=None):
        self.steps = StepLosses(self.train)

    def on_train_batch_end(self, batch, logs=None):
        self.steps.add(batch, logs)

    def on_test_begin(self, logs=None):
        self.held_out_steps = StepLosses(self.engine.last_held_out)

    def on_test_batch_end(self, batch, logs=None):
        self.held_out_steps.add(batch, logs)

    steps = held_out_steps = None

    def on_epoch_end(self, epoch, logs=None):
        if not logs:
            return
        if not self.train.labelled:
            logs.update(self.steps.real_means())
            logs.update({f"val_{name}": value for name, value in (
                self.held_out_steps.real_means() if self.held_out_steps else {}).items()})
            return
        training = {name: value for name, value in logs.items() if not name.startswith("val_")}
        held_out = {name[4:]: value for name, value in logs.items() if name.startswith("val_")}
        logs.update(real_means(training, self.train))
        logs.update({f"val_{name}": value for name, value in real_means(held_out, self.engine.last_held_out).items()})


class StepLosses:
    """Each step's loss of an epoch over a `PaddedShare` of data without labels, read back from Keras' running mean.

    Keras hands the batch callbacks the mean of the steps' losses so far,
    each weighed by its batch's rows, padding included: after step `k` the
    running mean times the padded rows so far is the weighed sum, and the
    difference of two sums over the step's padded rows is the step's loss.
    `real_means` weighs the steps' losses by their real rows, as one process
    does. A call that covers several steps (`steps_per_execution`) counts
    as one step of their rows.
    """

    def __init__(self, share):
        self.share = share if isinstance(share, PaddedShare) and not share.labelled else None
        self.done = self.padded_rows = 0
        self.padded_sum = self.real_sum = 0.0
        self.real_rows = 0

    def add(self, batch, logs):
        if self.share is None or not logs or "loss" not in logs:
            return
        rows = self.share.global_rows[self.done:batch + 1]
        self.done = batch + 1
        padded = sum(padded_size(count, self.share.multiple) for count in rows)
        padded_sum = float(logs["loss"]) * (self.padded_rows + padded)
        step_loss = (padded_sum - self.padded_sum) / padded
        self.padded_sum, self.padded_rows = padded_sum, self.padded_rows + padded
        self.real_sum += step_loss * sum(rows)
        self.real_rows += sum(rows)

    def real_means(self):
        """`{"loss": ...}`: the steps' losses weighed by real rows (empty when nothing was read)."""
        return {"loss": self.real_sum / self.real_rows} if self.real_rows else {}


def real_means(logs, share):
    """The row means of `logs` (loss and accuracy) over the real rows of an epoch of `share` (a `PaddedShare`).

    Keras' means count the padded rows, whose loss and accuracy are 0
    (sample weight 0, label -1): multiplied by `padded rows / real rows`,
    they are the means over the real rows. Other metrics (not means over
    rows, or over one-hot labels) are not changed.
    """
    if not isinstance(share, PaddedShare) or not share.labelled:
        return {}  # without labels the model's loss weighs the rows itself (see `PaddedRows`)
    padded, real = share.epoch_rows()
    labels = share.reader.labels if hasattr(share.reader, "labels") else share.reader.y
    one_hot = np.ndim(labels) > 1 or getattr(share.reader, "augment", None) is not None and getattr(
        share.reader.augment, "mixes_labels", False)
    return {name: float(value) * padded / real for name, value in logs.items()
            if name == "loss" or name.endswith("_loss") or (name.endswith("accuracy") and not one_hot)}


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

    def gather_json(self, value):
        if self.process_count() == 1:
            return [value]
        from jax.experimental import multihost_utils

        payload = np.frombuffer(json.dumps(value).encode("utf-8"), dtype=np.uint8)
        lengths = np.asarray(multihost_utils.process_allgather(np.int32(len(payload)))).reshape(-1)
        padded = np.zeros(int(lengths.max()), np.uint8)
        padded[:len(payload)] = payload
        rows = np.asarray(multihost_utils.process_allgather(padded)).reshape(len(lengths), -1)
        return [json.loads(row[:length].tobytes().decode("utf-8")) for row, length in zip(rows, lengths)]

    def batch_multiple(self):
        """The devices of the current distribution's batch axis (JAX splits every batch evenly over them)."""
        distribution = keras.distribution.distribution()
        mesh = getattr(distribution, "device_mesh", None)
        if mesh is None:
            return 1
        return mesh.shape[list(mesh.axis_names).index(distribution.batch_dim_name)]

    def shard(self, dataset):
        """This process's rows of every global batch, padded to a multiple of the batch axis (`PaddedShare`)."""
        multiple, count = self.batch_multiple(), self.process_count()
        if multiple == 1 and count == 1 or not hasattr(dataset, "rows"):
            return super().shard(dataset)
        return PaddedShare(dataset, self.process_index(), count, multiple)

    def held_out(self, dataset):
        share = super().held_out(dataset)
        self.last_held_out = share  # its padding is taken out of `val_loss` (`PaddedRows`)
        return share

    last_held_out = None

    def prepare(self, model, train=None):
        if not isinstance(train, PaddedShare):
            return []
        return [PaddedRows(model, train, self)]

    def evaluate(self, model, dataset):
        share = self.held_out(dataset)
        steps = StepLosses(share)
        reader = keras.callbacks.LambdaCallback(on_test_batch_end=steps.add)
        scores = model.evaluate(self.fit_input(share), verbose=0, return_dict=True, callbacks=[reader])
        scores.update(real_means(scores, share))
        scores.update(steps.real_means())
        return scores

    def scope(self):
        distribution = keras.distribution.distribution()
        return super().scope() if distribution is None else distribution.scope()

    def saving_is_collective(self):
        # Keras reads a JAX array that spans the devices of several processes through collectives:
        # process 0 cannot save alone.
        return self.process_count() > 1
