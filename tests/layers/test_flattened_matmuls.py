"""The hot path runs its Dense layers on 2-D (tokens, width) views (issues 7 and 42).

These check that the reshapes around the matmuls keep every input rank and
a batch size unknown until run time (compiled predict on jax/tensorflow)
working, against numpy written from the formulas, and that jax's training
program holds no Dense matmul on a rank-3 view.
"""

import keras
import numpy as np
import pytest

from keras_vit import layers
from keras_vit.models import ViTClassifier
from tests import numpy_reference as ref
from tests.layers.test_layers_behaviour import _attention_weights


def to_numpy(x):
    return keras.ops.convert_to_numpy(x)


def _mlp_reference(mlp, x):
    w1, b1 = [to_numpy(w).astype("float64") for w in mlp.fc1.weights]
    w2, b2 = [to_numpy(w).astype("float64") for w in mlp.fc2.weights]
    return ref.gelu(x.astype("float64") @ w1 + b1) @ w2 + b2


@pytest.mark.parametrize("shape", [(7, 4), (2, 3, 4), (2, 3, 5, 4)])
def test_mlp_keeps_any_leading_shape(shape):
    x = np.random.default_rng(11).normal(size=shape).astype("float32")
    mlp = layers.MLP(mlp_dim=6)
    got = to_numpy(mlp(x))
    assert got.shape == shape
    np.testing.assert_allclose(got, _mlp_reference(mlp, x), atol=1e-5)
    assert mlp.compute_output_shape((None,) + shape[1:]) == (None,) + shape[1:]


def test_block_in_a_model_with_unknown_batch_matches_numpy():
    # Symbolic (None) batch, then compiled predict with two batch sizes.
    inputs = keras.Input(shape=(5, 8))
    block = layers.TransformerBlock(num_heads=2, mlp_dim=16)
    model = keras.Model(inputs, block(inputs))
    assert model.output.shape == (None, 5, 8)
    g1, b1 = [to_numpy(w) for w in block.norm1.weights]
    g2, b2 = [to_numpy(w) for w in block.norm2.weights]
    w = _attention_weights(block.attention)
    for batch in (3, 2):
        x = np.random.default_rng(batch).normal(size=(batch, 5, 8)).astype("float32")
        got = model.predict(x, batch_size=batch, verbose=0)
        expected = []
        for z in x.astype("float64"):
            z = z + ref.attention(ref.layer_norm(z, g1, b1, 1e-6), w, 2)
            z = z + _mlp_reference(block.mlp, ref.layer_norm(z, g2, b2, 1e-6))
            expected.append(z)
        np.testing.assert_allclose(got, np.stack(expected), atol=1e-5)


def test_attention_explicit_path_with_unknown_batch_matches_fast_path():
    inputs = keras.Input(shape=(6, 8))
    attention = layers.MultiHeadSelfAttention(num_heads=4)
    outputs, scores = attention(inputs, return_attention_scores=True)
    model = keras.Model(inputs, [outputs, scores])
    x = np.random.default_rng(12).normal(size=(3, 6, 8)).astype("float32")
    got, got_scores = model.predict(x, verbose=0)
    np.testing.assert_allclose(got, to_numpy(attention(x)), atol=1e-5)
    assert got_scores.shape == (3, 4, 6, 6)


def test_patch_encoder_in_a_model_with_unknown_batch_matches_numpy():
    inputs = keras.Input(shape=(6, 12))
    encoder = layers.PatchEncoder(hidden_dim=8, grid_size=(2, 3))
    model = keras.Model(inputs, encoder(inputs))
    assert model.output.shape == (None, 7, 8)
    kernel, bias = (to_numpy(w).astype("float64") for w in encoder.projection.weights)
    cls, pos = to_numpy(encoder.class_token), to_numpy(encoder.position_embedding_table)
    for batch in (3, 2):
        x = np.random.default_rng(batch).normal(size=(batch, 6, 12)).astype("float32")
        expected = np.concatenate([np.broadcast_to(cls, (batch, 1, 8)), x @ kernel + bias], axis=1) + pos
        np.testing.assert_allclose(model.predict(x, batch_size=batch, verbose=0), expected, atol=1e-5)


def _dot_generals(jaxpr):
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            yield eqn
        for param in eqn.params.values():
            for sub in param if isinstance(param, (list, tuple)) else (param,):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    yield from _dot_generals(inner)


@pytest.mark.skipif(keras.backend.backend() != "jax", reason="reads jax's traced training program")
def test_jax_training_program_runs_every_dense_matmul_on_2d_views():
    # XLA's CPU backend runs a rank-3 Dense matmul, and above all its kernel gradient
    # (which contracts the batch and token axes together), through much slower
    # kernels than the same matmul on the (tokens, width) view (issue 42: the patch
    # projection). Property: in the gradient of the loss, every matmul that is not
    # batched (the attention's are) multiplies two matrices over one axis.
    import jax

    rng = np.random.default_rng(42)
    for _ in range(3):
        patch = int(rng.choice([4, 8]))
        model = ViTClassifier.from_variant(
            "ViT-Ti/16", image_size=(patch * int(rng.integers(1, 4)), patch * int(rng.integers(2, 4))),
            patch_size=patch, hidden_dim=8, num_heads=2, mlp_dim=16, num_layers=1, num_classes=3,
            num_register_tokens=int(rng.integers(0, 2)), pooling=str(rng.choice(["token", "gap"])),
        )
        images = rng.uniform(0, 255, (2, *model.backbone.image_size, 3)).astype("float32")
        labels = np.array([0, 2], "int32")
        non_trainable = [v.value for v in model.non_trainable_variables]

        def loss(trainable):
            logits, _ = model.stateless_call(trainable, non_trainable, images, training=True)
            return keras.ops.mean(keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True))

        program = jax.make_jaxpr(jax.grad(loss))([v.value for v in model.trainable_variables])
        unbatched = [eqn for eqn in _dot_generals(program.jaxpr) if not eqn.params["dimension_numbers"][1][0]]
        assert len(unbatched) >= 10  # forward and gradients of the projection, qkv, out, fc1, fc2, head
        bad = [
            ([v.aval.shape for v in eqn.invars], eqn.params["dimension_numbers"][0])
            for eqn in unbatched
            if [v.aval.ndim for v in eqn.invars] != [2, 2] or len(eqn.params["dimension_numbers"][0][0]) != 1
        ]
        assert not bad, f"matmuls not on 2-D views (operand shapes, contracted axes): {bad}"


def test_patch_encoder_project_on_its_own_keeps_the_dense_dtype_policy():
    # `project()` is public: called outside the layer's own call, it still computes in the
    # projection's compute dtype (the Dense layer is called on the 2-D view, not only its matmul).
    encoder = layers.PatchEncoder(hidden_dim=8, dtype="mixed_bfloat16")
    patches = np.random.default_rng(5).normal(size=(2, 4, 12)).astype("float32")
    encoder.build(patches.shape)
    projected = encoder.project(patches)
    assert keras.backend.standardize_dtype(projected.dtype) == "bfloat16"
    assert tuple(projected.shape) == (2, 4, 8)
