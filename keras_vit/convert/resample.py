"""Position-embedding resampling, kept importable from `keras_vit.convert`.

The resampler lives in `keras_vit.utils.resample` so models can resample
(`with_image_size`) without importing the converters.
"""

from keras_vit.utils.resample import INTERPOLATIONS, interpolation_matrix, resample_position_embedding

__all__ = ["INTERPOLATIONS", "interpolation_matrix", "resample_position_embedding"]
