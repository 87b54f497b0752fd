"""Linear patch projection, prefix tokens and position embedding."""

import math

import keras
import numpy as np
from keras import ops

from keras_vit.utils.values import check_choice, check_count, check_divisible, check_rate, to_pair

POSITION_EMBEDDINGS = ("learned", "sincos2d", "none")


def sincos_2d_position_embedding(grid_size, hidden_dim, temperature=10000.0):
    """Fixed 2-D sine-cosine position embedding of a patch grid, in numpy.

    A quarter of the features encode the column with sines, a quarter with
    cosines, and the other half the row in the same way (the layout of
    big_vision's `posemb_sincos_2d`). Rows of the result follow the patches'
    row-major order.

    Args:
        grid_size: tuple. `(rows, cols)` of the patch grid.
        hidden_dim: int. Embedding width; must be divisible by 4.
        temperature: float. Base of the geometric frequency ladder.

    Returns:
        A float32 array of shape `(rows * cols, hidden_dim)`.
    """
    check_divisible(
        hidden_dim, "hidden_dim", 4, reason=" for the 2-D sin-cos position embedding",
        fix="Choose a width that is a multiple of 4, or position_embedding='learned'.",
    )
    rows, cols = grid_size
    quarter = hidden_dim // 4
    omega = np.arange(quarter, dtype=np.float64) / max(quarter - 1, 1)
    omega = 1.0 / temperature**omega  # (D/4,)
    row_index, col_index = np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij")
    col_angles = col_index.reshape(-1, 1) * omega[None]  # (N, D/4)
    row_angles = row_index.reshape(-1, 1) * omega[None]  # (N, D/4)
    table = np.concatenate(
        [np.sin(col_angles), np.cos(col_angles), np.sin(row_angles), np.cos(row_angles)],
        axis=1,
    )
    return table.astype("float32")


@keras.saving.register_keras_serializable(package="keras_vit")
class PatchEncoder(keras.layers.Layer):
    """Projects flattened patches and adds prefix tokens and positions.

    Implements eq. 1 of the ViT paper: each patch is mapped by a learned
    linear projection `E` to `hidden_dim` features, a learned class token is
    prepended (optionally followed by register tokens), and a position
    embedding is added. Dropout follows.

    Args:
        hidden_dim: int. Width `D` of the token embeddings.
        grid_size: int, tuple of two ints, or `None`. The patch grid
            `(rows, cols)`. Needed for `"sincos2d"` and for resampling to
            another resolution; when `None` the grid is taken to be square.
            Defaults to `None`.
        use_class_token: bool. Whether to prepend a learned class token.
            Defaults to `True`.
        num_register_tokens: int. Learned register tokens inserted after the
            class token (Darcet et al., 2023). Defaults to `0`.
        use_distillation_token: bool. DeiT's learned distillation token,
            placed right after the class token (before any register
            tokens), with a position-embedding row of its own as in timm's
            `VisionTransformerDistilled`. Defaults to `False`.
        projection_bias: bool. Whether the patch projection has a bias.
            CLIP's has none (timm builds it without one when `pre_norm=True`).
            Defaults to `True`.
        position_embedding: str. `"learned"` (a trainable table, the paper's
            default), `"sincos2d"` (fixed 2-D sine-cosine), or `"none"`.
            Defaults to `"learned"`.
        prefix_position_embedding: bool. For `"learned"`: whether the class
            and register tokens get rows of their own in the table (the
            paper's `N + 1` rows). `False` reproduces timm's
            `no_embed_class=True`. Defaults to `True`.
        dropout: float. Dropout rate applied to the token sequence.
            Defaults to `0.0`.
        kernel_initializer: Initializer of the projection kernel. Defaults
            to `"glorot_uniform"`.
        **kwargs: Base layer keyword arguments.

    Call arguments:
        patches: tensor of shape `(batch, num_patches, patch_features)`, as
            returned by `Patches`.
        training: bool. Whether dropout is active.
        corruption: callable or `None`. Applied to the projected patch
            embeddings `(batch, num_patches, hidden_dim)` before the prefix
            tokens and the position embedding are added, and must return a
            tensor of the same shape. Masked patch prediction uses it to
            replace patch embeddings (appendix B.1.2 of the paper), so a
            replaced patch still gets its own position. Defaults to `None`
            (no change). The same two steps are public as `project()` and
            `add_prefix_and_position()`.

    Returns:
        A tensor `(batch, num_prefix_tokens + num_patches, hidden_dim)`.
    """

    def __init__(
        self,
        hidden_dim,
        grid_size=None,
        use_class_token=True,
        num_register_tokens=0,
        position_embedding="learned",
        prefix_position_embedding=True,
        dropout=0.0,
        kernel_initializer="glorot_uniform",
        use_distillation_token=False,
        projection_bias=True,
        **kwargs,
    ):
        super().__init__(**kwargs)
        check_count(hidden_dim, "hidden_dim")
        check_choice(position_embedding, POSITION_EMBEDDINGS, "position_embedding")
        check_count(num_register_tokens, "num_register_tokens", minimum=0)
        check_rate(dropout, "dropout")
        self.hidden_dim = hidden_dim
        self.grid_size = None if grid_size is None else to_pair(grid_size, "grid_size")
        self.use_class_token = bool(use_class_token)
        self.num_register_tokens = num_register_tokens
        self.position_embedding = position_embedding
        self.prefix_position_embedding = bool(prefix_position_embedding)
        self.dropout = dropout
        self.use_distillation_token = bool(use_distillation_token)
        self.projection_bias = bool(projection_bias)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.projection = keras.layers.Dense(
            hidden_dim, use_bias=self.projection_bias, kernel_initializer=self.kernel_initializer,
            dtype=self.dtype_policy, name="projection",
        )
        self.dropout_layer = keras.layers.Dropout(dropout, dtype=self.dtype_policy, name="dropout")

    @property
    def num_prefix_tokens(self):
        """Number of tokens placed before the patch tokens."""
        return int(self.use_class_token) + int(self.use_distillation_token) + self.num_register_tokens

    def parameter_count(self, patch_features):
        """Weights this layer creates for patches of `patch_features` values on its `grid_size`.

        The projection and its bias, the class and register tokens, and a
        learned position embedding (one row per patch, plus one per prefix
        token with `prefix_position_embedding`); a sin-cos table is a
        constant, not a weight.
        """
        if self.grid_size is None:
            raise ValueError(f"Layer '{self.name}' counts its weights only with a known `grid_size`.")
        position_rows = 0
        if self.position_embedding == "learned":
            position_rows = self.grid_size[0] * self.grid_size[1]
            position_rows += self.num_prefix_tokens if self.prefix_position_embedding else 0
        projection = (patch_features + int(self.projection_bias)) * self.hidden_dim
        return projection + (self.num_prefix_tokens + position_rows) * self.hidden_dim

    def _resolve_grid(self, num_patches):
        if self.grid_size is not None:
            rows, cols = self.grid_size
            if num_patches is not None and rows * cols != num_patches:
                raise ValueError(
                    f"Layer '{self.name}' was configured for a {rows}x{cols} patch "
                    f"grid ({rows * cols} patches) but received {num_patches} "
                    "patches. Build the model for the image size you feed it."
                )
            return self.grid_size
        if num_patches is None:
            raise ValueError(
                f"Layer '{self.name}' needs a known number of patches to build "
                "its position embedding. Give the model a fixed image size."
            )
        side = math.isqrt(num_patches)
        if side * side != num_patches:
            raise ValueError(
                f"{num_patches} patches do not form a square grid. Pass "
                "`grid_size=(rows, cols)` to PatchEncoder for non-square images."
            )
        return (side, side)

    def build(self, input_shape):
        _, num_patches, _ = input_shape
        rows, cols = self._resolve_grid(num_patches)
        self.grid_size = (rows, cols)
        self.projection.build(input_shape)
        if self.use_class_token:
            self.class_token = self.add_weight(
                shape=(1, 1, self.hidden_dim), initializer="zeros", name="class_token"
            )
        if self.use_distillation_token:
            self.distillation_token = self.add_weight(
                shape=(1, 1, self.hidden_dim),
                initializer=keras.initializers.TruncatedNormal(stddev=0.02),
                name="distillation_token",
            )
        if self.num_register_tokens:
            self.register_tokens = self.add_weight(
                shape=(1, self.num_register_tokens, self.hidden_dim),
                initializer=keras.initializers.TruncatedNormal(stddev=1e-6),
                name="register_tokens",
            )
        if self.position_embedding == "learned":
            rows_in_table = rows * cols
            if self.prefix_position_embedding:
                rows_in_table += self.num_prefix_tokens
            self.position_embedding_table = self.add_weight(
                shape=(1, rows_in_table, self.hidden_dim),
                initializer=keras.initializers.TruncatedNormal(stddev=0.02),
                name="position_embedding",
            )
        elif self.position_embedding == "sincos2d":
            # A constant, not a weight: recomputed from the config on load.
            self._sincos_table = sincos_2d_position_embedding((rows, cols), self.hidden_dim)[None]
        self.built = True

    def _prefix_tokens(self, batch_size, dtype):
        tokens = []
        if self.use_class_token:
            tokens.append(ops.cast(self.class_token, dtype))
        if self.use_distillation_token:
            tokens.append(ops.cast(self.distillation_token, dtype))
        if self.num_register_tokens:
            tokens.append(ops.cast(self.register_tokens, dtype))
        prefix = ops.concatenate(tokens, axis=1) if len(tokens) > 1 else tokens[0]
        # (B, num_prefix, D)
        return ops.broadcast_to(prefix, (batch_size, self.num_prefix_tokens, self.hidden_dim))

    def project(self, patches):
        """Linear projection `E` of flattened patches (eq. 1 without positions).

        Args:
            patches: tensor `(batch, num_patches, patch_features)`.

        Returns:
            A tensor `(batch, num_patches, hidden_dim)`.
        """
        # The Dense layer runs on the 2-D (patches, features) view, as the
        # blocks' Dense layers do: on the rank-3 patches, XLA's CPU backend
        # computed the kernel gradient (which contracts the batch and patch
        # axes together) in one slow transposing fusion. Same weights, same
        # arithmetic; the reshapes are free. The layer is called (not only
        # its matmul) so its dtype policy, LoRA and quantization apply here
        # as they did, also when `project()` is called on its own.
        num_patches = ops.shape(patches)[1]
        x = self.projection(ops.reshape(patches, (-1, patches.shape[-1])))  # (B * N, D)
        return ops.reshape(x, (-1, num_patches, self.hidden_dim))  # (B, N, D)

    def add_prefix_and_position(self, embeddings, training=None):
        """Prepend the prefix tokens, add the position embedding, apply dropout.

        Args:
            embeddings: tensor `(batch, num_patches, hidden_dim)`, the output
                of `project()` (possibly modified).
            training: bool. Whether dropout is active.

        Returns:
            A tensor `(batch, num_prefix_tokens + num_patches, hidden_dim)`.
        """
        x = embeddings
        batch_size = ops.shape(x)[0]
        if self.position_embedding == "sincos2d":
            x = x + ops.cast(self._sincos_table, x.dtype)
        elif self.position_embedding == "learned" and not self.prefix_position_embedding:
            x = x + ops.cast(self.position_embedding_table, x.dtype)
        if self.num_prefix_tokens:
            x = ops.concatenate([self._prefix_tokens(batch_size, x.dtype), x], axis=1)
        if self.position_embedding == "learned" and self.prefix_position_embedding:
            x = x + ops.cast(self.position_embedding_table, x.dtype)
        return self.dropout_layer(x, training=training)

    def call(self, patches, training=None, corruption=None):
        x = self.project(patches)  # (B, N, D)
        if corruption is not None:
            # Before positions are added: a replaced patch keeps its own position.
            x = corruption(x)  # (B, N, D)
        return self.add_prefix_and_position(x, training=training)

    def compute_output_shape(self, input_shape):
        batch, num_patches, _ = input_shape
        tokens = None if num_patches is None else num_patches + self.num_prefix_tokens
        return (batch, tokens, self.hidden_dim)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "hidden_dim": self.hidden_dim,
                "grid_size": self.grid_size,
                "use_class_token": self.use_class_token,
                "num_register_tokens": self.num_register_tokens,
                "position_embedding": self.position_embedding,
                "prefix_position_embedding": self.prefix_position_embedding,
                "dropout": self.dropout,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
                "use_distillation_token": self.use_distillation_token,
                "projection_bias": self.projection_bias,
            }
        )
        return config
