"""Functional ViT models built from keras_vit layers."""

from keras_vit.models.variants import parse_variant, variant_names
from keras_vit.models.vit_backbone import ViTBackbone
from keras_vit.models.vit_classifier import ViTClassifier
from keras_vit.models.masked_patch_predictor import MaskedPatchPredictor
