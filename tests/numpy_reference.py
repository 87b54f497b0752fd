"""An independent numpy forward pass of the ViT, for checking our models.

Written from the paper's equations (1)-(4), not from keras_vit's code: it
takes plain arrays, cuts patches with explicit loops, and uses float64.
"""

import math

import numpy as np


def layer_norm(x, gamma, beta, epsilon):
    mean = x.mean(-1, keepdims=True)
    variance = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(variance + epsilon) * gamma + beta


def gelu(x):
    erf = np.vectorize(math.erf)
    return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))


def softmax(x):
    x = x - x.max(-1, keepdims=True)
    e = np.exp(x)
    return e / e.sum(-1, keepdims=True)


def patchify(image, patch):
    """One image (H, W, C) -> (N, P*P*C), patches row by row, (row, col, ch) inside."""
    height, width, _ = image.shape
    rows = []
    for top in range(0, height, patch):
        for left in range(0, width, patch):
            rows.append(image[top : top + patch, left : left + patch, :].reshape(-1))
    return np.stack(rows)


def attention(x, w, num_heads):
    tokens, width = x.shape
    head = width // num_heads
    q = x @ w["wq"] + w["bq"]
    k = x @ w["wk"] + w["bk"]
    v = x @ w["wv"] + w["bv"]
    out = np.zeros_like(x)
    for h in range(num_heads):
        cols = slice(h * head, (h + 1) * head)
        probs = softmax(q[:, cols] @ k[:, cols].T / math.sqrt(head))
        out[:, cols] = probs @ v[:, cols]
    return out @ w["wo"] + w["bo"]


def vit_forward(images, weights, patch, num_heads, epsilon, mean, std, scale):
    """Tokens after the final LayerNorm for a batch of raw images.

    `weights` is a dict: `projection_w (P*P*C, D)`, `projection_b`, `cls (D,)`,
    `pos (N+1, D)`, `blocks` (a list of dicts with `ln1_g, ln1_b, wq, bq, wk,
    bk, wv, bv, wo, bo, ln2_g, ln2_b, w1, b1, w2, b2`), `norm_g`, `norm_b`.
    """
    outputs = []
    for image in images.astype("float64"):
        image = (image * scale - np.asarray(mean)) / np.asarray(std)
        z = patchify(image, patch) @ weights["projection_w"] + weights["projection_b"]  # eq. 1
        z = np.concatenate([weights["cls"][None], z]) + weights["pos"]
        for block in weights["blocks"]:
            z = z + attention(layer_norm(z, block["ln1_g"], block["ln1_b"], epsilon), block, num_heads)  # eq. 2
            hidden = gelu(layer_norm(z, block["ln2_g"], block["ln2_b"], epsilon) @ block["w1"] + block["b1"])
            z = z + hidden @ block["w2"] + block["b2"]  # eq. 3
        outputs.append(layer_norm(z, weights["norm_g"], weights["norm_b"], epsilon))  # eq. 4
    return np.stack(outputs)
