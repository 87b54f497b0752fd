"""The engine of a PyTorch job: one process per device under `torchrun`, joined by `torch.distributed`.

Keras' `fit` on the torch backend trains in one process. Each process here
trains the same model on its rows of every global batch, and before each
optimizer update the gradients are averaged across processes in one
all-reduce, weighted by the rows each process trained on. That is what
`torch.nn.parallel.DistributedDataParallel` does; DDP cannot wrap a model
whose forward pass Keras' trainer calls itself, so the average is taken
between Keras' backward pass and its optimizer.

Held-out data is shared out by whole batches (process `p` evaluates global
batches `p`, `p + N`, ...), and the metrics' states (sums of loss, of
correct rows, of rows) are added up across processes afterwards: every
process then reports the numbers of the whole held-out set, weighted by its
rows, as one process does.

Launch (every process runs the same command)::

    torchrun --nproc_per_node=8 -m keras_vit finetune DATA --preset ... --distribute data
"""

import copy
import os
from datetime import timedelta

import keras

from keras_vit.distribution.engines import joining
from keras_vit.distribution.engines.base import Engine

TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
# How long a collective waits for a process that stopped before failing (torch's default is 30 minutes).
COLLECTIVE_TIMEOUT_SECONDS = 600


def launched_by_torchrun():
    """True when `torchrun` (or another launcher that sets the same variables) started this process."""
    return all(name in os.environ for name in TORCHRUN_VARIABLES)


# How a PyTorch job is described, said in every error about its variables.
_FIX = ("torchrun sets RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT for each process: start the job with "
        "`torchrun --nproc_per_node=N -m keras_vit COMMAND ... --distribute data`, or set them as torchrun does "
        "(docs/scale-out.md).")


def launcher():
    """`(name, variables)`: what starts this engine's processes, as messages name it, and the variables it sets.

    Read by the launch check (`engines.launched_jobs`); the tests clear
    these variables before starting a process of their own.
    """
    return "torchrun", (*TORCHRUN_VARIABLES, "LOCAL_RANK")



def launched_job(environ=None):
    """`(count, variables)` when torchrun's variables start this process as one of several, else `None`.

    `variables` spells what was read, for messages. None of torchrun's
    variables set, or `WORLD_SIZE=1`: one process. Any other of them set
    makes a job of several, and every variable is then checked
    (`job_of_variables`): a launch described in part (`WORLD_SIZE`
    without `RANK`, `MASTER_ADDR` alone ...) would train alone on the
    job's outputs, and is refused naming what is missing.

    Raises:
        JobError: the variable that is wrong (or missing), its value and the fix.
    """
    environ = os.environ if environ is None else environ
    given = [name for name in launcher()[1] if environ.get(name, "").strip()]
    if not given:
        return None
    count = joining.integer(environ, "WORLD_SIZE", _FIX, 1) if "WORLD_SIZE" in given else None
    if count == 1:
        return None
    missing = [name for name in TORCHRUN_VARIABLES if name not in given]
    if missing:
        verb = "is" if len(missing) == 1 else "are"
        raise joining.JobError(
            f"{', '.join(missing)} {verb} unset, though {', '.join(name for name in given)} "
            f"{'is' if len(given) == 1 else 'are'} set: this process looks started as one of a PyTorch job, and "
            f"would train alone on the job's outputs. Start the job with `torchrun --nproc_per_node=N -m keras_vit "
            f"COMMAND ... --distribute data` (it sets all four), or unset {', '.join(given)} to train one process "
            f"(docs/scale-out.md).")
    job_of_variables(environ)
    return count, f"torchrun's RANK={environ['RANK'].strip()}, WORLD_SIZE={count}"


def runs_this_process():
    """True when this process trains as one of a PyTorch job (it joined a process group of several)."""
    return running()


def job_of_variables(environ=None):
    """`(rank, count, host, port)` of the PyTorch job torchrun's variables describe, checked before any wait.

    `RANK` and `WORLD_SIZE` whole numbers with `0 <= RANK < WORLD_SIZE`,
    `MASTER_ADDR` set, `MASTER_PORT` from 1 to 65535, `LOCAL_RANK` (when
    set) a whole number: torch's own errors for these come late, or as an
    unreadable signature of `TCPStore`.

    Raises:
        JobError: the variable that is wrong (or missing), its value and the fix.
    """
    environ = os.environ if environ is None else environ
    missing = [name for name in TORCHRUN_VARIABLES if not environ.get(name, "").strip()]
    if missing:
        raise joining.JobError(f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} unset; {_FIX}")
    count = joining.integer(environ, "WORLD_SIZE", _FIX, 1)
    rank = joining.integer(environ, "RANK", _FIX, 0)
    if rank >= count:
        raise joining.JobError(f"RANK must be below WORLD_SIZE (the ranks of a job of {count} are 0 to {count - 1}); "
                               f"{_FIX} Received: RANK={environ['RANK']!r}, WORLD_SIZE={environ['WORLD_SIZE']!r}")
    if environ.get("LOCAL_RANK", "").strip():
        joining.integer(environ, "LOCAL_RANK", _FIX, 0)
    port = joining.integer(environ, "MASTER_PORT", _FIX, 1, 65535)
    return rank, count, environ["MASTER_ADDR"].strip(), port


def _group():
    """`torch.distributed` when a process group of several processes is running, else `None`."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        return dist
    return None


def running():
    """True when this process is one of several in a `torch.distributed` process group."""
    return _group() is not None


def join(join_timeout=None):
    """Join the `torch.distributed` process group that `torchrun` describes; return the process count.

    Uses NCCL when this process has a CUDA device (the one of its
    `LOCAL_RANK`) and gloo on CPUs. Every process first waits, at most
    `join_timeout` seconds, until every other one has reached the address
    of process 0 (`MASTER_ADDR:MASTER_PORT`), and fails naming the ones that
    did not. Calling it again does nothing.

    Args:
        join_timeout: float or `None`. Seconds to wait for the other
            processes; `None` reads `KERAS_VIT_JOIN_TIMEOUT` (default 60).

    Raises:
        RuntimeError: not under `torchrun`.
        JobError: one of torchrun's variables is wrong (named, with the fix).
        TimeoutError: a process did not join in time (the error names it and the address).
    """
    import torch
    import torch.distributed as dist

    if dist.is_initialized():
        return dist.get_world_size()
    if not launched_by_torchrun():
        missing = [name for name in TORCHRUN_VARIABLES if name not in os.environ]
        raise RuntimeError(
            "Data parallelism on PyTorch runs one process per device, started by torchrun: "
            "`torchrun --nproc_per_node=N -m keras_vit COMMAND ... --distribute data` (add --nnodes, "
            f"--node_rank and --master_addr for several machines). Missing: {', '.join(missing)}.")
    rank, count, host, port = job_of_variables()  # every variable checked before any wait
    seconds = joining.join_timeout() if join_timeout is None else float(join_timeout)
    address = f"{host}:{port}"
    store = _join_store(rank, count, address, seconds)
    backend = "gloo"
    if torch.cuda.is_available():
        # Keras puts tensors on "cuda", the current device: make it this process's own.
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        backend = "nccl"
    dist.init_process_group(backend=backend, store=store, rank=rank, world_size=count,
                            timeout=timedelta(seconds=COLLECTIVE_TIMEOUT_SECONDS))
    return dist.get_world_size()


def _join_store(rank, count, address, seconds):
    """The job's key-value store, once every process has written its name in it (at most `seconds`)."""
    import torch.distributed as dist

    host, port = address.rsplit(":", 1)
    # Under torchrun the launcher itself serves the store at MASTER_PORT; a process started by hand
    # (or another launcher) with RANK 0 serves it.
    agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
    try:
        store = dist.TCPStore(host, int(port), count, is_master=rank == 0 and not agent_store,
                              timeout=timedelta(seconds=seconds), wait_for_workers=False)
    except (RuntimeError, ValueError) as error:  # torch's DistStoreError is a RuntimeError
        raise TimeoutError(joining.missing_message(rank, count, [0], address, seconds, str(error))) from None
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    keys = [f"keras_vit/joined/{attempt}/{index}" for index in range(count)]
    store.set(keys[rank], "1")
    try:
        store.wait(keys, timedelta(seconds=seconds))
    except (RuntimeError, ValueError):
        missing = [index for index, key in enumerate(keys) if not store.check([key])]
        raise TimeoutError(joining.missing_message(rank, count, missing, address, seconds)) from None
    store.set_timeout(timedelta(seconds=COLLECTIVE_TIMEOUT_SECONDS))
    return store


def _flat(tensors):
    import torch

    return torch.cat([tensor.reshape(-1).to(torch.float64) for tensor in tensors])


def broadcast_variables(variables):
    """Copy process 0's values of `variables` (weights, optimizer state, seed states) to every process.

    Each value travels as its raw bytes, so integer seed states arrive
    unchanged; one broadcast for all of them.
    """
    import numpy as np
    import torch
    import torch.distributed as dist

    # np.array, not np.ascontiguousarray: the latter turns a scalar (the iteration count) into shape (1,).
    arrays = [np.array(keras.ops.convert_to_numpy(variable.value), order="C") for variable in variables]
    sizes = [array.nbytes for array in arrays]
    buffer = torch.from_numpy(np.concatenate([array.reshape(-1).view(np.uint8) for array in arrays]
                                             or [np.zeros(0, np.uint8)]))
    dist.broadcast(buffer, src=0)
    data = buffer.numpy()
    offset = 0
    for variable, array, size in zip(variables, arrays, sizes):
        value = data[offset:offset + size].view(array.dtype).reshape(array.shape)
        offset += size
        if not np.array_equal(value, array):
            variable.assign(value)


def add_metric_states(model):
    """Add every metric's state (loss sums, correct rows, row counts) over the processes, in place.

    Keras' metrics keep sums (`aggregation="sum"`: a `Mean` keeps a total
    and a count, accuracy the correct rows and the rows): added up, they
    are the state one process has after seeing every process's rows, and
    `model.get_metrics_result()` gives the job's numbers, weighted by rows.
    Variables aggregated as a mean are averaged; others are left alone.
    """
    import torch

    dist = _group()
    variables = [v for v in model.metrics_variables if getattr(v, "aggregation", "sum") in ("sum", "mean")]
    if dist is None or not variables:
        return
    values = [keras.ops.convert_to_tensor(v.value) for v in variables]
    buffer = _flat(values).cpu()
    dist.all_reduce(buffer)
    offset = 0
    for variable, value in zip(variables, values):
        total = buffer[offset:offset + value.numel()].view(value.shape)
        offset += value.numel()
        if variable.aggregation == "mean":
            total = total / dist.get_world_size()
        variable.assign(total.to(value.dtype))


class _HeldOutBatches(keras.utils.PyDataset):
    """Whole global batches `index, index + count, ...` of a held-out dataset: one process's share."""

    def __init__(self, dataset, index, count):
        super().__init__(workers=getattr(dataset, "workers", 1),
                         use_multiprocessing=getattr(dataset, "use_multiprocessing", False),
                         max_queue_size=getattr(dataset, "max_queue_size", 10))
        self.dataset = dataset
        self.batches = list(range(index, len(dataset), count))

    def __len__(self):
        return len(self.batches)

    def __getitem__(self, index):
        return self.dataset[self.batches[index]]


class _TrainingShare(keras.utils.PyDataset):
    """This process's rows of every global batch; one row of padding where it has none of a small batch.

    The model refuses an empty batch, and every process must take each step
    (the gradients meet in an all-reduce): a process without a row of a
    batch that has fewer rows than there are processes trains on the
    batch's first row, which `_GradientAverage` weights 0.
    """

    def __init__(self, dataset, index, count):
        super().__init__(workers=getattr(dataset, "workers", 1),
                         use_multiprocessing=getattr(dataset, "use_multiprocessing", False),
                         max_queue_size=getattr(dataset, "max_queue_size", 10))
        self.share, self.whole = copy.copy(dataset), copy.copy(dataset)
        self.share.shard, self.whole.shard = (index, count), None
        self.batch_size = dataset.batch_size

    def __len__(self):
        return len(self.share)

    def rows(self, index):
        return self.share.rows(index)

    def set_epoch(self, epoch):
        for dataset in (self.share, self.whole):
            if hasattr(dataset, "set_epoch"):
                dataset.set_epoch(epoch)

    def __getitem__(self, index):
        first, stop = self.share.rows(index)
        if stop > first:
            return self.share[index]
        return keras.tree.map_structure(lambda value: value[:1], self.whole[index])


class _GradientAverage(keras.callbacks.Callback):
    """Average each step's gradients over the processes, weighted by rows; the job's numbers in the logs.

    Keras' `fit` offers no supported hook between the backward pass and the
    optimizer's update on the torch backend (its `train_step` calls
    `self.optimizer.apply(gradients)` directly, and an optimizer has no
    public gradient transform), so the optimizer's `apply` is wrapped on
    this one optimizer: it receives the gradients after one all-reduce of
    `rows * gradient` (and of `rows`), divided by the job's rows. The rows
    of each step come from the data itself (`rows`, read in
    `on_train_batch_begin`), not from the model.

    A process without a row of a small last batch trains on one row of it
    (the model refuses empty batches), weighted 0; its metrics are set back
    to what they held before that step.
    """

    def __init__(self, model, train):
        super().__init__()
        self.train = train
        self.rows = 1
        self.epoch_rows = 0
        self.saved_metrics = None
        optimizer = model.optimizer
        earlier = getattr(optimizer.apply, "__self__", None)
        # Prepared again (another `fit`): wrap Keras' own `apply`, not the earlier average.
        self.apply = earlier.apply if isinstance(earlier, _GradientAverage) else optimizer.apply
        optimizer.apply = self.averaged_apply

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch_rows = 0

    def on_train_batch_begin(self, batch, logs=None):
        if not hasattr(self.train, "rows"):  # data not shared out by `shard`: every process weighs the same
            self.rows = 1
            return
        first, stop = self.train.rows(batch)
        self.rows = stop - first
        self.epoch_rows += self.rows
        self.saved_metrics = None
        if self.rows == 0:  # a row of padding: its loss and accuracy are not the job's
            self.saved_metrics = [keras.ops.convert_to_numpy(v.value) for v in self.model.metrics_variables]

    def on_train_batch_end(self, batch, logs=None):
        if self.saved_metrics is not None:
            for variable, value in zip(self.model.metrics_variables, self.saved_metrics):
                variable.assign(value)
            self.saved_metrics = None

    def averaged_apply(self, grads, trainable_variables=None):
        import torch

        dist = _group()
        variables = trainable_variables if trainable_variables is not None else self.model.trainable_variables
        grads = [torch.zeros_like(v.value) if g is None else g for g, v in zip(grads, variables)]
        buffer = torch.cat([_flat(grads) * self.rows, torch.tensor([float(self.rows)], dtype=torch.float64,
                                                                   device=grads[0].device)])
        dist.all_reduce(buffer)
        total = buffer[-1]
        averaged, offset = [], 0
        for grad in grads:
            averaged.append((buffer[offset:offset + grad.numel()] / total).view_as(grad).to(grad.dtype))
            offset += grad.numel()
        return self.apply(averaged, trainable_variables)

    def on_epoch_end(self, epoch, logs=None):
        import torch

        dist = _group()
        if not logs:
            return
        # Training metrics are means over this process's rows: weighted by those rows, they average to
        # the job's. Validation metrics come from the metrics' states, which hold the held-out evaluation
        # now (Keras evaluates after the epoch's training): added up over processes, they are the job's.
        names = sorted(name for name in logs if not name.startswith("val_"))
        rows = float(self.epoch_rows)
        buffer = torch.tensor([float(logs[name]) * rows for name in names] + [rows], dtype=torch.float64)
        dist.all_reduce(buffer)
        for name, value in zip(names, (buffer[:-1] / buffer[-1]).tolist()):
            logs[name] = value
        if any(name.startswith("val_") for name in logs):
            add_metric_states(self.model)
            for name, value in self.model.get_metrics_result().items():
                if f"val_{name}" in logs:
                    logs[f"val_{name}"] = float(value)


class TorchProcesses(Engine):
    """The processes of a `torch.distributed` job (`torchrun`), one device each."""

    name = "PyTorch processes (torchrun)"

    @property
    def num_replicas_in_sync(self):
        """The processes of the job, each one replica (as a `tf.distribute` strategy counts them)."""
        return self.process_count()

    def process_index(self):
        group = _group()
        return group.get_rank() if group else 0

    def process_count(self):
        group = _group()
        return group.get_world_size() if group else 1

    def barrier(self, name="keras_vit"):
        group = _group()
        if group is not None:
            group.barrier()

    def broadcast_json(self, value):
        import json

        import numpy as np
        import torch

        group = _group()
        if group is None:
            return value
        payload = np.frombuffer(json.dumps(value).encode("utf-8"), dtype=np.uint8) if self.is_chief() else None
        length = torch.tensor([0 if payload is None else len(payload)], dtype=torch.int64)
        group.broadcast(length, src=0)
        buffer = torch.zeros(int(length.item()), dtype=torch.uint8)
        if payload is not None:
            buffer.copy_(torch.from_numpy(payload.copy()))
        group.broadcast(buffer, src=0)
        return json.loads(buffer.numpy().tobytes().decode("utf-8"))

    def gather_json(self, value):
        import json

        import numpy as np
        import torch

        group = _group()
        if group is None:
            return [value]
        payload = np.frombuffer(json.dumps(value).encode("utf-8"), dtype=np.uint8).astype(np.int32)
        count = group.get_world_size()
        lengths = [torch.zeros(1, dtype=torch.int64) for _ in range(count)]
        group.all_gather(lengths, torch.tensor([len(payload)], dtype=torch.int64))
        longest = max(int(length.item()) for length in lengths)
        padded = torch.zeros(longest, dtype=torch.int32)
        padded[:len(payload)] = torch.from_numpy(payload)
        rows = [torch.zeros(longest, dtype=torch.int32) for _ in range(count)]
        group.all_gather(rows, padded)
        return [json.loads(row[:int(length.item())].numpy().astype(np.uint8).tobytes().decode("utf-8"))
                for row, length in zip(rows, lengths)]

    def shard(self, dataset):
        """This process's rows of every global batch of `dataset` (a new dataset; `dataset` is not changed)."""
        if self.process_count() == 1 or not hasattr(dataset, "rows"):
            return super().shard(dataset)
        return _TrainingShare(dataset, self.process_index(), self.process_count())

    def held_out(self, dataset):
        """Whole batches of `dataset` round-robin; all of it on every process when there are fewer batches."""
        count = self.process_count()
        if dataset is None or count == 1:
            return dataset
        if not hasattr(dataset, "__getitem__") or not hasattr(dataset, "__len__"):
            return super().held_out(dataset)
        if len(dataset) < count:
            return dataset  # every process evaluates all of it: nothing to add up
        return _HeldOutBatches(dataset, self.process_index(), count)

    def _shared_out(self, dataset):
        return self.process_count() > 1 and isinstance(dataset, _HeldOutBatches)

    def prepare(self, model, train=None):
        """Copy process 0's state to every process; average gradients and logs over them from now on.

        Copies process 0's weights, optimizer state and seed states to every
        process, then averages the gradients of every training step across
        processes before the optimizer applies them (gradient clipping and
        accumulation then act on the average, as in one process). Returns
        the callback to put first among `fit`'s.

        Args:
            model: a compiled `keras.Model`.
            train: the training data as `shard` returned it (its `rows(i)`
                give this process's rows of batch `i`).
        """
        if self.process_count() == 1:
            return []
        if model.optimizer is None:
            raise RuntimeError("Compile the model before training it in a job of several processes: the "
                               "gradients are averaged in its optimizer.")
        if not model.optimizer.built:
            model.optimizer.build(model.trainable_variables)
        broadcast_variables(list(model.variables) + list(model.optimizer.variables))
        return [_GradientAverage(model, train)]

    def evaluate(self, model, dataset):
        share = self.held_out(dataset)
        order = []
        if len(share) == 0:  # fewer batches than processes never happens here (`held_out`); kept for safety
            model.reset_metrics()
        else:
            order = list(model.evaluate(share, verbose=0, return_dict=True))
        if self._shared_out(share):
            add_metric_states(model)
        totals = model.get_metrics_result()
        # In the order Keras' `evaluate` gives them (loss first), as one process prints them.
        names = [name for name in order if name in totals] + [name for name in totals if name not in order]
        return {name: float(totals[name]) for name in names}

    def restore(self, checkpoint, model):
        """Process 0 reads the backup; `prepare` copies its weights and optimizer state to the others.

        The run directory need not be shared; the epoch count and the random
        generator's state travel with `broadcast_json`.
        """
        if self.process_count() == 1:
            return checkpoint.restore(model)
        epochs = checkpoint.restore(model) if self.is_chief() else 0
        state = self.broadcast_json({"epochs": epochs, "rng": getattr(checkpoint, "_pending_global_rng", None),
                                     "keepers": getattr(checkpoint, "restored_keepers", None) or {}})
        checkpoint._pending_global_rng = state["rng"]
        if hasattr(checkpoint, "restore_keepers"):  # the best evaluation so far: every process decides alike
            checkpoint.restore_keepers(state["keepers"], state["epochs"])
        return state["epochs"]
