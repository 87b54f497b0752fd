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

import keras

from keras_vit.distribution.engines.base import Engine
from keras_vit.distribution.engines.joining import DEFAULT_JOIN_TIMEOUT, JOIN_TIMEOUT_VARIABLE, join_timeout
# The engine modules import no framework at module level (each imports its own inside the functions that
# run only on its backend), so all four load here and `current()` picks one.
from keras_vit.distribution.engines import tf_workers, torch_processes
from keras_vit.distribution.engines.jax_processes import JaxProcesses
from keras_vit.distribution.engines.one_process import OneProcess
from keras_vit.distribution.engines.tf_workers import TensorFlowWorkers
from keras_vit.distribution.engines.torch_processes import TorchProcesses

_ENGINES = {}


def _engine(kind):
    if kind not in _ENGINES:
        kinds = {"jax": JaxProcesses, "torch": TorchProcesses, "tensorflow": TensorFlowWorkers}
        _ENGINES[kind] = kinds.get(kind, OneProcess)()
    return _ENGINES[kind]


def current():
    """The engine of the job this process runs in (one instance per kind, made on first use).

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


__all__ = ["DEFAULT_JOIN_TIMEOUT", "Engine", "JOIN_TIMEOUT_VARIABLE", "current", "join_timeout"]
