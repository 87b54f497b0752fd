"""Datasets: the embedded digits, class-per-subfolder image folders, augmentation.

- `load_digits_split`, `write_digits_folder`: scikit-learn's digits as
  arrays, or as a PNG folder for the image-folder path.
- `image_folder_datasets`: training and validation `keras.utils.PyDataset`s
  from a folder, on every backend (no TensorFlow needed).
- `read_image_folder`: a small folder as arrays.
- `checked_class_indices`: integer labels in `[0, num_classes)`, checked
  before training.
- `AugmentPolicy`: random resized crop and flip (big_vision's fine-tuning),
  and RandAugment / MixUp / CutMix from Keras' preprocessing layers.
- `read_image`, `center_crop`, `load_image`, `resize_images`: the one image
  path (decode, EXIF, alpha, pixel limit; resize and centre crop) that every
  command, the folders' evaluation and `ViTClassifier.predict` use.
"""

from keras_vit.data.augment import AugmentPolicy, random_resized_crop
from keras_vit.data.digits import load_digits_split, write_digits_folder
from keras_vit.data.image_folder import (
    IMAGE_EXTENSIONS,
    ArrayBatches,
    EpochSync,
    ImageFolderDataset,
    check_image_file,
    checked_class_indices,
    image_folder_datasets,
    index_image_folder,
    read_image_folder,
    stratified_split,
)
from keras_vit.data.images import (
    DEFAULT_MAX_PIXELS,
    ImageFileError,
    center_crop,
    load_image,
    open_image,
    read_image,
    resize_images,
)
