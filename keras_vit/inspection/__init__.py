"""See what a ViT learned: attention maps, attention rollout and the paper's Figure 7.

Arrays first: everything returns numpy arrays on every backend and needs no
plotting library. `keras_vit.inspection.figures` draws them with matplotlib
(`pip install matplotlib`).

Example:

>>> maps = keras_vit.inspection.attention_maps(model, images)     # (blocks, batch, heads, T, T)
>>> rollout = keras_vit.inspection.attention_rollout(maps)        # .image: (batch, height, width)
>>> distances = keras_vit.inspection.mean_attention_distance(maps)  # (blocks, heads), pixels
>>> panels = keras_vit.inspection.figure7(model, maps=maps)
>>> keras_vit.inspection.save_figure(panels.plot(), "figure7.png")
"""

from keras_vit.inspection.attention import (
    AttentionMaps,
    Rollout,
    attention_distance,
    attention_maps,
    attention_rollout,
    backbone_of,
    fuse_heads,
    mean_attention_distance,
    rollout,
    token_centres,
    upsample,
)
from keras_vit.inspection.embeddings import (
    PrincipalComponents,
    cosine_similarity_grid,
    patch_embedding_components,
    position_embedding_similarity,
    position_embedding_table,
    principal_components,
)
from keras_vit.inspection.figure7 import Figure7, figure7
from keras_vit.inspection.figures import (
    plot_attention_maps,
    plot_figure7,
    plot_mean_attention_distance,
    plot_patch_embedding_components,
    plot_position_similarity,
    plot_rollout,
    save_figure,
)

__all__ = [
    "AttentionMaps",
    "Figure7",
    "PrincipalComponents",
    "Rollout",
    "attention_distance",
    "attention_maps",
    "attention_rollout",
    "backbone_of",
    "cosine_similarity_grid",
    "figure7",
    "fuse_heads",
    "mean_attention_distance",
    "patch_embedding_components",
    "plot_attention_maps",
    "plot_figure7",
    "plot_mean_attention_distance",
    "plot_patch_embedding_components",
    "plot_position_similarity",
    "plot_rollout",
    "position_embedding_similarity",
    "position_embedding_table",
    "principal_components",
    "rollout",
    "save_figure",
    "token_centres",
    "upsample",
]
