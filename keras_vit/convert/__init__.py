"""Checkpoint interop: timm, Hugging Face and Google `.npz` ViT weights.

The mapping is numpy only and strict (every weight set exactly once, every
source tensor used or explicitly ignored, shapes checked). Files are never
unpickled.
"""

from keras_vit.convert.huggingface import export_huggingface, from_huggingface
from keras_vit.convert.io import read_npz, read_safetensors, write_safetensors
from keras_vit.convert.loader import from_npz, from_timm, load_checkpoint
from keras_vit.utils.resample import resample_position_embedding
from keras_vit.convert.timm import export_timm

__all__ = [
    "export_huggingface",
    "export_timm",
    "from_huggingface",
    "from_npz",
    "from_timm",
    "load_checkpoint",
    "read_npz",
    "read_safetensors",
    "resample_position_embedding",
    "write_safetensors",
]
