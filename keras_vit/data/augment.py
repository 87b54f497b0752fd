"""Training augmentation and evaluation crops for image folders.

The crop and flip follow big_vision's fine-tuning input pipeline
(`inception_crop` then `flip_lr`): a random region covering `scale` of the
image area with an aspect ratio in `ratio` is resized to the model's size.
They run on each decoded image at full resolution, with a numpy generator
seeded per image so a resumed run repeats them, and resample as the
evaluation transform does (`keras_vit.utils.image_resize.resize_region`, bicubic). RandAugment, MixUp and CutMix
are Keras' own preprocessing layers, applied to each batch.
"""

import dataclasses
import math

import numpy as np

from keras_vit.utils.image_resize import resize_region


def random_resized_crop(image, size, rng, scale=(0.05, 1.0), ratio=(3 / 4, 4 / 3), attempts=10):
    """A random region of `image` resized to `size` (Inception-style crop).

    The region covers a share of the area drawn uniformly from `scale`, with
    an aspect ratio drawn log-uniformly from `ratio`; after `attempts`
    misses the whole image is used. big_vision's fine-tuning configs use
    `inception_crop` with its default minimum area of 5%.

    Args:
        image: float array `(height, width, channels)`.
        size: `(height, width)` of the output.
        rng: `numpy.random.Generator`.
        scale: pair of floats. Defaults to `(0.05, 1.0)`.
        ratio: pair of floats. Defaults to `(3/4, 4/3)`.
        attempts: int. Defaults to `10`.

    Returns:
        float32 array `size + (channels,)`.
    """
    height, width = image.shape[:2]
    area = height * width
    for _ in range(attempts):
        target = area * rng.uniform(*scale)
        aspect = math.exp(rng.uniform(math.log(ratio[0]), math.log(ratio[1])))
        crop_w = math.sqrt(target * aspect)
        crop_h = math.sqrt(target / aspect)
        if crop_w <= width and crop_h <= height:
            left = rng.uniform(0, width - crop_w)
            top = rng.uniform(0, height - crop_h)
            return resize_region(image, (left, top, left + crop_w, top + crop_h), size)
    return resize_region(image, (0, 0, width, height), size)


@dataclasses.dataclass(frozen=True)
class AugmentPolicy:
    """What `ImageFolderDataset` does to training images.

    Args:
        crop: bool. Random resized crop (else resize + centre crop).
            Defaults to `True`.
        crop_scale: pair of floats. Area share range of the crop. Defaults
            to `(0.05, 1.0)`, big_vision's `inception_crop`.
        crop_ratio: pair of floats. Aspect ratio range. Defaults to
            `(3/4, 4/3)`.
        flip: bool. Random horizontal flip. Defaults to `True`.
        randaugment: bool. `keras.layers.RandAugment` (2 ops, factor 0.5).
            Defaults to `False`.
        mixup: float. MixUp `alpha` (`keras.layers.MixUp`); `0` is off.
            Defaults to `0.0`.
        cutmix: float. CutMix `factor` (`keras.layers.CutMix`); `0` is off.
            Defaults to `0.0`.
    """

    crop: bool = True
    crop_scale: tuple = (0.05, 1.0)
    crop_ratio: tuple = (3 / 4, 4 / 3)
    flip: bool = True
    randaugment: bool = False
    mixup: float = 0.0
    cutmix: float = 0.0

    def __post_init__(self):
        low, high = self.crop_scale
        if not 0.0 < low <= high <= 1.0:
            raise ValueError(f"`crop_scale` must satisfy 0 < low <= high <= 1. Received: {self.crop_scale}")
        if not 0.0 < self.crop_ratio[0] <= self.crop_ratio[1]:
            raise ValueError(f"`crop_ratio` must satisfy 0 < low <= high. Received: {self.crop_ratio}")
        for name in ("mixup", "cutmix"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"`{name}` must be a finite number >= 0. Received: {name}={value}")

    @classmethod
    def none(cls):
        """No augmentation: resize and centre-crop, no flip."""
        return cls(crop=False, flip=False)

    @property
    def mixes_labels(self):
        return self.mixup > 0 or self.cutmix > 0

    def apply_layers(self, images, labels, num_classes, seed):
        """RandAugment / MixUp / CutMix on a batch, with layers seeded by `seed`.

        Fresh layers with a seed derived from `(run seed, epoch, batch)` make
        the result a function of the batch alone, like the crop and flip.
        """
        if not (self.randaugment or self.mixes_labels):
            return images, labels
        import keras

        layer_seed = int(np.random.default_rng(seed).integers(2**31 - 1))
        # The batches are channels-last; Keras' image layers would otherwise follow the global image_data_format.
        layout = "channels_last"
        if self.randaugment:
            images = keras.layers.RandAugment(value_range=(0, 255), seed=layer_seed, data_format=layout)(
                images, training=True)
            images = np.asarray(keras.ops.convert_to_numpy(images), dtype="float32")
        mixers = []
        if self.mixup:
            mixers.append(keras.layers.MixUp(alpha=self.mixup, seed=layer_seed + 1, data_format=layout))
        if self.cutmix:
            mixers.append(keras.layers.CutMix(factor=self.cutmix, seed=layer_seed + 2, data_format=layout))
        if mixers and labels is not None:
            # With both on, each batch gets one of them (as timm's Mixup switch).
            mixer = mixers[np.random.default_rng(seed).integers(len(mixers))]
            mixed = mixer({"images": images, "labels": labels}, training=True)
            images = np.asarray(keras.ops.convert_to_numpy(mixed["images"]), dtype="float32")
            labels = np.asarray(keras.ops.convert_to_numpy(mixed["labels"]), dtype="float32")
        return images, labels
