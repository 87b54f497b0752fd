"""Low-rank adaptation (LoRA, Hu et al. 2021) of a keras_vit model, through Keras' own `Dense.enable_lora`.

`LowRankAdaptation` is a mixin of `ViTModel`: `enable_lora`, `lora_enabled`,
`lora_layers`, and the LoRA factors saved and loaded on their own
(`save_lora_weights` / `load_lora_weights`, as keras-hub's backbones offer).
Only public Keras API is used: `Dense.enable_lora`, `lora_kernel_a` /
`lora_kernel_b`, `lora_rank` / `lora_alpha`, and the layer's variables.

A LoRA weights file is an `.npz` of plain arrays (read with
`allow_pickle=False`): `lora/rank`, `lora/alpha`, and for each adapted Dense
`<path>/lora_kernel_a` and `<path>/lora_kernel_b`, where `<path>` is the
Dense's path inside its model (`transformer_block_0/attention/qkv`), so the
file of a classifier fits its backbone too.
"""

import os
import zipfile

import numpy as np
import keras

from keras_vit.layers.transformer_block import TransformerBlock
from keras_vit.writer import files
from keras_vit.utils.values import check_count, check_number

RANK_KEY, ALPHA_KEY = "lora/rank", "lora/alpha"
FACTORS = ("lora_kernel_a", "lora_kernel_b")
_GIVE = "Give a file written by `model.save_lora_weights`."


def _described(array):
    return f"shape {tuple(array.shape)}, dtype {array.dtype}" + (f", value {array.item()!r}" if array.size == 1 else "")


def read_lora_file(path):
    """The arrays of a LoRA weights file, or a `ValueError` naming the file and what is wrong with it.

    The file is an `.npz` archive of plain arrays, read with
    `allow_pickle=False`; a missing, empty, truncated or foreign file (a
    directory, a single `.npy` array, pickled objects) is refused here
    rather than surfacing as numpy's `EOFError`, `BadZipFile` or `TypeError`.

    Args:
        path: str or path-like.

    Returns:
        A dict of numpy arrays.
    """
    name = repr(os.fspath(path))
    if not os.path.exists(path):
        raise ValueError(f"{name} does not exist. {_GIVE}")
    if os.path.isdir(path):
        raise ValueError(f"{name} is a directory, not a LoRA weights file. {_GIVE}")
    if os.path.getsize(path) == 0:
        raise ValueError(f"{name} is empty (0 bytes): the save that wrote it did not finish. {_GIVE}")
    try:
        stored = np.load(path, allow_pickle=False)
        if not isinstance(stored, np.lib.npyio.NpzFile):
            raise ValueError(f"it holds one array ({_described(np.asarray(stored))}), not an .npz archive of "
                             "named factors")
        with stored:
            return {key: np.asarray(stored[key]) for key in stored.files}
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile) as error:
        raise ValueError(f"{name} is not a LoRA weights file (an .npz of plain arrays): {error}. The file is "
                         f"damaged or in another format. {_GIVE}") from None


def transformer_blocks(model):
    """Every `TransformerBlock` of a model's encoder (the backbone's, for a model that holds one)."""
    backbone = getattr(model, "backbone", model)
    return [layer for layer in backbone._flatten_layers(include_self=False) if isinstance(layer, TransformerBlock)]


def _base_kernel(layer):
    """The Dense's own kernel variable; with LoRA on, `layer.kernel` is the sum, not a variable."""
    kernels = [variable for variable in layer.weights if variable.name == "kernel"]
    if len(kernels) != 1:
        raise ValueError(f"{layer.path} has {len(kernels)} variables named 'kernel'; expected one.")
    return kernels[0]


class LowRankAdaptation:
    """LoRA on every transformer block's attention and MLP Dense layers (a mixin of `ViTModel`)."""

    def lora_layers(self):
        """The Dense layers LoRA adapts: every block's attention `qkv` and projection, MLP `fc1` and `fc2`."""
        return [dense for block in transformer_blocks(self) for dense in (
            block.attention.qkv, block.attention.output_projection, block.mlp.fc1, block.mlp.fc2)]

    @property
    def lora_enabled(self):
        """Whether `enable_lora` was called on this model."""
        return any(layer.lora_enabled for layer in self.lora_layers())

    def enable_lora(self, rank, alpha=None):
        """Fine-tune low-rank updates of the encoder instead of its weights (LoRA, Hu et al. 2021).

        Keras' own `Dense.enable_lora` adds `A` (in x rank) and `B` (rank x
        out, starting at zero, so the model is unchanged at first) to every
        block's attention `qkv` and projection and MLP `fc1` and `fc2`;
        their output gains `(alpha / rank) * x A B`. Every other weight of
        the backbone (embeddings, norms, biases, a hybrid stem) is frozen; a
        classifier's head (and `fc_norm` / `pre_logits`) stays trainable.

        Saving merges: `save_to_preset`, `save` and `save_weights` write
        `kernel + (alpha / rank) A B` as the kernel and no LoRA weights, so
        the saved model loads as a plain model, without LoRA. To keep the
        factors apart, use `save_lora_weights`.

        Args:
            rank: int. Rank of the update, e.g. 4 to 16.
            alpha: float or `None`. Scale numerator; `None` uses `rank`
                (a scale of 1). Defaults to `None`.

        Example:

        >>> model = keras_vit.ViTClassifier.from_preset("vit_b16_augreg_in21k", num_classes=5)
        >>> model.enable_lora(8)
        >>> model.compile(optimizer="adamw", loss="sparse_categorical_crossentropy")
        """
        check_count(rank, "rank")
        if alpha is not None:
            check_number(alpha, "alpha")
        layers = self.lora_layers()
        if not layers:
            raise ValueError(f"This {type(self).__name__} has no transformer block to adapt.")
        if any(layer.lora_enabled for layer in layers):
            raise ValueError("LoRA is already enabled on this model; enable it once.")
        smallest = min(min(layer.kernel.shape) for layer in layers)
        if rank > smallest:
            raise ValueError(f"`rank` must be at most the smallest side of every adapted kernel ({smallest}). "
                             f"Received: rank={rank}")
        for layer in layers:
            layer.enable_lora(int(rank), lora_alpha=alpha)
        backbone = getattr(self, "backbone", self)
        for variable in backbone.weights:
            if variable.name not in FACTORS:
                variable.trainable = False

    # === The factors on their own ===

    def lora_weights(self):
        """The LoRA factors as a dict of numpy arrays, in the layout of a LoRA weights file.

        `lora/rank`, `lora/alpha`, and `<path>/lora_kernel_a` /
        `<path>/lora_kernel_b` for each adapted Dense (its path inside the
        model). `set_lora_weights` takes it back.

        Raises:
            ValueError: LoRA is not enabled.
        """
        layers = self._adapted_layers("save")
        arrays = {RANK_KEY: np.asarray(layers[0].lora_rank, "int64"),
                  ALPHA_KEY: np.asarray(layers[0].lora_alpha, "float64")}
        for layer in layers:
            for factor in FACTORS:
                arrays[f"{layer.path}/{factor}"] = keras.ops.convert_to_numpy(getattr(layer, factor).value)
        return arrays

    def save_lora_weights(self, path):
        """Write the LoRA factors (not the model's other weights) to an `.npz` file.

        The file is small (rank x (in + out) numbers per adapted kernel) and
        loads with `load_lora_weights` on a model with the same base
        weights, e.g. the preset it was fine-tuned from. It holds plain
        arrays: no pickles.

        Args:
            path: str or path-like. The file is an `.npz` archive whatever
                its name; `"flowers.lora.npz"` says so. Claimed before
                anything is written.

        Raises:
            ValueError: LoRA is not enabled.
        """
        destination = files.claim(path, files.FILE)
        arrays = self.lora_weights()
        with destination.staged(suffix=".npz") as temporary:
            np.savez(temporary, **arrays)  # plain arrays, no pickles

    def load_lora_weights(self, path, kernels_merged=False):
        """Load LoRA factors written by `save_lora_weights`.

        On a model without LoRA, LoRA is enabled first with the file's rank
        and alpha; on one with LoRA, the ranks must match. Nothing changes
        when the file does not fit.

        Args:
            path: str or path-like. An `.npz` file of `save_lora_weights`.
            kernels_merged: bool. `True` when this model's kernels hold the
                merged values `W + (alpha / rank) A B` of the same factors:
                a weights file saved with LoRA on (`save_weights`, an epoch
                backup) and loaded with `load_weights`. The factors' product
                is then taken out of each kernel, so the model trains on
                from the same base kernel and factors. Defaults to `False`
                (the kernels are the base, e.g. the preset fine-tuned from).

        Raises:
            ValueError: the file is not a LoRA weights file, its rank or
                layers or shapes do not fit this model, or a factor holds
                NaN or infinite values (a diverged run: a model with them
                predicts NaN). The model is left as it was.

        Example:

        >>> model = keras_vit.ViTClassifier.from_preset("vit_b16_augreg_in21k", num_classes=5)
        >>> model.load_lora_weights("flowers.lora.npz")
        """
        arrays = read_lora_file(path)
        self.set_lora_weights(arrays, kernels_merged=kernels_merged, source=repr(os.fspath(path)))

    def set_lora_weights(self, arrays, kernels_merged=False, source="The LoRA weights"):
        """Set the LoRA factors from a dict in the layout of `lora_weights()`.

        Args:
            arrays: dict of numpy arrays, as `lora_weights()` returns.
            kernels_merged: bool. As in `load_lora_weights`.
            source: str. What the arrays came from, for the messages.
        """
        rank, alpha = _rank_and_alpha(arrays, source)
        layers = self.lora_layers()
        if self.lora_enabled and layers[0].lora_rank != rank:
            raise ValueError(f"{source} holds LoRA factors of rank {rank}, but this model has LoRA of rank "
                             f"{layers[0].lora_rank}. Load it on a model without LoRA (it is enabled for you) "
                             f"or one made with `enable_lora({rank}, alpha={alpha:g})`.")
        self._check_lora_arrays(arrays, layers, rank, source)
        _check_factor_values(arrays, source)
        if kernels_merged and not self.lora_enabled:
            raise ValueError("`kernels_merged=True` takes the factors out of kernels that hold them merged, "
                             "so LoRA must be enabled before the merged weights load. Call "
                             f"`enable_lora({rank}, alpha={alpha:g})`, then `load_weights`, then this.")
        if not self.lora_enabled:
            self.enable_lora(rank, alpha=alpha)
        for layer in layers:
            a, b = (arrays[f"{layer.path}/{factor}"] for factor in FACTORS)
            if kernels_merged:
                kernel = _base_kernel(layer)
                merged = keras.ops.convert_to_numpy(kernel.value).astype("float64")
                scale = layer.lora_alpha / layer.lora_rank
                kernel.assign((merged - scale * (a.astype("float64") @ b.astype("float64"))).astype(kernel.dtype))
            layer.lora_kernel_a.assign(a)
            layer.lora_kernel_b.assign(b)

    def _adapted_layers(self, action):
        layers = [layer for layer in self.lora_layers() if layer.lora_enabled]
        if not layers:
            raise ValueError(f"LoRA is not enabled on this {type(self).__name__}: there are no factors to {action}. "
                             "Call `model.enable_lora(rank)` and train first.")
        return layers

    def _check_lora_arrays(self, arrays, layers, rank, source):
        """Refuse, before anything changes, factors that do not fit this model's layers."""
        expected = {}
        for layer in layers:
            inputs, outputs = layer.kernel.shape
            expected[f"{layer.path}/lora_kernel_a"] = (int(inputs), rank)
            expected[f"{layer.path}/lora_kernel_b"] = (rank, int(outputs))
        stored = set(arrays) - {RANK_KEY, ALPHA_KEY}
        missing, extra = sorted(set(expected) - stored), sorted(stored - set(expected))
        wrong = sorted(key for key in set(expected) & stored if tuple(arrays[key].shape) != expected[key])
        if missing or extra or wrong:
            details = "; ".join(part for part in (
                f"missing {', '.join(missing[:4])}" if missing else "",
                f"for layers this model lacks: {', '.join(extra[:4])}" if extra else "",
                ", ".join(f"{key} {tuple(arrays[key].shape)} instead of {expected[key]}" for key in wrong[:4]),
            ) if part)
            raise ValueError(f"{source} does not fit this model with its {RANK_KEY!r} of {rank} ({details}). It was "
                             "saved from another architecture, or damaged; load it on the model it was trained with "
                             "(same variant and blocks).")


def _rank_and_alpha(arrays, source):
    """The file's rank (a positive integer scalar) and alpha (a finite real scalar), each checked."""
    missing = [key for key in (RANK_KEY, ALPHA_KEY) if key not in arrays]
    if missing:
        raise ValueError(f"{source} is not a LoRA weights file: it has no {' and no '.join(map(repr, missing))}. "
                         f"{_GIVE}")
    rank, alpha = np.asarray(arrays[RANK_KEY]), np.asarray(arrays[ALPHA_KEY])
    if rank.shape != () or rank.dtype.kind not in "iu" or int(rank) <= 0:
        raise ValueError(f"{source}: {RANK_KEY!r} must be a positive integer scalar. Received: {_described(rank)}. "
                         f"The file is damaged. {_GIVE}")
    if alpha.shape != () or alpha.dtype.kind not in "iuf" or not np.isfinite(alpha):
        raise ValueError(f"{source}: {ALPHA_KEY!r} must be a finite real scalar. Received: {_described(alpha)}. "
                         f"The file is damaged. {_GIVE}")
    return int(rank), float(alpha)


def _check_factor_values(arrays, source):
    """Refuse factors that are not floating point, or hold NaN or infinity, naming each."""
    factors = {key: np.asarray(value) for key, value in arrays.items() if key not in (RANK_KEY, ALPHA_KEY)}
    not_float = sorted(f"{key} ({value.dtype})" for key, value in factors.items() if value.dtype.kind != "f")
    if not_float:
        raise ValueError(f"{source}: LoRA factors hold floating-point numbers, but {', '.join(not_float[:4])} "
                         f"do not. The file is damaged. {_GIVE}")
    bad = sorted(f"{key} ({int(value.size - np.isfinite(value).sum())} of {value.size} values)"
                 for key, value in factors.items() if not np.isfinite(value).all())
    if bad:
        raise ValueError(
            f"{source} has LoRA factors that are NaN or infinite: {', '.join(bad[:4])}"
            + (f" and {len(bad) - 4} more" if len(bad) > 4 else "")
            + ". A model with them predicts NaN. The training run that wrote it diverged or the file is damaged; "
            "load the factors of an earlier epoch, or train again with a lower learning rate."
        )
