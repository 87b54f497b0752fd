"""Attention of a ViT in numpy, from the paper's equations, for checking keras_vit.inspection.

Written from the definitions, not from keras_vit's code: patches are cut with
loops (tests/numpy_reference.py), every head's softmax(q k^T / sqrt(d)) is
computed per image in float64, and the rollout and distances are loops over
tokens.
"""

import math

import keras
import numpy as np

from keras_vit.layers.attention import qkv_column_order
from tests import numpy_reference as ref


def to_numpy(x):
    return keras.ops.convert_to_numpy(x).astype("float64")


def block_weights(block):
    kernel, bias = [to_numpy(w) for w in block.attention.qkv.weights]
    width = kernel.shape[0]
    # Back to timm's q | k | v columns from the layer's per-head order.
    attention = block.attention
    to_timm = np.argsort(qkv_column_order(attention.num_heads, width // attention.num_heads))
    kernel, bias = kernel[:, to_timm], bias[to_timm]
    out_kernel, out_bias = [to_numpy(w) for w in block.attention.output_projection.weights]
    fc1, fc1_b = [to_numpy(w) for w in block.mlp.fc1.weights]
    fc2, fc2_b = [to_numpy(w) for w in block.mlp.fc2.weights]
    return {
        "wq": kernel[:, :width], "wk": kernel[:, width : 2 * width], "wv": kernel[:, 2 * width :],
        "bq": bias[:width], "bk": bias[width : 2 * width], "bv": bias[2 * width :],
        "wo": out_kernel, "bo": out_bias,
        "ln1": [to_numpy(w) for w in block.norm1.weights], "ln2": [to_numpy(w) for w in block.norm2.weights],
        "w1": fc1, "b1": fc1_b, "w2": fc2, "b2": fc2_b, "epsilon": block.norm1.epsilon,
    }


def heads_attention(x, w, num_heads):
    """x (T, D) -> (output (T, D), probabilities (heads, T, T))."""
    head = x.shape[1] // num_heads
    q, k, v = x @ w["wq"] + w["bq"], x @ w["wk"] + w["bk"], x @ w["wv"] + w["bv"]
    out = np.zeros_like(x)
    probabilities = []
    for h in range(num_heads):
        cols = slice(h * head, (h + 1) * head)
        p = ref.softmax(q[:, cols] @ k[:, cols].T / math.sqrt(head))
        probabilities.append(p)
        out[:, cols] = p @ v[:, cols]
    return out @ w["wo"] + w["bo"], np.stack(probabilities)


def tokens_in(backbone, image, stem=None):
    """Eq. 1: prefix tokens, projected patches and position embedding for one raw image."""
    image = image.astype("float64") * backbone.pixel_scale
    image = (image - np.asarray(backbone.pixel_mean)) / np.asarray(backbone.pixel_std)
    if stem is not None:
        image = stem(image)
    encoder = backbone.get_layer("patch_encoder")
    kernel, bias = [to_numpy(w) for w in encoder.projection.weights]
    patch_h, patch_w = backbone.patch_size
    assert patch_h == patch_w
    z = ref.patchify(image, patch_h) @ kernel + bias
    prefix = []
    if encoder.use_class_token:
        prefix.append(to_numpy(encoder.class_token)[0])
    if encoder.num_register_tokens:
        prefix.append(to_numpy(encoder.register_tokens)[0])
    if encoder.position_embedding == "learned":
        table = to_numpy(encoder.position_embedding_table)[0]
        if encoder.prefix_position_embedding:
            z = np.concatenate(prefix + [z]) + table
        else:
            z = np.concatenate(prefix + [z + table])
    else:
        z = np.concatenate(prefix + [z])
    return z


def attention_reference(backbone, images, stem=None):
    """Attention probabilities of every block: (blocks, batch, heads, T, T), float64."""
    blocks = [backbone.get_layer(f"transformer_block_{i}") for i in range(backbone.num_layers)]
    weights = [block_weights(block) for block in blocks]
    result = []
    for image in images:
        z = tokens_in(backbone, image, stem)
        per_block = []
        for w in weights:
            attended, probabilities = heads_attention(ref.layer_norm(z, *w["ln1"], w["epsilon"]), w, backbone.num_heads)
            per_block.append(probabilities)
            z = z + attended  # eq. 2
            hidden = ref.gelu(ref.layer_norm(z, *w["ln2"], w["epsilon"]) @ w["w1"] + w["b1"])
            z = z + hidden @ w["w2"] + w["b2"]  # eq. 3
        result.append(np.stack(per_block))
    return np.stack(result, axis=1)


def rollout_reference(scores):
    """Abnar & Zuidema (2020): per block, mean over heads, 0.5 A + 0.5 I, chained from the first block.

    scores: (blocks, batch, heads, T, T). Returns (batch, T, T). Loops over
    images and blocks; the product is accumulated as R_l = A_l R_(l-1).
    """
    blocks, batch, heads, tokens, _ = scores.shape
    out = np.zeros((batch, tokens, tokens))
    for b in range(batch):
        joint = np.eye(tokens)
        for layer in range(blocks):
            mean = sum(scores[layer, b, h] for h in range(heads)) / heads
            # rows of `mean` sum to 1, so adding I and re-normalising halves both
            augmented = 0.5 * mean + 0.5 * np.eye(tokens)
            joint = augmented @ joint
        out[b] = joint
    return out


def mean_distance_reference(scores, grid_size, token_size, num_prefix_tokens):
    """Loops: for each image, head and query patch, sum_k a_qk * |centre_q - centre_k| / sum_k a_qk."""
    blocks, batch, heads = scores.shape[:3]
    rows, cols = grid_size
    result = np.zeros((blocks, heads))
    for layer in range(blocks):
        for h in range(heads):
            total = 0.0
            for b in range(batch):
                for q in range(rows * cols):
                    qy, qx = (q // cols + 0.5) * token_size[0], (q % cols + 0.5) * token_size[1]
                    weighted = mass = 0.0
                    for k in range(rows * cols):
                        ky, kx = (k // cols + 0.5) * token_size[0], (k % cols + 0.5) * token_size[1]
                        a = scores[layer, b, h, num_prefix_tokens + q, num_prefix_tokens + k]
                        weighted += a * math.hypot(qy - ky, qx - kx)
                        mass += a
                    total += weighted / mass
            result[layer, h] = total / (batch * rows * cols)
    return result
