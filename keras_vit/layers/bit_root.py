"""The root (first layers) of a BiT ResNet: 7x7/2 conv, GroupNorm, ReLU, 3x3/2 max-pool."""

import keras
from keras import ops

from keras_vit.layers import fused

from keras_vit.layers.std_conv import StdConv2D, same_padding
from keras_vit.utils.values import check_group_count


@keras.saving.register_keras_serializable(package="keras_vit")
class BiTRoot(keras.layers.Layer):
    """Root block of the BiT ResNet used by the hybrid ViTs.

    A weight-standardised 7x7 convolution with stride 2, GroupNorm, ReLU
    and a 3x3 max-pool with stride 2: the image shrinks by 4 in each
    direction. Both the convolution and the pool use TensorFlow's SAME
    padding (asymmetric for even sizes), identical on every backend. This
    is the non-pre-activation root of the ViT paper's hybrids (timm
    `create_resnetv2_stem(stem_type="same", preact=False)`); the R+ViT-Ti
    hybrid uses it alone as its stem. Inputs are channels-last whatever
    `keras.config.image_data_format()` says.

    Args:
        filters: int. Output channels. Defaults to `64`.
        num_groups: int. GroupNorm groups; must divide `filters`. Defaults
            to `32`.
        std_conv_epsilon: float. Weight-standardisation epsilon. Defaults
            to `1e-8` (timm).
        group_norm_epsilon: float. GroupNorm epsilon. Defaults to `1e-5`
            (timm).
        **kwargs: Base layer keyword arguments, such as `name` and `dtype`.

    Call arguments:
        inputs: A tensor of shape `(batch, height, width, channels)`.

    Returns:
        A tensor of shape `(batch, ceil(ceil(height / 2) / 2),
        ceil(ceil(width / 2) / 2), filters)`.
    """

    def __init__(self, filters=64, num_groups=32, std_conv_epsilon=1e-8, group_norm_epsilon=1e-5, **kwargs):
        super().__init__(**kwargs)
        check_group_count(filters, num_groups, "filters")
        self.filters = filters
        self.num_groups = num_groups
        self.std_conv_epsilon = float(std_conv_epsilon)
        self.group_norm_epsilon = float(group_norm_epsilon)
        self.conv = StdConv2D(
            filters, 7, strides=2, padding="same", epsilon=self.std_conv_epsilon, dtype=self.dtype_policy, name="conv"
        )
        self.norm = keras.layers.GroupNormalization(
            groups=num_groups, epsilon=self.group_norm_epsilon, dtype=self.dtype_policy, name="norm"
        )

    def build(self, input_shape):
        self.conv.build(input_shape)
        conv_shape = self.conv.compute_output_shape(input_shape)
        self.norm.build(conv_shape)
        self.built = True

    def call(self, inputs):
        x = ops.relu(fused.group_norm(self.norm, self.conv(inputs)))
        _, height, width, _ = x.shape
        # The pools state their layout: by default they follow the global image_data_format.
        if height is None or width is None:
            return ops.max_pool(x, 3, strides=2, padding="same", data_format="channels_last")
        pad_h, pad_w = same_padding(height, 3, 2), same_padding(width, 3, 2)
        # Zero padding equals TF's "ignore the padded pixels" here because the
        # ReLU output is non-negative and every window holds a real pixel.
        x = ops.pad(x, ((0, 0), pad_h, pad_w, (0, 0)))
        return ops.max_pool(x, 3, strides=2, padding="valid", data_format="channels_last")

    def compute_output_shape(self, input_shape):
        batch, height, width, _ = self.conv.compute_output_shape(input_shape)
        height = None if height is None else -(-height // 2)
        width = None if width is None else -(-width // 2)
        return (batch, height, width, self.filters)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "filters": self.filters,
                "num_groups": self.num_groups,
                "std_conv_epsilon": self.std_conv_epsilon,
                "group_norm_epsilon": self.group_norm_epsilon,
            }
        )
        return config
