"""The distribution helpers and `keras-vit train --distribute` on each backend.

In this process JAX and TensorFlow see one device; what happens on many
devices is tested in test_jax_distribution.py and test_tf_distribution.py.
Here: the right kind of object per backend, clear errors where a backend
has no engine, and that the train command builds and fits the model inside
the distribution's scope.
"""

import argparse
import types

import keras
import pytest

from keras_vit import distribution as vit_distribution
from keras_vit.cli import main
from keras_vit.commands import train as train_command

BACKEND = keras.backend.backend()


def _parse(*argv):
    parser = argparse.ArgumentParser()
    train_command.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_parallelism_must_be_data_or_model():
    with pytest.raises(ValueError, match="parallelism"):
        vit_distribution.distribution_for_backend("pipeline")
    with pytest.raises(SystemExit):
        _parse("--distribute", "pipeline")


@pytest.mark.skipif(BACKEND != "jax", reason="keras.distribution runs on JAX only")
def test_jax_helpers_return_keras_distributions():
    devices = keras.distribution.list_devices()
    data = vit_distribution.distribution_for_backend("data")
    assert isinstance(data, keras.distribution.DataParallel)
    assert data.device_mesh.devices.size == len(devices)
    model = vit_distribution.distribution_for_backend("model")
    assert isinstance(model, keras.distribution.ModelParallel)
    assert tuple(model.device_mesh.axis_names) == ("batch", "model")
    assert model.device_mesh.shape[1] == len(devices)  # one host: all local devices on the model axis
    with pytest.raises(ValueError, match="model_parallelism"):
        vit_distribution.model_parallel(model_parallelism=len(devices) + 1)
    with pytest.raises(ValueError, match="KERAS_BACKEND=tensorflow"):
        vit_distribution.tensorflow_strategy()


@pytest.mark.skipif(BACKEND != "tensorflow", reason="tf.distribute runs on TensorFlow only")
def test_tensorflow_helpers():
    import tensorflow as tf

    strategy = vit_distribution.distribution_for_backend("data")
    assert isinstance(strategy, tf.distribute.MirroredStrategy)
    expected = len(tf.config.list_logical_devices("GPU")) or len(tf.config.list_logical_devices("CPU"))
    assert strategy.num_replicas_in_sync == expected
    with pytest.raises(ValueError, match="KERAS_BACKEND=jax"):
        vit_distribution.distribution_for_backend("model")
    with pytest.raises(ValueError, match="KERAS_BACKEND=jax"):
        vit_distribution.data_parallel()


@pytest.mark.skipif(BACKEND != "torch", reason="PyTorch's data parallelism is one process per device")
def test_torch_explains_what_to_do_instead(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ValueError, match="torchrun --nproc_per_node=N -m keras_vit") as info:
        vit_distribution.distribution_for_backend("data")
    assert "RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT are unset" in str(info.value)
    with pytest.raises(ValueError, match="KERAS_BACKEND=jax") as info:
        vit_distribution.distribution_for_backend("model")
    assert "backend='torch'" in str(info.value)
    with pytest.raises(ValueError, match="KERAS_BACKEND=jax"):
        vit_distribution.model_parallel()


def _fake_training(monkeypatch, record):
    """Replace the expensive parts of `keras-vit train` with recorders."""

    def train_classifier(model, train_data, test_data, **kwargs):
        record["distribution"] = keras.distribution.distribution() if BACKEND == "jax" else None
        if BACKEND == "tensorflow":
            import tensorflow as tf

            record["strategy"] = tf.distribute.get_strategy() if tf.distribute.has_strategy() else None
        record["model"] = model
        record["train_size"] = len(train_data[0])
        return {"accuracy": 1.0, "loss": 0.0, "seconds": 0.0}

    monkeypatch.setattr("keras_vit.workflows.training.train_classifier", train_classifier)


@pytest.mark.parametrize("kind", ["data", "model"])
def test_train_command_wires_the_distribution(kind, monkeypatch, capsys):
    record = {}
    _fake_training(monkeypatch, record)
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)  # not under torchrun
    status = main(["train", "--distribute", kind, "--epochs", "1"])
    output = capsys.readouterr()
    if BACKEND == "jax":
        assert status == 0, output.err
        expected = keras.distribution.DataParallel if kind == "data" else keras.distribution.ModelParallel
        assert isinstance(record["distribution"], expected)
        # The model was built in the scope: its weights took their layouts from it.
        qkv = next(w for w in record["model"].weights if w.path.endswith("attention/qkv/kernel"))
        assert tuple(qkv._layout.axes) == ((None, None) if kind == "data" else (None, "model"))
        assert f"Distributed ({kind} parallel): mesh" in output.out
    elif BACKEND == "tensorflow" and kind == "data":
        import tensorflow as tf

        assert status == 0, output.err
        assert isinstance(record["strategy"], tf.distribute.MirroredStrategy)
        assert type(record["model"].weights[0].value).__name__ == "MirroredVariable"
        assert "MirroredStrategy with" in output.out
    else:  # model parallel off JAX; PyTorch outside torchrun
        assert status == 2
        expected = "torchrun --nproc_per_node=N" if (BACKEND, kind) == ("torch", "data") else "KERAS_BACKEND=jax"
        assert "keras-vit train: error:" in output.err and expected in output.err
        assert "model" not in record


@pytest.mark.one_backend("reads the mesh of a stand-in distribution; no device is touched")
def test_batches_are_cut_to_the_batch_axis_of_the_mesh(monkeypatch):
    from keras_vit.distribution.engines.jax_processes import JaxProcesses
    from keras_vit.distribution.engines.one_process import OneProcess

    mesh = types.SimpleNamespace(shape=(2, 4), axis_names=("batch", "model"))
    distribution = types.SimpleNamespace(device_mesh=mesh, batch_dim_name="batch")
    monkeypatch.setattr(keras.distribution, "distribution", lambda: distribution)
    assert JaxProcesses().batch_multiple() == 2
    monkeypatch.setattr(keras.distribution, "distribution", lambda: None)
    assert JaxProcesses().batch_multiple() == 1
    assert OneProcess().batch_multiple() == 1  # tf.distribute and PyTorch split uneven batches themselves
