"""The engine of a job of one process (any backend, one device or a one-process distribution's devices)."""

from keras_vit.distribution.engines.base import Engine


class OneProcess(Engine):
    """Process 0 of 1: every dataset whole, Keras' `fit`, `evaluate` and saving as they are."""
