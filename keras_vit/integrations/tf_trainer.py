"""The first batch Keras' TensorFlow trainer builds a model from, as one replica's tensors.

Under a `tf.distribute` strategy, Keras 3's TensorFlow trainer builds the
model, its compiled loss and metrics before the first step
(`_maybe_symbolic_build`). To learn the input shapes and dtypes it takes the
first distributed batch and reduces it across replicas with
`strategy.reduce("MEAN", batch, axis=None)`. Under
`MultiWorkerMirroredStrategy` that eager cross-worker reduce cannot take the
per-replica batch: "ValueError: Attempt to convert a value (PerReplica:{...})
with an unsupported type (PerReplica) to a Tensor" (Keras issue 20585,
open), so `fit` fails before its first step. The symbolic build reads only
shapes and dtypes, which one replica's tensors have as well: `local_batch`
gives it those, with no collective at all.

TensorFlow is imported inside the function: this module is used only when
the TensorFlow backend runs.
"""


def local_batch(strategy, iterator):
    """The first batch of a Keras TensorFlow epoch iterator, with one replica's tensors for distributed values.

    Takes one batch, as Keras does (it resets the iterator after the build,
    so training still starts at the first batch). Every
    `tf.distribute.DistributedValues` in it is replaced by this worker's
    first replica's tensor (`strategy.experimental_local_results(value)[0]`,
    the same shape and dtype the reduce would give); other values are kept,
    as Keras keeps them.

    Args:
        strategy: the model's `tf.distribute.Strategy`
            (`model.distribute_strategy`).
        iterator: the epoch iterator Keras' TensorFlow trainer passes to
            `_maybe_symbolic_build`: iterating it yields
            `(begin_step, end_step, tf_iterator)`.

    Returns:
        The batch (a structure of tensors), or `None` when the iterator does
        not have that form (a Keras that changed it: the caller then leaves
        the build to Keras).
    """
    import tensorflow as tf

    try:
        for _, _, batches in iterator:
            batch = next(batches)
            break
        else:
            return None
    except (TypeError, ValueError):
        return None

    def one_replica(value):
        if isinstance(value, tf.distribute.DistributedValues):
            return strategy.experimental_local_results(value)[0]
        return value

    return tf.nest.map_structure(one_replica, batch)


def multi_worker(strategy):
    """True for a `MultiWorkerMirroredStrategy` whose cluster has more than one task (chief or worker)."""
    import tensorflow as tf

    if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return False
    cluster = strategy.cluster_resolver.cluster_spec().as_dict()
    return len(cluster.get("chief", [])) + len(cluster.get("worker", [])) > 1


def reducible_logs(logs):
    """`logs` (a step's metric results) with every scalar made a vector of one value.

    Across workers, Keras' TensorFlow trainer averages what a train or test
    step returns with `strategy.reduce("MEAN", value, axis=0)`, which needs
    an axis 0 that the scalar results lack ("Invalid reduction dimension 0
    for input with 0 dimensions"; within one worker it averages them with
    `tf.reduce_mean` and no axis, so this is needed across workers only).
    A vector of one value averages to the same scalar.
    """
    import tensorflow as tf

    def vector(value):
        if isinstance(value, tf.Tensor) and value.shape.rank == 0:
            return tf.reshape(value, [1])
        return value

    return tf.nest.map_structure(vector, logs)
