"""Which process of a multi-process job this is: short names for what the job's engine says.

A TPU pod slice, a multi-GPU box under `torchrun` and a multi-node cluster
all run one Python process per host or per device. Only process 0 (the
chief) prints progress and writes checkpoints, logs and models. Everything
here asks `keras_vit.distribution.engines.current()`, the one place that
knows how each backend's processes work together (see that package).
"""

from keras_vit.distribution import engines


def process_count():
    """The number of processes in the job (1 when nothing was initialised)."""
    return engines.current().process_count()


def process_index():
    """This process's index in the job, `0 <= index < process_count()`."""
    return engines.current().process_index()


def is_chief():
    """True on process 0: the one that prints progress and writes files."""
    return engines.current().is_chief()


def barrier(name="keras_vit"):
    """Wait until every process of the job reaches this point (nothing to wait for alone)."""
    engines.current().barrier(name)


def broadcast_json(value):
    """The chief's `value` (any JSON value) on every process: each returns what process 0 passed."""
    return engines.current().broadcast_json(value)


def saving_is_collective():
    """True when every process must take part in saving a model (only process 0's file is kept)."""
    return engines.current().saving_is_collective()
