"""The engine of a TensorFlow job: workers of a `MultiWorkerMirroredStrategy`, described by `TF_CONFIG`.

Each worker of the job is one process (one per host) started with the same
command and its own `TF_CONFIG`, the JSON that names every worker's
`host:port` and this one's index:

    TF_CONFIG='{"cluster": {"worker": ["host0:port", "host1:port"]}, "task": {"type": "worker", "index": 0}}'

`strategy()` waits, at most `KERAS_VIT_JOIN_TIMEOUT` seconds, until every
worker has started, then creates the job's
`tf.distribute.MultiWorkerMirroredStrategy`, which TensorFlow accepts only
before any other TensorFlow operation of the process. The engine
(`TensorFlowWorkers`) passes barriers and broadcasts through the strategy's
collectives, feeds each worker its own rows of every global batch
(`worker_batches`), weighs each worker's loss by its share of the batch's
rows (`RowShare`), and applies the two workarounds Keras' TensorFlow
trainer needs under this strategy (`prepare`, with the code in
`keras_vit/integrations/tf_trainer.py`). Saving is collective: every worker
saves, and only worker 0's file is kept. The strategy sums the gradients
across workers every step; `keras_vit.optimizers` clip and accumulate that
sum (`keras_vit/integrations/tf_optimizers.py`).
"""

import json
import os

import keras

from keras_vit.distribution.engines import joining, peer_watch
from keras_vit.distribution.engines.base import Engine
from keras_vit.integrations.tf_trainer import local_batch, multi_worker, reducible_logs

# The job's strategy, made once per process: TensorFlow allows one collective setup per process.
_STRATEGY = None


_EXAMPLE = '{"cluster": {"worker": ["host0:port", "host1:port"]}, "task": {"type": "worker", "index": 0}}'


def _tf_config(environ=None):
    """The cluster and task of `TF_CONFIG`, checked whole before any wait; `None` when it is unset or empty.

    The JSON TensorFlow reads: `cluster` maps each task type to a list of
    `host:port` strings (ports from 1 to 65535; one `chief` at most), and
    `task` names this process's type (one of the cluster's) and its index
    in that type's list. A worker list given as one string (which TensorFlow
    would read as a list of its characters) and an index outside the list
    are refused here.

    Raises:
        JobError: what is wrong, the value received and an example.
    """
    text = (os.environ if environ is None else environ).get("TF_CONFIG", "")
    if not text.strip():
        return None

    def wrong(problem):
        return joining.JobError(f"TF_CONFIG must be JSON like {_EXAMPLE}, naming every worker's host:port and "
                                f"this process's task; this one {problem} (docs/scale-out.md). Received: "
                                f"TF_CONFIG={text!r}")

    try:
        config = json.loads(text)
    except ValueError as error:
        raise wrong(f"is not JSON ({error})") from None
    if not isinstance(config, dict) or not isinstance(config.get("cluster"), dict) or not config["cluster"]:
        raise wrong('has no "cluster" of task lists')
    cluster, task = config["cluster"], config.get("task", {})
    for task_type, addresses in cluster.items():
        if not isinstance(addresses, list) or not addresses:
            raise wrong(f'lists the {task_type!r} tasks as {json.dumps(addresses)}, not as a list of "host:port" '
                        'strings')
        for address in addresses:
            joining.host_and_port(address, "TF_CONFIG", f"e.g. TF_CONFIG='{_EXAMPLE}' (docs/scale-out.md).",
                                  what=f"each {task_type} task's address")
    if len(cluster.get("chief", [])) > 1:
        raise wrong("names more than one chief")
    # An evaluator may be left out of the cluster (TensorFlow allows it); `tf_config_job` refuses it by name.
    if not isinstance(task, dict) or task.get("type") not in (*cluster, "evaluator"):
        raise wrong(f'has no "task" whose "type" is one of the cluster\'s ({", ".join(cluster)})')
    index = task.get("index", 0)
    if isinstance(index, str) and index.strip().isdigit():
        index = int(index)
    tasks = len(cluster.get(task["type"], [None]))
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < tasks:
        raise wrong(f'gives the task the index {json.dumps(index)}, not one from 0 to {tasks - 1} (its place '
                    f'among the {tasks} {task["type"]} tasks)')
    return cluster, task["type"], index


# The task types of a `MultiWorkerMirroredStrategy`: every one of them trains.
TRAINING_TASKS = ("chief", "worker")


def tf_config_job(environ=None):
    """`(index, count)` of this task in the training cluster `TF_CONFIG` describes, or `None`.

    The tasks that train are the `chief` (index 0, when there is one) and
    the `worker`s. `None` when `TF_CONFIG` is unset, or names fewer than
    two training tasks (one process). An `evaluator` or `ps` task, and a
    cluster with parameter servers, are refused: keras_vit trains with
    `MultiWorkerMirroredStrategy`, which has no such tasks, so the process
    would train alone on the job's data and outputs.

    Raises:
        JobError: `TF_CONFIG` is not the JSON TensorFlow reads, or names a
            task keras_vit does not run (checked whole, before any wait).
    """
    config = _tf_config(environ)
    if config is None:
        return None
    cluster, task_type, index = config
    others = sorted(set(cluster) - set(TRAINING_TASKS))
    if task_type not in TRAINING_TASKS or "ps" in cluster:
        what = (f"gives this process the task type {task_type!r}" if task_type not in TRAINING_TASKS
                else f"lists {', '.join(repr(name) for name in others)} tasks beside the workers")
        text = (os.environ if environ is None else environ).get("TF_CONFIG", "")
        raise joining.JobError(
            f"TF_CONFIG {what}, but keras_vit trains with MultiWorkerMirroredStrategy, whose tasks are the chief "
            f"and the workers (no evaluator, no parameter servers): this process would train alone on the job's "
            f"data and outputs. Start keras-vit on the chief and worker tasks only, each with a TF_CONFIG whose "
            f"cluster lists just those (evaluate the saved model afterwards, without TF_CONFIG), or unset "
            f"TF_CONFIG to train one process (docs/scale-out.md). Received: TF_CONFIG={text!r}")
    chiefs, workers = len(cluster.get("chief", [])), len(cluster.get("worker", []))
    if chiefs + workers < 2:
        return None
    return (index if task_type == "chief" else chiefs + index), chiefs + workers


def launcher():
    """`(name, variables)`: what starts this engine's processes and the variables it sets (`engines.launched_jobs`)."""
    return "TF_CONFIG", ("TF_CONFIG",)



def launched_job(environ=None):
    """`(count, variables)` when `TF_CONFIG` starts this process as one of several training tasks, else `None`.

    Raises:
        JobError: `TF_CONFIG` is not the JSON TensorFlow reads.
    """
    job = tf_config_job(environ)
    return None if job is None else (job[1], f"a TF_CONFIG of {job[1]} training tasks")


def runs_this_process():
    """True when this process trains under a multi-worker strategy of several workers."""
    return current_strategy() is not None


def first_worker_address(environ=None):
    """The `host:port` of process 0 of the job `TF_CONFIG` describes (the chief, else worker 0), or `None`."""
    text = (os.environ if environ is None else environ).get("TF_CONFIG", "")
    if tf_config_job(environ) is None:
        return None
    cluster = json.loads(text)["cluster"]
    return (cluster.get("chief") or cluster["worker"])[0]


def strategy(join_timeout=None):
    """The job's `tf.distribute.MultiWorkerMirroredStrategy` (made on the first call; TensorFlow backend).

    Call it before any TensorFlow operation of the process (TensorFlow
    refuses to set up collectives afterwards); with `TF_CONFIG` set,
    `keras_vit.distribution.distribution_for_backend("data")` does. It
    first waits, at most `join_timeout` seconds, until every worker of
    `TF_CONFIG` has reached process 0's address (TensorFlow's own wait for
    a worker that never starts has no bound this process can catch).

    Args:
        join_timeout: float or `None`. Seconds to wait for the other
            workers; `None` reads `KERAS_VIT_JOIN_TIMEOUT` (default 60).

    Raises:
        ValueError: `TF_CONFIG` does not describe a job of several workers,
            or TensorFlow ran an operation before (the error says so).
        TimeoutError: a worker did not start in time (the error names it
            and process 0's address).
    """
    global _STRATEGY
    if _STRATEGY is not None:
        return _STRATEGY
    job_of_config = tf_config_job()
    if job_of_config is None:
        raise ValueError(
            "A TensorFlow job of several workers is described by TF_CONFIG, which names every worker and this "
            'one\'s index, e.g. TF_CONFIG=\'{"cluster": {"worker": ["host0:port", "host1:port"]}, "task": '
            '{"type": "worker", "index": 0}}\' (docs/scale-out.md). Received: '
            f"TF_CONFIG={os.environ.get('TF_CONFIG')!r}")
    seconds = joining.join_timeout() if join_timeout is None else float(join_timeout)
    # Meet first on process 0's port, with a bounded wait; its gRPC server takes the port afterwards. The
    # connections stay open: a worker that dies later stops the others at once, named (`peer_watch`).
    peers = joining.rendezvous(*job_of_config, first_worker_address(), seconds, keep=True)
    import tensorflow as tf

    try:
        _STRATEGY = tf.distribute.MultiWorkerMirroredStrategy()
    except (RuntimeError, ValueError) as error:
        raise ValueError(
            "TensorFlow could not set up the multi-worker job: MultiWorkerMirroredStrategy must be created "
            "before any other TensorFlow operation of the process. Create it first (call "
            f"keras_vit.distribution.tf_workers.strategy() at the start of the program). TensorFlow said: {error}"
        ) from None
    peer_watch.start(*job_of_config, peers)
    return _STRATEGY


def current_strategy():
    """The multi-worker strategy this process trains under, or `None` (off TensorFlow, or one process).

    The one `strategy()` made, else the strategy whose scope is open when
    it is a `MultiWorkerMirroredStrategy` of several workers (one a user
    made).
    """
    if keras.backend.backend() != "tensorflow":
        return None
    if _STRATEGY is not None:
        return _STRATEGY
    import tensorflow as tf

    if not tf.distribute.has_strategy():
        return None
    current = tf.distribute.get_strategy()
    return current if multi_worker(current) else None


def job():
    """`(index, count)` of this worker in its multi-worker TensorFlow job, or `None` outside one."""
    current = current_strategy()
    if current is None:
        return None
    resolver = current.cluster_resolver
    cluster = resolver.cluster_spec().as_dict()
    chiefs = len(cluster.get("chief", []))
    index = resolver.task_id if resolver.task_type == "chief" else chiefs + resolver.task_id
    return index, chiefs + len(cluster.get("worker", []))


def _all_reduce_sum(values):
    """The element-wise sum over the job's workers of `values` (a numpy array, one per worker)."""
    import tensorflow as tf

    current = current_strategy()
    local = tf.constant(values)
    devices = len(current.extended.worker_devices)

    @tf.function  # the strategy's collectives run eagerly only slowly, with a warning
    def all_reduce():
        # One replica per local device: the first of each worker contributes, the others add zeros.
        per_replica = current.run(lambda: tf.where(
            tf.equal(tf.distribute.get_replica_context().replica_id_in_sync_group % devices, 0),
            local, tf.zeros_like(local)))
        return current.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

    return all_reduce().numpy()


def barrier():
    """Wait until every worker of the job reaches this point (an all-reduce of one number)."""
    _all_reduce_sum(0)


def broadcast_json(value, is_chief):
    """The chief's `value` (any JSON value) on every worker, sent as UTF-8 JSON bytes (never pickled)."""
    import numpy as np

    payload = np.frombuffer(json.dumps(value).encode("utf-8"), dtype=np.uint8).astype(np.int32) if is_chief else None
    length = int(_all_reduce_sum(np.int64(0 if payload is None else len(payload))))
    buffer = _all_reduce_sum(np.zeros(length, np.int32) if payload is None else payload)
    return json.loads(buffer.astype(np.uint8).tobytes().decode("utf-8"))


def gather_json(value, index, count):
    """Every worker's `value` (any JSON value), in worker order, on every worker (UTF-8 JSON bytes, never pickled)."""
    import numpy as np

    payload = np.frombuffer(json.dumps(value).encode("utf-8"), dtype=np.uint8).astype(np.int32)
    own = np.zeros(count, np.int64)
    own[index] = len(payload)
    lengths = _all_reduce_sum(own)
    rows = np.zeros((count, int(lengths.max())), np.int32)  # each worker fills its row, the sum holds them all
    rows[index, :len(payload)] = payload
    rows = _all_reduce_sum(rows)
    return [json.loads(row[:int(length)].astype(np.uint8).tobytes().decode("utf-8"))
            for row, length in zip(rows, lengths)]


def worker_batches(data, current=None):
    """`data` (a sharded `keras.utils.PyDataset`) as the job's distributed dataset for `fit` and `evaluate`.

    `data` gives this worker's rows of every global batch
    (`shard=(index, count)`, as `TensorFlowWorkers.shard` sets it).
    Passed to `fit` as it is, Keras would turn it into a `tf.data` pipeline
    that the strategy then splits again by data (taking part of this
    worker's part); and left unsharded, every worker would read every image
    and keep its share. Here each worker's own batches become its replica's
    batches (`distribute_datasets_from_function`, which neither rebatches
    nor shards): every image is read once per epoch, by one worker.

    Batches are read when `fit` asks for them, from `data[i]` in order,
    after the callbacks' `on_epoch_begin` (so `set_epoch` chooses the
    epoch's order); batch 0 is read once more here for the element spec.
    One replica per worker (one device each, as on CPUs or one GPU per
    worker).

    Raises:
        ValueError: more than one replica on this worker.
    """
    import numpy as np
    import tensorflow as tf

    current = current or current_strategy()
    if len(current.extended.worker_devices) != 1:
        raise ValueError(
            "Each worker feeds its own rows to one replica: run one worker per device (one process per GPU, "
            f"or per CPU host). Received: {len(current.extended.worker_devices)} devices on this worker.")

    def spec(value):
        value = np.asarray(value)
        return tf.TensorSpec((None, *value.shape[1:]), tf.as_dtype(value.dtype))

    first = data[0]
    signature = tuple(spec(v) for v in first) if isinstance(first, tuple) else spec(first)

    def batches():
        for index in range(len(data)):
            yield data[index]

    def dataset(context):
        # The number of batches is known: Keras then counts the steps instead of running into the end.
        dataset = tf.data.Dataset.from_generator(batches, output_signature=signature)
        return dataset.apply(tf.data.experimental.assert_cardinality(len(data))).prefetch(1)

    return current.distribute_datasets_from_function(dataset)


def _wrap_for_workers(model, strategy):
    """Apply the two workarounds Keras 3's TensorFlow trainer needs across workers to `model` (once).

    Keras offers no supported hook for either: the build from the first
    batch is the trainer's private `_maybe_symbolic_build`, and the
    reduction of what a step returns is inside its `make_train_function`. A
    subclass override would put TensorFlow's distribution into every model
    class (and leave other Keras models out), so the engine wraps the two
    methods on the one model it trains, and only under a strategy of
    several workers:

    - the build before the first step gets one replica's tensors of the
      first batch (`tf_trainer.local_batch`) instead of a cross-worker
      reduce that fails eagerly (Keras issue 20585);
    - `train_step` and `test_step` return their scalars as vectors of one
      value, which the trainer's cross-worker mean along axis 0 accepts
      (`tf_trainer.reducible_logs`; TensorFlow issue 72388);
    - each worker's loss is weighted by its share of the global batch's rows
      (`RowShare`), not by `1 / workers` as Keras weights it.
    """

    if getattr(model, "_keras_vit_workers", None) is strategy:
        return
    build = getattr(model, "_maybe_symbolic_build", None)
    train_step, test_step = model.train_step, model.test_step

    if build is not None:
        def build_from_one_replica(iterator=None, data_batch=None):
            if iterator is not None and data_batch is None:
                batch = local_batch(strategy, iterator)
                if batch is not None:
                    return build(data_batch=batch)
            return build(iterator=iterator, data_batch=data_batch)

        model._maybe_symbolic_build = build_from_one_replica
    if model.optimizer is not None:
        share = RowShare(model)
        model.train_step = lambda data: reducible_logs(share.train_step(train_step, data))
    else:
        model.train_step = lambda *args, **kwargs: reducible_logs(train_step(*args, **kwargs))
    model.test_step = lambda *args, **kwargs: reducible_logs(test_step(*args, **kwargs))
    model._keras_vit_workers = strategy


class RowShare:
    """Weight each worker's training loss by its share of the global batch's rows, as one process weighs it.

    Keras' TensorFlow trainer divides each replica's loss (the mean over
    its rows) by the number of replicas, and the optimizer sums the
    replicas' gradients: the step follows the mean of the workers' means.
    That is one process's mean over the global batch only when every worker
    has as many rows; a batch read unevenly (2 and 3 rows of 5, or 0 and 1
    of a last batch of 1) weighs the rows of the smaller share more. Here
    each replica's loss is multiplied by `replicas * rows / global rows`
    (the global rows are one all-reduce of the replicas' row counts), so the
    summed gradient is the global batch's mean gradient. The metrics need
    nothing: Keras weighs the loss tracker by each replica's rows and sums
    the metrics' states across replicas.

    Keras calls `model.optimizer.scale_loss(loss)` between the loss and the
    gradient (the supported hook for loss scaling, in every backend's
    trainer); the factor is computed from the batch in `train_step` (which
    the engine wraps on this one model already: Keras has no hook that sees
    both the batch and the loss) and applied there, in the same traced step,
    and only during that step.
    """

    def __init__(self, model):
        self.model = model
        self.factor = None
        optimizer = model.optimizer
        scale_loss = optimizer.scale_loss
        # Prepared again: wrap Keras' own `scale_loss`, not an earlier share's.
        self.scale_loss = getattr(scale_loss, "__keras_vit_scale_loss__", scale_loss)

        def scaled_by_share(loss):
            loss = self.scale_loss(loss)
            return loss if self.factor is None else loss * keras.ops.cast(self.factor, loss.dtype)

        scaled_by_share.__keras_vit_scale_loss__ = self.scale_loss
        optimizer.scale_loss = scaled_by_share

    def train_step(self, train_step, data):
        import tensorflow as tf

        context = tf.distribute.get_replica_context()
        if context is None or context.num_replicas_in_sync == 1:
            return train_step(data)
        x, _, _ = keras.utils.unpack_x_y_sample_weight(data)
        rows = tf.cast(tf.shape(keras.tree.flatten(x)[0])[0], tf.float32)
        total = context.all_reduce(tf.distribute.ReduceOp.SUM, rows)
        self.factor = tf.math.divide_no_nan(rows * context.num_replicas_in_sync, total)
        try:
            return train_step(data)
        finally:
            self.factor = None


class TensorFlowWorkers(Engine):
    """The workers of a `MultiWorkerMirroredStrategy` (`TF_CONFIG`), one replica each."""

    name = "TensorFlow workers (MultiWorkerMirroredStrategy)"

    def _job(self):
        return job() or (0, 1)

    def process_index(self):
        return self._job()[0]

    def process_count(self):
        return self._job()[1]

    def barrier(self, name="keras_vit"):
        if self.process_count() > 1:
            barrier()

    def broadcast_json(self, value):
        return value if self.process_count() == 1 else broadcast_json(value, self.is_chief())

    def gather_json(self, value):
        index, count = self._job()
        return [value] if count == 1 else gather_json(value, index, count)

    def fit_input(self, dataset):
        # A sharded dataset handed to `fit` as it is would be split by the strategy once more.
        if getattr(dataset, "shard", None) is None or current_strategy() is None:
            return dataset
        return worker_batches(dataset)

    def scope(self):
        current = current_strategy()
        return super().scope() if current is None else current.scope()

    def prepare(self, model, train=None):
        current = current_strategy()
        if current is not None:
            _wrap_for_workers(model, current)
        return []

    def evaluate(self, model, dataset):
        current = current_strategy()
        if current is not None:
            _wrap_for_workers(model, current)
        return super().evaluate(model, dataset)

    def saving_is_collective(self):
        # Inside the strategy's scope Keras' saving creates a variable the first time
        # (`saving_lib.get_attr_skipset` builds a reference optimizer), which the strategy makes with a
        # broadcast from worker 0; saved by worker 0 alone, it is met by the other workers' next
        # collective instead ("Collective instance ... expected type 0 ... but got type 1").
        return self.process_count() > 1
