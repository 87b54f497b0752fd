"""PyTorch's global random generator, saved with a checkpoint and restored on resume.

Keras' `Dropout` without a seed takes a fast path on the torch backend that
draws from torch's global generator instead of the layer's `SeedGenerator`.
A resumed run drops the same units as an uninterrupted one only if that
generator's state is in the checkpoint. On JAX and TensorFlow the layers draw
from their own seed states (saved with the model's variables), so both
functions do nothing there.
"""

import keras


def global_rng_state():
    """The torch global generator's state as a list of bytes (JSON-friendly), or None off torch."""
    if keras.backend.backend() != "torch":
        return None
    import torch

    return torch.get_rng_state().tolist()


def set_global_rng_state(state):
    """Restore a state from `global_rng_state()`; None, or another backend, does nothing."""
    if state is None or keras.backend.backend() != "torch":
        return
    import torch

    torch.set_rng_state(torch.tensor(state, dtype=torch.uint8))
