"""A preset and a `.keras` file meant for use hold the model's weights, not the optimizer's state.

Keras writes a compiled model's optimizer variables next to its weights: an
AdamW-fine-tuned ViT-Ti preset held 10,976,649 values beside its 5,488,324
weights (66 MB instead of 22). The epoch checkpoint of a run keeps them, to
resume; what a user keeps and ships does not.
"""

import warnings
import zipfile

import h5py
import keras
import numpy as np
import pytest

from keras_vit import ViTClassifier
from keras_vit.workflows.training import save_model


def _values_in_h5(source):
    """Number of stored values (every dataset's size) in an HDF5 file or file object."""
    counted = []
    with h5py.File(source, "r") as file:
        file.visititems(lambda name, item: counted.append(item.size) if isinstance(item, h5py.Dataset) else None)
    return sum(counted)


@pytest.fixture(scope="module")
def fitted_classifier():
    """A tiny classifier after one AdamW step: what both tests below save (neither changes it)."""
    model = ViTClassifier.from_variant("ViT-Ti/16", image_size=8, patch_size=4, hidden_dim=16, num_layers=1,
                                       num_heads=2, mlp_dim=32, num_classes=3)
    model.compile(optimizer=keras.optimizers.AdamW(1e-3), loss="sparse_categorical_crossentropy")
    rng = np.random.default_rng(0)
    model.fit(rng.uniform(0, 255, (4, 8, 8, 3)).astype("float32"), np.array([0, 1, 2, 0]), epochs=1, verbose=0)
    return model


def test_a_preset_of_a_fitted_model_holds_its_weights_only(fitted_classifier, tmp_path):
    model = fitted_classifier
    # With the optimizer, as Keras writes a compiled model: weights, two moments each, the iteration count.
    model.save_weights(str(tmp_path / "with_optimizer.weights.h5"))
    assert _values_in_h5(str(tmp_path / "with_optimizer.weights.h5")) > 2 * model.count_params()

    model.save_to_preset(str(tmp_path / "preset"))
    assert _values_in_h5(str(tmp_path / "preset" / "model.weights.h5")) == model.count_params()
    # The model keeps its optimizer and can go on training.
    assert model.optimizer is not None and model.compiled
    assert int(keras.ops.convert_to_numpy(model.optimizer.iterations)) == 1
    loaded = ViTClassifier.from_preset(str(tmp_path / "preset"))
    for theirs, ours in zip(loaded.weights, model.weights):
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(theirs), keras.ops.convert_to_numpy(ours))


def test_save_model_writes_the_model_without_the_optimizer(fitted_classifier, tmp_path):
    model = fitted_classifier
    path = str(tmp_path / "model.keras")
    save_model(model, path)
    with zipfile.ZipFile(path) as archive, archive.open("model.weights.h5") as weights:
        assert _values_in_h5(weights) == model.count_params()
    assert model.optimizer is not None and model.compiled
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "Skipping variable loading for optimizer"
        loaded = keras.saving.load_model(path)
    x = np.random.default_rng(1).uniform(0, 255, (2, 8, 8, 3)).astype("float32")
    np.testing.assert_allclose(keras.ops.convert_to_numpy(loaded(x)), keras.ops.convert_to_numpy(model(x)),
                               rtol=1e-6, atol=1e-6)


@pytest.mark.one_backend("an uncompiled model has no optimizer to leave out")
def test_an_uncompiled_model_saves_as_before(tmp_path):
    model = ViTClassifier.from_variant("ViT-Ti/16", image_size=8, patch_size=4, hidden_dim=16, num_layers=1,
                                       num_heads=2, mlp_dim=32, num_classes=3)
    model.save_to_preset(str(tmp_path / "preset"))
    assert _values_in_h5(str(tmp_path / "preset" / "model.weights.h5")) == model.count_params()
