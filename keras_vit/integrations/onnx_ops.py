"""ONNX conversion rules that the exporters Keras uses lack, registered on demand.

Keras exports ONNX from the TensorFlow backend through tf2onnx. Keras' exact
GELU on TensorFlow is written with `erfc`, which ONNX has no operator for
and tf2onnx 1.17 has no rule for, so the export of every ViT MLP fails with
"No Op registered for Erfc". The rule below writes it as `1 - Erf(x)`
(ONNX has `Erf` since opset 9): the cancellation near erfc(x) ~ 0 costs
about 1e-7 absolute, and GELU multiplies it by x / 2 at x < 0, where the
result is ~0 anyway.
"""

_registered = False


def register_tf2onnx_rules():
    """Teach tf2onnx the TensorFlow ops keras_vit's graphs use that it lacks (`Erfc`). Idempotent."""
    global _registered
    if _registered:
        return
    import numpy as np
    from tf2onnx import utils
    from tf2onnx.handler import tf_op

    @tf_op("Erfc")
    class Erfc:  # noqa: F841 - registered by the decorator
        @classmethod
        def version_9(cls, ctx, node, **kwargs):
            dtype = ctx.get_dtype(node.input[0])
            one = ctx.make_const(utils.make_name(f"{node.name}_one"),
                                 np.array(1, dtype=utils.map_onnx_to_numpy_type(dtype)))
            node.type = "Erf"  # node now computes erf(x); 1 - erf(x) takes its consumers
            complement = ctx.insert_new_node_on_output("Sub", node.output[0], name=utils.make_name(f"{node.name}_1m"))
            ctx.replace_inputs(complement, [one.output[0], node.output[0]])
            ctx.set_dtype(complement.output[0], dtype)
            ctx.copy_shape(node.output[0], complement.output[0])

    _registered = True
