"""torch.compile: one graph for the forward pass, and jit_compile=True in fit.

Compiling is nearly all of this file's time, and most of a compile is
Dynamo tracing Keras' Python, whatever the model's size. `predict` and
`evaluate` with jit_compile=True compile the forward pass alone: on torch,
`predict`'s compiled forward against the eager one is
tests/models/test_feature_extractor.py::test_extractor_jit_compiles (the
same backbone code through Keras' compiled predict step), and the forward
pass compiled inside `fit` is checked here by each step's loss.
"""

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit.utils.seeds import set_random_seed

pytestmark = pytest.mark.skipif(keras.backend.backend() != "torch", reason="torch.compile: PyTorch only")


def tiny_classifier(num_layers=2):
    set_random_seed(0)
    return keras_vit.ViTClassifier.from_variant(
        "ViT-Ti/16", image_size=16, patch_size=8, hidden_dim=32, num_layers=num_layers, num_heads=2, mlp_dim=64,
        num_classes=3, dropout=0.0)


def test_the_forward_pass_compiles_without_a_graph_break():
    import torch

    model = tiny_classifier()
    x = torch.from_numpy(np.random.default_rng(0).uniform(0, 255, (2, 16, 16, 3)).astype("float32"))
    explanation = torch._dynamo.explain(lambda images: model(images, training=False))(x)
    torch._dynamo.reset()
    reasons = [str(reason.reason).splitlines()[0] for reason in explanation.break_reasons]
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1, reasons


# One block: compiling is most of this test's time and grows with the graph; the forward pass's
# graph, two blocks deep, is checked above. Two steps (one per epoch): the first step's graph and the
# second's differ (Dynamo recompiles train_step once the gradients exist and once the optimizer's
# weight-decay cache does), and the second's is the one every later step runs. A `predict` before the fit
# compiled a third graph, the inference forward pass, for ~16 CPU s: the module docstring says where that
# is checked. One optimizer, keras_vit's AdamW (a fused torch kernel when
# eager, Keras' update under torch.compile): the only optimizer of keras_vit's with a path of its own
# under torch.compile. A second case with Keras' SGD compiled the same model again for another minute
# of the torch pass to check Keras' own optimizer (keras_vit's SGD differs from it only under
# tf.distribute); the "paper" recipe's SGD fits eager, as `jit_compile="auto"` runs on torch, in
# tests/finetune/test_finetune.py.
@pytest.mark.slow  # compiling takes ~30-60 s on 2 shared cores
def test_jit_compile_predicts_and_fits_as_eager():
    import torch

    from keras_vit.workflows.optimizers import AdamW

    rng = np.random.default_rng(0)
    x, y = rng.uniform(0, 255, (6, 16, 16, 3)).astype("float32"), rng.integers(0, 3, 6)
    results = {}
    for jit in (False, True):
        model = tiny_classifier(num_layers=1)
        model.compile(optimizer=AdamW(1e-2), loss="sparse_categorical_crossentropy", jit_compile=jit)
        graphs_before = torch._dynamo.utils.counters["stats"]["unique_graphs"]
        losses = model.fit(x, y, epochs=2, batch_size=6, shuffle=False, verbose=0).history["loss"]
        results[jit] = losses, [keras.ops.convert_to_numpy(weight) for weight in model.weights]
    # Three graphs: train_step's twice (Keras' `zero_grad` finds no gradients before the first step only) and the
    # backward pass with the update once. The update's frame compiled again at the second step while the optimizer
    # decided each variable's weight decay in the first step (Keras fills a cache then, which the guards watch).
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"] - graphs_before
    assert graphs == 3, f"{graphs} graphs compiled for two training steps"
    # The first loss is the compiled forward pass's on the initial weights; the second, after the compiled
    # backward pass and AdamW update; the weights, after the second step's graph.
    np.testing.assert_allclose(results[True][0], results[False][0], atol=1e-5)
    for compiled, eager in zip(results[True][1], results[False][1]):
        np.testing.assert_allclose(compiled, eager, atol=1e-5)
    assert not np.allclose(*results[True][0])  # it trained
