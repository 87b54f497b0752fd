"""Position-embedding resampling to another patch grid, in numpy.

The interpolation reproduces `torch.nn.functional.interpolate` with
`align_corners=False` (what timm's `resample_abs_pos_embed` and Hugging
Face's `interpolate_pos_encoding` call), so a converted model resampled here
matches its source resampled there. It runs once, in float64 numpy, and the
result is cast to float32, so every Keras backend receives the same table.
"""

import numpy as np

from keras_vit.utils.values import to_pair

INTERPOLATIONS = ("bicubic", "bilinear")


def _cubic(x, a):
    # Keys' cubic convolution kernel; PyTorch uses a=-0.75 for plain bicubic
    # and a=-0.5 (as PIL does) for the antialiased variant.
    x = np.abs(x)
    near = ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0
    far = ((a * x - 5.0 * a) * x + 8.0 * a) * x - 4.0 * a
    return np.where(x < 1.0, near, np.where(x < 2.0, far, 0.0))


def _triangle(x):
    return np.maximum(0.0, 1.0 - np.abs(x))


def _antialiased_weights(in_size, out_size, interpolation):
    """(out, in) matrix of PyTorch's separable antialiased resize (PIL-style)."""
    scale = in_size / out_size
    interp_size = 4 if interpolation == "bicubic" else 2
    # Downsampling stretches the filter over `scale` input pixels.
    support = interp_size * 0.5 * scale if scale >= 1.0 else interp_size * 0.5
    inverse_scale = 1.0 / scale if scale >= 1.0 else 1.0
    weights = np.zeros((out_size, in_size))
    for i in range(out_size):
        center = scale * (i + 0.5)
        lo = max(int(center - support + 0.5), 0)
        hi = min(int(center + support + 0.5), in_size)
        taps = (np.arange(lo, hi) - center + 0.5) * inverse_scale
        w = _cubic(taps, -0.5) if interpolation == "bicubic" else _triangle(taps)
        total = w.sum()
        weights[i, lo:hi] = w / total if total != 0 else w
    return weights


def _plain_weights(in_size, out_size, interpolation):
    """(out, in) matrix of PyTorch's non-antialiased bicubic / bilinear."""
    scale = in_size / out_size
    weights = np.zeros((out_size, in_size))
    for i in range(out_size):
        source = scale * (i + 0.5) - 0.5
        if interpolation == "bicubic":
            base = int(np.floor(source))
            t = source - base
            coefficients = _cubic(np.array([t + 1.0, t, 1.0 - t, 2.0 - t]), -0.75)
            for offset, c in zip(range(-1, 3), coefficients):
                # Border pixels are repeated outside the grid.
                weights[i, min(max(base + offset, 0), in_size - 1)] += c
        else:
            source = max(source, 0.0)
            base = int(source)
            t = source - base
            weights[i, base] += 1.0 - t
            weights[i, min(base + 1, in_size - 1)] += t
    return weights


def interpolation_matrix(in_size, out_size, interpolation="bicubic", antialias=True):
    """The (out_size, in_size) matrix of a 1-D resize with `align_corners=False`."""
    if antialias:
        return _antialiased_weights(in_size, out_size, interpolation)
    return _plain_weights(in_size, out_size, interpolation)


def resample_position_embedding(
    table, num_prefix_tokens, old_grid, new_grid, interpolation="bicubic", antialias=True
):
    """Resample a learned position-embedding table to another patch grid.

    The first `num_prefix_tokens` rows (class and register tokens) are kept
    as they are; the remaining rows are read as an `old_grid` image with `D`
    channels (row-major), resized to `new_grid` in 2-D, and flattened back.
    The result equals timm's `resample_abs_pos_embed` (bicubic, antialias by
    default), and Hugging Face's `interpolate_pos_encoding` with
    `antialias=False`.

    Args:
        table: array of shape `(1, T, D)` or `(T, D)`, with
            `T = num_prefix_tokens + old_grid[0] * old_grid[1]`.
        num_prefix_tokens: int. Leading rows that are not on the grid (0 for
            tables without class-token rows, as timm's `no_embed_class`).
        old_grid: int or `(rows, cols)`. The table's patch grid.
        new_grid: int or `(rows, cols)`. The target patch grid.
        interpolation: str. `"bicubic"` or `"bilinear"`. Defaults to
            `"bicubic"`.
        antialias: bool. Low-pass filter when shrinking, as
            `torch.nn.functional.interpolate(antialias=True)`. Defaults to
            `True` (timm's choice for state dicts).

    Returns:
        A float32 array shaped like `table` but with
        `num_prefix_tokens + new_grid[0] * new_grid[1]` rows. When the grids
        are equal the values are returned unchanged.
    """
    if interpolation not in INTERPOLATIONS:
        raise ValueError(
            f"Unknown `interpolation`. Use one of {INTERPOLATIONS}. Received: interpolation={interpolation!r}"
        )
    old_grid = to_pair(old_grid, "old_grid")
    new_grid = to_pair(new_grid, "new_grid")
    table = np.asarray(table)
    squeeze = table.ndim == 2
    if squeeze:
        table = table[None]
    if table.ndim != 3 or table.shape[0] != 1:
        raise ValueError(
            "The position embedding must be shaped (1, tokens, dim) or (tokens, dim). "
            f"Received: shape={np.shape(table)}"
        )
    expected = num_prefix_tokens + old_grid[0] * old_grid[1]
    if table.shape[1] != expected:
        raise ValueError(
            f"The position embedding has {table.shape[1]} rows, but {num_prefix_tokens} prefix "
            f"tokens and a {old_grid[0]}x{old_grid[1]} grid need {expected}. Check `old_grid` and "
            f"`num_prefix_tokens`. Received: shape={table.shape}, old_grid={old_grid}, "
            f"num_prefix_tokens={num_prefix_tokens}"
        )
    if old_grid == new_grid:
        result = table.astype(np.float32)
    else:
        dim = table.shape[-1]
        prefix = table[:, :num_prefix_tokens]
        grid = table[0, num_prefix_tokens:].astype(np.float64).reshape(old_grid[0], old_grid[1], dim)
        rows = interpolation_matrix(old_grid[0], new_grid[0], interpolation, antialias)  # (R', R)
        cols = interpolation_matrix(old_grid[1], new_grid[1], interpolation, antialias)  # (C', C)
        resized = np.einsum("ir,rcd,jc->ijd", rows, grid, cols)  # (R', C', D)
        resized = resized.reshape(1, new_grid[0] * new_grid[1], dim)
        result = np.concatenate([prefix.astype(np.float64), resized], axis=1).astype(np.float32)
    return result[0] if squeeze else result
