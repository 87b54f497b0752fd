"""Class-per-subfolder image datasets that feed `model.fit` on every backend.

```
photos/
  cat/  a.jpg b.png ...
  dog/  c.jpg ...
```

`image_folder_datasets("photos", image_size=224)` returns a training and a
validation `keras.utils.PyDataset`. `PyDataset` is Keras' own loader for
Python data: `fit`, `evaluate` and `predict` take it on TensorFlow, JAX and
PyTorch alike, and it needs neither TensorFlow nor grain. Images are decoded with Pillow (the decoder Keras'
own `image_dataset_from_directory(format="grain")` uses); this module adds
only the glue that loader lacks:

- every file is checked before training starts (unreadable, empty, not an
  image, or more pixels than `max_pixels`, a guard against decompression
  bombs): a clear error naming the file, or a logged skip;
- the random resized crop is taken from the full decoded image (as
  big_vision's `inception_crop`), not from a copy already shrunk to the
  model's size;
- batch order and augmentation depend only on `(seed, epoch, batch)`, so a
  run resumed after a kill sees exactly the batches the killed run would
  have seen, and step `i` of an epoch trains batch `i`: the images of a
  batch are decoded in threads of the dataset's own, not in Keras'
  prefetching workers (see `ImageFolderDataset`).
"""

import logging
import os
from concurrent.futures import ThreadPoolExecutor

import keras
import numpy as np

from keras_vit.data.augment import AugmentPolicy, random_resized_crop
from keras_vit.data.images import DEFAULT_MAX_PIXELS, ImageFileError, as_transform, open_image, read_image
from keras_vit.utils import to_pair
from keras_vit.utils.errors import ArgumentError, quote
from keras_vit.writer.ownership import path_relation

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif")

logger = logging.getLogger("keras_vit.data")


def check_image_file(path, max_pixels=DEFAULT_MAX_PIXELS):
    """Read an image's header and check it can be decoded safely (`keras_vit.data.images.open_image`).

    Returns:
        `(width, height)`.

    Raises:
        ImageFileError: the file is empty, not an image Pillow can read, has
            no pixels or more than `max_pixels`.
    """
    with open_image(path, max_pixels) as image:
        size = image.size
    if size[0] == 0 or size[1] == 0:
        raise ImageFileError(f"{quote(path)} has no pixels ({size[0]}x{size[1]}).")
    return size


def _check_class_link(directory, class_dir):
    """Refuse a class folder that is a link back into the data directory (or to a folder holding it).

    Such a folder would list the data directory's images again under another
    label: every image trained twice, once with a wrong class. A link to a
    folder elsewhere (another disk) is fine. Links below a class folder are
    not followed (`os.walk`), so they cannot loop.
    """
    if not os.path.islink(class_dir):
        return
    data, target = os.path.realpath(directory), os.path.realpath(class_dir)
    if target == data or os.path.commonpath([data, target]) in (data, target):
        raise ValueError(
            f"The class folder {quote(class_dir)} is a link to {quote(target)}, which "
            f"{'is inside' if target.startswith(data + os.sep) else 'is or contains'} the data directory "
            f"{quote(directory)}: its images would be read again under the label {os.path.basename(class_dir)!r}. "
            "Remove the link, or copy the images it should hold into a real folder."
        )


def _image_files(directory):
    """Every image file a class-per-subfolder folder lists (as `index_image_folder` walks it), unchecked."""
    for name in sorted(os.listdir(directory)):
        class_dir = os.path.join(directory, name)
        if name.startswith(".") or not os.path.isdir(class_dir):
            continue
        for root, dirs, files in os.walk(class_dir):
            dirs.sort()
            for file in sorted(files):
                if not file.startswith(".") and file.lower().endswith(IMAGE_EXTENSIONS):
                    yield os.path.join(root, file)


def _file_identity(path):
    """`(device, inode)` of the file `path` names (through links); `None` if it cannot be read."""
    try:
        status = os.stat(path)
    except OSError:
        return None
    return status.st_dev, status.st_ino


def check_held_out(data_dir, held_out_dir, argument):
    """Refuse a held-out folder that is not held out from the training folder `data_dir`.

    Held-out accuracy measured on training images says nothing about new
    images. Refused, after resolving links and `..`: a held-out folder that
    is the training folder, lies inside it or contains it, or lists an image
    file that the training folder lists too: the same file through a
    symbolic link, a hard link, or a class folder that links into the
    training folder (compared by device and inode, one `stat` per file).
    Byte-identical copies are not looked for: that would read every image of
    both folders before training (150 GB for ImageNet), and near-duplicates
    (re-encoded, resized) would still pass.

    Args:
        data_dir: str. The training folder.
        held_out_dir: str or `None`. The validation or test folder; `None`
            passes.
        argument: str. The argument naming `held_out_dir`
            (`"validation_dir"`, `"test_dir"`), named in the error.

    Raises:
        ArgumentError: naming `argument`, the relation and the fix.
    """
    if held_out_dir is None:
        return
    fix = ("Give a folder of other images, or leave {name} out to hold out a split of the training folder "
           "instead.")
    relation = path_relation(held_out_dir, data_dir)
    if relation is not None:
        raise ArgumentError(
            f"{{name}} {quote(held_out_dir)} {relation} the training folder {quote(data_dir)} (links and '..' "
            f"resolved): its accuracy would be measured on training images. {fix}", argument)
    trained = {}
    for path in _image_files(data_dir):
        identity = _file_identity(path)
        if identity is not None:
            trained.setdefault(identity, path)
    shared = [(path, trained[identity]) for path in _image_files(held_out_dir)
              if (identity := _file_identity(path)) is not None and identity in trained]
    if shared:
        example, original = shared[0]
        raise ArgumentError(
            f"{{name}} {quote(held_out_dir)} shares {len(shared)} image file(s) with the training folder "
            f"{quote(data_dir)} (links to the same file), e.g. {quote(example)} is {quote(original)}: their "
            f"accuracy would be measured on training images. {fix}", argument)


def index_image_folder(directory, class_names=None, on_bad_file="error", max_pixels=DEFAULT_MAX_PIXELS):
    """List the images of a class-per-subfolder directory, checking each file.

    Args:
        directory: str. A folder with one subfolder per class.
        class_names: list of str or `None`. Subfolders to use, in label
            order. Defaults to every subfolder, sorted by name.
        on_bad_file: str. `"error"` raises on the first unusable file;
            `"skip"` logs a warning per file and leaves it out. Defaults to
            `"error"`.
        max_pixels: int. See `check_image_file`.

    Returns:
        `(paths, labels, class_names)`: a list of file paths, an int32 array
        of labels in `[0, len(class_names))`, and the class names.

    Raises:
        ValueError: the directory is missing, has no class subfolders, a
            class has no image, or (with `on_bad_file="error"`) a file is
            unusable.
    """
    if on_bad_file not in ("error", "skip"):
        raise ValueError(f"`on_bad_file` must be 'error' or 'skip'. Received: on_bad_file={on_bad_file!r}")
    directory = os.fspath(directory)
    if not os.path.isdir(directory):
        raise ValueError(f"No such image folder: {quote(directory)}. Give a directory with one subfolder per class.")
    found = sorted(name for name in os.listdir(directory)
                   if os.path.isdir(os.path.join(directory, name)) and not name.startswith("."))
    if class_names is None:
        class_names = found
        if not class_names:
            raise ValueError(
                f"{quote(directory)} has no class subfolders. Put the images of each class in a subfolder "
                "named after the class, e.g. photos/cat/1.jpg, photos/dog/2.jpg."
            )
    else:
        class_names = [str(name) for name in class_names]
        missing = [name for name in class_names if name not in found]
        if missing:
            raise ValueError(f"{quote(directory)} has no subfolder for the classes {missing}. Found: {found}")
    for name in class_names:
        _check_class_link(directory, os.path.join(directory, name))
    paths, labels = [], []
    for label, name in enumerate(class_names):
        class_dir = os.path.join(directory, name)
        count = 0
        for root, dirs, files in os.walk(class_dir):
            dirs.sort()
            for file in sorted(files):
                if file.startswith(".") or not file.lower().endswith(IMAGE_EXTENSIONS):
                    continue
                path = os.path.join(root, file)
                try:
                    check_image_file(path, max_pixels=max_pixels)
                except ImageFileError as error:
                    if on_bad_file == "error":
                        raise ImageFileError(f"{error} (Pass on_bad_file='skip' / --skip-bad-files to leave "
                                             "such files out.)") from None
                    logger.warning("Skipping %s", error)
                    continue
                paths.append(path)
                labels.append(label)
                count += 1
        if count == 0:
            raise ValueError(
                f"The class folder {quote(class_dir)} has no usable image ({', '.join(IMAGE_EXTENSIONS)}). "
                "Add images or remove the folder."
            )
    return paths, np.asarray(labels, dtype="int32"), list(class_names)


def checked_class_indices(labels, num_classes):
    """Integer class labels, checked before training on them, as an int32 array.

    Args:
        labels: array-like of labels.
        num_classes: int. Number of classes of the model's head.

    Returns:
        The labels as an int32 numpy array.

    Raises:
        ValueError: labels are not integers, not 1-D, or outside
            `[0, num_classes)`; the message names the offending value.

    Example:

    >>> keras_vit.data.checked_class_indices([0, 2, 1], num_classes=3)
    array([0, 2, 1], dtype=int32)
    """
    array = np.asarray(labels)
    if array.ndim != 1:
        raise ValueError(f"Labels must be a 1-D array of class indices. Received shape {array.shape}.")
    if array.size and not np.issubdtype(array.dtype, np.integer):
        if np.issubdtype(array.dtype, np.floating) and np.all(np.isfinite(array)) and np.all(array == np.round(array)):
            array = array.astype("int64")
        else:
            raise ValueError(
                f"Labels must be integer class indices, not {array.dtype} values (one-hot or probabilities?). "
                "Pass class indices in [0, num_classes)."
            )
    if array.size:
        low, high = int(array.min()), int(array.max())
        if low < 0 or high >= num_classes:
            bad = low if low < 0 else high
            raise ValueError(
                f"Labels must be in [0, {num_classes}) for a {num_classes}-class model. Received a label {bad}."
            )
    return array.astype("int32")


def stratified_split(labels, validation_split, seed=0):
    """Indices of a per-class random split, the same for the same seed.

    Every class with at least two images keeps at least one in each part.

    Returns:
        `(train_indices, validation_indices)`, sorted int arrays.
    """
    if not 0.0 < validation_split < 1.0:
        raise ValueError(f"`validation_split` must be in (0, 1). Received: validation_split={validation_split}")
    rng = np.random.default_rng(seed)
    train, validation = [], []
    for label in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == label))
        count = int(round(len(members) * validation_split))
        if len(members) >= 2:
            count = min(max(count, 1), len(members) - 1)
        validation.extend(members[:count])
        train.extend(members[count:])
    return np.sort(np.asarray(train, dtype="int64")), np.sort(np.asarray(validation, dtype="int64"))


class _ShardedRows:
    """The rows of every global batch that one process of a multi-process job reads.

    `shard = (index, count)` gives process `index` rows
    `[n * index // count, n * (index + 1) // count)` of each global batch of
    `n` rows: together the processes read every row of an epoch once.
    Subclasses have `batch_size` and `__len__`, and `_num_rows()`.
    """

    # Rows of every batch are cut to a multiple of this: JAX splits each batch evenly over the
    # batch axis of its device mesh (`engines.current().shard` sets it on a copy).
    batch_multiple = 1

    @property
    def shard(self):
        return getattr(self, "_shard", None)

    @shard.setter
    def shard(self, shard):
        if shard is None:
            self._shard = None
            return
        index, count = (int(shard[0]), int(shard[1]))
        if not 0 <= index < count:
            raise ValueError(f"`shard` must be (index, count) with 0 <= index < count. Received: shard={shard!r}")
        # A batch of fewer rows than processes leaves some without a row of it (`rows` is empty there):
        # the job's engine (keras_vit.distribution.engines) decides what such a process feeds.
        self._shard = (index, count)

    def __len__(self):
        full, last = divmod(self._num_rows(), self.batch_size)
        return full + (last - last % self.batch_multiple > 0)

    def rows(self, index):
        """`(first, stop)`: the rows of global batch `index` this dataset reads (all of them without `shard`)."""
        size = min(self.batch_size, self._num_rows() - index * self.batch_size)
        size -= size % self.batch_multiple
        if self.shard is None:
            return 0, size
        shard, count = self._shard
        return size * shard // count, size * (shard + 1) // count


class ImageFolderDataset(_ShardedRows, keras.utils.PyDataset):
    """Batches of `(images, labels)` read from files, for `fit` on any backend.

    Batch `b` of epoch `e` depends only on `(seed, e, b)`: the file order
    is a permutation drawn from `(seed, e)` and each batch's augmentation
    from `(seed, e, b)`. `set_epoch` (called by `EpochSync` at the start of
    every epoch) selects the epoch, so a resumed run repeats exactly the
    batches of an uninterrupted one.

    Args:
        paths: list of str. Image files.
        labels: int array or `None` (images only, e.g. for pre-training).
        image_size: int or `(height, width)`. Output size.
        num_channels: int. 1 or 3; images are converted.
        batch_size: int. Defaults to `32`.
        training: bool. Shuffle and augment (random resized crop, flip and
            the `augment` policy's options); otherwise resize the shorter
            side and crop the centre, in file order. Defaults to `False`.
        augment: `AugmentPolicy` or `None`. Training augmentation. Defaults
            to `AugmentPolicy()`.
        num_classes: int or `None`. Needed when the policy mixes labels
            (MixUp / CutMix): labels are then one-hot.
        seed: int. Defaults to `0`.
        class_names: list of str or `None`. Kept as `.class_names`.
        workers: int. Threads that decode the images of a batch in parallel
            (Pillow releases the GIL). They are the dataset's own: Keras'
            prefetching workers (`PyDataset(workers=...)`) keep the batches
            they prefetched when `fit` reads one batch to build the model
            and hand them out first in the next epoch, so step `i` trained
            another batch than batch `i` (and a job of several processes
            weighted each step by the wrong batch's rows). Defaults to `2`.
        use_multiprocessing, max_queue_size: accepted as
            `keras.utils.PyDataset` takes them, and unused: Keras reads
            this dataset in its own thread, one batch at a time.
        shard: `(index, count)` or `None`. Read only process `index`'s
            share of every batch, for training with `count` processes (one
            per host): `batch_size` is then the global batch, and process
            `i` reads rows `[n * i // count, n * (i + 1) // count)` of each
            global batch of `n` rows, so the processes together read every
            image of an epoch once and none twice. Augmentation is drawn
            per image, from the image's place in the global batch, so the
            shards see exactly the pixels one process would (MixUp, CutMix
            and RandAugment, which act on a whole batch, act on each
            process's rows). Defaults to `None` (everything).
        transform: the model's evaluation transform (`ImageTransform`, a
            dict of its fields, or the model itself): how held-out images
            are resized and cropped, and every image's alpha rule.
            Defaults to `None` (a model built from scratch's).
    """

    def __init__(self, paths, labels, image_size, num_channels=3, batch_size=32, training=False, augment=None,
                 num_classes=None, seed=0, class_names=None, workers=2, use_multiprocessing=False,
                 max_queue_size=8, shard=None, transform=None):
        # Keras reads batches in order, one at a time (workers=1); `decode_threads` decode each batch's images.
        super().__init__(workers=1, use_multiprocessing=False, max_queue_size=max_queue_size)
        if not isinstance(workers, int) or isinstance(workers, bool) or workers <= 0:
            raise ValueError(f"`workers` must be a positive int. Received: workers={workers!r}")
        self.decode_threads = workers
        self._pool = None
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size <= 0:
            raise ValueError(f"`batch_size` must be a positive int. Received: batch_size={batch_size!r}")
        if not paths:
            raise ValueError("An ImageFolderDataset needs at least one image.")

        self.paths = list(paths)
        self.labels = None if labels is None else np.asarray(labels, dtype="int32")
        self.image_size = to_pair(image_size, "image_size")
        self.num_channels = num_channels
        self.batch_size = batch_size
        self.training = training
        self.augment = (augment or AugmentPolicy()) if training else None
        self.num_classes = num_classes
        self.seed = int(seed)
        self.class_names = class_names
        self.epoch = 0
        if self.augment is not None and self.augment.mixes_labels and self.labels is not None and not num_classes:
            raise ValueError("MixUp / CutMix need `num_classes` to make one-hot labels.")
        self.shard = shard
        self.transform = as_transform(transform)

    def _num_rows(self):
        return len(self.paths)

    def set_epoch(self, epoch):
        """Select the epoch whose order and augmentation the batches follow."""
        self.epoch = int(epoch)

    def order(self, epoch=None):
        """The file indices in the order epoch `epoch` reads them."""
        if not self.training:
            return np.arange(len(self.paths))
        epoch = self.epoch if epoch is None else epoch
        return np.random.default_rng([self.seed, epoch]).permutation(len(self.paths))

    def __getitem__(self, index):
        if not 0 <= index < len(self):
            raise IndexError(f"batch {index} of {len(self)}")
        epoch = self.epoch
        first, stop = self.rows(index)
        chosen = self.order(epoch)[index * self.batch_size + first:index * self.batch_size + stop]
        images = np.empty((len(chosen),) + self.image_size + (self.num_channels,), dtype="float32")

        def decode(row):
            # One generator per image, keyed by its place in the global batch: the same pixels
            # whichever process (and whichever thread) reads it.
            rng = np.random.default_rng([self.seed, epoch, index, 1, first + row]) if self.training else None
            image = read_image(self.paths[chosen[row]], self.num_channels, alpha=self.transform.alpha)
            if self.training and self.augment.crop:
                image = random_resized_crop(image, self.image_size, rng, scale=self.augment.crop_scale,
                                            ratio=self.augment.crop_ratio)
            else:
                image = self.transform(image, self.image_size)
            if self.training and self.augment.flip and rng.random() < 0.5:
                image = image[:, ::-1]
            images[row] = image

        if self.decode_threads > 1 and len(chosen) > 1:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.decode_threads, thread_name_prefix="keras_vit_decode")
            list(self._pool.map(decode, range(len(chosen))))  # list(): raise a decoding error here
        else:
            for row in range(len(chosen)):
                decode(row)
        if self.labels is None:
            if self.training:
                images = self.augment.apply_layers(images, None, self.num_classes, [self.seed, epoch, index])[0]
            return images
        labels = self.labels[chosen]
        if self.augment is not None and self.augment.mixes_labels:
            labels = np.eye(self.num_classes, dtype="float32")[labels]
        if self.training:
            images, labels = self.augment.apply_layers(images, labels, self.num_classes, [self.seed, epoch, index])
        return images, labels


class EpochSync(keras.callbacks.Callback):
    """Tell `ImageFolderDataset`s (or any object with `set_epoch`) the epoch `fit` starts.

    `fit` calls callbacks' `on_epoch_begin` before it starts reading the
    epoch's batches, so every batch of it follows that epoch's order.
    """

    def __init__(self, *datasets):
        super().__init__()
        self.datasets = [dataset for dataset in datasets if hasattr(dataset, "set_epoch")]

    def on_epoch_begin(self, epoch, logs=None):
        for dataset in self.datasets:
            dataset.set_epoch(epoch)


class ArrayBatches(_ShardedRows, keras.utils.PyDataset):
    """In-memory arrays in batches whose order depends only on `(seed, epoch)`.

    The resumable counterpart of `fit(x, y, shuffle=True)` (whose shuffling
    state is not part of a checkpoint), used by `keras-vit train` and
    `keras-vit pretrain`.

    Args:
        x: array. Inputs.
        y: array or `None`. Targets.
        batch_size: int.
        seed: int. Defaults to `0`.
        shuffle: bool. Defaults to `True`.
        shard: `(index, count)` or `None`. Return only process `index`'s
            rows of every global batch of `batch_size` rows (see
            `ImageFolderDataset`). Defaults to `None` (every row).
    """

    def __init__(self, x, y=None, batch_size=32, seed=0, shuffle=True, shard=None):
        super().__init__()
        self.x, self.y = x, y
        self.batch_size, self.seed, self.shuffle = batch_size, int(seed), shuffle
        self.epoch = 0
        self.shard = shard

    def _num_rows(self):
        return len(self.x)

    def set_epoch(self, epoch):
        self.epoch = int(epoch)

    def __getitem__(self, index):
        if not 0 <= index < len(self):
            raise IndexError(f"batch {index} of {len(self)}")
        order = (np.random.default_rng([self.seed, self.epoch]).permutation(len(self.x)) if self.shuffle
                 else np.arange(len(self.x)))
        first, stop = self.rows(index)
        chosen = order[index * self.batch_size + first:index * self.batch_size + stop]
        if self.y is None:
            return self.x[chosen]
        return self.x[chosen], self.y[chosen]


def image_folder_datasets(directory, image_size, num_channels=3, batch_size=32, validation_split=0.2,
                          validation_dir=None, seed=0, augment=None, class_names=None, on_bad_file="error",
                          max_pixels=DEFAULT_MAX_PIXELS, workers=2, shard=None, transform=None):
    """A training and a validation dataset from a class-per-subfolder image folder.

    Args:
        directory: str. One subfolder per class (JPEG, PNG, BMP, GIF).
        image_size: int or `(height, width)`. The model's input size; any
            image size is read and brought to it.
        num_channels: int. The model's channels (1 or 3); grayscale, RGBA
            and palette images are converted. Defaults to `3`.
        batch_size: int. Defaults to `32`.
        validation_split: float. Share of each class held out (by `seed`)
            when `validation_dir` is not given. `0` gives no validation
            set. Defaults to `0.2`.
        validation_dir: str or `None`. A separate folder with the same class
            subfolders, used as the validation set instead of a split.
        seed: int. Seeds the split, the order and the augmentation.
            Defaults to `0`.
        augment: `AugmentPolicy` or `None`. Training augmentation. Defaults
            to `AugmentPolicy()` (random resized crop and flip).
        class_names: list of str or `None`. See `index_image_folder`.
        on_bad_file: `"error"` or `"skip"`. See `index_image_folder`.
        max_pixels: int. See `check_image_file`.
        workers: int. Decoding threads per dataset. Defaults to `2`.
        shard: `(index, count)` or `None`. This process's share of every
            global batch, for training with many processes (see
            `ImageFolderDataset`). Defaults to `None`.
        transform: the model's evaluation transform, or the model (see
            `ImageFolderDataset`). Defaults to `None`.

    Returns:
        `(train, validation)`: `ImageFolderDataset`s (`validation` is `None`
        without a validation set), each with `.class_names`.

    Example:

    >>> train, validation = keras_vit.data.image_folder_datasets("photos", image_size=224)
    >>> model.fit(train, validation_data=validation, epochs=5)
    """
    paths, labels, class_names = index_image_folder(directory, class_names, on_bad_file, max_pixels)
    augment = augment or AugmentPolicy()
    common = dict(image_size=image_size, num_channels=num_channels, batch_size=batch_size,
                  num_classes=len(class_names), seed=seed, class_names=class_names, workers=workers, shard=shard,
                  transform=as_transform(transform))
    if validation_dir is not None:
        val_paths, val_labels, _ = index_image_folder(validation_dir, class_names, on_bad_file, max_pixels)
        train_paths, train_labels = paths, labels
    elif validation_split:
        train_index, val_index = stratified_split(labels, validation_split, seed)
        train_paths, train_labels = [paths[i] for i in train_index], labels[train_index]
        val_paths, val_labels = [paths[i] for i in val_index], labels[val_index]
    else:
        train_paths, train_labels, val_paths, val_labels = paths, labels, [], None
    train = ImageFolderDataset(train_paths, train_labels, training=True, augment=augment, **common)
    validation = None
    if val_paths:
        # The validation set's labels are one-hot too when training mixes labels,
        # so one loss and one accuracy serve both.
        validation = _EvalDataset(val_paths, val_labels, one_hot=augment.mixes_labels, **common)
    return train, validation


class _EvalDataset(ImageFolderDataset):
    def __init__(self, paths, labels, one_hot=False, **kwargs):
        super().__init__(paths, labels, training=False, **kwargs)
        self.one_hot = one_hot

    def __getitem__(self, index):
        images, labels = super().__getitem__(index)
        if self.one_hot:
            labels = np.eye(self.num_classes, dtype="float32")[labels]
        return images, labels


def read_image_folder(directory, image_size, num_channels=3, class_names=None, on_bad_file="error",
                      max_pixels=DEFAULT_MAX_PIXELS, transform=None):
    """Every image of a class-per-subfolder folder as arrays, by the model's evaluation transform.

    For small folders (few-shot evaluation, tests); use
    `image_folder_datasets` to train. `transform` is the model's (an
    `ImageTransform`, a dict of its fields, or the model); `None` is a model
    built from scratch's.

    Returns:
        `(images, labels, class_names)`: float32 `(n, h, w, c)` in [0, 255],
        int32 labels, and the class names.
    """
    paths, labels, class_names = index_image_folder(directory, class_names, on_bad_file, max_pixels)

    size = to_pair(image_size, "image_size")
    transform = as_transform(transform)
    images = np.stack([transform(read_image(path, num_channels, alpha=transform.alpha), size) for path in paths])
    return images, labels, class_names
