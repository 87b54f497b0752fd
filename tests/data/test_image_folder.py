"""Image folders: formats, conversions, bad files, splits, seeded batches, and fit on every backend."""

import logging
import os
import subprocess
import sys

import keras
import numpy as np
import pytest
from PIL import Image

import keras_vit
from keras_vit.data import (
    AugmentPolicy,
    EpochSync,
    ImageFileError,
    checked_class_indices,
    image_folder_datasets,
    index_image_folder,
    read_image,
    read_image_folder,
    stratified_split,
)
from keras_vit.data import center_crop
from tests.finetune.helpers import write_folder


def _save(path, array, mode):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    Image.fromarray(array, mode).save(path)


# The folder reader (Pillow and numpy, `read_image_folder`, the split, the label checks) does not touch the
# backend: these run in one pass. test_fit_reads_the_folder_on_this_backend feeds the folder to `fit` in each.
READER_ONLY = pytest.mark.one_backend("Pillow and numpy: the folder reader never calls the backend")


@READER_ONLY
def test_every_format_and_mode_comes_out_at_the_models_size_and_channels(tmp_path):
    rng = np.random.default_rng(0)
    rgb = rng.integers(0, 256, (13, 21, 3), dtype="uint8")
    _save(str(tmp_path / "a" / "rgb.jpg"), rgb, "RGB")
    _save(str(tmp_path / "a" / "gray.png"), rgb[..., 0], "L")
    _save(str(tmp_path / "b" / "rgba.png"), np.dstack([rgb, np.full((13, 21), 255, "uint8")]), "RGBA")
    _save(str(tmp_path / "b" / "rgb.bmp"), rgb, "RGB")
    Image.fromarray(rgb).convert("P").save(str(tmp_path / "b" / "palette.gif"))
    (tmp_path / "b" / "notes.txt").write_text("not an image, not listed")
    for channels in (1, 3):
        images, labels, names = read_image_folder(str(tmp_path), image_size=(8, 6), num_channels=channels)
        assert images.shape == (5, 8, 6, channels) and images.dtype == np.float32
        assert names == ["a", "b"] and labels.tolist() == [0, 0, 1, 1, 1]
        assert 0.0 <= images.min() and images.max() <= 255.0
    # Grayscale to RGB repeats the channel; RGB to grayscale is Pillow's luminance.
    gray = read_image(str(tmp_path / "a" / "gray.png"), 3)
    np.testing.assert_array_equal(gray[..., 0], gray[..., 2])
    np.testing.assert_array_equal(gray[..., 0], rgb[..., 0])


@READER_ONLY
def test_transparent_pixels_become_white(tmp_path):
    rgba = np.zeros((4, 4, 4), "uint8")
    rgba[..., 0] = 255  # red, fully transparent
    _save(str(tmp_path / "x.png"), rgba, "RGBA")
    np.testing.assert_array_equal(read_image(str(tmp_path / "x.png"), 3), np.full((4, 4, 3), 255.0))


@READER_ONLY
def test_center_crop_keeps_the_middle_without_distortion():
    image = np.tile(np.arange(20, dtype="float32")[None, :, None], (10, 1, 1))  # value = column
    cropped = center_crop(image, (10, 10))
    np.testing.assert_array_equal(cropped[0, :, 0], np.arange(5, 15))


@READER_ONLY
def test_bad_files_are_named_or_skipped(tmp_path, caplog):
    write_folder(str(tmp_path), classes=2, per_class=3)
    empty = tmp_path / "class_0" / "empty.jpg"
    empty.write_bytes(b"")
    with pytest.raises(ImageFileError, match="empty.jpg.*empty"):
        index_image_folder(str(tmp_path))
    empty.unlink()
    fake = tmp_path / "class_1" / "fake.png"
    fake.write_text("hello")
    with pytest.raises(ImageFileError, match="fake.png.*not an image"):
        index_image_folder(str(tmp_path))
    with caplog.at_level(logging.WARNING, logger="keras_vit.data"):
        paths, labels, _ = index_image_folder(str(tmp_path), on_bad_file="skip")
    assert len(paths) == 6 and "fake.png" in caplog.text


@READER_ONLY
def test_decompression_bombs_are_refused_before_decoding(tmp_path):
    _save(str(tmp_path / "a" / "big.png"), np.zeros((100, 100), "uint8"), "L")
    with pytest.raises(ImageFileError, match=r"big.png declares 100 x 100 = 10,000 pixels, over the limit of 5,000"):
        index_image_folder(str(tmp_path), max_pixels=5000)


@READER_ONLY
def test_a_truncated_file_fails_with_its_name(tmp_path):
    path = str(tmp_path / "a" / "cut.png")
    _save(path, np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype="uint8"), "RGB")
    with open(path, "rb") as file:
        data = file.read()
    with open(path, "wb") as file:
        file.write(data[: len(data) // 2])
    index_image_folder(str(tmp_path))  # the header is fine
    with pytest.raises(ImageFileError, match="cut.png.*truncated"):
        read_image(path, 3)


@READER_ONLY
def test_missing_or_flat_folders_get_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="No such image folder"):
        index_image_folder(str(tmp_path / "nope"))
    with pytest.raises(ValueError, match="no class subfolders"):
        index_image_folder(str(tmp_path))
    (tmp_path / "cats").mkdir()
    with pytest.raises(ValueError, match="cats.*no usable image"):
        index_image_folder(str(tmp_path))


@READER_ONLY
def test_split_is_stratified_and_fixed_by_the_seed():
    labels = np.repeat(np.arange(3), [10, 5, 2])
    train, held = stratified_split(labels, 0.2, seed=1)
    assert sorted(np.concatenate([train, held]).tolist()) == list(range(17))
    assert np.bincount(labels[held], minlength=3).tolist() == [2, 1, 1]
    again = stratified_split(labels, 0.2, seed=1)
    np.testing.assert_array_equal(held, again[1])
    assert not np.array_equal(held, stratified_split(labels, 0.2, seed=2)[1])


def test_batches_depend_only_on_seed_epoch_and_index(tmp_path):
    write_folder(str(tmp_path), classes=2, per_class=4)
    policy = AugmentPolicy(randaugment=True)
    train, validation = image_folder_datasets(str(tmp_path), 8, batch_size=2, validation_split=0.25, augment=policy)
    assert len(train.paths) == 6 and len(validation.paths) == 2
    first = train[1]
    train.set_epoch(1)
    other_epoch = train[1]
    train.set_epoch(0)
    again = train[1]
    np.testing.assert_array_equal(first[0], again[0])
    np.testing.assert_array_equal(first[1], again[1])
    assert not np.array_equal(first[0], other_epoch[0])
    x, y = validation[0]
    assert x.shape == (2, 8, 8, 3) and y.dtype == np.int32


def test_mixup_and_cutmix_give_soft_labels(tmp_path):
    write_folder(str(tmp_path), classes=3, per_class=4)
    train, validation = image_folder_datasets(str(tmp_path), 8, batch_size=6, augment=AugmentPolicy(mixup=0.4, cutmix=1.0))
    _, labels = train[0]
    assert labels.shape == (6, 3) and labels.dtype == np.float32
    np.testing.assert_allclose(labels.sum(axis=1), 1.0, atol=1e-5)
    assert validation[0][1].shape[-1] == 3  # held-out labels one-hot too, for one loss


@READER_ONLY
def test_checked_class_indices():
    np.testing.assert_array_equal(checked_class_indices([0, 2, 1], 3), [0, 2, 1])
    with pytest.raises(ValueError, match=r"in \[0, 3\).*label 3"):
        checked_class_indices([0, 3], 3)
    with pytest.raises(ValueError, match=r"label -1"):
        checked_class_indices([-1, 0], 3)
    with pytest.raises(ValueError, match="integer class indices"):
        checked_class_indices([0.5, 1.0], 3)
    with pytest.raises(ValueError, match="1-D"):
        checked_class_indices(np.eye(3), 3)


@READER_ONLY
def test_digits_png_folder_holds_the_same_split(tmp_path):
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    train_dir, test_dir = keras_vit.data.write_digits_folder(str(tmp_path / "digits"))
    images, labels, names = read_image_folder(test_dir, 8, num_channels=1)
    assert names == [str(d) for d in range(10)] and len(images) == 360
    digits = load_digits()
    _, x_test, _, y_test = train_test_split(digits.images, digits.target, test_size=0.2, stratify=digits.target,
                                            random_state=0)
    expected = np.rint(x_test * 255.0 / 16.0)
    # The folder orders files by class; compare as sets of (label, image) rows.
    key = lambda x, y: sorted(zip(y.tolist(), [row.tobytes() for row in x.astype("uint8")]))  # noqa: E731
    assert key(images[..., 0], labels) == key(expected, y_test)
    assert len(index_image_folder(train_dir)[0]) == 1437


def test_fit_reads_the_folder_on_this_backend(tmp_path):
    write_folder(str(tmp_path), classes=2, per_class=6)
    train, validation = image_folder_datasets(str(tmp_path), 8, batch_size=4, validation_split=0.25)
    model = keras_vit.ViTClassifier.from_variant("ViT-Ti/16", image_size=8, patch_size=4, hidden_dim=16,
                                                 num_layers=1, num_heads=2, mlp_dim=16, num_classes=2)
    model.compile(optimizer="adam")
    history = model.fit(train, validation_data=validation, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0]) and "val_accuracy" in history.history


# A TensorFlow-free install runs JAX or torch. JAX's is the README's user line, which
# tests/examples/test_user_install.py installs into a fresh venv (no TensorFlow in it) and runs `finetune` on a
# folder of photos through these readers; this process-of-its-own check would repeat it in the jax pass.
@pytest.mark.slow
@pytest.mark.skipif(keras.backend.backend() != "torch",
                    reason="a TensorFlow-free install runs JAX or torch; JAX's: tests/examples/test_user_install.py")
def test_works_on_an_install_without_tensorflow(tmp_path):
    write_folder(str(tmp_path / "data"), classes=2, per_class=4)
    script = f"""
import sys
sys.modules["tensorflow"] = None  # `import tensorflow` now fails, as on an install without it
import keras, keras_vit
from keras_vit.data import image_folder_datasets
train, validation = image_folder_datasets({str(tmp_path / "data")!r}, 8, batch_size=4, validation_split=0.25)
model = keras_vit.ViTClassifier.from_variant("ViT-Ti/16", image_size=8, patch_size=4, hidden_dim=16, num_layers=1,
                                             num_heads=2, mlp_dim=16, num_classes=2)
model.compile(optimizer="adam")
model.fit(train, validation_data=validation, epochs=1, verbose=0)
assert "tensorflow" not in [m.split(".")[0] for m in sys.modules if sys.modules[m] is not None]
print("ok", keras.backend.backend())
"""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=root)
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "ok " + keras.backend.backend() in done.stdout


class _RecordingModel(keras.Model):
    """A one-weight model whose training steps record the labels of the batch they train on."""

    def __init__(self):
        super().__init__()
        self.dense = keras.layers.Dense(2)
        self.seen = []

    def call(self, images):
        return self.dense(keras.ops.mean(images, axis=(1, 2)))

    def train_step(self, data):
        self.seen.append(keras.ops.convert_to_numpy(data[1]).tolist())
        return super().train_step(data)


@pytest.mark.one_backend("Keras' PyDataset adapter and our decoding threads are the same on every backend")
@pytest.mark.parametrize("seed", range(3))
def test_fit_trains_batch_i_of_epoch_e_at_step_i_with_decoding_threads(tmp_path, seed):
    # Keras' threaded enqueuer (PyDataset workers > 1) keeps the batches it prefetched when `fit` peeks at
    # the first batch to build the model, and hands them out first in the next epoch: step i trained another
    # batch than batch i (and a job of several processes weighted each step by batch i's rows).
    rng = np.random.default_rng(seed)
    images, batch_size = int(rng.integers(7, 30)), int(rng.integers(2, 9))
    folder = write_folder(str(tmp_path / "photos"), classes=2, per_class=images, size=(10, 12), seed=seed)
    train, _ = image_folder_datasets(folder, 8, batch_size=batch_size, validation_split=0, seed=seed, workers=3,
                                     augment=AugmentPolicy(crop=False, flip=False))
    model = _RecordingModel()
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy", run_eagerly=True)
    model.fit(train, epochs=2, shuffle=False, verbose=0, callbacks=[EpochSync(train)])
    expected = []
    for epoch in range(2):
        train.set_epoch(epoch)
        expected += [train[index][1].tolist() for index in range(len(train))]
    assert model.seen == expected
