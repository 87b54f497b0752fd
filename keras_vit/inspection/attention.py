"""Attention maps, attention rollout and mean attention distance, as numpy arrays.

The attention probabilities come from the backbone's explicit attention path
(`ViTBackbone.feature_extractor(attention_scores=True)`), so they are the
same on TensorFlow, JAX and PyTorch; everything after that is numpy, written
from the definitions in the ViT paper (section 4.5, appendices D.7-D.8) and
Abnar & Zuidema (2020), "Quantifying Attention Flow in Transformers".
"""

import dataclasses
import weakref

import keras
import numpy as np

from keras_vit.models.encoder import resolve_block_indices
from keras_vit.models.vit_backbone import ViTBackbone
from keras_vit.utils import to_pair

HEAD_FUSIONS = ("mean", "max", "min")
UPSAMPLING = ("bilinear", "nearest")


def backbone_of(model):
    """The `ViTBackbone` of a backbone, classifier or masked patch predictor.

    Args:
        model: a `ViTBackbone`, or a model with a `backbone` attribute that
            is one (`ViTClassifier`, `MaskedPatchPredictor`).

    Returns:
        The `ViTBackbone`.
    """
    if isinstance(model, ViTBackbone):
        return model
    backbone = getattr(model, "backbone", None)
    if isinstance(backbone, ViTBackbone):
        return backbone
    raise ValueError(
        "Inspection needs a keras_vit ViTBackbone, or a model that holds one as `.backbone` "
        f"(ViTClassifier, MaskedPatchPredictor). Received: a {type(model).__name__}."
    )


@dataclasses.dataclass(frozen=True)
class AttentionMaps:
    """Attention probabilities of some blocks for a batch of images.

    Tokens are ordered as in the backbone: `num_prefix_tokens` prefix tokens
    (the class token first, then register tokens), then one token per cell
    of the `grid_size` patch grid in row-major order. For a hybrid a cell is
    a cell of the CNN's feature map, so `token_size` (input pixels per
    token) is the stem's stride times the patch size.

    Attributes:
        scores: float32 array `(num_blocks, batch, heads, tokens, tokens)`;
            `scores[l, b, h, q, k]` is how much query token `q` attends to
            key token `k` in head `h` of block `blocks[l]` (rows sum to 1).
        blocks: tuple of ints. The block index of each entry of `scores`.
        grid_size: tuple `(rows, cols)` of the patch grid.
        num_prefix_tokens: int. Class and register tokens before the patches.
        use_class_token: bool. Whether token 0 is a class token.
        image_size: tuple `(height, width)` of the input images in pixels.
        probe: float32 array `(batch, heads, patches)` or `None`. For a
            backbone with an attention-pooling (MAP) head (SigLIP), the
            probe's attention over the patch tokens of the backbone's
            output: the weights that make the pooled feature. `None` for
            other backbones.
    """

    scores: np.ndarray
    blocks: tuple
    grid_size: tuple
    num_prefix_tokens: int
    use_class_token: bool
    image_size: tuple
    probe: np.ndarray = None

    @property
    def token_size(self):
        """`(height, width)` in input pixels covered by one patch token."""
        return (self.image_size[0] / self.grid_size[0], self.image_size[1] / self.grid_size[1])

    def _grid(self, values):
        return values.reshape(values.shape[:-1] + tuple(self.grid_size))

    @property
    def class_token(self):
        """Attention of the class token to every patch: `(blocks, batch, heads, rows, cols)`.

        The share it gives to prefix tokens (itself, registers) is left out,
        so a map sums to `1 - prefix share`.
        """
        if not self.use_class_token:
            raise ValueError(
                "This model has no class token (it pools the patch tokens), so there is no class-token "
                "attention map. Use `maps.mean_patch_query` or `maps.query(row, col)` instead."
            )
        return self._grid(self.scores[..., 0, self.num_prefix_tokens :])

    @property
    def probe_map(self):
        """The attention-pooling probe's attention to every patch: `(batch, heads, rows, cols)`.

        What the pooled feature of a model without a class token (SigLIP)
        is made of: after the last block, one learned probe attends to the
        patch tokens and their weighted sum is the embedding.
        """
        if self.probe is None:
            raise ValueError(
                "This model has no attention-pooling head (attention_pooling=False), so there is no probe. Use "
                "`maps.class_token` (with a class token) or `maps.mean_patch_query`."
            )
        return self._grid(np.asarray(self.probe))

    @property
    def mean_patch_query(self):
        """Attention to every patch averaged over the patch queries: `(blocks, batch, heads, rows, cols)`.

        What the mean of the patch tokens (GAP pooling) attends to.
        """
        return self._grid(self.scores[..., self.num_prefix_tokens :, self.num_prefix_tokens :].mean(-2))

    def query(self, row, col):
        """Attention of the patch at `(row, col)` to every patch: `(blocks, batch, heads, rows, cols)`."""
        rows, cols = self.grid_size
        if not (0 <= row < rows and 0 <= col < cols):
            raise ValueError(f"The patch grid is {rows}x{cols}. Received: row={row}, col={col}")
        return self._grid(self.scores[..., self.num_prefix_tokens + row * cols + col, self.num_prefix_tokens :])

    @property
    def patches(self):
        """Patch-to-patch attention: `(blocks, batch, heads, rows, cols, rows, cols)`.

        `patches[..., qr, qc, kr, kc]` is the attention of the patch at
        `(qr, qc)` to the patch at `(kr, kc)`.
        """
        grid = tuple(self.grid_size)
        block = self.scores[..., self.num_prefix_tokens :, self.num_prefix_tokens :]
        return block.reshape(block.shape[:-2] + grid + grid)

    @property
    def prefix_share(self):
        """Attention each token gives to the prefix tokens: `(blocks, batch, heads, tokens)`."""
        return self.scores[..., : self.num_prefix_tokens].sum(-1)

    def block(self, index):
        """Scores of block `index`: `(batch, heads, tokens, tokens)`.

        `index` is a block number from `blocks`; negatives count from the
        last extracted block (`-1` is `blocks[-1]`).
        """
        if -len(self.blocks) <= index < 0:
            index = self.blocks[index]
        if index not in self.blocks:
            raise ValueError(f"Block {index} was not extracted; these were: {list(self.blocks)}.")
        return self.scores[self.blocks.index(index)]


# Extractors are functional models; building one per call would re-trace the
# graph (and recompile on JAX), so keep one per backbone and block list.
_EXTRACTORS = weakref.WeakKeyDictionary()


def _extractor(backbone, blocks):
    cache = _EXTRACTORS.setdefault(backbone, {})
    if blocks not in cache:
        cache[blocks] = backbone.feature_extractor(blocks=list(blocks), attention_scores=True)
    return cache[blocks]


def attention_maps(model, images, blocks=None, batch_size=8):
    """Attention probabilities of a backbone's blocks for a batch of images.

    Works on every backend: the probabilities come from the explicit
    attention path of the backbone's feature extractor and are returned as
    numpy arrays.

    Args:
        model: a `ViTBackbone`, `ViTClassifier` or `MaskedPatchPredictor`.
        images: array `(batch, height, width, channels)` of raw pixels, as the
            model takes them (its preprocessing is part of the model), or
            one image `(height, width, channels)`.
        blocks: int, list of ints or `None`. Blocks to extract (negatives
            count from the last); `None` extracts all. Defaults to `None`.
        batch_size: int. Images per forward pass. Defaults to `8`.

    Returns:
        An `AttentionMaps`.

    Example:

    >>> maps = keras_vit.inspection.attention_maps(model, images)
    >>> maps.class_token.shape  # (blocks, batch, heads, rows, cols)
    (12, 2, 12, 14, 14)
    """
    backbone = backbone_of(model)
    images = np.asarray(images, dtype="float32")
    expected = tuple(backbone.input_shape[1:])
    if images.ndim == 3:  # one image
        images = images[None]
    if images.ndim != 4 or images.shape[1:] != expected:
        raise ValueError(
            f"The model takes images shaped (batch, {', '.join(map(str, expected))}). Received: images of shape "
            f"{images.shape}. Resize the images to the model's input size (or pass one image as images[None])."
        )
    indices = tuple(resolve_block_indices(blocks, backbone.num_layers))
    extractor = _extractor(backbone, indices)
    outputs, probes = [], []
    for start in range(0, len(images), batch_size):
        result = extractor.predict_on_batch(images[start : start + batch_size])
        outputs.append(np.stack([np.asarray(result[f"attention_{i}"], dtype="float32") for i in indices]))
        if backbone.attention_pooling:  # the MAP probe's attention over the output's patch tokens
            _, probe = backbone.pool(result["output"], return_attention_scores=True)
            probes.append(np.asarray(keras.ops.convert_to_numpy(probe), dtype="float32"))  # (B, H, N)
    scores = np.concatenate(outputs, axis=1)  # (L, B, H, T, T)
    return AttentionMaps(
        scores=scores,
        blocks=indices,
        grid_size=tuple(backbone.grid_size),
        num_prefix_tokens=int(backbone.num_prefix_tokens),
        use_class_token=bool(backbone.use_class_token),
        image_size=tuple(backbone.image_size),
        probe=np.concatenate(probes) if probes else None,
    )


# === Attention rollout ===


def fuse_heads(scores, head_fusion="mean"):
    """Combine the heads of `(..., heads, tokens, tokens)` scores into `(..., tokens, tokens)`."""
    if head_fusion not in HEAD_FUSIONS:
        raise ValueError(f"`head_fusion` must be one of {HEAD_FUSIONS}. Received: head_fusion={head_fusion!r}")
    return getattr(np, head_fusion)(scores, axis=-3)


def rollout(scores, head_fusion="mean"):
    """Attention rollout through consecutive blocks (Abnar & Zuidema, 2020).

    For each block the heads are fused (averaged, as in the ViT paper's
    appendix D.8), the identity is added for the residual connection and
    the rows are re-normalised; the per-block matrices are then multiplied
    from the first block to the last: `R = Â_L ... Â_2 Â_1`.

    Args:
        scores: array `(blocks, batch, heads, tokens, tokens)`, or a list of
            `(batch, heads, tokens, tokens)` arrays, first block first.
        head_fusion: str. `"mean"` (the paper's), `"max"` or `"min"`.
            Defaults to `"mean"`.

    Returns:
        A float64 array `(batch, tokens, tokens)` whose rows sum to 1:
        `R[b, q, k]` is how much of input token `k` flows into output
        token `q`.
    """
    result = None
    for block in scores:
        fused = fuse_heads(np.asarray(block, dtype="float64"), head_fusion)  # (B, T, T)
        fused = fused + np.eye(fused.shape[-1])
        fused = fused / fused.sum(-1, keepdims=True)
        result = fused if result is None else fused @ result
    if result is None:
        raise ValueError("Attention rollout needs the scores of at least one block.")
    return result


def upsample(maps, size, method="bilinear"):
    """Resize `(..., rows, cols)` maps to `(..., height, width)`.

    Cell centres sit at `(i + 0.5) * height / rows` (the half-pixel
    convention of image resizing), and values beyond the outer centres are
    held constant, so each patch's value lands on the pixels it covers.

    Args:
        maps: array `(..., rows, cols)`.
        size: int or `(height, width)`.
        method: str. `"bilinear"` or `"nearest"` (blocks of constant value).
            Defaults to `"bilinear"`.

    Returns:
        A float64 array `(..., height, width)`.
    """
    if method not in UPSAMPLING:
        raise ValueError(f"`method` must be one of {UPSAMPLING}. Received: method={method!r}")
    height, width = to_pair(size, "size")
    maps = np.asarray(maps, dtype="float64")
    rows, cols = maps.shape[-2:]
    along_rows = _interpolation_matrix(rows, height, method)  # (height, rows)
    along_cols = _interpolation_matrix(cols, width, method)  # (width, cols)
    return np.einsum("hr,...rc,wc->...hw", along_rows, maps, along_cols)


def _interpolation_matrix(source, target, method):
    positions = (np.arange(target) + 0.5) * source / target - 0.5  # output centres in source cells
    matrix = np.zeros((target, source))
    if method == "nearest":
        matrix[np.arange(target), np.clip(np.floor(positions + 0.5), 0, source - 1).astype(int)] = 1.0
        return matrix
    positions = np.clip(positions, 0, source - 1)
    low = np.floor(positions).astype(int)
    high = np.minimum(low + 1, source - 1)
    weight = positions - low
    np.add.at(matrix, (np.arange(target), low), 1.0 - weight)
    np.add.at(matrix, (np.arange(target), high), weight)
    return matrix


@dataclasses.dataclass(frozen=True)
class Rollout:
    """Attention rollout of a batch of images.

    Attributes:
        matrix: float64 array `(batch, tokens, tokens)`, the rolled-out
            attention (rows sum to 1).
        grid: float64 array `(batch, rows, cols)`: the rollout row of the
            query token (see `query`) over the patch tokens.
        image: float64 array `(batch, height, width)`: `grid` upsampled to
            the input images.
        query: str. `"probe"` (the attention-pooling probe's weights times
            the patches' rows: the pooled feature of a model such as SigLIP),
            `"class"` (the class token's row) or `"mean"` (the mean of the
            patch tokens' rows, for models that pool them).
    """

    matrix: np.ndarray
    grid: np.ndarray
    image: np.ndarray
    query: str


def attention_rollout(maps, head_fusion="mean", query=None, upsampling="bilinear"):
    """Attention rollout of `AttentionMaps`, as a map over each image.

    The blocks in `maps` must be `0, 1, ..., k` (all of them for the whole
    network, as the paper's Figure 6 uses; fewer for the rollout up to
    block `k`).

    The map shown for an image is one row of the rollout matrix restricted
    to the patch tokens: for a model with an attention-pooling head
    (SigLIP) the probe's attention over the output patches (heads fused)
    times the rollout, which is the rollout of the pooled feature; else the
    class token's row for models with one (what the classifier reads), and
    for models that pool the patch tokens (GAP, no class token) the mean of
    the patch tokens' rows, which is the rollout of the pooled vector
    because pooling is that same average.

    Args:
        maps: `AttentionMaps` from `attention_maps`.
        head_fusion: str. `"mean"` (the paper's), `"max"` or `"min"`.
            Defaults to `"mean"`.
        query: str or `None`. `"probe"`, `"class"` or `"mean"`; `None`
            picks `"probe"` when the model has an attention-pooling head,
            else `"class"` when it has a class token, else `"mean"`.
            Defaults to `None`.
        upsampling: str. `"bilinear"` or `"nearest"`. Defaults to
            `"bilinear"`.

    Returns:
        A `Rollout`.
    """
    if tuple(maps.blocks) != tuple(range(len(maps.blocks))):
        raise ValueError(
            "Attention rollout multiplies through consecutive blocks from the first, so `maps` must hold "
            f"blocks 0..k. Received blocks {list(maps.blocks)}; extract them with `attention_maps(model, images)` "
            "(all blocks) or `blocks=list(range(k + 1))`."
        )
    if query is None:
        query = default_query(maps)
    if query not in ROLLOUT_QUERIES:
        raise ValueError(f"`query` must be one of {ROLLOUT_QUERIES} or None. Received: query={query!r}")
    if query == "class" and not maps.use_class_token:
        raise ValueError("This model has no class token; use query='mean' (the mean of the patch tokens).")
    if query == "probe" and maps.probe is None:
        raise ValueError("This model has no attention-pooling head; use query='class' or 'mean'.")
    matrix = rollout(maps.scores, head_fusion)
    prefix = maps.num_prefix_tokens
    if query == "class":
        row = matrix[:, 0, prefix:]
    elif query == "probe":
        # The pooled feature is the probe's weighted sum of the output patches (the MAP head has no residual
        # from the tokens), so its rollout is the probe's fused weights times the patches' rollout rows.
        probe = fuse_heads(np.asarray(maps.probe, dtype="float64")[..., None, :], head_fusion)[:, 0]  # (B, N)
        probe = probe / probe.sum(-1, keepdims=True)
        row = np.einsum("bq,bqk->bk", probe, matrix[:, prefix:, prefix:])
    else:
        row = matrix[:, prefix:, prefix:].mean(axis=1)
    grid = row.reshape((len(row),) + tuple(maps.grid_size))
    return Rollout(matrix=matrix, grid=grid, image=upsample(grid, maps.image_size, upsampling), query=query)


# The rollout's query tokens, and what each shows (printed by `keras-vit explain`).
ROLLOUT_QUERIES = ("probe", "class", "mean")
QUERY_DESCRIPTIONS = {
    "probe": "the attention-pooling probe (the model has no class token: its pooled feature is the probe's "
             "weighted sum of the output patches), rolled out through the blocks",
    "class": "the class token (what the head reads), rolled out through the blocks",
    "mean": "the mean of the patch tokens (the model pools them), rolled out through the blocks",
}


def default_query(maps):
    """The token whose rollout shows what makes the model's feature: the probe, the class token or the mean."""
    if maps.probe is not None:
        return "probe"
    return "class" if maps.use_class_token else "mean"


# === Mean attention distance ===


def token_centres(grid_size, token_size=(1.0, 1.0)):
    """Pixel coordinates `(rows * cols, 2)` of the centres of a patch grid, row-major."""
    rows, cols = grid_size
    row, col = np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij")
    return np.stack([(row.ravel() + 0.5) * token_size[0], (col.ravel() + 0.5) * token_size[1]], axis=-1)


def attention_distance(scores, grid_size, token_size=(1.0, 1.0), num_prefix_tokens=0, renormalize=True):
    """Attention-weighted distance of each query patch to the key patches.

    The paper's "attention distance" (section 4.5, Figure 7 right): for a
    query patch, the distance in pixels to every key patch weighted by the
    attention it gives that patch. Distances are between patch centres.

    Prefix tokens (class, registers) have no place in the image: they are
    left out as queries, and as keys their share of the attention is left
    out too. With `renormalize=True` the remaining weights are rescaled to
    sum to 1, so the result is the expected distance of the image
    information a query gathers, whatever share it gives to prefix tokens;
    with `False` the prefix share counts as distance 0 (what implementations
    that simply drop the class token's rows and columns compute).

    Args:
        scores: array `(..., tokens, tokens)` of attention probabilities.
        grid_size: tuple `(rows, cols)` of the patch grid.
        token_size: tuple `(height, width)` of a patch in pixels. Defaults
            to `(1, 1)` (distances in patches).
        num_prefix_tokens: int. Tokens before the patches. Defaults to `0`.
        renormalize: bool. See above. Defaults to `True`.

    Returns:
        A float64 array `(..., num_patches)`: the distance for each query.
    """
    scores = np.asarray(scores, dtype="float64")
    num_patches = grid_size[0] * grid_size[1]
    if scores.shape[-1] != num_prefix_tokens + num_patches or scores.shape[-2] != scores.shape[-1]:
        raise ValueError(
            f"Scores of shape {scores.shape} do not fit {num_prefix_tokens} prefix tokens and a "
            f"{grid_size[0]}x{grid_size[1]} grid ({num_prefix_tokens + num_patches} tokens)."
        )
    weights = scores[..., num_prefix_tokens:, num_prefix_tokens:]  # (..., N, N)
    if renormalize:
        weights = weights / np.maximum(weights.sum(-1, keepdims=True), np.finfo("float64").tiny)
    centres = token_centres(grid_size, token_size)
    distances = np.sqrt(((centres[:, None] - centres[None]) ** 2).sum(-1))  # (N, N)
    return (weights * distances).sum(-1)


def mean_attention_distance(maps, renormalize=True):
    """Mean attention distance of every head of every extracted block, in pixels.

    Figure 7 (right) of the ViT paper: the attention-weighted distance of
    each query patch (see `attention_distance`), averaged over the query
    patches and the images.

    Args:
        maps: `AttentionMaps` from `attention_maps`.
        renormalize: bool. Rescale the patch keys' weights to sum to 1 (see
            `attention_distance`). Defaults to `True`.

    Returns:
        A float64 array `(blocks, heads)`, in input pixels; row `l` belongs
        to block `maps.blocks[l]`.
    """
    per_query = attention_distance(
        maps.scores, maps.grid_size, maps.token_size, maps.num_prefix_tokens, renormalize
    )  # (L, B, H, N)
    return per_query.mean(axis=(1, 3))
