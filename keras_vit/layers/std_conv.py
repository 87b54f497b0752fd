"""Weight-standardised 2-D convolution with TensorFlow-style SAME padding."""

import math

import keras
from keras import ops

from keras_vit.layers import fused
from keras_vit.utils.values import check_choice, check_count, check_number, to_pair


def same_padding(size, kernel_size, stride, dilation=1):
    """TensorFlow's SAME padding of one spatial axis as `(before, after)`.

    TF pads so that the output has `ceil(size / stride)` positions and puts
    the odd pixel, if any, after the input. PyTorch's symmetric padding puts
    it on both sides, which shifts every stride-2 window by one pixel and is
    why converted BiT/hybrid weights need this exact rule.

    Args:
        size: int. Input length along the axis.
        kernel_size: int. Kernel length along the axis.
        stride: int. Stride along the axis.
        dilation: int. Dilation along the axis. Defaults to `1`.

    Returns:
        A tuple `(before, after)` of non-negative ints.
    """
    total = max((math.ceil(size / stride) - 1) * stride + (kernel_size - 1) * dilation + 1 - size, 0)
    return total // 2, total - total // 2


@keras.saving.register_keras_serializable(package="keras_vit")
class StdConv2D(keras.layers.Layer):
    """2-D convolution whose kernel is standardised before every use.

    Weight Standardisation (Qiao et al., 2019) normalises each output
    channel's kernel to zero mean and unit variance over its
    `(height, width, in_channels)` entries: `w' = (w - mean) /
    sqrt(var + epsilon)`. Paired with GroupNorm it replaces BatchNorm in the
    BiT ResNets that the hybrid ViTs use as their stem. The standardisation
    runs in float32 also under mixed precision because the variance of a
    small kernel underflows in half precision.

    `padding="same"` is TensorFlow's rule on every backend: the padding is
    computed from the static input size and applied explicitly, so a
    stride-2 convolution pads one pixel less on the top/left than on the
    bottom/right, as the original JAX code and timm's `StdConv2dSame` do.

    Inputs are channels-last whatever `keras.config.image_data_format()`
    says: the layer's kernel and its saved weights have one layout.

    Args:
        filters: int. Output channels.
        kernel_size: int or tuple of two ints. Kernel height and width.
        strides: int or tuple of two ints. Defaults to `1`.
        padding: str. `"same"` (TensorFlow-style, possibly asymmetric) or
            `"valid"`. Defaults to `"same"`.
        use_bias: bool. Add a bias after the convolution. Defaults to
            `False`, as in BiT.
        epsilon: float. Added to the kernel variance. Defaults to `1e-8`
            (timm's `StdConv2dSame` in the hybrid ViTs).
        kernel_initializer: Initializer of the kernel. Defaults to
            He-uniform over the fan-out (timm draws He-normal; after
            standardisation only the kernel's direction matters, and the
            uniform draw compiles much faster on JAX).
        **kwargs: Base layer keyword arguments, such as `name` and `dtype`.

    Call arguments:
        inputs: A tensor of shape `(batch, height, width, channels)`.

    Returns:
        A tensor of shape `(batch, out_height, out_width, filters)`.

    Example:

    >>> conv = keras_vit.layers.StdConv2D(64, 7, strides=2)
    >>> conv(np.zeros((1, 224, 224, 3))).shape
    (1, 112, 112, 64)
    """

    def __init__(
        self,
        filters,
        kernel_size,
        strides=1,
        padding="same",
        use_bias=False,
        epsilon=1e-8,
        kernel_initializer=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        check_count(filters, "filters")
        check_choice(padding, ("same", "valid"), "padding")
        check_number(epsilon, "epsilon", minimum=0)
        self.filters = int(filters)
        self.kernel_size = to_pair(kernel_size, "kernel_size")
        self.strides = to_pair(strides, "strides")
        self.padding = padding
        self.use_bias = use_bias
        self.epsilon = float(epsilon)
        if kernel_initializer is None:
            kernel_initializer = keras.initializers.VarianceScaling(2.0, mode="fan_out", distribution="uniform")
        self.kernel_initializer = keras.initializers.get(kernel_initializer)

    def build(self, input_shape):
        if len(input_shape) != 4 or input_shape[-1] is None:
            raise ValueError(
                f"Layer '{self.name}' expects inputs shaped (batch, height, width, channels) with a known "
                f"channel count. Received: input_shape={tuple(input_shape)}"
            )
        self.kernel = self.add_weight(
            name="kernel",
            shape=self.kernel_size + (input_shape[-1], self.filters),
            initializer=self.kernel_initializer,
        )
        self.bias = self.add_weight(name="bias", shape=(self.filters,), initializer="zeros") if self.use_bias else None
        self.built = True

    def standardized_kernel(self):
        """The kernel after standardisation, in float32, shape `(kh, kw, in, out)`."""
        kernel = ops.cast(self.kernel, "float32")
        mean = ops.mean(kernel, axis=(0, 1, 2), keepdims=True)
        # Biased variance, as torch's batch_norm in training mode (timm) uses.
        variance = ops.mean(ops.square(kernel - mean), axis=(0, 1, 2), keepdims=True)
        return (kernel - mean) * ops.rsqrt(variance + self.epsilon)

    def _paddings(self, height, width):
        return (
            same_padding(height, self.kernel_size[0], self.strides[0]),
            same_padding(width, self.kernel_size[1], self.strides[1]),
        )

    def call(self, inputs):
        kernel = ops.cast(self.standardized_kernel(), self.compute_dtype)
        _, height, width, _ = inputs.shape
        if self.padding == "same" and (height is None or width is None):
            # Without a static size the padding cannot be computed here; the
            # backend's own SAME rule is TF's on TF/JAX and close to it on torch.
            # The layout is stated: the default follows the global image_data_format.
            outputs = ops.conv(inputs, kernel, strides=self.strides, padding="same", data_format="channels_last")
        else:
            if self.padding == "same":
                pad_h, pad_w = self._paddings(height, width)
                if pad_h != (0, 0) or pad_w != (0, 0):
                    # (B, H + pad_h, W + pad_w, C): explicit, possibly asymmetric, zero padding.
                    inputs = ops.pad(inputs, ((0, 0), pad_h, pad_w, (0, 0)))
            # ops.conv(..., padding="valid", data_format="channels_last"), without Keras' layout copies on torch.
            outputs = fused.conv2d(inputs, kernel, self.strides)
        if self.bias is not None:
            outputs = outputs + ops.cast(self.bias, outputs.dtype)
        return outputs

    def compute_output_shape(self, input_shape):
        batch, height, width, _ = input_shape
        sizes = []
        for size, kernel, stride in zip((height, width), self.kernel_size, self.strides):
            if size is None:
                sizes.append(None)
            elif self.padding == "same":
                sizes.append(math.ceil(size / stride))
            else:
                sizes.append((size - kernel) // stride + 1)
        return (batch, sizes[0], sizes[1], self.filters)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "filters": self.filters,
                "kernel_size": self.kernel_size,
                "strides": self.strides,
                "padding": self.padding,
                "use_bias": self.use_bias,
                "epsilon": self.epsilon,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
            }
        )
        return config
