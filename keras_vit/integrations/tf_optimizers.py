"""An optimizer step under a `tf.distribute` strategy that computes what one device computes.

Keras 3's TensorFlow optimizer (Keras 3.15) gets each replica's partial
gradient (Keras scales each replica's loss by `1 / num_replicas`, so the
partial gradients sum to the global batch's gradient). It clips that
partial gradient (`clipnorm`, `clipvalue`, `global_clipnorm`) and only then
sums the replicas' gradients (`_backend_update_step`). With clipping on, N
replicas therefore train something else than one device does on the same
global batches: the norm of a part is not the norm of the sum.

Its gradient accumulation (`gradient_accumulation_steps`) does not run under
a strategy at all: it chooses between "accumulate" and "update" with a
conditional whose branches synchronise the replicas, which TensorFlow
refuses ("`merge_call` called while defining a new graph or a tf.function",
Keras issue 20582, open), even with one replica.

`apply_summed` replaces that step for the optimizer it is given: it sums the
replicas' gradients first (one all-reduce per batch, as Keras' unclipped
step costs), clips the sum, and updates every replica's weights with it, so
the weights and the optimizer's state stay equal on every replica. Under
accumulation the accumulators hold the summed gradients too (equal on every
replica and worker, so a checkpoint taken between two updates resumes right),
and the update is chosen inside each variable's update, where a conditional
may stand.

TensorFlow is imported inside functions: this module is used only when the
TensorFlow backend runs.
"""


# Keras internals (Keras 3.15) that the strategy step calls by name. A Keras without one of them keeps its own step.
_KERAS_INTERNALS = ("_clip_gradients", "_get_variable_index", "_use_weight_decay", "_iterations")


def can_apply_summed(optimizer):
    """True on the TensorFlow backend, with a Keras whose optimizer has what `apply_summed` calls."""
    import keras

    return keras.backend.backend() == "tensorflow" and all(hasattr(optimizer, name) for name in _KERAS_INTERNALS)


def strategy_replica_context():
    """The replica context of a `tf.distribute` strategy this code runs in, or `None`.

    `None` outside a strategy (the default strategy, one device: Keras'
    own step is right there) and in a strategy's cross-replica context
    (Keras' optimizer does not sum gradients there either).
    """
    import tensorflow as tf

    if not tf.distribute.has_strategy():
        return None
    return tf.distribute.get_replica_context()


def clips(optimizer):
    """True when `optimizer` clips gradients (`clipnorm`, `clipvalue` or `global_clipnorm` above 0)."""
    return any(value is not None and value > 0
               for value in (optimizer.clipnorm, optimizer.clipvalue, optimizer.global_clipnorm))


def apply_summed(optimizer, grads, trainable_variables, clip):
    """Update `trainable_variables` from the replicas' summed gradients, when Keras' step would not.

    Runs in a strategy's replica context when `optimizer` accumulates
    gradients (Keras' accumulation fails under any strategy), or clips them
    with more than one replica in sync (Keras clips each replica's part).
    Otherwise it does nothing and returns `False`: the caller then takes
    Keras' own step, which is right there. Optimizers with EMA
    (`use_ema=True`) always take Keras' step.

    What it does, per batch: sums the gradients over the replicas (one
    all-reduce); under accumulation adds the accumulated sum and divides by
    `gradient_accumulation_steps`, as Keras does on one device; clips with
    `clip`; and on an update batch applies weight decay and
    `optimizer.update_step` to every variable (on the other batches it
    only stores the new sum in the accumulators).

    Args:
        optimizer: a `keras.optimizers.Optimizer` of the TensorFlow backend
            whose update is `weight decay, then update_step` (SGD, AdamW,
            Adam and Keras' other optimizers that leave
            `_backend_apply_gradients` to the base class).
        grads: list of this replica's gradients, one per variable, already
            unscaled (`loss_scale_factor`) and without `None`.
        trainable_variables: the variables, as `optimizer.apply` passes them
            to `_backend_apply_gradients`.
        clip: Keras' clipping of a gradient list (the optimizer class's
            `_clip_gradients` before any override), called on the sum.

    Returns:
        `True` when it updated, `False` when the caller must take Keras' step.
    """
    import tensorflow as tf

    context = strategy_replica_context()
    if context is None or optimizer.use_ema:
        return False
    steps = optimizer.gradient_accumulation_steps
    replicas = context.num_replicas_in_sync
    if not steps and not (clips(optimizer) and replicas > 1):
        return False

    grads = [tf.convert_to_tensor(grad) for grad in grads]  # an IndexedSlices gradient, as a tensor
    if replicas > 1:
        grads = context.all_reduce(tf.distribute.ReduceOp.SUM, grads)
    if steps:
        accumulators = [optimizer._accumulated_gradients[optimizer._get_variable_index(variable)]
                        for variable in trainable_variables]
        # Every replica holds the same sums (each is assigned the all-reduced
        # gradient), so reading this replica's copy reads them all.
        totals = [grad + tf.cast(accumulator.value, grad.dtype) for grad, accumulator in zip(grads, accumulators)]
        is_update = tf.equal((optimizer._iterations + 1) % steps, 0)
        update_grads = clip([total / steps for total in totals])
        new_sums = [tf.where(is_update, tf.zeros_like(total), total) for total in totals]
    else:
        accumulators, new_sums, is_update = [], [], tf.constant(True)
        update_grads = clip(grads)
    learning_rate = optimizer.learning_rate

    def update(variable, grad, is_update, learning_rate):
        def weight_decay_and_step():
            # Keras' TensorFlow `_apply_weight_decay`, then its update: here
            # because weight decay's own cross-replica call cannot be made
            # inside this update.
            if optimizer.weight_decay is not None and optimizer._use_weight_decay(variable):
                lr = tf.cast(learning_rate, variable.dtype)
                wd = tf.cast(optimizer.weight_decay, variable.dtype)
                variable.assign_sub(variable * wd * lr)
            optimizer.update_step(grad, variable, learning_rate)

        if not steps:
            return weight_decay_and_step()
        # The conditional stands here, inside one replica's update of one
        # variable, where nothing synchronises.
        return tf.cond(is_update, weight_decay_and_step, lambda: None)

    def merged(strategy, update_grads, new_sums, is_update, learning_rate):
        for variable, grad in zip(trainable_variables, update_grads):
            strategy.extended.update(_tf_variable(variable), update, args=(grad, is_update, learning_rate),
                                     group=False)
        for accumulator, new_sum in zip(accumulators, new_sums):
            strategy.extended.update(_tf_variable(accumulator), _assign, args=(new_sum,), group=False)

    tf.__internal__.distribute.interim.maybe_merge_call(
        merged, context.strategy, update_grads, new_sums, is_update, learning_rate)
    return True


def _assign(variable, value):
    import tensorflow as tf

    variable.assign(tf.cast(value, variable.dtype))


def _tf_variable(variable):
    """The `tf.Variable` (a distributed one under a strategy) behind a `keras.Variable`."""
    import keras

    return variable.value if isinstance(variable, keras.Variable) else variable
