"""The bottleneck residual unit of the BiT ResNet used by the hybrid ViTs."""

import keras
from keras import ops

from keras_vit.layers import fused

from keras_vit.layers.std_conv import StdConv2D
from keras_vit.utils.values import check_count, check_group_count, is_int


@keras.saving.register_keras_serializable(package="keras_vit")
class BiTBottleneckUnit(keras.layers.Layer):
    """Bottleneck unit with weight-standardised convs and GroupNorm.

    `relu(norm3(conv3(relu(norm2(conv2(relu(norm1(conv1(x)))))))) +
    shortcut)`, with a 1x1 `conv1` down to `bottleneck_filters`, a 3x3
    `conv2` that carries the stride, and a 1x1 `conv3` up to `filters`. The
    shortcut is `x`, or a projection (`conv_proj`, a strided 1x1 StdConv,
    then `norm_proj`, GroupNorm) when the channel count or the resolution
    changes. This is the post-activation unit of the ViT paper's hybrids
    (timm `resnetv2.Bottleneck`, vit_jax `ResidualUnit`), not BiT's
    pre-activation unit.

    Args:
        filters: int. Output channels (4x the bottleneck width in ResNets).
        strides: int. Stride of `conv2` and of the projection. Defaults
            to `1`.
        bottleneck_filters: int or `None`. Channels of `conv1`/`conv2`;
            `None` means `filters // 4`. Defaults to `None`.
        use_projection: bool or `None`. Whether the shortcut is projected;
            `None` decides from the input (projected when the channels or
            the stride change). Defaults to `None`.
        num_groups: int. GroupNorm groups. Defaults to `32`.
        std_conv_epsilon: float. Weight-standardisation epsilon. Defaults
            to `1e-8` (timm).
        group_norm_epsilon: float. GroupNorm epsilon. Defaults to `1e-5`
            (timm).
        **kwargs: Base layer keyword arguments, such as `name` and `dtype`.

    Call arguments:
        inputs: A tensor of shape `(batch, height, width, channels)`.

    Returns:
        A tensor of shape `(batch, ceil(height / strides),
        ceil(width / strides), filters)`.
    """

    def __init__(
        self,
        filters,
        strides=1,
        bottleneck_filters=None,
        use_projection=None,
        num_groups=32,
        std_conv_epsilon=1e-8,
        group_norm_epsilon=1e-5,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if bottleneck_filters is None and is_int(filters):
            bottleneck_filters = max(1, filters // 4)
        check_group_count(filters, num_groups, "filters")
        check_group_count(bottleneck_filters, num_groups, "bottleneck_filters")
        check_count(strides, "strides")
        self.filters = filters
        self.strides = strides
        self.bottleneck_filters = bottleneck_filters
        self.use_projection = use_projection
        self.num_groups = num_groups
        self.std_conv_epsilon = float(std_conv_epsilon)
        self.group_norm_epsilon = float(group_norm_epsilon)

        self.conv1 = self._conv(bottleneck_filters, 1, 1, "conv1")
        self.norm1 = self._norm("norm1")
        self.conv2 = self._conv(bottleneck_filters, 3, strides, "conv2")
        self.norm2 = self._norm("norm2")
        self.conv3 = self._conv(filters, 1, 1, "conv3")
        self.norm3 = self._norm("norm3")
        # The projection exists only when needed, which `build` decides.
        self.conv_proj = None
        self.norm_proj = None

    def _conv(self, channels, kernel_size, strides, name):
        return StdConv2D(
            channels, kernel_size, strides=strides, epsilon=self.std_conv_epsilon, dtype=self.dtype_policy, name=name
        )

    def _norm(self, name):
        return keras.layers.GroupNormalization(
            groups=self.num_groups, epsilon=self.group_norm_epsilon, dtype=self.dtype_policy, name=name
        )

    def _projects(self, input_channels):
        if self.use_projection is None:
            return input_channels != self.filters or self.strides != 1
        return bool(self.use_projection)

    def build(self, input_shape):
        self.conv1.build(input_shape)
        shape = self.conv1.compute_output_shape(input_shape)
        self.norm1.build(shape)
        self.conv2.build(shape)
        shape = self.conv2.compute_output_shape(shape)
        self.norm2.build(shape)
        self.conv3.build(shape)
        shape = self.conv3.compute_output_shape(shape)
        self.norm3.build(shape)
        if self._projects(input_shape[-1]):
            self.conv_proj = self._conv(self.filters, 1, self.strides, "conv_proj")
            self.norm_proj = self._norm("norm_proj")
            self.conv_proj.build(input_shape)
            self.norm_proj.build(self.conv_proj.compute_output_shape(input_shape))
        elif input_shape[-1] != self.filters or self.strides != 1:
            raise ValueError(
                "Without a projection the shortcut must keep the shape: the input needs `filters` channels "
                f"and `strides` must be 1. Received: input channels={input_shape[-1]}, filters={self.filters}, "
                f"strides={self.strides}, use_projection={self.use_projection}"
            )
        self.built = True

    def call(self, inputs):
        shortcut = inputs if self.conv_proj is None else fused.group_norm(self.norm_proj, self.conv_proj(inputs))
        x = ops.relu(fused.group_norm(self.norm1, self.conv1(inputs)))
        x = ops.relu(fused.group_norm(self.norm2, self.conv2(x)))
        x = fused.group_norm(self.norm3, self.conv3(x))
        return ops.relu(x + shortcut)

    def compute_output_shape(self, input_shape):
        return self.conv3.compute_output_shape(self.conv2.compute_output_shape(input_shape))

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "filters": self.filters,
                "strides": self.strides,
                "bottleneck_filters": self.bottleneck_filters,
                "use_projection": self.use_projection,
                "num_groups": self.num_groups,
                "std_conv_epsilon": self.std_conv_epsilon,
                "group_norm_epsilon": self.group_norm_epsilon,
            }
        )
        return config
