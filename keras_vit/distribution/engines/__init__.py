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

from keras_vit.distribution.engines import joining
from keras_vit.distribution.engines.base import Engine
from keras_vit.distribution.engines.joining import DEFAULT_JOIN_TIMEOUT, JOIN_TIMEOUT_VARIABLE, JobError, join_timeout
# The engine modules import no framework at module level (each imports its own inside the functions that
# run only on its backend), so all four load here and `current()` picks one.
from keras_vit.distribution.engines import jax_processes, tf_workers, torch_processes
from keras_vit.distribution.engines.jax_processes import JaxProcesses
from keras_vit.distribution.engines.one_process import OneProcess
from keras_vit.distribution.engines.tf_workers import TensorFlowWorkers
from keras_vit.distribution.engines.torch_processes import TorchProcesses

_ENGINES = {}


def _engine(engine_name):
    if engine_name not in _ENGINES:
        classes = {"jax": JaxProcesses, "torch": TorchProcesses, "tensorflow": TensorFlowWorkers}
        _ENGINES[engine_name] = classes.get(engine_name, OneProcess)()
    return _ENGINES[engine_name]


def current():
    """The engine of the job this process runs in (one instance of each engine, made on first use).

    JAX: `JaxProcesses` (one or several processes; it also knows the
    devices a batch is split over). PyTorch: `TorchProcesses` once the
    process joined a `torch.distributed` group of several. TensorFlow:
    `TensorFlowWorkers` under a multi-worker strategy. Otherwise `OneProcess`.
    """
    backend = keras.backend.backend()
    if backend == "jax":
        return _engine("jax")
    if backend == "torch":
        return _engine("torch" if torch_processes.running() else "one")
    if backend == "tensorflow":
        return _engine("tensorflow" if tf_workers.current_strategy() is not None else "one")
    return _engine("one")


# Which backend joins the job each launcher describes.
_LAUNCHERS = {"torchrun": "torch", "TF_CONFIG": "tensorflow", "KERAS_DISTRIBUTION_*": "jax"}


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
    if environ.get("RANK", "").strip() and environ.get("WORLD_SIZE", "").strip():
        count = joining.integer(environ, "WORLD_SIZE", torch_processes._FIX, 1)
        if count > 1:
            torch_processes.job_of_variables(environ)
            jobs.append(("torchrun", count, f"torchrun's RANK={environ['RANK'].strip()}, WORLD_SIZE={count}"))
    tf_job = tf_workers.tf_config_job(environ)
    if tf_job is not None:
        jobs.append(("TF_CONFIG", tf_job[1], f"a TF_CONFIG of {tf_job[1]} training tasks"))
    jax_job = jax_processes.job_of_variables(environ)
    if jax_job is not None and jax_job[1] > 1:
        jobs.append(("KERAS_DISTRIBUTION_*", jax_job[1], f"KERAS_DISTRIBUTION_NUM_PROCESSES={jax_job[1]}"))
    return jobs


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
    if all(_LAUNCHERS[launcher] != backend for launcher, _, _ in jobs):
        raise JobError(
            f"{launcher} describes a job of {count} processes ({variables}), which the {backend} backend does "
            f"not join: each process would train alone. Set KERAS_BACKEND={_LAUNCHERS[launcher]}, or describe "
            f"the job as the {backend} backend reads it (docs/scale-out.md).")


__all__ = ["DEFAULT_JOIN_TIMEOUT", "Engine", "JOIN_TIMEOUT_VARIABLE", "JobError", "check_launch", "current",
           "join_timeout", "launched_jobs"]
