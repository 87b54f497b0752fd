"""Inputs checked before tracing: the image batches and labels a keras_vit model takes.

`InputChecks` is a mixin of `ViTModel`: `fit`, `evaluate` and `predict` check
their batch first (`check_inputs`), so a batch that cannot be right gets a
clear error instead of a traced shape error (on JAX a wrong-shaped batch
reaching a compiled `predict` leaves the model's variables purged), and
`predict` brings a numpy batch of raw images of another size to the
model's with the model's own evaluation transform.
"""

import numpy as np

from keras_vit.layers.patches import check_image_shape
from keras_vit.utils.checks import check_image_batch, check_pixel_range
from keras_vit.utils.image_resize import image_transform, resize_images


class InputChecks:
    """`check_inputs` before `fit`, `evaluate` and `predict` (a mixin of `ViTModel`)."""

    def image_shape(self):
        """`(height, width, channels)` of the images this model takes."""
        backbone = getattr(self, "backbone", self)
        return tuple(backbone.image_size) + (backbone.num_channels,)

    def check_inputs(self, x, y=None):
        """Raise a clear error for images (or labels) that do not fit, before any tracing.

        A wrong-shaped batch that reaches a compiled `predict` on JAX leaves
        the model's variables purged and the model unusable; checking
        arrays, tensors and `tf.data` element specs first avoids that.
        """
        spec = getattr(x, "element_spec", None)
        if spec is not None:  # a tf.data.Dataset of images or (images, labels)
            if isinstance(spec, (tuple, list)):
                spec, y = spec[0], (spec[1] if len(spec) > 1 else None)
            x = spec
        shape = getattr(x, "shape", None)
        if shape is None:
            return
        # Empty and boolean batches: the functional Input would cast booleans to float silently.
        check_image_batch(x)
        shape = tuple(None if d is None else int(d) for d in shape)
        expected = self.image_shape()
        # Rank and channels first, with the layers' own messages.
        check_image_shape(shape, (1, 1), num_channels=expected[2], layer_name="The model")
        if any(got is not None and got != want for got, want in zip(shape[1:], expected)):
            raise ValueError(
                f"{type(self).__name__} '{self.name}' takes batches of images shaped (batch, {expected[0]}, "
                f"{expected[1]}, {expected[2]}) but received a batch of shape {shape}. Resize the images "
                f"(`keras_vit.data.resize_images(images, ({expected[0]}, {expected[1]}), model)`, which `predict` "
                "applies to numpy batches itself), or get a model for their size with `model.with_image_size(...)`."
            )
        backbone = getattr(self, "backbone", self)
        scale = float(getattr(backbone, "pixel_scale", 1.0) or 1.0)
        # One min / max over a numpy batch; tensors and datasets are not read (a device sync).
        check_pixel_range(x, expected_max=1.0 / scale, model=self)
        self.check_label_values(y)

    def check_label_values(self, y):
        """Subclasses check labels against their loss; the default accepts anything."""

    def fit(self, x=None, y=None, *args, **kwargs):
        self.check_inputs(x, y)
        return super().fit(x, y, *args, **kwargs)

    def evaluate(self, x=None, y=None, *args, **kwargs):
        self.check_inputs(x, y)
        return super().evaluate(x, y, *args, **kwargs)

    def predict(self, x, *args, **kwargs):
        x = self.resize_raw_images(x)
        self.check_inputs(x)
        return super().predict(x, *args, **kwargs)

    def resize_raw_images(self, x):
        """A numpy batch of raw images of another size, brought to the model's by its evaluation transform.

        The model's own transform (`keras_vit.utils.image_resize.
        image_transform(model)`: a centre crop or a stretch, its crop
        fraction and interpolation), exactly as `keras-vit predict` and the
        image folders' held-out images are: `model.predict(photos)` takes a
        batch of any size, as keras-hub's image classifiers and Hugging
        Face's pipeline do. Anything else (tensors, datasets, the model's own
        size) is returned as it is.
        """
        if not isinstance(x, np.ndarray) or x.ndim != 4:
            return x
        expected = self.image_shape()
        if tuple(x.shape[1:3]) == tuple(expected[:2]) or x.shape[3] != expected[2] or not len(x):
            return x
        return resize_images(x, expected[:2], image_transform(self))
