"""Ready-made distributions: keras.distribution on JAX, tf.distribute on TensorFlow."""

import keras

from keras_vit.distribution import engines
from keras_vit.distribution.engines import jax_processes, tf_workers, torch_processes
from keras_vit.distribution.layout import layout_map
from keras_vit.utils.renames import refuse_unknown, renamed_argument

PARALLELISMS = ("data", "model")


def _require_backend(expected, what, alternative):
    backend = keras.backend.backend()
    if backend != expected:
        raise ValueError(
            f"{what} needs KERAS_BACKEND={expected}. {alternative} Received: backend={backend!r}"
        )


def _devices(devices):
    if devices is None:
        return list(keras.distribution.list_devices())
    devices = list(devices)
    if not devices:
        raise ValueError("`devices` must list at least one device. Received: devices=[]")
    return devices


def _one_process():
    import jax

    return jax.process_count() == 1


def data_parallel(devices=None):
    """A `keras.distribution.DataParallel` over the devices at hand (JAX).

    Every device holds a full copy of the weights and a slice of each
    batch; gradients are averaged across devices. The global batch size must
    be divisible by the number of devices.

    Args:
        devices: list of device names (e.g. `["tpu:0", "tpu:1"]`) or `None`
            for every device of every process
            (`keras.distribution.list_devices()`). Defaults to `None`.

    Returns:
        A `keras.distribution.DataParallel`; use it with
        `keras.distribution.set_distribution(...)` or `with distribution.scope():`
        around building, compiling and fitting the model.
    """
    _require_backend(
        "jax", "keras.distribution", "On TensorFlow use `keras_vit.distribution.tensorflow_strategy()`."
    )
    # Across processes each one feeds its own rows (`engines.current().shard`): Keras'
    # auto-sharding accepts only a tf.data.Dataset there.
    return keras.distribution.DataParallel(devices=_devices(devices), auto_shard_dataset=_one_process())


def model_parallel(model_parallelism=None, devices=None, batch_axis="batch", model_axis="model"):
    """A `keras.distribution.ModelParallel` with the ViT layout map (JAX).

    The devices form a 2-D mesh `(batch_axis, model_axis)` of shape
    `(len(devices) // model_parallelism, model_parallelism)`: each weight
    matched by `layout_map` is split over the model axis, and batches are
    split over the batch axis.

    Args:
        model_parallelism: int or `None`. Devices a weight is split over.
            `None` uses the devices of one host (JAX's local device count):
            tensor parallelism over the fast links inside a host, data
            parallelism across hosts. Defaults to `None`.
        devices: list of device names or `None` for all devices. Defaults
            to `None`.
        batch_axis: str. Name of the data-parallel mesh axis. Defaults to
            `"batch"`.
        model_axis: str. Name of the model-parallel mesh axis. Defaults to
            `"model"`.

    Returns:
        A `keras.distribution.ModelParallel`.

    Example:

    >>> distribution = keras_vit.distribution.model_parallel(model_parallelism=4)  # 8 devices: 2 x 4
    >>> with distribution.scope():
    ...     model = keras_vit.ViTClassifier.from_variant("ViT-H/14")
    """
    _require_backend(
        "jax", "keras.distribution", "On TensorFlow use `keras_vit.distribution.tensorflow_strategy()` "
        "(data parallel); model parallelism runs on JAX."
    )
    devices = _devices(devices)
    if model_parallelism is None:
        import jax

        model_parallelism = min(jax.local_device_count(), len(devices))
    if not isinstance(model_parallelism, int) or model_parallelism <= 0 or len(devices) % model_parallelism:
        raise ValueError(
            f"`model_parallelism` must be a positive int dividing the number of devices ({len(devices)}). "
            f"Received: model_parallelism={model_parallelism!r}"
        )
    mesh = keras.distribution.DeviceMesh(
        shape=(len(devices) // model_parallelism, model_parallelism),
        axis_names=(batch_axis, model_axis),
        devices=devices,
    )
    distribution = keras.distribution.ModelParallel(layout_map=layout_map(mesh, model_axis), batch_dim_name=batch_axis)
    distribution.auto_shard_dataset = _one_process()  # see data_parallel
    return distribution


def tensorflow_strategy(devices=None, tpu=None):
    """A `tf.distribute` strategy for data-parallel `model.fit` (TensorFlow).

    Build, compile and fit the model inside `strategy.scope()`. Keras
    splits each batch across replicas, sums the gradients and reports the
    same loss as on one device.

    Args:
        devices: list of TensorFlow device names for `MirroredStrategy`, or
            `None` for every GPU (or, without GPUs, every logical CPU).
            Defaults to `None`.
        tpu: str or `None`. When given, a `tf.distribute.TPUStrategy` on
            that TPU: `"local"` on a TPU VM, the TPU's name or `grpc://`
            address for a TPU node. The code path of `fit` is the same.
            Defaults to `None`.

    Returns:
        A `tf.distribute.MirroredStrategy` or `tf.distribute.TPUStrategy`.
    """
    _require_backend(
        "tensorflow", "tf.distribute", "On JAX use `keras_vit.distribution.data_parallel()` or `model_parallel()`."
    )
    import tensorflow as tf

    if tpu is not None:
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu)
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
        return tf.distribute.TPUStrategy(resolver)
    if devices is None:
        devices = [device.name for device in tf.config.list_logical_devices("GPU")]
        devices = devices or [device.name for device in tf.config.list_logical_devices("CPU")]
    return tf.distribute.MirroredStrategy(devices=_devices(devices))


def distribution_for_backend(parallelism=None, model_parallelism=None, tpu=None, **kwargs):
    """The distribution for `"data"` or `"model"` parallelism on the current backend.

    JAX: `data_parallel()` or `model_parallel(model_parallelism)`.
    TensorFlow: `tensorflow_strategy(tpu=tpu)` for `"data"`, or, when
    `TF_CONFIG` names several workers, the job's
    `MultiWorkerMirroredStrategy` (`tf_workers.strategy()`); model
    parallelism is JAX-only. PyTorch: `"data"` joins the processes of a
    `torchrun` job and returns their engine
    (`engines.torch_processes.TorchProcesses`; one process per device,
    gradients averaged across them); outside `torchrun` it raises with the
    command to use. On JAX and PyTorch the other processes of a job must
    join within `KERAS_VIT_JOIN_TIMEOUT` seconds (default 60).

    Args:
        parallelism: str. `"data"` (the model copied to every device) or
            `"model"` (its weights split too). Called `kind` before; that
            keyword still works, with a `DeprecationWarning`.
        model_parallelism: int or `None`. See `model_parallel`.
        tpu: str or `None`. See `tensorflow_strategy`.

    Returns:
        An object with a `scope()` context manager: a
        `keras.distribution.Distribution`, a `tf.distribute.Strategy` or
        the PyTorch job's engine.
        Build, compile and fit the model inside that scope.
    """
    parallelism = renamed_argument(kwargs, "kind", "parallelism", parallelism, "distribution_for_backend")
    refuse_unknown(kwargs, "distribution_for_backend")
    if parallelism not in PARALLELISMS:
        raise ValueError(f"`parallelism` must be one of {PARALLELISMS}. Received: parallelism={parallelism!r}")
    backend = keras.backend.backend()
    if backend == "jax":
        jax_processes.join()  # a multi-process job when Keras' KERAS_DISTRIBUTION_* variables say so
        return data_parallel() if parallelism == "data" else model_parallel(model_parallelism)
    if backend == "tensorflow":
        if parallelism == "model":
            raise ValueError(
                "Model parallelism (weights split across devices) runs on JAX through "
                "keras.distribution: set KERAS_BACKEND=jax. On TensorFlow use parallelism='data' "
                "(MirroredStrategy, or TPUStrategy with a TPU). Received: parallelism='model', "
                "backend='tensorflow'"
            )

        if tpu is None and tf_workers.tf_config_job() is not None:
            return tf_workers.strategy()  # TF_CONFIG names several workers: one process of a multi-worker job
        return tensorflow_strategy(tpu=tpu)
    if parallelism == "model":
        raise ValueError(
            "Model parallelism (weights split across devices) runs on JAX through keras.distribution: set "
            "KERAS_BACKEND=jax. On PyTorch use parallelism='data' under torchrun (one process per device). "
            f"Received: parallelism='model', backend={backend!r}"
        )

    if not torch_processes.launched_by_torchrun():
        raise ValueError(
            "Data parallelism on PyTorch runs one process per device, started by torchrun: "
            "`torchrun --nproc_per_node=N -m keras_vit COMMAND ... --distribute data` (docs/scale-out.md). "
            "This process was not started by torchrun (RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT are unset)."
        )
    torch_processes.join()
    return engines.current()
