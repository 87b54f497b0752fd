"""Helpers shared by the model tests: our weights in the numpy reference's layout."""

import keras
import numpy as np

from keras_vit.layers.attention import qkv_column_order


def to_numpy(x):
    return keras.ops.convert_to_numpy(x)


def randomise(model, seed=0):
    """Give every weight random values so zero-initialised ones are tested too."""
    rng = np.random.default_rng(seed)
    for weight in model.weights:
        weight.assign(rng.normal(scale=0.3, size=weight.shape).astype("float32"))


def _values(layer):
    return [to_numpy(w).astype("float64") for w in layer.weights]


def block_weights(block):
    """One TransformerBlock's weights as the numpy reference's dict."""
    qkv_w, qkv_b = _values(block.attention.qkv)
    width = qkv_w.shape[0]
    # The fused kernel groups its columns per head; back to timm's q | k | v.
    to_timm = np.argsort(qkv_column_order(block.num_heads, width // block.num_heads))
    qkv_w, qkv_b = qkv_w[:, to_timm], qkv_b[to_timm]
    entry = dict(zip(("ln1_g", "ln1_b"), _values(block.norm1)))
    entry.update(zip(("ln2_g", "ln2_b"), _values(block.norm2)))
    entry.update(zip(("wo", "bo"), _values(block.attention.output_projection)))
    entry.update(zip(("w1", "b1"), _values(block.mlp.fc1)))
    entry.update(zip(("w2", "b2"), _values(block.mlp.fc2)))
    # In timm's order the columns are q, k, v.
    for i, part in enumerate("qkv"):
        entry[f"w{part}"] = qkv_w[:, i * width : (i + 1) * width]
        entry[f"b{part}"] = qkv_b[i * width : (i + 1) * width]
    return entry


def reference_weights(backbone):
    """Read our model's weights into the numpy reference's plain layout."""
    encoder = backbone.get_layer("patch_encoder")
    kernel, bias = _values(encoder.projection)
    weights = {
        "projection_w": kernel,
        "projection_b": bias,
        "cls": to_numpy(encoder.class_token)[0, 0],
        "registers": to_numpy(encoder.register_tokens)[0] if encoder.num_register_tokens else None,
        "pos": to_numpy(encoder.position_embedding_table)[0],
        "blocks": [block_weights(backbone.get_layer(f"transformer_block_{i}")) for i in range(backbone.num_layers)],
    }
    weights["norm_g"], weights["norm_b"] = _values(backbone.get_layer("final_norm"))
    return weights
