"""Rematerialisation (gradient checkpointing) of a keras_vit model's transformer blocks.

`Rematerialisation` is a mixin of `ViTModel`: `set_remat` switches every
block to `keras.remat`. It is a training-time memory choice, not part of
the model's config.
"""

from keras_vit.models.lora import transformer_blocks


class Rematerialisation:
    """`set_remat` on every transformer block of the model (a mixin of `ViTModel`)."""

    def set_remat(self, enabled=True):
        """Recompute each transformer block's activations in the backward pass instead of keeping them.

        Gradient checkpointing, as `timm`'s `set_grad_checkpointing` and
        Hugging Face's `gradient_checkpointing_enable`: during training
        only each block's input is kept, and the block runs forward again
        when its gradients are computed (`keras.remat`: `jax.checkpoint`,
        `tf.recompute_grad`, `torch.utils.checkpoint`). Memory for
        activations falls from every intermediate of every block to one
        tensor per block; a training step does one more forward pass.
        Inference is unaffected. Not saved with the model; call it before
        `fit`.

        The blocks must be deterministic in training (`dropout`,
        `attention_dropout` and `drop_path_rate` 0, the defaults): the
        recomputation would otherwise draw its own dropout masks (on JAX it
        cannot draw them at all), so the gradients would not be those of
        the forward pass.

        Args:
            enabled: bool. Defaults to `True`.

        Raises:
            ValueError: a block drops units or paths in training.
        """
        blocks = transformer_blocks(self)
        random = sorted({name for block in blocks for name in ("dropout", "attention_dropout", "drop_path")
                         if getattr(block, name)})
        if enabled and random:
            raise ValueError(
                "Rematerialisation recomputes each block in the backward pass, and these blocks draw random "
                f"masks in training ({', '.join(random)} > 0): the recomputed pass would not match the forward "
                "one. Build the model with dropout=0.0, attention_dropout=0.0 and drop_path_rate=0.0 (the "
                "defaults) to use set_remat, or train without it."
            )
        for block in blocks:
            block.rematerialize = bool(enabled)
        self.train_function = None  # a compiled step would keep the old choice
