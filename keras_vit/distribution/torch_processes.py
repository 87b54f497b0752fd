"""Data-parallel `model.fit` across processes on PyTorch (`torchrun`, `torch.distributed`).

Keras' `fit` on the torch backend trains in one process. A multi-GPU box or a
cluster runs one process per device under `torchrun`; each process here
trains the same model on its share of every global batch, and before each
optimizer update the gradients are averaged across processes in one
all-reduce. That is what `torch.nn.parallel.DistributedDataParallel` does; it
cannot wrap a model whose forward pass Keras' trainer calls itself, so the
average is taken between Keras' backward pass and its optimizer.

Launch (every process runs the same command)::

    torchrun --nproc_per_node=8 -m keras_vit finetune DATA --preset ... --distribute data

or, from Python, inside a script started by `torchrun`::

    from keras_vit.distribution import torch_processes
    torch_processes.initialize()
    model.compile(...)
    torch_processes.data_parallel(model)
    model.fit(ImageFolderDataset(..., shard=(rank, world_size)), ...)
"""

import os
from datetime import timedelta

import keras

TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def launched_by_torchrun():
    """True when `torchrun` (or another launcher that sets the same variables) started this process."""
    return all(name in os.environ for name in TORCHRUN_VARIABLES)


def initialize(timeout_seconds=600):
    """Join the `torch.distributed` process group that `torchrun` set up; return the process count.

    Uses NCCL when this process has a CUDA device (the one of its
    `LOCAL_RANK`) and gloo on CPUs. Calling it again does nothing.

    Args:
        timeout_seconds: int. How long a collective waits for a process
            that stopped before failing (torch's default is 30 minutes).
            Defaults to `600`.

    Returns:
        int. The number of processes.

    Raises:
        RuntimeError: not under `torchrun`, or not on the torch backend.
    """
    if keras.backend.backend() != "torch":
        raise RuntimeError(f"torch.distributed needs KERAS_BACKEND=torch. Received: backend={keras.backend.backend()!r}")
    import torch
    import torch.distributed as dist

    if dist.is_initialized():
        return dist.get_world_size()
    if not launched_by_torchrun():
        missing = [name for name in TORCHRUN_VARIABLES if name not in os.environ]
        raise RuntimeError(
            "Data parallelism on PyTorch runs one process per device, started by torchrun: "
            "`torchrun --nproc_per_node=N -m keras_vit COMMAND ... --distribute data` (add --nnodes, "
            f"--node_rank and --master_addr for several machines). Missing: {', '.join(missing)}."
        )
    backend = "gloo"
    if torch.cuda.is_available():
        # Keras puts tensors on "cuda", the current device: make it this process's own.
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        backend = "nccl"
    dist.init_process_group(backend=backend, timeout=timedelta(seconds=timeout_seconds))
    return dist.get_world_size()


def _flat(tensors):
    import torch

    return torch.cat([tensor.reshape(-1).to(torch.float32) for tensor in tensors])


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


class _GradientAverage:
    """Average each step's gradients over every process, weighted by the rows each one trained on.

    Installed on a compiled model: its `train_step` records the local batch
    size, and its optimizer's `apply` receives the gradients after one
    all-reduce of `rows * gradient` (and of `rows`), divided by the global
    row count, so an uneven last batch averages exactly as one process would.
    """

    def __init__(self, model):
        self.model = model
        self.rows = 0
        self.epoch_rows = 0
        self.train_step = model.train_step
        self.apply = model.optimizer.apply

    def local_train_step(self, data):
        first = keras.tree.flatten(data)[0]
        self.rows = int(first.shape[0])
        self.epoch_rows += self.rows
        return self.train_step(data)

    def averaged_apply(self, grads, trainable_variables=None):
        import torch
        import torch.distributed as dist

        variables = trainable_variables if trainable_variables is not None else self.model.trainable_variables
        grads = [torch.zeros_like(v.value) if g is None else g for g, v in zip(grads, variables)]
        buffer = torch.cat([_flat(grads) * self.rows, torch.tensor([float(self.rows)])])
        dist.all_reduce(buffer)
        total = buffer[-1]
        averaged, offset = [], 0
        for grad in grads:
            averaged.append((buffer[offset:offset + grad.numel()] / total).view_as(grad).to(grad.dtype))
            offset += grad.numel()
        return self.apply(averaged, trainable_variables)


class AverageLogs(keras.callbacks.Callback):
    """Replace each process's epoch logs by the average over every process (weighted by rows trained).

    Put it first among the callbacks, so the CSV log and the checkpoint of
    process 0 record the job's loss and metrics, not process 0's alone.
    """

    def __init__(self, average):
        super().__init__()
        self.average = average

    def on_epoch_begin(self, epoch, logs=None):
        self.average.epoch_rows = 0

    def on_epoch_end(self, epoch, logs=None):
        import torch
        import torch.distributed as dist

        if not logs:
            return
        names = sorted(logs)
        rows = float(self.average.epoch_rows)
        # Training metrics are means over this process's rows; validation metrics
        # (every process evaluates the same data) come out unchanged.
        buffer = torch.tensor([float(logs[name]) * rows for name in names] + [rows], dtype=torch.float64)
        dist.all_reduce(buffer)
        for name, value in zip(names, (buffer[:-1] / buffer[-1]).tolist()):
            logs[name] = value


class TorchDataParallel:
    """`--distribute data` on PyTorch: the processes of a `torchrun` job, each with one device.

    The counterpart of a `keras.distribution.DataParallel` for the training
    workflows: `scope()` changes nothing (each process holds a whole model
    on its own device), and `keras_vit.workflows.training.fit_resumable`
    shards the data and averages the gradients (`data_parallel`).

    Args:
        timeout_seconds: int. See `initialize`.
    """

    def __init__(self, timeout_seconds=600):
        self.num_replicas_in_sync = initialize(timeout_seconds)

    def scope(self):
        import contextlib

        return contextlib.nullcontext()


def data_parallel(model):
    """Train `model` (compiled) in data parallel with every process of the `torch.distributed` job.

    Copies process 0's weights, optimizer state and seed states to every
    process, then averages the gradients of every training step across
    processes before the optimizer applies them (gradient clipping and
    accumulation then act on the average, as in one process). Feed each
    process its share of every global batch (`ImageFolderDataset(shard=...)`,
    `ArrayBatches(shard=...)`), and add the returned callback first to
    `fit`'s callbacks so the logs are the job's.

    Args:
        model: a compiled `keras.Model`.

    Returns:
        An `AverageLogs` callback for `fit`.

    Raises:
        RuntimeError: no process group (call `initialize()` first) or the
            model is not compiled.
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError("No torch.distributed process group: call keras_vit.distribution.torch_processes."
                           "initialize() first (under torchrun).")
    if model.optimizer is None:
        raise RuntimeError("Compile the model before `data_parallel(model)`: the gradients are averaged in its "
                           "optimizer.")
    if not model.optimizer.built:
        model.optimizer.build(model.trainable_variables)
    broadcast_variables(list(model.variables) + list(model.optimizer.variables))
    average = _GradientAverage(model)
    model.train_step = average.local_train_step
    model.optimizer.apply = average.averaged_apply
    model.make_train_function(force=True)
    return AverageLogs(average)
