"""Time keras_vit's forward pass and training step on one Keras backend.

Run by `benchmarks/run.py` in its own process (KERAS_BACKEND is set before
Keras is imported); prints one `BENCH_RESULT {json}` line.

    KERAS_BACKEND=jax PYTHONPATH=. .venv/bin/python benchmarks/keras_worker.py --variant ViT-S/16
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import common  # noqa: E402
import xla_flags  # noqa: E402


def check_accelerator(backend):
    """Stop with a clear message when --device gpu finds no accelerator for this backend."""
    if backend == "torch":
        import torch

        found = torch.cuda.is_available()
        detail = f"torch {torch.__version__}: torch.cuda.is_available() is False"
    elif backend == "jax":
        import jax

        found = jax.default_backend() == "gpu"
        detail = f"jax {jax.__version__}: default backend is {jax.default_backend()!r}, not 'gpu'"
    else:
        import tensorflow as tf

        found = bool(tf.config.list_physical_devices("GPU"))
        detail = f"tensorflow {tf.__version__}: tf.config.list_physical_devices('GPU') is empty"
    if not found:
        raise SystemExit(f"--device gpu: no accelerator for keras_vit[{backend}] ({detail}). Run on a machine "
                         "with a GPU and the framework's GPU build, or use --device cpu.")


def device_peak_mib(backend):
    """Peak accelerator memory in MiB (None on the CPU)."""
    if backend == "torch":
        import torch

        return torch.cuda.max_memory_allocated() / 2**20 if torch.cuda.is_available() else None
    if backend == "jax":
        import jax

        stats = jax.local_devices()[0].memory_stats() or {}
        return stats["peak_bytes_in_use"] / 2**20 if "peak_bytes_in_use" in stats else None
    import tensorflow as tf

    if not tf.config.list_physical_devices("GPU"):
        return None
    return tf.config.experimental.get_memory_info("GPU:0")["peak"] / 2**20


def set_threads(backend, threads):
    if backend == "torch":
        import torch

        torch.set_num_threads(threads)
        torch.set_num_interop_threads(1)
    elif backend == "tensorflow":
        import tensorflow as tf

        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(1)
    # jax: XLA has no thread-count flag; its pool follows the CPU affinity `run.py` gives the process.


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    common.add_common_arguments(parser)
    parser.add_argument(
        "--jit-compile",
        default="auto",
        choices=("auto", "true", "false"),
        help="model.compile(jit_compile=...): XLA on jax/tensorflow.",
    )
    parser.add_argument(
        "--dtype-policy", default="float32", choices=("float32", "mixed_bfloat16"),
        help="keras.config.set_dtype_policy before the model is built (bfloat16 matmuls, float32 weights).",
    )
    parser.add_argument(
        "--optimizer", default="keras_vit", choices=("keras_vit", "keras"),
        help="keras_vit.workflows.optimizers.AdamW (fused update on torch) or keras.optimizers.AdamW.",
    )
    args = parser.parse_args(argv)
    jit_compile = {"auto": "auto", "true": True, "false": False}[args.jit_compile]

    # Before any framework reads it: the flags as received, then the probe's dump flags last,
    # so the probe shows whether XLA read the whole line (xla_flags.py).
    received_xla_flags = os.environ.get("XLA_FLAGS", "")
    os.environ["XLA_FLAGS"], probe_dir = xla_flags.add_probe(received_xla_flags)
    start = time.perf_counter()
    import keras
    import numpy as np

    backend = keras.backend.backend()
    if args.device == "gpu":
        check_accelerator(backend)
    set_threads(backend, args.threads)
    keras.config.set_dtype_policy(args.dtype_policy)
    from keras_vit.models import ViTClassifier

    import_seconds = time.perf_counter() - start
    rss_after_import = common.current_rss_mib()
    # After the import figures (as before the probe existed), before any long work.
    if backend in ("jax", "tensorflow"):
        parsed = xla_flags.parsed_flags(backend, probe_dir)
        if parsed is None:
            raise SystemExit(f"XLA did not read all of XLA_FLAGS={received_xla_flags!r}: its probe dumped "
                             "nothing, so a word before the last flag stopped XLA's parser. Remove that word.")
    else:
        parsed = None

    # No keras.utils.set_random_seed: it imports TensorFlow to seed it too,
    # which would add ~400 MiB to every backend's peak memory.
    model = ViTClassifier.from_variant(args.variant, num_classes=common.NUM_CLASSES, activation=None)
    if args.optimizer == "keras_vit":
        from keras_vit.workflows.optimizers import AdamW
    else:
        AdamW = keras.optimizers.AdamW
    model.compile(
        optimizer=AdamW(learning_rate=1e-4),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=[],
        jit_compile=jit_compile,
    )
    rng = np.random.default_rng(0)
    result = {
        "framework": f"keras_vit[{backend}]",
        "backend": backend,
        "variant": args.variant,
        "threads": args.threads,
        "jit_compile": str(model.jit_compile),
        "dtype_policy": args.dtype_policy,
        "optimizer": f"{AdamW.__module__}.{AdamW.__name__}",
        "keras_version": keras.__version__,
        "num_params": int(model.count_params()),
        "import_seconds": import_seconds,
        "xla_flags": received_xla_flags,
        "xla_parsed": parsed,
        "rss_after_import_mib": rss_after_import,
        "load_before": common.load_average(),
    }
    if backend == "torch":
        import torch

        result["torch_version"] = torch.__version__
    elif backend == "jax":
        import jax

        result["jax_version"] = jax.__version__
    else:
        import tensorflow as tf

        result["tensorflow_version"] = tf.__version__

    if not args.skip_forward:
        images = rng.uniform(0, 255, (args.forward_batch, common.IMAGE_SIZE, common.IMAGE_SIZE, 3)).astype("float32")
        result["forward_first_call_seconds"], result["forward"] = common.measure(
            lambda: model.predict_on_batch(images), args.forward_batch, args
        )

    if not args.skip_train:
        images = rng.uniform(0, 255, (args.train_batch, common.IMAGE_SIZE, common.IMAGE_SIZE, 3)).astype("float32")
        labels = rng.integers(0, common.NUM_CLASSES, (args.train_batch,)).astype("int32")
        result["train_first_call_seconds"], result["train"] = common.measure(
            lambda: model.train_on_batch(images, labels), args.train_batch, args
        )

    result["peak_rss_mib"] = common.peak_rss_mib()
    result["device"] = args.device
    if args.device == "gpu":
        result["device_peak_mib"] = device_peak_mib(backend)
    result["placement"] = common.placement()
    if backend == "torch":
        import torch

        result["placement"]["torch_threads"] = torch.get_num_threads()
    result["load_after"] = common.load_average()
    common.emit(result)


if __name__ == "__main__":
    main()
