"""Figures of the inspection arrays, drawn with matplotlib (the `plot` extra).

Each `plot_*` function returns a `matplotlib.figure.Figure` of a fixed size
(`figsize` inches at `dpi`, so the PNG is `figsize * dpi` pixels) and each
`draw_*` function draws the same content into a figure or sub-figure that
the caller made. `save_figure` writes a PNG atomically. Nothing here uses
pyplot's global state, so figures can be made from threads and servers.
"""

import numpy as np

from keras_vit.inspection.attention import upsample
from keras_vit.writer.files import FILE, claim

PLOT_EXTRA_HINT = "pip install matplotlib"


def require_matplotlib():
    """Import matplotlib, or raise an `ImportError` that names the `plot` extra."""
    try:
        import matplotlib  # noqa: F401
        from matplotlib.figure import Figure
    except ImportError as error:
        raise ImportError(
            "Drawing inspection figures needs matplotlib, which is not installed. Install the plot extra: "
            f"`{PLOT_EXTRA_HINT}` (the arrays of keras_vit.inspection need no plotting library)."
        ) from error
    return Figure


def _figure(figsize, dpi):
    return require_matplotlib()(figsize=figsize, dpi=dpi, layout="constrained")


def save_figure(figure, path):
    """Write `figure` as a PNG atomically, at the figure's own size, through keras_vit's writer.

    A command that claimed a directory of figures at its start writes each
    through that claim instead: `destination.save_figure(name, figure)`.

    Args:
        figure: `matplotlib.figure.Figure`.
        path: str or path-like. A `.png` file whose directory exists.

    Returns:
        The path written.
    """
    destination = claim(path, FILE)
    destination.save_figure(None, figure)
    return destination.path


def display_image(image):
    """An image as matplotlib shows it: `(h, w)` or `(h, w, 3)` in [0, 1], with its colour map.

    Raw pixels of any range are stretched to [0, 1] (per image), since the
    model's preprocessing, not the file, fixes what the values mean.
    """
    image = np.asarray(image, dtype="float64")
    if image.ndim == 3 and image.shape[-1] == 1:
        image = image[..., 0]
    if image.ndim == 3 and image.shape[-1] != 3:
        raise ValueError(f"Only grayscale or RGB images can be shown. Received: an image of shape {image.shape}.")
    low, high = image.min(), image.max()
    image = (image - low) / (high - low) if high > low else np.zeros_like(image)
    return image, ("gray" if image.ndim == 2 else None)


def _no_ticks(axes):
    axes.set_xticks([])
    axes.set_yticks([])


# === Rollout and attention maps ===


def draw_rollout(figure, image, rollout_map, title=None):
    """Draw an image, its rollout map laid over it, and the image masked by the map.

    The third panel multiplies the image by the map scaled to [0, 1], as the
    ViT paper's Figure 6 shows attention.

    Args:
        figure: figure or sub-figure to draw into.
        image: array `(height, width, channels)` of raw pixels.
        rollout_map: array `(height, width)` (`Rollout.image[i]`) or a
            coarser `(rows, cols)` map, which is upsampled.
        title: str or `None`. Figure title. Defaults to `None`.
    """
    shown, cmap = display_image(image)
    rollout_map = np.asarray(rollout_map, dtype="float64")
    if rollout_map.shape != shown.shape[:2]:
        rollout_map = upsample(rollout_map, shown.shape[:2])
    left, centre, right = figure.subplots(1, 3)
    left.imshow(shown, cmap=cmap, vmin=0, vmax=1)
    left.set_title("input")
    centre.imshow(shown, cmap=cmap, vmin=0, vmax=1)
    overlay = centre.imshow(rollout_map, cmap="inferno", alpha=0.6, vmin=0)
    centre.set_title("attention rollout")
    peak = rollout_map.max()
    mask = rollout_map / peak if peak > 0 else rollout_map
    right.imshow(shown * (mask if shown.ndim == 2 else mask[..., None]), cmap=cmap, vmin=0, vmax=1)
    right.set_title("input x rollout")
    for axes in (left, centre, right):
        axes.set_xlabel("x (pixels)")
    left.set_ylabel("y (pixels)")
    figure.colorbar(overlay, ax=[left, centre, right], shrink=0.8, label="rollout weight")
    if title:
        figure.suptitle(title)


def plot_rollout(image, rollout_map, title=None, figsize=(10, 3.6), dpi=100):
    """A figure of an image beside its attention rollout map (see `draw_rollout`).

    Returns:
        `matplotlib.figure.Figure`.
    """
    figure = _figure(figsize, dpi)
    draw_rollout(figure, image, rollout_map, title)
    return figure


def draw_attention_maps(figure, image, maps, index=0, query=None, title=None):
    """Draw one image's attention maps: one row per block, one column per head.

    Each panel shows the attention of the query (the class token, or for
    models without one the mean of the patch queries) to every patch, laid
    over the image. All panels share one colour scale.

    Args:
        figure: figure or sub-figure to draw into.
        image: array `(height, width, channels)` of raw pixels.
        maps: `AttentionMaps`.
        index: int. Which image of the batch in `maps`. Defaults to `0`.
        query: str or `None`. `"class"` or `"mean"`; `None` picks `"class"`
            when the model has one. Defaults to `None`.
        title: str or `None`. Defaults to a title naming the query.
    """
    if query is None:
        query = "class" if maps.use_class_token else "mean"
    grids = maps.class_token if query == "class" else maps.mean_patch_query  # (L, B, H, rows, cols)
    grids = grids[:, index]
    shown, cmap = display_image(image)
    height, width = shown.shape[:2]
    num_blocks, num_heads = grids.shape[:2]
    axes = np.asarray(figure.subplots(num_blocks, num_heads, squeeze=False))
    vmax = float(grids.max())
    for row in range(num_blocks):
        for head in range(num_heads):
            panel = axes[row, head]
            panel.imshow(shown, cmap=cmap, vmin=0, vmax=1, extent=(0, width, height, 0))
            picture = panel.imshow(
                grids[row, head], cmap="inferno", alpha=0.7, vmin=0, vmax=vmax, extent=(0, width, height, 0),
                interpolation="nearest",
            )
            _no_ticks(panel)
            if row == 0:
                panel.set_title(f"head {head}", fontsize=8)
            if head == 0:
                panel.set_ylabel(f"block {maps.blocks[row]}", fontsize=8)
    figure.colorbar(picture, ax=axes, shrink=0.6, label="attention weight")
    who = "class token" if query == "class" else "mean patch query"
    figure.suptitle(title or f"Attention of the {who} to each patch")


def plot_attention_maps(image, maps, index=0, query=None, title=None, dpi=100):
    """A figure of one image's attention maps per block and head (see `draw_attention_maps`).

    The size grows with the number of blocks and heads (about 1.1 inch per
    panel).

    Returns:
        `matplotlib.figure.Figure`.
    """
    num_blocks, num_heads = maps.scores.shape[0], maps.scores.shape[2]
    figure = _figure((1.1 * num_heads + 1.5, 1.1 * num_blocks + 0.8), dpi)
    draw_attention_maps(figure, image, maps, index, query, title)
    return figure


# === Figure 7 ===


def draw_patch_embedding_components(figure, components, columns=7, title=None):
    """Draw the patch-embedding filters' principal components as small images.

    Each component is stretched to [0, 1] on its own (as in the paper's
    Figure 7, left), RGB for 3-channel models and grey for 1-channel ones.

    Args:
        figure: figure or sub-figure to draw into.
        components: `PrincipalComponents` from `patch_embedding_components`.
        columns: int. Components per row. Defaults to `7`.
        title: str or `None`. Defaults to a title with the count.
    """
    if not components.on_pixels:
        raise ValueError(
            "This is a hybrid model: its patch embedding acts on the CNN's feature map, not on pixels, so its "
            "filters are not images. Figure 7 (left) exists only for models that cut patches from the image."
        )
    pictures = components.components
    count = len(pictures)
    columns = min(columns, count)
    rows = -(-count // columns)
    axes = np.asarray(figure.subplots(rows, columns, squeeze=False))
    for position, panel in enumerate(axes.ravel()):
        panel.set_axis_off()
        if position < count:
            shown, cmap = display_image(pictures[position])
            panel.imshow(shown, cmap=cmap, vmin=0, vmax=1, interpolation="nearest")
            share = components.explained_variance_ratio[position]
            panel.set_title(f"{position + 1} ({share:.0%})", fontsize=7)
    figure.suptitle(title or f"Embedding filters: first {count} principal components")


def plot_patch_embedding_components(components, columns=7, title=None, figsize=(5, 5), dpi=100):
    """A figure of the patch-embedding principal components (see `draw_patch_embedding_components`).

    Returns:
        `matplotlib.figure.Figure`.
    """
    figure = _figure(figsize, dpi)
    draw_patch_embedding_components(figure, components, columns, title)
    return figure


def draw_position_similarity(figure, similarity, title=None):
    """Draw the position-embedding similarity grid (Figure 7, centre).

    One small map per patch position, placed at that position: map `(r, c)`
    shows the cosine similarity of patch `(r, c)`'s position embedding to
    every patch's. One colour scale from -1 to 1.

    Args:
        figure: figure or sub-figure to draw into.
        similarity: array `(rows, cols, rows, cols)` from
            `position_embedding_similarity`.
        title: str or `None`. Defaults to `"Position embedding similarity"`.
    """
    similarity = np.asarray(similarity)
    rows, cols = similarity.shape[:2]
    axes = np.asarray(figure.subplots(rows, cols, squeeze=False, gridspec_kw={"wspace": 0.02, "hspace": 0.02}))
    for row in range(rows):
        for col in range(cols):
            panel = axes[row, col]
            picture = panel.imshow(similarity[row, col], cmap="viridis", vmin=-1, vmax=1, interpolation="nearest")
            _no_ticks(panel)
            if col == 0:
                panel.set_ylabel(str(row + 1), fontsize=7, rotation=0, labelpad=8)
            if row == rows - 1:
                panel.set_xlabel(str(col + 1), fontsize=7)
    figure.supylabel("input patch row")
    figure.supxlabel("input patch column")
    figure.colorbar(picture, ax=axes, shrink=0.6, label="cosine similarity")
    figure.suptitle(title or "Position embedding similarity")


def plot_position_similarity(similarity, title=None, figsize=(5, 5), dpi=100):
    """A figure of the position-embedding similarity grid (see `draw_position_similarity`).

    Returns:
        `matplotlib.figure.Figure`.
    """
    figure = _figure(figsize, dpi)
    draw_position_similarity(figure, similarity, title)
    return figure


def draw_mean_attention_distance(figure, distances, blocks=None, max_distance=None, title=None, uniform_distance=None):
    """Draw mean attention distance against depth, one point per head (Figure 7, right).

    Args:
        figure: figure or sub-figure to draw into.
        distances: array `(blocks, heads)` from `mean_attention_distance`.
        blocks: sequence of block indices of the rows, or `None` for
            `0, 1, ...`. Defaults to `None`.
        max_distance: float or `None`. Top of the y axis (e.g. the image
            diagonal); `None` lets matplotlib choose. Defaults to `None`.
        title: str or `None`. Defaults to `"Mean attention distance"`.
        uniform_distance: float or `None`. Draw a dashed line at the
            distance of evenly spread attention (`Figure7.uniform_distance`).
            Defaults to `None`.
    """
    distances = np.asarray(distances, dtype="float64")
    num_blocks, num_heads = distances.shape
    depth = np.arange(num_blocks) if blocks is None else np.asarray(blocks)
    axes = figure.subplots()
    colours = _head_colours(num_heads)
    for head in range(num_heads):
        axes.scatter(depth, distances[:, head], s=18, color=colours[head], label=f"head {head}")
    if uniform_distance is not None:
        axes.axhline(uniform_distance, color="grey", linestyle="--", linewidth=1, label="uniform attention")
    axes.set_xlabel("network depth (block)")
    axes.set_ylabel("mean attention distance (pixels)")
    axes.set_xticks(depth)
    axes.set_ylim(0, max_distance if max_distance else None)
    axes.grid(alpha=0.3)
    if num_heads <= 16:
        # Outside the axes: with many heads an inside legend hides the points.
        axes.legend(fontsize=6, ncol=2 if num_heads > 8 else 1, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    figure.suptitle(title or "Mean attention distance")


def _head_colours(num_heads):
    from matplotlib import colormaps

    palette = colormaps["tab20" if num_heads > 10 else "tab10"]
    return [palette(head % palette.N) for head in range(num_heads)]


def plot_mean_attention_distance(distances, blocks=None, max_distance=None, title=None, figsize=(5, 4), dpi=100,
                                 uniform_distance=None):
    """A figure of mean attention distance per head against depth (see `draw_mean_attention_distance`).

    Returns:
        `matplotlib.figure.Figure`.
    """
    figure = _figure(figsize, dpi)
    draw_mean_attention_distance(figure, distances, blocks, max_distance, title, uniform_distance)
    return figure


def plot_figure7(components, similarity, distances, blocks=None, max_distance=None, title=None,
                 figsize=(15, 5), dpi=100, uniform_distance=None):
    """The paper's Figure 7: filters' principal components, position similarity, attention distance.

    Args:
        components: `PrincipalComponents`, from `patch_embedding_components`,
            or `None` to leave the left panel out (a hybrid's filters are
            not images).
        similarity: array `(rows, cols, rows, cols)` from
            `position_embedding_similarity`, or `None` for a model without
            position embedding.
        distances: array `(blocks, heads)` from `mean_attention_distance`.
        blocks: block indices of the rows of `distances`. Defaults to
            `0, 1, ...`.
        max_distance: float or `None`. Top of the distance axis.
        title: str or `None`. A title over the three panels.
        uniform_distance: float or `None`. A dashed reference line at the
            distance of evenly spread attention.
        figsize: tuple. Inches. Defaults to `(15, 5)`.
        dpi: int. Defaults to `100`.

    Returns:
        `matplotlib.figure.Figure`.
    """
    figure = _figure(figsize, dpi)
    left, centre, right = figure.subfigures(1, 3)
    if components is None or not components.on_pixels:
        left.text(0.5, 0.5, "no pixel filters\n(hybrid: patches of a\nCNN feature map)", ha="center", va="center")
    else:
        draw_patch_embedding_components(left, components)
    if similarity is None:
        centre.text(0.5, 0.5, "no position embedding", ha="center", va="center")
    else:
        draw_position_similarity(centre, similarity)
    draw_mean_attention_distance(right, distances, blocks, max_distance, uniform_distance=uniform_distance)
    if title:
        figure.suptitle(title)
    return figure
