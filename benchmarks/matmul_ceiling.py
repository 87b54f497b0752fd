"""Measure this machine's float32 matrix-multiply rate: the ceiling for GFLOP/s.

Times square float32 matmuls with numpy, torch and jax (whichever the
environment has) at the given thread count and prints one `BENCH_RESULT
{json}` line with the best rate of each. jax's thread pool follows XLA_FLAGS,
which `run.py` sets.
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
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--size", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    n = args.size
    result = {"size": n, "threads": args.threads, "load_before": common.load_average()}

    import numpy as np

    a = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
    b = np.random.default_rng(1).standard_normal((n, n), dtype=np.float32)
    result["numpy_gflops"] = best_rate(np.matmul, a, b, n, args.repeats)
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None:
        torch.set_num_threads(args.threads)
        ta, tb = torch.from_numpy(a), torch.from_numpy(b)
        result["torch_gflops"] = best_rate(torch.mm, ta, tb, n, args.repeats)
        result["torch_version"] = torch.__version__
    try:
        # XLA's CPU matmul (jax) uses other kernels than torch's BLAS; the
        # ceiling is the best any of them reaches on this machine.
        import jax
        import jax.numpy as jnp
    except ImportError:
        jax = None
    if jax is not None:
        ja, jb = jnp.asarray(a), jnp.asarray(b)
        jit_matmul = jax.jit(jnp.matmul)
        result["jax_gflops"] = best_rate(lambda x, y: jit_matmul(x, y).block_until_ready(), ja, jb, n, args.repeats)
        result["jax_version"] = jax.__version__
    result["gflops"] = max(v for k, v in result.items() if k.endswith("_gflops"))
    result["load_after"] = common.load_average()
    common.emit(result)


if __name__ == "__main__":
    main()
