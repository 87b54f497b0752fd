"""Backend-agnostic Keras layers of the Vision Transformer."""

from keras_vit.layers.attention import MultiHeadSelfAttention
from keras_vit.layers.attention_pooling import AttentionPooling
from keras_vit.layers.bit_bottleneck_unit import BiTBottleneckUnit
from keras_vit.layers.bit_root import BiTRoot
from keras_vit.layers.drop_path import DropPath
from keras_vit.layers.image_normalization import ImageNormalization
from keras_vit.layers.layer_scale import LayerScale
from keras_vit.layers.mlp import MLP
from keras_vit.layers.patch_encoder import PatchEncoder
from keras_vit.layers.patches import Patches
from keras_vit.layers.std_conv import StdConv2D
from keras_vit.layers.transformer_block import TransformerBlock
from keras_vit.layers.token_pooling import TokenPooling
from keras_vit.layers.patch_corruption import PatchCorruption
