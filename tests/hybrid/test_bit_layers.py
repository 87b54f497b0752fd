"""BiT ResNet layers: contract, and numpy references for StdConv2D and the root's pooling."""

import keras
import numpy as np
import pytest

from keras_vit import layers
from keras_vit.layers.std_conv import same_padding
from tests.helpers import run_layer_contract

CASES = {
    "std_conv_stride2_bias": (
        layers.StdConv2D,
        {"filters": 4, "kernel_size": 7, "strides": 2, "use_bias": True, "epsilon": 1e-5},
        (2, 9, 8, 3),
        (2, 5, 4, 4),
        2,
    ),
    "std_conv_valid": (layers.StdConv2D, {"filters": 2, "kernel_size": 3, "padding": "valid"}, (1, 6, 5, 2),
                       (1, 4, 3, 2), 1),
    "bit_root": (layers.BiTRoot, {"filters": 8, "num_groups": 4}, (2, 16, 12, 3), (2, 4, 3, 8), 3),
    "bit_unit_projection": (
        layers.BiTBottleneckUnit,
        {"filters": 16, "strides": 2, "num_groups": 4},
        (2, 6, 6, 8),
        (2, 3, 3, 16),
        12,
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_layer_contract(case):
    layer_class, kwargs, input_shape, output_shape, num_weights = CASES[case]
    run_layer_contract(layer_class, kwargs, input_shape, output_shape, num_weights)


def test_same_padding_is_tensorflow_rule():
    # TF pads the odd pixel after the input (hand-computed from TF's formula).
    assert same_padding(224, 7, 2) == (2, 3)
    assert same_padding(112, 3, 2) == (0, 1)
    assert same_padding(7, 3, 2) == (1, 1)
    assert same_padding(9, 1, 2) == (0, 0)
    assert same_padding(10, 3, 1) == (1, 1)


def _numpy_std_conv(x, kernel, stride, epsilon):
    """Weight standardisation + TF SAME zero padding + direct convolution in float64."""
    kernel = kernel.astype(np.float64)
    mean = kernel.mean(axis=(0, 1, 2), keepdims=True)
    var = kernel.var(axis=(0, 1, 2), keepdims=True)
    kernel = (kernel - mean) / np.sqrt(var + epsilon)
    kh, kw, _, out = kernel.shape
    _, h, w, _ = x.shape
    out_h, out_w = -(-h // stride), -(-w // stride)
    total_h = max((out_h - 1) * stride + kh - h, 0)
    total_w = max((out_w - 1) * stride + kw - w, 0)
    x = np.pad(x, ((0, 0), (total_h // 2, total_h - total_h // 2), (total_w // 2, total_w - total_w // 2), (0, 0)))
    y = np.zeros((x.shape[0], out_h, out_w, out))
    for i in range(out_h):
        for j in range(out_w):
            patch = x[:, i * stride:i * stride + kh, j * stride:j * stride + kw, :]
            y[:, i, j, :] = np.einsum("bhwc,hwco->bo", patch, kernel)
    return y


@pytest.mark.parametrize("size,kernel_size,stride", [((8, 10), 7, 2), ((7, 9), 3, 2), ((6, 5), 3, 1), ((5, 6), 1, 2)])
def test_std_conv_matches_numpy(size, kernel_size, stride):
    rng = np.random.default_rng(1)
    x = rng.normal(size=(2, *size, 3)).astype("float32")
    conv = layers.StdConv2D(5, kernel_size, strides=stride, epsilon=1e-8)
    conv.build(x.shape)
    kernel = rng.normal(0.3, 2.0, size=conv.kernel.shape).astype("float32")  # non-zero mean, non-unit std
    conv.kernel.assign(kernel)
    expected = _numpy_std_conv(x.astype(np.float64), kernel, stride, 1e-8)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(conv(x)), expected, atol=2e-4)


def test_std_conv_is_invariant_to_kernel_scale_and_shift():
    # The property weight standardisation exists for.
    rng = np.random.default_rng(2)
    x = rng.normal(size=(1, 6, 6, 2)).astype("float32")
    conv = layers.StdConv2D(3, 3, strides=2)
    conv.build(x.shape)
    kernel = rng.normal(size=conv.kernel.shape).astype("float32")
    conv.kernel.assign(kernel)
    first = keras.ops.convert_to_numpy(conv(x))
    conv.kernel.assign(5.0 * kernel + 3.0)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(conv(x)), first, atol=1e-4)


def test_root_matches_numpy():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(2, 10, 12, 3)).astype("float32")
    root = layers.BiTRoot(filters=4, num_groups=2, std_conv_epsilon=1e-8, group_norm_epsilon=1e-5)
    root.build(x.shape)
    kernel = rng.normal(size=root.conv.kernel.shape).astype("float32")
    gamma, beta = rng.normal(1.0, 0.3, size=4).astype("float32"), rng.normal(0, 0.3, size=4).astype("float32")
    root.conv.kernel.assign(kernel)
    root.norm.gamma.assign(gamma)
    root.norm.beta.assign(beta)

    y = _numpy_std_conv(x.astype(np.float64), kernel, 2, 1e-8)  # (2, 5, 6, 4)
    groups = y.reshape(2, 5, 6, 2, 2)
    mean = groups.mean(axis=(1, 2, 4), keepdims=True)
    var = groups.var(axis=(1, 2, 4), keepdims=True)
    y = ((groups - mean) / np.sqrt(var + 1e-5)).reshape(y.shape) * gamma + beta
    y = np.maximum(y, 0)
    # TF SAME max-pool: padded positions never win (pad with -inf).
    pad_h, pad_w = same_padding(5, 3, 2), same_padding(6, 3, 2)
    y = np.pad(y, ((0, 0), pad_h, pad_w, (0, 0)), constant_values=-np.inf)
    expected = np.stack(
        [np.stack([y[:, 2 * i:2 * i + 3, 2 * j:2 * j + 3].max(axis=(1, 2)) for j in range(3)], 1) for i in range(3)], 1
    )
    np.testing.assert_allclose(keras.ops.convert_to_numpy(root(x)), expected, atol=2e-4)


def test_unit_without_projection_adds_its_input():
    unit = layers.BiTBottleneckUnit(8, num_groups=2)
    x = np.random.default_rng(4).uniform(0.5, 1.0, size=(1, 3, 3, 8)).astype("float32")
    unit.build(x.shape)
    assert unit.conv_proj is None
    # With norm3's scale and shift at zero the residual branch is zero, so the unit is relu(x).
    unit.norm3.gamma.assign(np.zeros(8, "float32"))
    unit.norm3.beta.assign(np.zeros(8, "float32"))
    np.testing.assert_allclose(keras.ops.convert_to_numpy(unit(x)), x, atol=1e-6)


def test_bad_arguments_name_the_fix():
    with pytest.raises(ValueError, match="num_groups=32"):
        layers.BiTRoot(filters=8)
    with pytest.raises(ValueError, match="padding"):
        layers.StdConv2D(4, 3, padding="causal")
    with pytest.raises(ValueError, match="kernel_size"):
        layers.StdConv2D(4, 0)
    with pytest.raises(ValueError, match="use_projection=False"):
        unit = layers.BiTBottleneckUnit(16, num_groups=4, use_projection=False)
        unit.build((1, 4, 4, 8))
