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


def gelu_tanh(x):
    """GELU with the tanh approximation (Flax's `nn.gelu` default, big_vision's MLPs)."""
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


ACTIVATIONS = {"gelu": gelu, "gelu_tanh": gelu_tanh}


def softmax(x):
    x = x - x.max(-1, keepdims=True)
    e = np.exp(x)
    return e / e.sum(-1, keepdims=True)


def patchify(image, patch):
    """One image (H, W, C) -> (N, Ph*Pw*C), patches row by row, (row, col, ch) inside.

    `patch` is an int (square patches) or a pair (height, width).
    """
    patch_h, patch_w = (patch, patch) if np.isscalar(patch) else patch
    height, width, _ = image.shape
    rows = []
    for top in range(0, height, patch_h):
        for left in range(0, width, patch_w):
            rows.append(image[top : top + patch_h, left : left + patch_w, :].reshape(-1))
    return np.stack(rows)


def attention(x, w, num_heads, return_probabilities=False):
    """Multi-head self-attention of one token sequence (T, D).

    With `return_probabilities`, also returns the (num_heads, T, T)
    softmax(q k^T / sqrt(d)) of every head (query rows, key columns).
    """
    tokens, width = x.shape
    head = width // num_heads
    q = x @ w["wq"] + w["bq"]
    k = x @ w["wk"] + w["bk"]
    v = x @ w["wv"] + w["bv"]
    out = np.zeros_like(x)
    all_probs = []
    for h in range(num_heads):
        cols = slice(h * head, (h + 1) * head)
        probs = softmax(q[:, cols] @ k[:, cols].T / math.sqrt(head))
        out[:, cols] = probs @ v[:, cols]
        all_probs.append(probs)
    out = out @ w["wo"] + w["bo"]
    if return_probabilities:
        return out, np.stack(all_probs)
    return out


def map_head(tokens, w, num_heads, epsilon, activation="gelu"):
    """Multi-head attention pooling of one token sequence (T, D) -> (D,), as the MAP paper defines it.

    A learned probe (D,) is the single query of a multi-head attention over
    the tokens (keys and values), the result is projected back, and a
    pre-LayerNorm MLP with a residual follows:
    `y = MHA(probe, tokens); pooled = y + MLP(LN(y))`.

    `w` is a dict: `probe (D,)`, `wq, bq, wk, bk, wv, bv, wo, bo` (as in
    `attention`), `ln_g, ln_b`, `w1, b1, w2, b2`.
    """
    width = tokens.shape[-1]
    head = width // num_heads
    q = w["probe"] @ w["wq"] + w["bq"]  # (D,)
    k = tokens @ w["wk"] + w["bk"]  # (T, D)
    v = tokens @ w["wv"] + w["bv"]
    attended = np.zeros(width)
    for h in range(num_heads):
        cols = slice(h * head, (h + 1) * head)
        probs = softmax(k[:, cols] @ q[cols] / math.sqrt(head))  # (T,)
        attended[cols] = probs @ v[:, cols]
    y = attended @ w["wo"] + w["bo"]
    hidden = ACTIVATIONS[activation](layer_norm(y, w["ln_g"], w["ln_b"], epsilon) @ w["w1"] + w["b1"])
    return y + hidden @ w["w2"] + w["b2"]


def vit_forward(images, weights, patch, num_heads, epsilon, mean, std, scale, intermediates=False, activation="gelu"):
    """Tokens after the final LayerNorm for a batch of raw images.

    `weights` is a dict: `projection_w (P*P*C, D)`, `projection_b`, `cls (D,)`
    (or `None`: no class token, as in big_vision's MAP and GAP models),
    optional `registers (R, D)` (register tokens placed after the class
    token), `pos (1+R+N, D)`, `blocks` (a list of dicts with `ln1_g, ln1_b,
    wq, bq, wk, bk, wv, bv, wo, bo, ln2_g, ln2_b, w1, b1, w2, b2`), `norm_g`,
    `norm_b`. `activation` is the MLP's, `"gelu"` (exact) or `"gelu_tanh"`.

    With `intermediates=True`, returns a dict of batched arrays instead:
    `embeddings` (tokens entering block 0), `blocks` (a list: tokens after
    each block), `attention` (a list: each block's (H, T, T) probabilities
    per image) and `output`.
    """
    collected = {"embeddings": [], "blocks": [], "attention": [], "output": []}
    for image in images.astype("float64"):
        image = (image * scale - np.asarray(mean)) / np.asarray(std)
        z = patchify(image, patch) @ weights["projection_w"] + weights["projection_b"]  # eq. 1
        prefix = [] if weights.get("cls") is None else [weights["cls"][None]]
        if weights.get("registers") is not None:
            prefix.append(weights["registers"])
        z = np.concatenate(prefix + [z]) + weights["pos"]
        collected["embeddings"].append(z)
        per_block, per_attention = [], []
        for block in weights["blocks"]:
            attended, probs = attention(
                layer_norm(z, block["ln1_g"], block["ln1_b"], epsilon), block, num_heads, return_probabilities=True
            )
            z = z + attended  # eq. 2
            normed = layer_norm(z, block["ln2_g"], block["ln2_b"], epsilon)
            hidden = ACTIVATIONS[activation](normed @ block["w1"] + block["b1"])
            z = z + hidden @ block["w2"] + block["b2"]  # eq. 3
            per_block.append(z)
            per_attention.append(probs)
        collected["blocks"].append(per_block)
        collected["attention"].append(per_attention)
        collected["output"].append(layer_norm(z, weights["norm_g"], weights["norm_b"], epsilon))  # eq. 4
    if not intermediates:
        return np.stack(collected["output"])
    num_blocks = len(weights["blocks"])
    return {
        "embeddings": np.stack(collected["embeddings"]),
        "blocks": [np.stack([image[i] for image in collected["blocks"]]) for i in range(num_blocks)],
        "attention": [np.stack([image[i] for image in collected["attention"]]) for i in range(num_blocks)],
        "output": np.stack(collected["output"]),
    }
