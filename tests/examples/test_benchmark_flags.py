"""`make bench`'s XLA_FLAGS: only real XLA flags, and XLA reads every one of them.

XLA stops reading XLA_FLAGS at the first word that is not a flag and ignores
the rest without a message; the benchmark once wrote such a word after its own
flags. The check here is XLA's own: the worker's probe dumps the options XLA
parsed, which exist only if the whole line was read.
"""

import importlib.util
import json
import os
import random
import subprocess
import sys

import pytest

pytestmark = pytest.mark.one_backend("the benchmark's XLA_FLAGS, read by XLA in a jax process of its own")

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BENCHMARKS = os.path.join(ROOT, "benchmarks")
# Real flags of this XLA with non-default values, so the read-back shows each was parsed.
VALID = ("--xla_cpu_use_xnnpack=false", "--xla_cpu_enable_fast_min_max=true", "--xla_cpu_prefer_vector_width=512",
         "--xla_cpu_experimental_ynn_fusion_type=", "--xla_cpu_parallel_codegen_split_count=8")
NOT_FLAGS = ("intra_op_parallelism_threads=2", "xla_cpu_use_xnnpack=false", "-xla_cpu_ftz=true",
             "--intra_op_parallelism_threads=2", "--XLA_CPU_FTZ=true", "=", "--")


def load(name):
    sys.path.insert(0, BENCHMARKS)
    try:
        spec = importlib.util.spec_from_file_location(f"bench_{name}", os.path.join(BENCHMARKS, f"{name}.py"))
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(BENCHMARKS)


def test_a_word_that_is_not_an_xla_flag_is_refused_by_name():
    xla_flags = load("xla_flags")
    rng = random.Random(42)
    for _ in range(200):
        flags = rng.sample(VALID, rng.randint(0, len(VALID)))
        assert xla_flags.check_flags(" ".join(flags)) == flags
        bad = rng.choice(NOT_FLAGS)
        words = list(flags)
        words.insert(rng.randint(0, len(words)), bad)
        with pytest.raises(ValueError) as caught:
            xla_flags.check_flags(" ".join(words))
        assert repr(bad) in str(caught.value)


def test_xla_reads_every_flag_the_benchmark_gives_its_workers(monkeypatch, tmp_path):
    """The driver's environment for 2 threads plus a user's flags: XLA parses all of it, probe last."""
    run = load("run")
    xla_flags = load("xla_flags")
    user_flags = ["--xla_cpu_use_xnnpack=false", "--xla_cpu_prefer_vector_width=512"]
    monkeypatch.setenv("XLA_FLAGS", " ".join(user_flags))
    env = run.child_env(threads=2)
    env["XLA_FLAGS"], dump_dir = xla_flags.add_probe(env["XLA_FLAGS"])
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    code = ("import json, sys; sys.path.insert(0, sys.argv[1]); import xla_flags; "
            "print(json.dumps(xla_flags.parsed_flags('jax', sys.argv[2])))")
    proc = subprocess.run([sys.executable, "-c", code, BENCHMARKS, dump_dir], env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    parsed = json.loads(proc.stdout.strip().splitlines()[-1])
    assert parsed is not None, f"XLA read none of XLA_FLAGS={env['XLA_FLAGS']!r} up to its last flag"
    assert parsed["xla_cpu_use_xnnpack"] == "false"
    assert parsed["xla_cpu_prefer_vector_width"] == "512"


def test_fewer_threads_than_cpus_pins_every_worker():
    run = load("run")
    allowed = sorted(os.sched_getaffinity(0))
    for threads in range(1, len(allowed) + 3):
        cpus = run.worker_cpus(threads)
        assert cpus == (allowed[:threads] if threads < len(allowed) else None)
        env = run.child_env(threads)
        assert env.get(run.CPUS_VARIABLE) == (",".join(map(str, cpus)) if cpus else None)
        assert env["OMP_NUM_THREADS"] == str(threads)
