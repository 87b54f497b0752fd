"""Seeding without starting TensorFlow on the jax and torch backends."""

import sys


def set_random_seed(seed):
    """`keras.utils.set_random_seed(seed)`, minus TensorFlow when it is not in use.

    Keras seeds TensorFlow whenever it is installed (for `tf.data`
    pipelines), which imports it: seconds of start-up and TensorFlow's CUDA
    log lines on a jax or torch run. keras_vit feeds no `tf.data` pipeline
    there, so TensorFlow is seeded only when it is the backend or already
    imported. Python's, numpy's, the backend's and Keras' own global seeds
    are set as `keras.utils.set_random_seed` sets them.

    Args:
        seed: int.
    """
    import keras

    if keras.backend.backend() == "tensorflow" or "tensorflow" in sys.modules:
        keras.utils.set_random_seed(seed)
        return
    # A None entry in sys.modules makes `import tensorflow` raise ImportError,
    # which Keras reads as "not installed"; the entry is removed at once after.
    sys.modules["tensorflow"] = None
    try:
        keras.utils.set_random_seed(seed)
    finally:
        del sys.modules["tensorflow"]
