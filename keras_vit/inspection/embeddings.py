"""Figure 7 (left and centre) of the ViT paper: what the embeddings learned.

- `patch_embedding_components`: principal components of the linear patch
  embedding's filters, shown as small images.
- `position_embedding_similarity`: cosine similarity between the position
  embedding of each patch and those of all the others.
"""

import dataclasses

import keras
import numpy as np

from keras_vit.inspection.attention import backbone_of
from keras_vit.layers.patch_encoder import sincos_2d_position_embedding


@dataclasses.dataclass(frozen=True)
class PrincipalComponents:
    """Principal components of the patch-embedding filters.

    Attributes:
        components: float64 array `(k, patch_height, patch_width, channels)`,
            unit-norm components, strongest first. For a hybrid the
            channels are the CNN feature map's, not colours.
        explained_variance_ratio: float64 array `(k,)`: the share of the
            filters' variance along each component.
        on_pixels: bool. Whether the filters act on image pixels (`False`
            for hybrids, whose patches are cut from a feature map).
    """

    components: np.ndarray
    explained_variance_ratio: np.ndarray
    on_pixels: bool


def principal_components(filters, num_components=None):
    """PCA of a set of filters (rows of `filters`), by SVD of the centred rows.

    Each component's sign is chosen so that its largest-magnitude entry is
    positive (PCA leaves the sign arbitrary; this makes it reproducible).

    Args:
        filters: array `(num_filters, features)`.
        num_components: int or `None`. How many to keep; `None` keeps all
            `min(num_filters, features)`. Defaults to `None`.

    Returns:
        `(components, explained_variance_ratio)`: float64 arrays
        `(k, features)` and `(k,)`.
    """
    filters = np.asarray(filters, dtype="float64")
    centred = filters - filters.mean(axis=0, keepdims=True)
    _, singular_values, vt = np.linalg.svd(centred, full_matrices=False)
    limit = min(filters.shape)
    k = limit if num_components is None else num_components
    if not isinstance(k, (int, np.integer)) or not 1 <= k <= limit:
        raise ValueError(
            f"`num_components` must be between 1 and {limit} ({filters.shape[0]} filters of "
            f"{filters.shape[1]} features). Received: num_components={num_components!r}"
        )
    variance = singular_values**2
    ratio = variance / max(variance.sum(), np.finfo("float64").tiny)
    components = vt[:k]
    signs = np.sign(components[np.arange(k), np.abs(components).argmax(axis=1)])
    return components * signs[:, None], ratio[:k]


def patch_embedding_components(model, num_components=28):
    """Principal components of the patch embedding's filters (Figure 7, left).

    The patch embedding `E` (the `projection` of the backbone's
    `patch_encoder`) maps each flattened `P x P x C` patch to `D` features;
    its `D` columns are `D` filters of shape `(P, P, C)`. Their first
    principal components show which spatial patterns the model's first
    layer picks out (the paper shows the first 28 for ViT-L/32). The
    filters act on the preprocessed pixels (after the model's mean/std).

    Args:
        model: a `ViTBackbone`, `ViTClassifier` or `MaskedPatchPredictor`.
        num_components: int. How many components, at most
            `min(D, P * P * C)`; larger values are cut to that. Defaults to
            `28`, as in the paper.

    Returns:
        A `PrincipalComponents`.
    """
    backbone = backbone_of(model)
    encoder = backbone.get_layer("patch_encoder")
    kernel = keras.ops.convert_to_numpy(encoder.projection.kernel)  # (P * P * C, D)
    patches_in = backbone.get_layer("patches").input.shape  # (B, h, w, C) of image or feature map
    patch_height, patch_width = backbone.patch_size
    channels = patches_in[-1]
    if not isinstance(num_components, (int, np.integer)) or num_components < 1:
        raise ValueError(f"`num_components` must be a positive int. Received: num_components={num_components!r}")
    components, ratio = principal_components(kernel.T, min(num_components, min(kernel.shape)))
    return PrincipalComponents(
        components=components.reshape(-1, patch_height, patch_width, channels),
        explained_variance_ratio=ratio,
        on_pixels=backbone.stem is None,
    )


def position_embedding_table(model):
    """The position embedding of the patch tokens: float64 `(rows * cols, D)`, row-major.

    Rows of the class and register tokens (when the table has them) are
    left out: they have no place in the grid.

    Args:
        model: a `ViTBackbone`, `ViTClassifier` or `MaskedPatchPredictor`.

    Returns:
        A float64 array.
    """
    backbone = backbone_of(model)
    encoder = backbone.get_layer("patch_encoder")
    if encoder.position_embedding == "none":
        raise ValueError(
            "This model has no position embedding (position_embedding='none'), so there is nothing to compare."
        )
    if encoder.position_embedding == "sincos2d":
        return sincos_2d_position_embedding(encoder.grid_size, encoder.hidden_dim).astype("float64")
    table = keras.ops.convert_to_numpy(encoder.position_embedding_table)[0].astype("float64")
    if encoder.prefix_position_embedding:
        table = table[encoder.num_prefix_tokens :]
    return table


def cosine_similarity_grid(table, grid_size):
    """Cosine similarity of every row of `table` with every other, on the grid.

    Args:
        table: array `(rows * cols, D)`, one embedding per patch, row-major.
        grid_size: tuple `(rows, cols)`.

    Returns:
        A float64 array `(rows, cols, rows, cols)`: `[r, c]` is the map of
        the patch at `(r, c)`'s similarity to every patch.
    """
    table = np.asarray(table, dtype="float64")
    rows, cols = grid_size
    if table.ndim != 2 or table.shape[0] != rows * cols:
        raise ValueError(
            f"A {rows}x{cols} grid needs a table of {rows * cols} rows. Received: a table of shape {table.shape}."
        )
    unit = table / np.maximum(np.linalg.norm(table, axis=-1, keepdims=True), np.finfo("float64").tiny)
    return (unit @ unit.T).reshape(rows, cols, rows, cols)


def position_embedding_similarity(model):
    """Cosine similarity between position embeddings (Figure 7, centre).

    For each patch position, its position embedding's cosine similarity to
    the embedding of every other patch. A model that learned the 2-D layout
    shows, for each position, a bright spot at itself fading with distance,
    often with its row and column lit up.

    Args:
        model: a `ViTBackbone`, `ViTClassifier` or `MaskedPatchPredictor`.

    Returns:
        A float64 array `(rows, cols, rows, cols)`; `[r, c]` is the map of
        the patch at `(r, c)`.
    """
    backbone = backbone_of(model)
    return cosine_similarity_grid(position_embedding_table(backbone), backbone.grid_size)
