"""Datasets that ship inside packages, and preprocessing helpers."""

from keras_vit.data.digits import load_digits_split
