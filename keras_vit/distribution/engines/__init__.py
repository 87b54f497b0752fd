"""The engine of a job: the one place that knows how the processes of a job work together.

One module per engine, behind one interface (`base.Engine`):

| engine | module | processes |
|---|---|---|
| one process | `one_process.OneProcess` | PyTorch or TensorFlow without a job (one device, or `MirroredStrategy` / `TPUStrategy` devices) |
| JAX | `jax_processes.JaxProcesses` | `jax.distributed` processes under one `keras.distribution` (also one JAX process) |
| PyTorch | `torch_processes.TorchProcesses` | one process per device under `torchrun` |
| TensorFlow | `tf_workers.TensorFlowWorkers` | the workers of a `MultiWorkerMirroredStrategy` (`TF_CONFIG`) |

`current()` chooses it from the backend and the job this process joined;
the workflows ask it everything about the job (index, count, barrier,
broadcast, sharding, evaluation, saving) and never test the backend.
"""

import os

import keras

from keras_vit.distribution.engines.base import Engine
from keras_vit.distribution.engines.joining import DEFAULT_JOIN_TIMEOUT, JOIN_TIMEOUT_VARIABLE, JobError, join_timeout
# The engine modules import no framework at module level (each imports its own inside the functions that
# run only on its backend), so all four load here and `current()` picks one.
from keras_vit.distribution.engines import jax_processes, tf_workers, torch_processes
from keras_vit.distribution.engines.jax_processes import JaxProcesses
from keras_vit.distribution.engines.one_process import OneProcess
from keras_vit.distribution.engines.tf_workers import TensorFlowWorkers
from keras_vit.distribution.engines.torch_processes import TorchProcesses

# The engines of several processes: the backend each runs on, its module and its `Engine`, in the order a launch
# is checked. Each module defines `launcher()`, `launched_job(environ)` and `runs_this_process()`; a fourth
# engine is one such module and one entry here (docs/scale-out.md).
_JOB_ENGINES = {
    "torch": (torch_processes, TorchProcesses),
    "tensorflow": (tf_workers, TensorFlowWorkers),
    "jax": (jax_processes, JaxProcesses),
}
# Every variable a launcher sets to start a process as one of a job (nine): a process started without the
# launcher's job, as the tests start one, clears these.
LAUNCHER_VARIABLES = tuple(name for module, _ in _JOB_ENGINES.values() for name in module.launcher()[1])

_ENGINES = {}


def _engine(backend):
    if backend not in _ENGINES:
        _ENGINES[backend] = _JOB_ENGINES[backend][1]() if backend in _JOB_ENGINES else OneProcess()
    return _ENGINES[backend]


def current():
    """The engine of the job this process runs in (one instance of each engine, made on first use).

    JAX: `JaxProcesses` (one or several processes; it also knows the
    devices a batch is split over). PyTorch: `TorchProcesses` once the
    process joined a `torch.distributed` group of several. TensorFlow:
    `TensorFlowWorkers` under a multi-worker strategy. Otherwise `OneProcess`.
    """
    backend = keras.backend.backend()
    if backend in _JOB_ENGINES and _JOB_ENGINES[backend][0].runs_this_process():
        return _engine(backend)
    return _engine("one")


def launched_jobs(environ=None):
    """`[(launcher, count, variables)]`: each launcher whose variables start this process as one of several.

    A launcher's variables describe a job of several processes: torchrun's
    `RANK` and `WORLD_SIZE` (more than 1), a `TF_CONFIG` of several
    training tasks, Keras' `KERAS_DISTRIBUTION_NUM_PROCESSES` (more than 1).
    Their values are checked as each engine checks them (`JobError`
    naming the variable); `variables` spells what was read, for messages.
    """
    environ = os.environ if environ is None else environ
    jobs = []
    for module, _ in _JOB_ENGINES.values():
        job = module.launched_job(environ)
        if job is not None:
            jobs.append((module.launcher()[0], *job))
    return jobs


def _backend_of(launcher):
    return next(backend for backend, (module, _) in _JOB_ENGINES.items() if module.launcher()[0] == launcher)


def check_launch(distribute, environ=None):
    """Refuse, before any work, a process a launcher started as one of several that would not join them.

    Without `--distribute` (`distribute=None`) each process of the launch
    would train alone on the same data and write the same outputs (under
    torchrun the second stopped at the first's log.csv): refused, with the
    flag to add. Joining them silently instead would change what
    `--batch-size` means (the job's batch, shared out) behind the user's
    back; the refusal names the flag, and the user decides. With
    `--distribute` on a backend that reads none of the launchers' variables
    present (torchrun's alone under JAX, `TF_CONFIG` under PyTorch), the
    processes would also train alone: refused, naming the backend to use.

    Raises:
        JobError: the launcher, its variables and the fix.
    """
    jobs = launched_jobs(environ)
    if not jobs:
        return
    launcher, count, variables = jobs[0]
    if not distribute:
        raise JobError(
            f"This process is one of {count} that a launcher started ({variables}), but without --distribute "
            f"each would train alone on the same data and outputs. Add --distribute data to train them as one "
            f"job (--batch-size is then the job's batch, shared out), or start one process without the "
            f"launcher's variables.")
    backend = keras.backend.backend()
    if all(_backend_of(launcher) != backend for launcher, _, _ in jobs):
        raise JobError(
            f"{launcher} describes a job of {count} processes ({variables}), which the {backend} backend does "
            f"not join: each process would train alone. Set KERAS_BACKEND={_backend_of(launcher)}, or describe "
            f"the job as the {backend} backend reads it (docs/scale-out.md).")


__all__ = ["DEFAULT_JOIN_TIMEOUT", "Engine", "JOIN_TIMEOUT_VARIABLE", "JobError", "LAUNCHER_VARIABLES", "check_launch",
           "current", "join_timeout", "launched_jobs"]
