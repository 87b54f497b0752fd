"""One change at a time to keras_vit's jax program, in one interleaved run.

Each experiment is keras_vit's ViT on jax with one change: an XLA flag, or
one layer computed another way (the change is made in the worker process
only, by replacing one function, so the package is not edited to try it).
Every experiment runs in its own process, in an interleaved order that is
reversed every other round, beside the baseline (no change), so a change in
the machine's load hits all of them alike. Each process times
`predict_on_batch` and `train_on_batch` as `keras_worker.py` does and counts
the kinds of instructions in the optimized training program (XLA's own dump):
loop fusions, YNNPACK / XNNPACK fusions, copies and transposes.

The table gives, per experiment, the median images/s (wall and per CPU
second) and its ratio to the baseline of the same round, as the median over
rounds: on a loaded machine the ratios within a round are what can be read.

    PYTHONPATH=. .venv/bin/python benchmarks/experiments/jax_experiments.py --rounds 2
    PYTHONPATH=. .venv/bin/python benchmarks/experiments/jax_experiments.py --experiments baseline,rank3_patch_projection

Writes `benchmarks/results/jax-experiments-<UTC time>.json`. The patch
projection on every backend, two ways alternated in one process:
`benchmarks/experiments/patch_projection.py`.
"""

import argparse
import collections
import datetime
import glob
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

EXPERIMENTS = os.path.dirname(os.path.abspath(__file__))
HERE = os.path.dirname(EXPERIMENTS)  # benchmarks/: common.py, keras_worker.py, results/
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, EXPERIMENTS)
sys.path.insert(0, ROOT)

import common  # noqa: E402
import xla_flags  # noqa: E402


# --- the changes to the model code (applied in the worker before the model is built) ---

def rank3_patch_projection():
    """The patch projection Dense called on the rank-3 (B, N, P) patches, as before issue 42 folded it."""
    from keras_vit.layers.patch_encoder import PatchEncoder

    def project(self, patches):
        return self.projection(patches)  # (B, N, D)

    PatchEncoder.project = project


def _attention(kind):
    from keras import ops

    from keras_vit.layers import fused

    original = fused.qkv_attention

    def qkv_attention(qkv, num_heads, scale):
        batch, tokens, width = ops.shape(qkv)
        hidden_dim = width // 3
        head_dim = hidden_dim // num_heads
        qkv = ops.reshape(qkv, (-1, tokens, num_heads, 3, head_dim))  # (B, T, H, 3, Dh)
        if kind == "contiguous_qkv":
            # q, k and v as three contiguous (B, T, H, Dh) arrays instead of strided slices.
            q, k, v = ops.unstack(ops.transpose(qkv, (3, 0, 1, 2, 4)), axis=0)
            context = ops.dot_product_attention(q, k, v, scale=scale)  # (B, T, H, Dh)
            return ops.reshape(context, (-1, tokens, hidden_dim))
        q, k, v = ops.unstack(ops.transpose(qkv, (3, 0, 2, 1, 4)), axis=0)  # each (B, H, T, Dh)
        if kind == "head_major":
            logits = ops.einsum("bhqd,bhkd->bhqk", q, k) * ops.cast(scale, q.dtype)  # (B, H, T, T)
            probs = ops.cast(ops.softmax(ops.cast(logits, "float32"), axis=-1), v.dtype)
            context = ops.einsum("bhqk,bhkd->bhqd", probs, v)  # (B, H, T, Dh)
        elif kind == "heads_in_batch":
            q, k, v = (ops.reshape(t, (-1, tokens, head_dim)) for t in (q, k, v))  # (B * H, T, Dh)
            logits = ops.matmul(q, ops.transpose(k, (0, 2, 1))) * ops.cast(scale, q.dtype)  # (B * H, T, T)
            probs = ops.cast(ops.softmax(ops.cast(logits, "float32"), axis=-1), v.dtype)
            context = ops.reshape(ops.matmul(probs, v), (-1, num_heads, tokens, head_dim))  # (B, H, T, Dh)
        else:
            raise ValueError(kind)
        return ops.reshape(ops.transpose(context, (0, 2, 1, 3)), (-1, tokens, hidden_dim))  # (B, T, D)

    qkv_attention.original = original
    fused.qkv_attention = qkv_attention


# name: (XLA flags, code change or None, what it is)
EXPERIMENTS = {
    "baseline": ("", None, "keras_vit as committed, no flags"),
    "rank3_patch_projection": ("", rank3_patch_projection,
                               "patch projection Dense on (B, N, P) instead of (B*N, P) (before issue 42)"),
    "attention_contiguous_qkv": ("", lambda: _attention("contiguous_qkv"),
                                 "q, k, v transposed to contiguous arrays before keras.ops.dot_product_attention"),
    "attention_head_major": ("", lambda: _attention("head_major"),
                             "(B, H, T, Dh) einsum + float32 softmax + einsum, no dot_product_attention"),
    "attention_heads_in_batch": ("", lambda: _attention("heads_in_batch"),
                                 "(B*H, T, Dh) batched matmuls + float32 softmax, no dot_product_attention"),
    "no_ynn_fusions": ("--xla_cpu_experimental_ynn_fusion_type=", None, "YNNPACK fusions off"),
    "no_xnnpack": ("--xla_cpu_use_xnnpack=false", None, "XNNPACK off"),
    "xnn_graph_greedy": ("--xla_cpu_experimental_xnn_graph_fusion_mode=XNN_GRAPH_FUSION_MODE_GREEDY", None,
                         "XNNPACK graph fusion, greedy"),
    "onednn": ("--xla_cpu_use_onednn=true", None, "oneDNN thunks for matmul fusions"),
    "vector_width_512": ("--xla_cpu_prefer_vector_width=512", None, "LLVM codegen at 512-bit vectors"),
}


def fusion_counts(dump_dir):
    """Kinds of instructions in the optimized training program (`jit_train_step`), from XLA's dump."""
    paths = glob.glob(os.path.join(dump_dir, "*jit_train_step*cpu_after_optimizations.txt"))
    if not paths:
        return None
    with open(sorted(paths)[-1]) as f:
        text = f.read()
    # Only the entry computation's instructions run as thunks; fused computations are bodies.
    entry = text[text.index("\nENTRY "):]
    entry = entry[:entry.index("\n}\n")]
    counts = collections.Counter()
    for line in entry.splitlines():
        match = re.search(r"= \S+ ([a-z-]+)\(", line)
        if not match:
            continue
        op = match.group(1)
        if op == "fusion":
            kind = re.search(r"kind=(\w+)", line)
            name = line.split("=")[0].strip().lstrip("%")
            label = re.sub(r"[.\d]+$", "", name)
            counts[f"fusion:{kind.group(1) if kind else '?'}:{label}"] += 1
        elif op not in ("parameter", "get-tuple-element", "tuple", "constant", "bitcast"):
            counts[op] += 1
    return dict(counts)


def worker(args):
    flags, change, _ = EXPERIMENTS[args.worker]
    received = os.environ.get("XLA_FLAGS", "")
    dump_dir = tempfile.mkdtemp(prefix="jax-experiment-dump-")
    os.environ["XLA_FLAGS"] = " ".join(
        [received, f"--xla_dump_to={dump_dir}", "--xla_dump_hlo_module_re=.*(train_step|xla_flags_probe).*"]
    ).strip()
    try:
        import keras
        import numpy as np

        parsed = xla_flags.parsed_flags("jax", dump_dir)
        if parsed is None:
            raise SystemExit(f"XLA did not read all of XLA_FLAGS={received!r}")
        if change is not None:
            change()
        from keras_vit.models import ViTClassifier
        from keras_vit.workflows.optimizers import AdamW

        model = ViTClassifier.from_variant(args.variant, num_classes=common.NUM_CLASSES, activation=None)
        model.compile(optimizer=AdamW(learning_rate=1e-4),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile=True)
        rng = np.random.default_rng(0)
        result = {"experiment": args.worker, "xla_flags": received, "xla_parsed": parsed,
                  "load_before": common.load_average()}
        images = rng.uniform(0, 255, (args.forward_batch, 224, 224, 3)).astype("float32")
        result["forward_first_call_seconds"], result["forward"] = common.measure(
            lambda: model.predict_on_batch(images), args.forward_batch, args)
        images = rng.uniform(0, 255, (args.train_batch, 224, 224, 3)).astype("float32")
        labels = rng.integers(0, common.NUM_CLASSES, (args.train_batch,)).astype("int32")
        result["train_first_call_seconds"], result["train"] = common.measure(
            lambda: model.train_on_batch(images, labels), args.train_batch, args)
        result["train_program"] = fusion_counts(dump_dir)
        result["load_after"] = common.load_average()
        result["peak_rss_mib"] = common.peak_rss_mib()
        common.emit(result)
    finally:
        shutil.rmtree(dump_dir, ignore_errors=True)


def summarize(raw, names):
    """Per experiment: median images/s, and the median over rounds of its ratio to that round's baseline."""
    table = {}
    for name in names:
        row = {}
        for mode in ("forward", "train"):
            for key in ("images_per_s", "images_per_cpu_s"):
                values = [r[mode][key] for r in raw[name] if "error" not in r]
                ratios = [r[mode][key] / b[mode][key] for r, b in zip(raw[name], raw["baseline"])
                          if "error" not in r and "error" not in b]
                row[f"{mode}_{key}"] = statistics.median(values) if values else None
                row[f"{mode}_{key}_vs_baseline"] = statistics.median(ratios) if ratios else None
                row[f"{mode}_{key}_vs_baseline_all"] = ratios
        table[name] = row
    return table


def print_table(summary):
    names = list(summary["table"])
    print(f"\nViT {summary['variant']} float32 on jax, forward batch {summary['forward_batch']}, train batch "
          f"{summary['train_batch']}, {summary['rounds']} rounds; load {summary['load_at_start']:.1f} at start, "
          f"{summary['load_at_end']:.1f} at end")
    print(f"{'experiment':26} {'fwd img/s':>9} {'x base':>7} {'per CPU-s':>9} {'x base':>7} "
          f"{'train img/s':>11} {'x base':>7} {'per CPU-s':>9} {'x base':>7}  loop fusions  all fusions")
    for name in names:
        row = summary["table"][name]

        def cell(key, width, digits=2):
            value = row.get(key)
            return f"{value:>{width}.{digits}f}" if value is not None else f"{'-':>{width}}"

        counts = summary["programs"].get(name) or {}
        loops = sum(v for k, v in counts.items() if k.startswith("fusion:kLoop"))
        fusions = sum(v for k, v in counts.items() if k.startswith("fusion:"))
        print(f"{name:26} {cell('forward_images_per_s', 9)} {cell('forward_images_per_s_vs_baseline', 7)} "
              f"{cell('forward_images_per_cpu_s', 9)} {cell('forward_images_per_cpu_s_vs_baseline', 7)} "
              f"{cell('train_images_per_s', 11)} {cell('train_images_per_s_vs_baseline', 7)} "
              f"{cell('train_images_per_cpu_s', 9)} {cell('train_images_per_cpu_s_vs_baseline', 7)}  "
              f"{loops:>12} {fusions:>12}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--python", default=sys.executable, help="Python of the env with keras_vit and jax.")
    parser.add_argument("--experiments", default=",".join(EXPERIMENTS),
                        help=f"Comma-separated, from: {', '.join(EXPERIMENTS)}. The baseline always runs.")
    parser.add_argument("--variant", default="ViT-S/16", choices=tuple(common.TIMM_NAMES)[:3])
    parser.add_argument("--forward-batch", type=int, default=8)
    parser.add_argument("--train-batch", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--output-dir", default=os.path.join(HERE, "results"))
    parser.add_argument("--report", metavar="JSON", help="Only print the table of an earlier run.")
    parser.add_argument("--worker", choices=tuple(EXPERIMENTS), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args)
    if args.report:
        with open(args.report) as f:
            print_table(json.load(f))
        return 0
    names = ["baseline"] + [n.strip() for n in args.experiments.split(",") if n.strip() and n.strip() != "baseline"]
    for name in names:
        if name not in EXPERIMENTS:
            parser.error(f"unknown experiment {name!r}; choose from {', '.join(EXPERIMENTS)}")
    try:
        base_flags = xla_flags.build(os.environ.get("XLA_FLAGS", ""))
    except ValueError as error:
        parser.error(str(error))
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    summary = {"date_utc": stamp, "machine": common.host_info(), "variant": args.variant,
               "forward_batch": args.forward_batch, "train_batch": args.train_batch, "rounds": args.rounds,
               "warmup": args.warmup, "repeats": args.repeats, "load_at_start": common.load_average(),
               "experiments": {n: {"xla_flags": EXPERIMENTS[n][0], "what": EXPERIMENTS[n][2]} for n in names},
               "command": " ".join(sys.argv)}
    raw = {name: [] for name in names}
    started = time.perf_counter()
    for round_index in range(args.rounds):
        order = names if round_index % 2 == 0 else list(reversed(names))
        for name in order:
            env = dict(os.environ, KERAS_BACKEND="jax", TF_CPP_MIN_LOG_LEVEL="2",
                       XLA_FLAGS=xla_flags.build(base_flags, EXPERIMENTS[name][0]))
            env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
            command = [args.python, os.path.abspath(__file__), "--worker", name, "--variant", args.variant,
                       "--forward-batch", str(args.forward_batch), "--train-batch", str(args.train_batch),
                       "--warmup", str(args.warmup), "--repeats", str(args.repeats)]
            proc = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True)
            lines = [line for line in proc.stdout.splitlines() if line.startswith("BENCH_RESULT ")]
            if lines:
                result = json.loads(lines[-1][len("BENCH_RESULT "):])
                status = (f"fwd {result['forward']['images_per_s']:.2f} img/s, train "
                          f"{result['train']['images_per_s']:.2f} img/s; XLA read: {result['xla_parsed']}")
            else:
                result = {"error": f"exit code {proc.returncode}", "stderr_tail": proc.stderr[-1500:]}
                status = result["error"] + "\n" + result["stderr_tail"]
            raw[name].append(result)
            print(f"[{time.perf_counter() - started:6.0f}s] round {round_index + 1} {name}: {status} "
                  f"(load {common.load_average():.1f})", flush=True)
    summary["raw"] = raw
    summary["table"] = summarize(raw, names)
    summary["programs"] = {n: next((r.get("train_program") for r in raw[n] if "error" not in r), None)
                           for n in names}
    path = common.write_summary(summary, args.output_dir, f"jax-experiments-{stamp}.json")
    print_table(summary)
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
