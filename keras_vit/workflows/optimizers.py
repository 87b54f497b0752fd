"""Keras' SGD and AdamW, made to train under `tf.distribute` as on one device; AdamW fused on PyTorch."""

import keras

from keras_vit.integrations import tf_optimizers, torch_optimizers
from keras_vit.utils.renames import refuse_unknown, renamed_argument


class ReplicaSummedGradients:
    """Mixin: under a `tf.distribute` strategy, clip and accumulate the replicas' summed gradients.

    Mixed into a `keras.optimizers.Optimizer` subclass (before it in the
    bases). Keras 3's TensorFlow optimizer clips each replica's partial
    gradient before it sums the replicas' gradients, so with `clipnorm`,
    `clipvalue` or `global_clipnorm` N replicas train differently from one
    device on the same global batches; and its `gradient_accumulation_steps`
    fails under any strategy (Keras issue 20582). Under a strategy this
    optimizer sums the gradients across replicas first, clips and
    accumulates the sum, and updates every replica with it
    (`keras_vit.integrations.tf_optimizers.apply_summed`), which costs one
    all-reduce per batch, as Keras' unclipped step does.

    Everywhere else (JAX, PyTorch, TensorFlow without a strategy, or with
    a strategy when neither clipping nor accumulation is on) it is Keras'
    optimizer unchanged. JAX steps the global batch at once, and
    keras_vit's PyTorch processes sum gradients before the optimizer runs,
    so both already clip the global gradient.
    """

    def build(self, variables):
        super().build(variables)
        # Which variables decay is decided here, once, not in the first update: Keras decides it lazily and keeps
        # the answers on the optimizer, so under torch.compile the first step changed what the compiled update's
        # guards read, and the second step compiled the backward pass and the update again.
        for variable in variables:
            self._use_weight_decay(variable)

    def _backend_apply_gradients(self, grads, trainable_variables):
        if tf_optimizers.can_apply_summed(self) and tf_optimizers.apply_summed(
                self, grads, trainable_variables, super()._clip_gradients):
            return
        super()._backend_apply_gradients(grads, trainable_variables)


def _keras_backend_class(keras_class):
    """The class Keras makes for `keras_class` on this backend.

    On torch Keras swaps its optimizers for subclasses that update all
    variables with `torch._foreach_*` operations (in `__new__`, for the
    exact class only, so a subclass of `keras.optimizers.SGD` would lose
    them); elsewhere this is `keras_class`. `__new__` alone runs: nothing is
    built.
    """
    return type(keras_class.__new__(keras_class))


@keras.saving.register_keras_serializable(package="keras_vit")
class SGD(ReplicaSummedGradients, _keras_backend_class(keras.optimizers.SGD)):
    """`keras.optimizers.SGD` that clips and accumulates like one device under a `tf.distribute` strategy.

    The same optimizer as `keras.optimizers.SGD` (same arguments, variables,
    update and config); it differs only under a TensorFlow `tf.distribute`
    strategy, where Keras' SGD clips each replica's part of the gradient
    instead of the global gradient and cannot accumulate gradients at all
    (see `ReplicaSummedGradients`).

    Args:
        learning_rate: float, schedule or callable. Defaults to `0.01`.
        momentum: float. Defaults to `0.0`.
        nesterov: bool. Defaults to `False`.
        **kwargs: Any other argument of `keras.optimizers.SGD` (weight
            decay, gradient clipping, EMA, loss scale, gradient
            accumulation, `name`).

    Example:

    >>> model.compile(optimizer=keras_vit.optimizers.SGD(0.01, momentum=0.9, global_clipnorm=1.0),
    ...               loss="sparse_categorical_crossentropy")
    """


@keras.saving.register_keras_serializable(package="keras_vit")
class AdamW(ReplicaSummedGradients, keras.optimizers.AdamW):
    """`keras.optimizers.AdamW`, with a fused update on the torch backend, distributed right on TensorFlow.

    The same optimizer as `keras.optimizers.AdamW` (same arguments, same
    variables, same update, same config), so `fit`, checkpoints and `.keras`
    files treat it as one. What differs is how the torch backend runs the
    update: Keras' own AdamW there updates all weights with `torch._foreach_*`
    operations, each of which makes a temporary list as large as the model
    (`g**2`, `m * alpha`, `sqrt(v) + epsilon`, their quotient). This one calls
    torch's fused Adam kernel once per step (`keras_vit.integrations.torch_optimizers`), which
    reads and writes every tensor once and allocates nothing model-sized: a
    ViT-B/16 training step uses less memory and less time. On JAX and
    TensorFlow it is `keras.optimizers.AdamW` unchanged (XLA fuses the update
    itself). Under a TensorFlow `tf.distribute` strategy it clips and
    accumulates the replicas' summed gradients, as one device would (Keras'
    AdamW clips each replica's part and cannot accumulate there; see
    `ReplicaSummedGradients`).

    Weight decay is Keras' (`variable -= variable * weight_decay * lr`,
    before the Adam step, honouring `exclude_from_weight_decay`). `amsgrad`,
    and variables of mixed dtypes or devices, take Keras' own path.

    Args:
        learning_rate: float, schedule or callable. Defaults to `0.001`.
        weight_decay: float. Defaults to `0.004`.
        beta_1: float. Defaults to `0.9`.
        beta_2: float. Defaults to `0.999`.
        epsilon: float. Defaults to `1e-7`.
        amsgrad: bool. Defaults to `False`.
        **kwargs: Any other argument of `keras.optimizers.AdamW` (gradient
            clipping, EMA, loss scale, gradient accumulation, `name`).

    Example:

    >>> model.compile(optimizer=keras_vit.workflows.optimizers.AdamW(1e-3, weight_decay=0.05),
    ...               loss="sparse_categorical_crossentropy")
    """

    def _backend_update_step(self, grads, trainable_variables, learning_rate):
        if not self._can_fuse(grads, trainable_variables):
            return super()._backend_update_step(grads, trainable_variables, learning_rate)
        indices = [self._get_variable_index(v) for v in trainable_variables]
        torch_optimizers.adam_update(
            trainable_variables,
            grads,
            [self._momentums[i] for i in indices],
            [self._velocities[i] for i in indices],
            learning_rate=self._get_current_learning_rate(),
            step=self.iterations + 1,
            beta_1=self.beta_1,
            beta_2=self.beta_2,
            epsilon=self.epsilon,
        )

    def _can_fuse(self, grads, trainable_variables):
        return not self.amsgrad and torch_optimizers.has_fused_adam(trainable_variables, grads)


def warmup_cosine_schedule(peak, warmup_updates, total_updates, batches_per_update=1):
    """Linear warm-up then cosine decay, in which every optimizer update has a non-zero learning rate.

    Update `u` (counted from 0) runs at `peak * (u + 1) / warmup_updates`
    during the warm-up (its last update at `peak`), then at
    `peak * (1 + cos(pi * (u + 1 - warmup_updates) / (total_updates - warmup_updates + 1))) / 2`,
    which stays above zero up to the last update. A warm-up from 0 at update
    0, as Keras' `CosineDecay(0.0, ...)` gives, would spend the first update
    on nothing: on a small folder that is one update of ten.

    Keras evaluates a schedule at the batch count, not the update count
    (with `gradient_accumulation_steps=k`, update `u` is applied at batch
    `k * (u + 1) - 1`), so the schedule is laid out in batches: it takes
    the values above at the batches that apply an update.

    Args:
        peak: float. Learning rate at the end of the warm-up.
        warmup_updates: int. Updates of the warm-up (at least 1).
        total_updates: int. Updates of the whole run.
        batches_per_update: int. Batches accumulated per update. Defaults
            to `1`.

    Returns:
        A `keras.optimizers.schedules.CosineDecay` (Keras' own, so a
        `.keras` file holding the optimizer loads without keras_vit).
    """
    warmup_updates = max(1, int(warmup_updates))
    total_updates = max(warmup_updates, int(total_updates))
    first = peak / (batches_per_update * warmup_updates)
    # Keras' warm-up is linear from `initial_learning_rate` at batch 0 to
    # `warmup_target` at batch `warmup_steps`: the line through the updates'
    # values, batch b -> peak * (b + 1) / (k * W), starts at peak / (k * W) and
    # reaches peak at batch k * W - 1, the batch of the warm-up's last update.
    return keras.optimizers.schedules.CosineDecay(
        initial_learning_rate=first,
        warmup_target=peak,
        warmup_steps=batches_per_update * warmup_updates - 1,
        decay_steps=batches_per_update * (total_updates - warmup_updates + 1),
    )


def build_optimizer(name=None, learning_rate=None, total_updates=None, weight_decay=0.0, warmup_fraction=0.1,
                    global_clipnorm=None, accumulation=1, **kwargs):
    """The optimizer of every training command: keras_vit's `SGD` or `AdamW` under a warm-up and cosine decay.

    `keras-vit train`, `pretrain` and `finetune` all build theirs here, so a
    job trains alike on every engine: these optimizers are Keras' own on
    one process, on JAX and on PyTorch, and under a `tf.distribute`
    strategy (TensorFlow workers included) they sum the replicas' gradients
    before they clip or accumulate, where Keras' clip each replica's part.

    Args:
        name: str. The optimizer: `"sgd"` (momentum 0.9) or `"adamw"`.
            Called `kind` before; that keyword still works, with a
            `DeprecationWarning`.
        learning_rate: float. The peak learning rate, reached at the end of
            the warm-up.
        total_updates: int. Optimizer updates of the whole run (after
            accumulation).
        weight_decay: float. Decoupled weight decay (none for SGD at 0).
            Defaults to `0.0`.
        warmup_fraction: float. Share of the updates spent warming up.
            Defaults to `0.1`.
        global_clipnorm: float or `None`. Clip the gradient's global norm.
            Defaults to `None`.
        accumulation: int. Batches accumulated per update. Defaults to `1`.

    Returns:
        A `keras_vit.optimizers.SGD` or `AdamW`.
    """
    name = renamed_argument(kwargs, "kind", "name", name, "build_optimizer")
    refuse_unknown(kwargs, "build_optimizer")
    missing = [argument for argument, value in
               (("name", name), ("learning_rate", learning_rate), ("total_updates", total_updates)) if value is None]
    if missing:
        raise TypeError(f"build_optimizer() needs {', '.join(f'`{argument}`' for argument in missing)}.")
    total_updates = max(1, int(total_updates))
    schedule = warmup_cosine_schedule(learning_rate, max(1, int(total_updates * warmup_fraction)), total_updates,
                                      accumulation)
    common = {"learning_rate": schedule, "global_clipnorm": global_clipnorm,
              "gradient_accumulation_steps": accumulation if accumulation > 1 else None}
    if name == "sgd":
        return SGD(momentum=0.9, weight_decay=weight_decay or None, **common)
    if name == "adamw":
        return AdamW(weight_decay=weight_decay, **common)
    raise ValueError(f"`name` must be 'sgd' or 'adamw'. Received: name={name!r}")
