"""Time to first prediction: a new process that imports, builds a model and predicts once.

Run by `benchmarks/run.py` in a fresh process per measurement (the driver
passes the time it started the process, so interpreter start-up counts);
prints one `BENCH_RESULT {json}` line with the time of each phase:

    KERAS_BACKEND=jax PYTHONPATH=. .venv/bin/python benchmarks/first_prediction.py --impl keras_vit
    .venv-ref/bin/python benchmarks/first_prediction.py --impl timm

keras_vit does what a user's script does: `ViTClassifier.from_variant(...)`
(random weights, as timm's `create_model(pretrained=False)`), then
`predict_on_batch` on one image with Keras' defaults (jax: XLA; tensorflow:
`tf.function`; torch: eager). `--jax-cache-dir` turns on JAX's persistent
compilation cache, the way a user would:

    jax.config.update("jax_compilation_cache_dir", "~/.cache/jax")
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)

so a second process loads the compiled programs instead of compiling them.
TensorFlow (`tf.function`) and eager torch have no persistent cache.
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--impl", choices=("keras_vit", "timm"), required=True)
    parser.add_argument("--variant", default="ViT-S/16")
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--device", choices=("cpu", "gpu"), default="cpu")
    parser.add_argument("--jax-cache-dir", default=None, help="JAX persistent compilation cache directory")
    parser.add_argument("--started", type=float, default=None,
                        help="time.time() when the driver started this process (default: now)")
    args = parser.parse_args(argv)
    started = args.started if args.started is not None else time.time()
    entered = time.time()

    import common

    result = {"impl": args.impl, "variant": args.variant, "threads": args.threads, "device": args.device,
              "interpreter_seconds": entered - started, "load_before": common.load_average()}
    if args.impl == "keras_vit":
        backend = os.environ.get("KERAS_BACKEND", "tensorflow")
        if backend == "jax" and args.jax_cache_dir:
            import jax

            jax.config.update("jax_compilation_cache_dir", args.jax_cache_dir)
            jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
            jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
            result["jax_cache_dir"] = args.jax_cache_dir
        import keras
        import numpy as np

        if backend == "torch":
            import torch

            torch.set_num_threads(args.threads)
        elif backend == "tensorflow":
            import tensorflow as tf

            tf.config.threading.set_intra_op_parallelism_threads(args.threads)
        from keras_vit.models import ViTClassifier

        imported = time.time()
        model = ViTClassifier.from_variant(args.variant, num_classes=common.NUM_CLASSES)
        built = time.time()
        image = np.random.default_rng(0).uniform(0, 255, (1, common.IMAGE_SIZE, common.IMAGE_SIZE, 3))
        model.predict_on_batch(image.astype("float32"))
        predicted = time.time()
        result["framework"] = f"keras_vit[{backend}]"
        result["keras_version"] = keras.__version__
    else:
        import torch

        torch.set_num_threads(args.threads)
        import timm

        imported = time.time()
        device = "cuda" if args.device == "gpu" else "cpu"
        model = timm.create_model(common.TIMM_NAMES[args.variant], pretrained=False,
                                  num_classes=common.NUM_CLASSES).to(device).eval()
        built = time.time()
        with torch.inference_mode():
            model(torch.randn(1, 3, common.IMAGE_SIZE, common.IMAGE_SIZE, device=device)).cpu()
        predicted = time.time()
        result["framework"] = "timm"
        result["timm_version"] = timm.__version__
    result.update({
        "import_seconds": imported - entered,
        "build_seconds": built - imported,
        "first_call_seconds": predicted - built,
        "total_seconds": predicted - started,
        "peak_rss_mib": common.peak_rss_mib(),
        "load_after": common.load_average(),
    })
    common.emit(result)


if __name__ == "__main__":
    main()
