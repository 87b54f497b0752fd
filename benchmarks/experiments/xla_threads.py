"""How many threads jax's XLA CPU runtime really works with, counted per thread.

Runs a jitted 1024x1024 float32 matmul and an exact GELU 40 times each and
prints, for each, the CPU ticks every thread of the process used meanwhile
(`/proc/self/task/*/stat`). Counting busy threads does not depend on the
machine's load, as a wall-clock or CPU/wall ratio would. Run it under the
settings to compare:

    .venv/bin/python benchmarks/experiments/xla_threads.py
    XLA_FLAGS=--xla_cpu_multi_thread_eigen=false .venv/bin/python benchmarks/experiments/xla_threads.py
    taskset -c 0 .venv/bin/python benchmarks/experiments/xla_threads.py
"""

import json
import os


def thread_ticks():
    """`{thread id: user + system clock ticks}` for every thread of this process."""
    ticks = {}
    for thread in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{thread}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            ticks[thread] = int(fields[11]) + int(fields[12])
        except OSError:
            pass
    return ticks


def main():
    import jax
    import jax.numpy as jnp

    a = jnp.ones((1024, 1024), jnp.float32)
    x = jnp.ones((16, 197, 1536), jnp.float32)
    programs = {
        "matmul": (jax.jit(lambda a: a @ a), a),
        "gelu": (jax.jit(lambda x: jax.nn.gelu(x * 1.0001 + 0.5, approximate=False).sum()), x),
    }
    result = {"allowed_cpus": sorted(os.sched_getaffinity(0)), "xla_flags": os.environ.get("XLA_FLAGS", ""),
              "jax": jax.__version__}
    for name, (program, argument) in programs.items():
        program(argument).block_until_ready()
        before = thread_ticks()
        for _ in range(40):
            program(argument).block_until_ready()
        after = thread_ticks()
        busy = sorted((after[t] - before.get(t, 0) for t in after), reverse=True)
        result[f"{name}_ticks_per_busy_thread"] = [ticks for ticks in busy if ticks > 1]
    result["os_threads"] = len(os.listdir("/proc/self/task"))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
