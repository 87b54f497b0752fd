"""Measure each framework's own float32 matrix-multiply rate: what explains a host's results.

Times square float32 matmuls with numpy, torch, jax and tensorflow (whichever
the environment has) at the given thread count and prints one `BENCH_RESULT
{json}` line with the best rate of each. The frameworks use different matmul
kernels (OpenBLAS, oneDNN/MKL, XLA's Eigen or oneDNN), and which one is
fastest depends on the CPU: on one 2-core AMD EPYC with AVX-512 jax and numpy
reached 400-420 GFLOP/s, on another of the same kind 190-210, while torch
stayed at ~183 on both. jax's thread pool follows the CPUs the process may
use (XLA has no thread-count flag): `run.py` pins a worker to `--threads` CPUs
when there are more.

    python benchmarks/matmul_ceiling.py --threads 2
    python benchmarks/matmul_ceiling.py --device gpu     # torch CUDA, jax GPU, tensorflow GPU
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402


def best_rate(matmul, a, b, n, repeats):
    matmul(a, b)  # warm-up: thread pools, packing buffers
    best = 0.0
    for _ in range(repeats):
        start = time.perf_counter()
        matmul(a, b)
        best = max(best, 2 * n**3 / (time.perf_counter() - start) / 1e9)
    return best


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--size", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", choices=("cpu", "gpu"), default="cpu")
    parser.add_argument("--frameworks", default="numpy,torch,jax,tensorflow")
    args = parser.parse_args(argv)
    wanted = set(args.frameworks.split(","))
    n = args.size
    gpu = args.device == "gpu"
    result = {"size": n, "threads": args.threads, "device": args.device, "load_before": common.load_average()}

    import numpy as np

    a = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
    b = np.random.default_rng(1).standard_normal((n, n), dtype=np.float32)
    if "numpy" in wanted and not gpu:
        result["numpy_gflops"] = best_rate(np.matmul, a, b, n, args.repeats)
    if "torch" in wanted:
        try:
            import torch
        except ImportError:
            torch = None
        if torch is not None and (not gpu or torch.cuda.is_available()):
            torch.set_num_threads(args.threads)
            device = "cuda" if gpu else "cpu"
            ta, tb = torch.from_numpy(a).to(device), torch.from_numpy(b).to(device)
            sync = torch.cuda.synchronize if gpu else (lambda: None)
            result["torch_gflops"] = best_rate(lambda x, y: (torch.mm(x, y), sync()), ta, tb, n, args.repeats)
            result["torch_version"] = torch.__version__
    if "jax" in wanted:
        try:
            import jax
            import jax.numpy as jnp
        except ImportError:
            jax = None
        if jax is not None and (not gpu or jax.default_backend() == "gpu"):
            ja, jb = jnp.asarray(a), jnp.asarray(b)
            jit_matmul = jax.jit(jnp.matmul)
            result["jax_gflops"] = best_rate(lambda x, y: jit_matmul(x, y).block_until_ready(), ja, jb, n,
                                             args.repeats)
            result["jax_version"] = jax.__version__
    if "tensorflow" in wanted:
        try:
            os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
            import tensorflow as tf
        except ImportError:
            tf = None
        if tf is not None and (not gpu or tf.config.list_physical_devices("GPU")):
            tf.config.threading.set_intra_op_parallelism_threads(args.threads)
            tf.config.threading.set_inter_op_parallelism_threads(1)
            with tf.device("/GPU:0" if gpu else "/CPU:0"):
                ta, tb = tf.constant(a), tf.constant(b)
                # Eager tf.matmul on the CPU returns when done; on a GPU one
                # element is read back to wait for it.
                run = (lambda x, y: tf.matmul(x, y)[0, 0].numpy()) if gpu else tf.matmul
                result["tensorflow_gflops"] = best_rate(run, ta, tb, n, args.repeats)
            result["tensorflow_version"] = tf.__version__
    rates = [v for k, v in result.items() if k.endswith("_gflops")]
    result["gflops"] = max(rates) if rates else None
    result["load_after"] = common.load_average()
    result["placement"] = common.placement()
    common.emit(result)


if __name__ == "__main__":
    main()
