"""The three panels of the ViT paper's Figure 7 for one model, as numbers."""

import dataclasses
import math

import numpy as np

from keras_vit.inspection.attention import attention_distance, attention_maps, backbone_of, mean_attention_distance
from keras_vit.inspection.embeddings import patch_embedding_components, position_embedding_similarity
from keras_vit.inspection.figures import plot_figure7


@dataclasses.dataclass(frozen=True)
class Figure7:
    """Figure 7 of the ViT paper for one model and a set of images.

    Attributes:
        components: `PrincipalComponents` of the patch-embedding filters
            (left panel), or `None` for a hybrid (its filters are not images).
        similarity: float64 array `(rows, cols, rows, cols)`, the
            position-embedding cosine similarity (centre panel), or `None`
            for a model without position embedding.
        mean_attention_distance: float64 array `(blocks, heads)` in input
            pixels (right panel).
        blocks: tuple of the block index of each row.
        image_diagonal: float. The image's diagonal in pixels, the largest
            possible distance (the top of the right panel's axis).
        uniform_distance: float. The mean attention distance of a head that
            spreads its attention evenly over all patches (dashed line in
            the right panel): heads below it attend locally. On a small
            grid a head that looks at one fixed place for every query lands
            near it too, so read it with the attention maps.
    """

    components: object
    similarity: object
    mean_attention_distance: np.ndarray
    blocks: tuple
    image_diagonal: float
    uniform_distance: float

    def to_dict(self):
        """The numbers as plain Python values (for JSON)."""
        return {
            "mean_attention_distance_pixels": self.mean_attention_distance.round(4).tolist(),
            "blocks": list(self.blocks),
            "image_diagonal_pixels": round(self.image_diagonal, 4),
            "uniform_attention_distance_pixels": round(self.uniform_distance, 4),
            "explained_variance_ratio": (
                None if self.components is None else self.components.explained_variance_ratio.round(6).tolist()
            ),
        }

    def plot(self, title=None, figsize=(15, 5), dpi=100):
        """Draw the three panels (needs the `plot` extra); returns a matplotlib Figure."""
        return plot_figure7(
            self.components, self.similarity, self.mean_attention_distance, self.blocks,
            max_distance=self.image_diagonal, uniform_distance=self.uniform_distance, title=title,
            figsize=figsize, dpi=dpi,
        )


def figure7(model, images=None, maps=None, num_components=28, batch_size=8):
    """Compute Figure 7's three panels for `model`.

    Args:
        model: a `ViTBackbone`, `ViTClassifier` or `MaskedPatchPredictor`.
        images: array `(batch, height, width, channels)` of raw pixels, the
            images whose attention is averaged (the paper used 128 images).
            Not needed when `maps` is given.
        maps: `AttentionMaps` of all blocks, if already computed. Defaults to
            `None`.
        num_components: int. Principal components of the filters. Defaults
            to `28`.
        batch_size: int. Images per forward pass. Defaults to `8`.

    Returns:
        A `Figure7`.
    """
    backbone = backbone_of(model)
    if maps is None:
        if images is None:
            raise ValueError("Pass `images` (or `maps`): the attention distance is averaged over images.")
        maps = attention_maps(backbone, images, batch_size=batch_size)
    components = patch_embedding_components(backbone, num_components) if backbone.stem is None else None
    similarity = None
    if backbone.get_layer("patch_encoder").position_embedding != "none":
        similarity = position_embedding_similarity(backbone)
    height, width = backbone.image_size
    num_patches = maps.grid_size[0] * maps.grid_size[1]
    uniform = np.full((num_patches, num_patches), 1.0 / num_patches)
    return Figure7(
        components=components,
        similarity=similarity,
        mean_attention_distance=mean_attention_distance(maps),
        blocks=tuple(maps.blocks),
        image_diagonal=math.hypot(height, width),
        uniform_distance=float(attention_distance(uniform, maps.grid_size, maps.token_size).mean()),
    )
