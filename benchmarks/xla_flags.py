"""XLA_FLAGS for the benchmark's workers, and proof that XLA read every one of them.

XLA reads `XLA_FLAGS` as a command line: it stops at the first word that does
not start with `--` and silently ignores everything after it (a value that
does not start with `--` at all is taken for a file name, and the process
dies). An unknown `--name` kills the process. So a word such as
`intra_op_parallelism_threads=2` (a TensorFlow session option, not an XLA
flag) switched off every flag written after it, without a message.

XLA has no flag for its CPU thread pool: jax's CPU client sizes its pool by
the CPUs the process may run on (`os.sched_getaffinity`), so `run.py` sets
the thread count of an XLA worker with its CPU affinity, not with a flag.
`--xla_cpu_multi_thread_eigen` is still accepted (default true), but in jax
0.10's CPU runtime it changed neither the number of threads that did work
nor the speed of a matmul or a GELU (measured per thread from
`/proc/self/task`, 2026-11-26).

The proof: the worker appends a dump flag *last*, limited to one tiny
program named `xla_flags_probe`, compiles that program, and reads back the
`debug_options` file XLA writes beside its dump. The file exists only if
XLA parsed the whole line up to the last flag, and it lists every option
that differs from XLA's defaults: the flags the worker actually ran with.

This module imports no framework, so `run.py` (any Python), the workers and
the tests can all use it.
"""

import atexit
import os
import re
import shutil
import tempfile
import time

# `--xla_name` or `--xla_name=value` (the value may be empty: `--xla_cpu_experimental_ynn_fusion_type=`).
FLAG = re.compile(r"--xla_[a-z0-9_]+(=\S*)?")
PROBE_NAME = "xla_flags_probe"


def check_flags(text, source="XLA_FLAGS"):
    """The words of `text`, each checked to be one XLA flag.

    Args:
        text: str. Space-separated flags, as in `XLA_FLAGS`.
        source: str. Where the text came from, for the message.

    Returns:
        The list of flags (words), in order.

    Raises:
        ValueError: for the first word that is not `--xla_<name>[=value]`,
            naming it and why it matters.
    """
    words = text.split()
    for index, word in enumerate(words):
        if not FLAG.fullmatch(word):
            after = " ".join(words[index + 1:])
            ignored = f", and would silently ignore what follows it ({after})" if after else ""
            raise ValueError(
                f"{source}: {word!r} is not an XLA flag (`--xla_<name>=<value>`). XLA stops reading at the "
                f"first word that is not a flag{ignored}. Remove it; a thread count for jax is set with "
                f"`--threads` (CPU affinity), not with XLA_FLAGS."
            )
    return words


def build(inherited="", extra=""):
    """The `XLA_FLAGS` value for a worker: the inherited flags, then `extra`, each checked.

    Args:
        inherited: str. The caller's own `XLA_FLAGS` (passed through, as before).
        extra: str. Flags for this worker only (an experiment).

    Returns:
        The checked flags joined by spaces (`""` for none).
    """
    return " ".join(check_flags(inherited, "XLA_FLAGS") + check_flags(extra, "--xla-flags"))


def add_probe(flags):
    """Append the dump flags of the probe to `flags`; returns `(new_flags, dump_dir)`.

    They go last: if any word before them stops XLA's parser, they are not
    read, and `read_probe` finds no dump.
    """
    dump_dir = tempfile.mkdtemp(prefix="xla-flags-probe-")
    # Removed at exit, not after the probe: XLA keeps making an (empty) folder there for every later program.
    atexit.register(shutil.rmtree, dump_dir, True)
    probe = f"--xla_dump_to={dump_dir} --xla_dump_hlo_module_re=.*{PROBE_NAME}.*"
    return (f"{flags} {probe}".strip(), dump_dir)


def read_probe(dump_dir):
    """The options XLA parsed, from the probe's dump: `{name: value}`, or `None` if nothing was dumped.

    XLA writes the options that differ from its defaults; the probe's own
    two dump flags are left out, and so are the options the framework sets
    itself without any flag (jax: `xla_cpu_enable_fast_min_max: false`,
    `xla_detailed_logging: false`; they are kept, since they are what ran).
    """
    names = [n for n in os.listdir(dump_dir) if PROBE_NAME in n and n.endswith(".debug_options")]
    if not names:
        return None
    options = {}
    with open(os.path.join(dump_dir, sorted(names)[0])) as f:
        for line in f:
            name, _, value = line.strip().partition(":")
            if name and name not in ("xla_dump_to", "xla_dump_hlo_module_re"):
                options[name] = value.strip().strip('"')
    return options


def probe(backend):
    """Compile the tiny probe program on `backend` ("jax" or "tensorflow") so XLA dumps its options."""
    # A constant of its own per call: a program found in jax's persistent compilation cache is not
    # compiled, so nothing would be dumped.
    offset = float(time.time_ns() % 1_000_003)
    if backend == "jax":
        import jax
        import jax.numpy as jnp

        def xla_flags_probe(x):
            return x * 2.0 + offset

        jax.jit(xla_flags_probe)(jnp.ones(3)).block_until_ready()
    elif backend == "tensorflow":
        import tensorflow as tf

        @tf.function(jit_compile=True)
        def xla_flags_probe(x):
            return x * 2.0 + offset

        xla_flags_probe(tf.ones(3))
    else:
        raise ValueError(f"No XLA on backend {backend!r}: the probe runs on jax or tensorflow.")


def parsed_flags(backend, dump_dir):
    """Run the probe and read what XLA parsed; `None` when XLA did not read the whole line."""
    probe(backend)
    return read_probe(dump_dir)
