"""Resampling of a learned position-embedding table to a new patch grid (numpy only).

Fine-tuning at another resolution keeps the patch size, so the patch grid
changes; the paper 2-D interpolates the embeddings of the grid and keeps the
prefix (class, register) rows as they are. The interpolation here is the one
timm uses (`torch.nn.functional.interpolate(mode="bicubic",
align_corners=False)`, with `antialias=True` by default), written as two
separable weight matrices so it runs without any backend.
"""

import math

import numpy as np


def _cubic(x, a):
    x = abs(x)
    if x < 1.0:
        return ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0
    if x < 2.0:
        return (((x - 5.0) * x + 8.0) * x - 4.0) * a
    return 0.0


def _resize_matrix(in_size, out_size, antialias):
    """(out_size, in_size) matrix that resizes one axis like torch's bicubic."""
    scale = in_size / out_size
    matrix = np.zeros((out_size, in_size), dtype=np.float64)
    for i in range(out_size):
        center = scale * (i + 0.5)
        if antialias:
            # Pillow-style filter (a = -0.5), widened when shrinking so it averages.
            stretch = max(scale, 1.0)
            support = 2.0 * stretch
            lo = max(int(center - support + 0.5), 0)
            hi = min(int(center + support + 0.5), in_size)
            weights = np.array([_cubic((j - center + 0.5) / stretch, -0.5) for j in range(lo, hi)])
            matrix[i, lo:hi] = weights / weights.sum()
        else:
            # Keys cubic convolution (a = -0.75) with the border pixel repeated.
            source = center - 0.5
            base = math.floor(source)
            fraction = source - base
            for k in range(-1, 3):
                index = min(max(base + k, 0), in_size - 1)
                matrix[i, index] += _cubic(fraction - k, -0.75)
    return matrix


def resample_position_embedding(table, num_prefix_tokens, old_grid, new_grid, antialias=True):
    """Resample a `(1, prefix + h*w, D)` position-embedding table to a new grid.

    Args:
        table: array `(1, T, D)` or `(T, D)`. Rows are the prefix tokens first,
            then the patch grid in row-major order.
        num_prefix_tokens: int. Leading rows kept unchanged (0 when the
            table has no prefix rows).
        old_grid: tuple `(h, w)` of the table's patch grid.
        new_grid: tuple `(h', w')` of the target grid.
        antialias: bool. Average when shrinking (timm's default).

    Returns:
        A float32 array `(1, prefix + h'*w', D)` (or `(T', D)` for 2-D input).
    """
    array = np.asarray(table)
    squeeze = array.ndim == 2
    if squeeze:
        array = array[None]
    old_h, old_w = old_grid
    new_h, new_w = new_grid
    if array.shape[1] != num_prefix_tokens + old_h * old_w:
        raise ValueError(
            f"The position-embedding table has {array.shape[1]} rows, but {num_prefix_tokens} prefix "
            f"tokens and a {old_h}x{old_w} grid need {num_prefix_tokens + old_h * old_w}. "
            f"Received: table shape {array.shape}, old_grid={tuple(old_grid)}"
        )
    prefix = array[:, :num_prefix_tokens]
    grid = array[0, num_prefix_tokens:].reshape(old_h, old_w, -1).astype(np.float64)
    if (old_h, old_w) != (new_h, new_w):
        rows = _resize_matrix(old_h, new_h, antialias)
        cols = _resize_matrix(old_w, new_w, antialias)
        grid = np.einsum("ih,hwd,jw->ijd", rows, grid, cols)
    grid = grid.reshape(1, new_h * new_w, -1).astype(np.float32)
    result = np.concatenate([prefix.astype(np.float32), grid], axis=1)
    return result[0] if squeeze else result
