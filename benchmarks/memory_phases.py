"""Resident memory after each phase of a process that builds, predicts with and trains keras_vit.

    KERAS_BACKEND=tensorflow PYTHONPATH=. .venv/bin/python benchmarks/memory_phases.py --variant ViT-Ti/16
    KERAS_BACKEND=jax PYTHONPATH=. .venv/bin/python benchmarks/memory_phases.py --jax-cache /tmp/jax-cache

`make bench` reports one peak per process; this script says where it is
reached: after the imports, the model's build and compile, the first and
fifth `predict_on_batch`, the first and fifth `train_on_batch` (the same
calls, batches and optimizer as `benchmarks/keras_worker.py`). Each line is
the resident size and the peak so far, in MiB.
Run it again with allocator settings in the environment (`MALLOC_ARENA_MAX`,
...) or with `--jit-compile false` to see what they change; with
`--jax-cache DIR` run twice, the second time without any compilation.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import common  # noqa: E402


def resident_and_peak_mib():
    """`(resident, peak so far)` of this process in MiB."""
    return common.current_rss_mib(), common.peak_rss_mib()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variant", default="ViT-Ti/16")
    parser.add_argument("--forward-batch", type=int, default=16)
    parser.add_argument("--train-batch", type=int, default=8)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--jit-compile", default="auto", choices=("auto", "true", "false"))
    parser.add_argument("--jax-cache", default=None, help="jax's persistent compilation cache directory")
    args = parser.parse_args(argv)

    phases = [("start", *resident_and_peak_mib())]
    if args.jax_cache:
        import jax

        jax.config.update("jax_compilation_cache_dir", args.jax_cache)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    import keras
    import numpy as np

    from keras_worker import set_threads
    from keras_vit.models import ViTClassifier
    from keras_vit.workflows.optimizers import AdamW

    set_threads(keras.backend.backend(), args.threads)
    phases.append(("imports", *resident_and_peak_mib()))
    model = ViTClassifier.from_variant(args.variant, activation=None)
    model.compile(optimizer=AdamW(learning_rate=1e-4),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=[],
                  jit_compile={"auto": "auto", "true": True, "false": False}[args.jit_compile])
    phases.append(("build + compile", *resident_and_peak_mib()))
    rng = np.random.default_rng(0)
    images = rng.uniform(0, 255, (args.forward_batch, 224, 224, 3)).astype("float32")
    for call in range(1, 6):
        model.predict_on_batch(images)
        if call in (1, 5):
            phases.append((f"predict_on_batch x{call}", *resident_and_peak_mib()))
    images = rng.uniform(0, 255, (args.train_batch, 224, 224, 3)).astype("float32")
    labels = rng.integers(0, 1000, (args.train_batch,)).astype("int32")
    for call in range(1, 6):
        model.train_on_batch(images, labels)
        if call in (1, 2, 5):
            phases.append((f"train_on_batch x{call}", *resident_and_peak_mib()))

    print(f"keras_vit[{keras.backend.backend()}] {args.variant}, jit_compile={model.jit_compile}, "
          f"MALLOC_ARENA_MAX={os.environ.get('MALLOC_ARENA_MAX')}, XLA_FLAGS={os.environ.get('XLA_FLAGS')!r}")
    print(f"{'after':<22}{'resident MiB':>14}{'peak MiB':>10}")
    for name, resident, peak in phases:
        print(f"{name:<22}{resident:>14.0f}{peak:>10.0f}")


if __name__ == "__main__":
    main()
