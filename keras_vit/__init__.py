"""keras_vit: the Vision Transformer for Keras 3 on TensorFlow, JAX and PyTorch."""

from keras_vit import convert, data, distribution, layers, presets
from keras_vit.fewshot import fewshot_evaluate
from keras_vit.finetuning import finetune
from keras_vit.models import MaskedPatchPredictor, ViTBackbone, ViTClassifier, parse_variant, variant_names
from keras_vit.presets import decode_predictions

__version__ = "0.1.0"
