"""Torch's fused Adam kernel as the update step of `keras_vit.optimizers.AdamW`.

Keras' AdamW on the torch backend updates all weights with `torch._foreach_*`
operations, each of which makes a temporary list as large as the model.
`adam_update` runs torch's fused Adam kernel once per step instead: it reads
and writes every tensor once and allocates nothing model-sized. It is an
optimizer step, not a layer operation, so it sits here with the other
optimizer integration (`tf_optimizers`), not in `keras_vit.layers.fused`.

Its reference is Keras' Adam formula, which `adam_update` computes with
`keras.ops` on every other backend (the test's reference on all three);
`keras_vit.optimizers.AdamW` calls it only where `has_fused_adam` holds, on
torch. PyTorch is imported inside the functions, when torch runs.
"""

import math

import keras
from keras import ops


def _is_torch():
    return keras.backend.backend() == "torch"


def has_fused_adam(variables, grads):
    """Whether `adam_update` runs a fused kernel for these variables.

    Only on torch, and only for variables of one floating dtype on one
    device with gradients of that dtype (what torch's kernel takes). Not
    inside `torch.compile` (`jit_compile=True`): inductor cannot trace the
    kernel's in-place writes to the weights ("mutating a non-functional
    tensor with a functional tensor"), and it fuses Keras' own update into
    a few kernels itself.
    """
    if not _is_torch() or not variables:
        return False
    import torch

    if torch.compiler.is_compiling():
        return False
    dtype = variables[0].dtype
    if not keras.backend.is_float_dtype(dtype) or any(v.dtype != dtype for v in variables):
        return False
    if any(g is None or keras.backend.standardize_dtype(g.dtype) != dtype for g in grads):
        return False
    device = variables[0].value.device
    return all(v.value.device == device for v in variables)


def adam_update(variables, grads, momentums, velocities, learning_rate, step, beta_1, beta_2, epsilon):
    """One Adam step on a list of variables, in place, as Keras defines it.

    Reference formula (`keras.optimizers.Adam.update_step`, per variable):

        alpha = lr * sqrt(1 - beta_2**step) / (1 - beta_1**step)
        m += (g - m) * (1 - beta_1)
        v += (g**2 - v) * (1 - beta_2)
        variable -= alpha * m / (sqrt(v) + epsilon)

    On torch this is one call of torch's fused Adam kernel over all
    variables, which reads and writes each tensor once and allocates
    nothing model-sized. torch's kernel adds epsilon after the bias
    correction (`sqrt(v) / sqrt(1 - beta_2**step) + eps`), so it gets
    `epsilon / sqrt(1 - beta_2**step)`: the same update as Keras'.

    Args:
        variables: list of `keras.Variable`, updated in place.
        grads: list of gradient tensors, one per variable.
        momentums: list of `keras.Variable` (first moments), updated.
        velocities: list of `keras.Variable` (second moments), updated.
        learning_rate: float or scalar tensor.
        step: int or scalar tensor. The step number, counting from 1.
        beta_1: float.
        beta_2: float.
        epsilon: float.
    """
    if _is_torch():
        import torch

        step = float(ops.convert_to_numpy(step))
        learning_rate = float(ops.convert_to_numpy(learning_rate))
        corrected_epsilon = epsilon / math.sqrt(1.0 - beta_2**step)
        params = [v.value for v in variables]
        grads = [ops.convert_to_tensor(g) for g in grads]
        # The kernel only reads the step count: one tensor serves every weight.
        steps = [torch.tensor(step, dtype=torch.float32, device=params[0].device)] * len(params)
        with torch.no_grad():
            torch._fused_adam_(
                params,
                grads,
                [m.value for m in momentums],
                [v.value for v in velocities],
                [],
                steps,
                lr=learning_rate,
                beta1=beta_1,
                beta2=beta_2,
                weight_decay=0.0,
                eps=corrected_epsilon,
                amsgrad=False,
                maximize=False,
            )
        return
    for variable, grad, m, v in zip(variables, grads, momentums, velocities):
        dtype = variable.dtype
        grad = ops.cast(grad, dtype)
        step_t = ops.cast(step, dtype)
        alpha = (
            ops.cast(learning_rate, dtype)
            * ops.sqrt(1 - ops.power(ops.cast(beta_2, dtype), step_t))
            / (1 - ops.power(ops.cast(beta_1, dtype), step_t))
        )
        m.assign_add(ops.multiply(ops.subtract(grad, m), 1 - beta_1))
        v.assign_add(ops.multiply(ops.subtract(ops.square(grad), v), 1 - beta_2))
        variable.assign_sub(ops.divide(ops.multiply(m, alpha), ops.add(ops.sqrt(v), epsilon)))
