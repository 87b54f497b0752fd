"""Functional ViT models built from keras_vit layers."""

from keras_vit.models.base import MAX_PARAMETERS, ViTModel
from keras_vit.models.encoder import AttentionScores
from keras_vit.models.hybrid import applications_stem, bit_resnet_stem, keras_cv_resnet_v2_stem, set_stem_trainable
from keras_vit.models.variants import hybrid_variant_names, parse_variant, variant_names
from keras_vit.models.vit_backbone import ViTBackbone
from keras_vit.models.vit_classifier import ViTClassifier
from keras_vit.models.masked_patch_predictor import MaskedPatchPredictor
