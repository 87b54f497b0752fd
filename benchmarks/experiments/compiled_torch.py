"""keras_vit under torch.compile against Hugging Face's ViT, eager and compiled, in one process.

    KERAS_BACKEND=torch python benchmarks/experiments/compiled_torch.py [--variant ViT-S/16] [--batch 8] [--rounds 5]

For one variant (random weights, 224x224, 1000 classes, same architecture
on both sides) it reports:

- dynamo's graph breaks and graphs for one keras_vit forward pass
  (`torch._dynamo.explain`);
- forward images/s: keras_vit eager, keras_vit compiled (`torch.compile` of
  the model's call, the path `jit_compile=True` takes in `predict`), and
  Hugging Face `ViTForImageClassification` eager and compiled;
- the largest difference between compiled and eager outputs, and the compile
  time (the first call) apart from the timed rounds.

timm runs in another environment (`make bench`), so Hugging Face is the
reference here: the same CPU build of torch, measured in the same run.
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import common  # noqa: E402


def timed(function, x, rounds):
    """(seconds of the first call, median seconds of `rounds` further calls)."""
    import torch

    with torch.no_grad():
        start = time.perf_counter()
        function(x)
        first = time.perf_counter() - start
        seconds = []
        for _ in range(rounds):
            start = time.perf_counter()
            function(x)
            seconds.append(time.perf_counter() - start)
    seconds.sort()
    return first, seconds[len(seconds) // 2]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", default="ViT-S/16")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    import keras
    import numpy as np
    import torch
    import transformers

    import keras_vit
    from keras_vit.models.variants import MODEL_SIZES

    assert keras.backend.backend() == "torch", "run with KERAS_BACKEND=torch"
    torch.manual_seed(0)
    size = MODEL_SIZES[args.variant.split("/")[0].split("-")[1]]
    patch = int(args.variant.split("/")[1])
    model = keras_vit.ViTClassifier.from_variant(args.variant, num_classes=1000, activation=None)
    images = np.random.default_rng(0).uniform(0, 255, (args.batch, 224, 224, 3)).astype("float32")
    x = torch.from_numpy(images)

    def ours(inputs):
        return model(inputs, training=False)

    explanation = torch._dynamo.explain(ours)(x)
    torch._dynamo.reset()
    eager_out = ours(x).detach().numpy()
    compiled = torch.compile(ours)
    compile_first, compiled_seconds = timed(compiled, x, args.rounds)
    compiled_out = compiled(x).detach().numpy()
    _, eager_seconds = timed(ours, x, args.rounds)

    config = transformers.ViTConfig(hidden_size=size["hidden_dim"], num_hidden_layers=size["num_layers"],
                                    num_attention_heads=size["num_heads"], intermediate_size=size["mlp_dim"],
                                    patch_size=patch, image_size=224, num_labels=1000)
    reference = transformers.ViTForImageClassification(config).eval()
    pixels = torch.from_numpy(np.ascontiguousarray(images.transpose(0, 3, 1, 2) / 255.0, dtype="float32"))

    def theirs(inputs):
        return reference(pixel_values=inputs).logits

    _, hf_eager = timed(theirs, pixels, args.rounds)
    hf_compiled_fn = torch.compile(theirs)
    hf_first, hf_compiled = timed(hf_compiled_fn, pixels, args.rounds)

    rate = lambda seconds: args.batch / seconds  # noqa: E731
    print(f"host: {common.host_info()['cpu']}, {os.cpu_count()} cores; torch {torch.__version__}, "
          f"keras {keras.__version__}, transformers {transformers.__version__}")
    print(f"{args.variant}, batch {args.batch}, 224x224, forward, median of {args.rounds}")
    print(f"keras_vit graph breaks: {explanation.graph_break_count}, graphs: {explanation.graph_count}")
    for reason in {str(b.reason).splitlines()[0] for b in explanation.break_reasons}:
        print(f"  break: {reason[:160]}")
    print(f"compiled vs eager keras_vit output: max |difference| {np.abs(compiled_out - eager_out).max():.2e}")
    print("| run | images/s | vs HF eager | vs HF compiled | first call s |")
    print("|---|---|---|---|---|")
    for name, seconds, first in (("keras_vit eager", eager_seconds, None),
                                 ("keras_vit compiled", compiled_seconds, compile_first),
                                 ("HF eager", hf_eager, None), ("HF compiled", hf_compiled, hf_first)):
        print(f"| {name} | {rate(seconds):.1f} | {hf_eager / seconds:.2f} | {hf_compiled / seconds:.2f} | "
              f"{'' if first is None else f'{first:.1f}'} |")


if __name__ == "__main__":
    main()
