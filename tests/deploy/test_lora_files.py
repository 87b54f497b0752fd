"""Promise: `load_lora_weights` refuses a LoRA file that is damaged, does not fit, or holds NaN or infinite
factors, with a `ValueError` that names the file (and the array), and the model is left as it was.

The mutations are generated: every array of a saved LoRA file (the rank, the alpha, each factor) is removed,
joined by a stranger, reshaped, retyped or spoiled with non-finite values; and the file itself is emptied,
cut, replaced by random bytes, by a directory, by a plain `.npy`, by an archive of pickled objects. The
refusal comes before anything changes, so these tests do not depend on the backend.
"""

import random

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit.utils.seeds import set_random_seed

pytestmark = pytest.mark.one_backend("a LoRA file is checked before any variable changes")

RANK = 2


def tiny_classifier(seed=0):
    set_random_seed(seed)
    return keras_vit.ViTClassifier.from_variant(
        "ViT-Ti/16", image_size=8, patch_size=4, hidden_dim=8, num_layers=1, num_heads=2, mlp_dim=16, num_classes=3)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    model = tiny_classifier()
    model.enable_lora(RANK, alpha=4.0)
    rng = np.random.default_rng(0)
    for layer in model.lora_layers():
        layer.lora_kernel_b.assign(rng.normal(0, 0.1, layer.lora_kernel_b.shape).astype("float32"))
    path = tmp_path_factory.mktemp("lora") / "adapter.lora.npz"
    model.save_lora_weights(str(path))
    with np.load(path, allow_pickle=False) as stored:
        return path, {key: stored[key] for key in stored.files}


def _state(model):
    return [keras.ops.convert_to_numpy(weight.value).copy() for weight in model.weights]


def _nan_like(array):
    return np.full_like(array, np.nan)


def _one_inf(array):
    array = array.astype("float32").copy()
    array.flat[0] = np.inf
    return array


# What can happen to one array of the file. The rank and alpha are scalars; the factors are matrices.
MUTATIONS = {
    "removed": None,
    "a vector": lambda value: np.stack([value, value]),
    "a scalar": lambda value: np.asarray(1.0, "float32"),
    "transposed": lambda value: value.T if value.ndim == 2 else np.asarray([value]),
    "integers": lambda value: np.asarray(value).astype("int32") + 1,
    "booleans": lambda value: np.ones(np.shape(value), bool),
    "strings": lambda value: np.full(np.shape(value), "x"),
    "all NaN": lambda value: np.full(np.shape(value), np.nan, "float32"),
    "one infinity": lambda value: _one_inf(np.asarray(value, "float32").reshape(np.shape(value) or (1,)))
    .reshape(np.shape(value)),
    "zero": lambda value: np.zeros(np.shape(value), np.asarray(value).dtype),
    "negative": lambda value: -np.abs(np.asarray(value)) - 1,
}


def _accepted(key, mutation, arrays):
    """Whether the file stays one that `save_lora_weights` could have written for this model."""
    if key == "lora/alpha":
        # alpha: any finite real scale, integer or not (zero and negative scale the update; Keras takes them).
        return mutation in ("zero", "negative", "integers")
    if key.endswith("lora_kernel_a") or key.endswith("lora_kernel_b"):
        # A factor: any finite float matrix of its shape; zeros and negative values are numbers like any.
        return mutation in ("zero", "negative")
    return False  # the rank is a positive integer scalar: none of the mutations keep it one


def test_every_mutation_of_one_array_is_refused_naming_the_file_and_the_array(saved, tmp_path):
    path, arrays = saved
    cases = [(key, mutation) for key in sorted(arrays) for mutation in MUTATIONS]
    cases += [("extra/lora_kernel_a", "added"), ("transformer_block_0/attention/qkv/kernel", "added")]
    drawn = random.Random(40).sample(cases, 40)
    wrong = []
    model = tiny_classifier()  # a refusal leaves it as it was, so the next case reuses it
    before = _state(model)
    for index, (key, mutation) in enumerate(drawn):
        changed = dict(arrays)
        if mutation == "added":
            changed[key] = np.zeros((8, RANK), "float32")
        elif MUTATIONS[mutation] is None:
            del changed[key]
        else:
            changed[key] = MUTATIONS[mutation](arrays[key])
        file = tmp_path / f"case{index}.lora.npz"
        np.savez(file, **changed)
        if model.lora_enabled:  # the previous case loaded
            model = tiny_classifier()
        label = f"{key} {mutation}"
        try:
            model.load_lora_weights(str(file))
        except ValueError as error:
            message = str(error)
            if mutation != "added" and _accepted(key, mutation, arrays):
                wrong.append(f"{label}: refused a file save_lora_weights could write: {message[:200]}")
            elif str(file) not in message or key not in message:
                wrong.append(f"{label}: the message does not name the file and the array: {message[:200]}")
            elif model.lora_enabled or any(not np.array_equal(a, b) for a, b in zip(_state(model), before)):
                wrong.append(f"{label}: the model changed before the refusal")
        except Exception as error:  # noqa: BLE001 - a raw error is what this test looks for
            wrong.append(f"{label}: {type(error).__name__}: {str(error)[:200]}")
        else:
            if mutation == "added" or not _accepted(key, mutation, arrays):
                wrong.append(f"{label}: loaded")
    assert wrong == [], "\n".join(wrong)


def test_all_nan_factors_are_refused_not_loaded_into_a_model_that_predicts_nan(saved, tmp_path):
    _, arrays = saved
    spoiled = {key: (_nan_like(value) if "lora_kernel" in key else value) for key, value in arrays.items()}
    file = tmp_path / "diverged.lora.npz"
    np.savez(file, **spoiled)
    model = tiny_classifier()
    with pytest.raises(ValueError, match="NaN or infinite") as error:
        model.load_lora_weights(str(file))
    assert str(file) in str(error.value) and "lora_kernel_a" in str(error.value)
    assert not model.lora_enabled
    assert np.isfinite(keras.ops.convert_to_numpy(model.predict(np.zeros((1, 8, 8, 3)), verbose=0))).all()


def _pickled_archive(path):
    np.savez(path, **{"lora/rank": np.asarray([{"rank": 2}], dtype=object)})


FILES = {
    "empty": lambda path, data: path.write_bytes(b""),
    "cut in half": lambda path, data: path.write_bytes(data[: len(data) // 2]),
    "random bytes": lambda path, data: path.write_bytes(np.random.default_rng(0).bytes(len(data))),
    "a directory": lambda path, data: path.mkdir(),
    "a plain .npy": lambda path, data: np.save(open(path, "wb"), np.zeros(3)),
    "pickled objects": lambda path, data: _pickled_archive(path),
    "missing": lambda path, data: None,
}


@pytest.mark.parametrize("how", list(FILES))
def test_a_damaged_lora_file_is_refused_naming_it(saved, tmp_path, how):
    source, _ = saved
    path = tmp_path / "adapter.lora.npz"
    FILES[how](path, source.read_bytes())
    model = tiny_classifier()
    with pytest.raises(ValueError) as error:
        model.load_lora_weights(str(path))
    assert str(path) in str(error.value) and "save_lora_weights" in str(error.value), str(error.value)
    assert not model.lora_enabled


def test_a_file_that_fits_still_loads(saved):
    path, arrays = saved
    model = tiny_classifier()
    model.load_lora_weights(str(path))
    layer = model.lora_layers()[0]
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(layer.lora_kernel_b.value),
                                  arrays[f"{layer.path}/lora_kernel_b"])
