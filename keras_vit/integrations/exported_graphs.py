"""Run an exported graph in its own runtime: TensorFlow, onnxruntime or LiteRT.

Each runtime is imported inside its function, only when an export is
checked or a user runs one (`keras_vit.workflows.export.run_exported`).
"""

import numpy as np


def run_saved_model(directory, images):
    """A TensorFlow SavedModel's `serve` signature on `images` (TensorFlow)."""
    import tensorflow as tf

    # Kept in a name while `serve` runs: the function refers to the loaded object's variables.
    loaded = tf.saved_model.load(directory)
    return np.asarray(loaded.serve(tf.constant(images)))


def run_onnx(path, images):
    """An ONNX graph's first output on `images` (onnxruntime, CPU)."""
    import onnxruntime

    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: images})[0]


def run_litert(path, images):
    """A LiteRT (TFLite) graph's first output on `images`, at any batch size.

    Uses `ai_edge_litert`'s interpreter, else TensorFlow's `tf.lite`.
    """
    try:
        from ai_edge_litert.interpreter import Interpreter
    except ImportError:
        from tensorflow.lite import Interpreter
    interpreter = Interpreter(model_path=path)
    source = interpreter.get_input_details()[0]
    interpreter.resize_tensor_input(source["index"], images.shape)
    interpreter.allocate_tensors()
    interpreter.set_tensor(source["index"], images)
    interpreter.invoke()
    return interpreter.get_tensor(interpreter.get_output_details()[0]["index"])
