"""The patch projection on (B, N, P) against the folded (B * N, P) view, on every backend.

`PatchEncoder` projects the flattened patches with one Dense layer. Applied
to the rank-3 `(B, N, P)` patches, XLA's CPU backend differentiates it
through a transposing fusion of many inputs (issue 42); folded to the 2-D
`(B * N, P)` view, it is the same matmul the blocks' Dense layers run. The
two are the same arithmetic on the same weights; this measures which runs
faster on jax, torch and tensorflow.

One process per backend holds two models, one per way of projecting (set on
each model's own `PatchEncoder`, so the package is not edited to try it),
and alternates them: in each round, forward then training, each way timed
`--repeats` times, the order of the two reversed every other round. So both
see the same machine load, and the ratio folded / rank-3 of each round can
be read on a busy host. `--processes` repeats the whole thing in new
processes (the backends' order, and which way is built first, reversed each
time). Threads are set as
`run.py` sets them (`--threads`, default all CPUs: 2 here).

    PYTHONPATH=. .venv/bin/python benchmarks/experiments/patch_projection.py
    PYTHONPATH=. .venv/bin/python benchmarks/experiments/patch_projection.py --backends jax --rounds 4 --processes 1

Writes `benchmarks/results/patch-projection-<UTC time>.json`.
"""

import argparse
import datetime
import json
import os
import statistics
import sys
import time
import types

EXPERIMENTS = os.path.dirname(os.path.abspath(__file__))
HERE = os.path.dirname(EXPERIMENTS)  # benchmarks/: common.py, keras_worker.py, results/
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, EXPERIMENTS)
sys.path.insert(0, ROOT)

import common  # noqa: E402

WAYS = ("rank3", "folded")
BACKENDS = ("jax", "torch", "tensorflow")


def project_rank3(self, patches):
    """The Dense layer called on the (B, N, P) patches (keras_vit before issue 42)."""
    return self.projection(patches)  # (B, N, D)


def project_folded(self, patches):
    """The Dense layer called on the (B * N, P) view (keras_vit since issue 42)."""
    from keras import ops

    tokens, features = ops.shape(patches)[1], patches.shape[-1]
    x = self.projection(ops.reshape(patches, (-1, features)))  # (B * N, D)
    return ops.reshape(x, (-1, tokens, self.hidden_dim))  # (B, N, D)


def _rates(fn, batch, repeats):
    wall, cpu = common.time_calls(fn, 0, repeats)
    return {"images_per_s": statistics.median(batch / t for t in wall),
            "images_per_cpu_s": statistics.median(batch / t for t in cpu), "seconds": wall}


def worker(args):
    import keras
    import numpy as np

    import keras_worker

    backend = keras.backend.backend()
    keras_worker.set_threads(backend, args.threads)
    from keras_vit.models import ViTClassifier
    from keras_vit.workflows.optimizers import AdamW

    rng = np.random.default_rng(0)
    forward_images = rng.uniform(0, 255, (args.forward_batch, 224, 224, 3)).astype("float32")
    train_images = rng.uniform(0, 255, (args.train_batch, 224, 224, 3)).astype("float32")
    labels = rng.integers(0, common.NUM_CLASSES, (args.train_batch,)).astype("int32")
    models, first_call = {}, {}
    # The way built (and compiled) first alternates between processes too: on eager torch the
    # first model's buffers may land differently in memory.
    for way in WAYS if args.built_first == WAYS[0] else tuple(reversed(WAYS)):
        model = ViTClassifier.from_variant(args.variant, num_classes=common.NUM_CLASSES, activation=None)
        encoder = model.backbone.get_layer("patch_encoder")
        encoder.project = types.MethodType(project_folded if way == "folded" else project_rank3, encoder)
        # As run.py: XLA on jax and tensorflow, eager on torch.
        model.compile(optimizer=AdamW(learning_rate=1e-4),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      jit_compile=backend != "torch")
        models[way] = model
        start = time.perf_counter()
        forward = model.predict_on_batch(forward_images)
        first_call[f"{way}_forward"] = time.perf_counter() - start
        start = time.perf_counter()
        model.train_on_batch(train_images, labels)
        first_call[f"{way}_train"] = time.perf_counter() - start
        for _ in range(args.warmup):
            model.predict_on_batch(forward_images)
            model.train_on_batch(train_images, labels)
    # Same weights would give the same logits; here the check is only that both ways ran to a finite result.
    assert np.isfinite(forward).all()
    rounds = []
    for index in range(args.rounds):
        order = WAYS if index % 2 == 0 else tuple(reversed(WAYS))
        result = {"order": order, "load": common.load_average()}
        for mode in ("forward", "train"):
            for way in order:
                model = models[way]
                if mode == "forward":
                    fn, batch = (lambda m=model: m.predict_on_batch(forward_images)), args.forward_batch
                else:
                    fn, batch = (lambda m=model: m.train_on_batch(train_images, labels)), args.train_batch
                result[f"{way}_{mode}"] = _rates(fn, batch, args.repeats)
        rounds.append(result)
    common.emit({"backend": backend, "threads": args.threads, "built_first": args.built_first,
                 "first_call_seconds": first_call, "rounds": rounds,
                 "placement": common.placement(), "peak_rss_mib": common.peak_rss_mib()})


def ratios(results, backend, mode, key):
    """folded / rank-3 of each round of each process of `backend`."""
    return [r[f"folded_{mode}"][key] / r[f"rank3_{mode}"][key]
            for result in results if result.get("backend") == backend for r in result["rounds"]]


def median_interval(values, draws=2000, seed=0):
    """A 90% bootstrap interval of the median of `values` (seeded: the same run prints the same interval)."""
    import random

    rng = random.Random(seed)
    medians = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(draws))
    return medians[int(0.05 * draws)], medians[int(0.95 * draws) - 1]


def print_table(summary):
    print(f"\nViT {summary['variant']} float32, forward batch {summary['forward_batch']}, train batch "
          f"{summary['train_batch']}, {summary['threads']} threads, {summary['processes']} process(es) x "
          f"{summary['rounds']} rounds x {summary['repeats']} calls per way; load {summary['load_at_start']:.1f} "
          f"at start, {summary['load_at_end']:.1f} at end")
    print("folded / rank-3 per round: median (90% bootstrap interval of the median) [min-max] n")
    print(f"{'backend':11} " + " ".join(f"{title:>34}" for title in
                                         ("forward wall", "forward per CPU-s", "train wall", "train per CPU-s")))
    for backend, row in summary["table"].items():
        cells = []
        for key in ("forward_images_per_s", "forward_images_per_cpu_s", "train_images_per_s",
                    "train_images_per_cpu_s"):
            values = row[key]
            if not values:
                cells.append("-")
                continue
            low, high = median_interval(values)
            cells.append(f"{statistics.median(values):.3f} ({low:.3f}-{high:.3f}) "
                         f"[{min(values):.2f}-{max(values):.2f}] {len(values)}")
        print(f"{backend:11} " + " ".join(f"{c:>34}" for c in cells))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--python", default=sys.executable, help="Python of the env with keras_vit.")
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--variant", default="ViT-S/16", choices=tuple(common.TIMM_NAMES)[:3])
    parser.add_argument("--forward-batch", type=int, default=8, help="run.py's for ViT-S/16")
    parser.add_argument("--train-batch", type=int, default=4, help="run.py's for ViT-S/16")
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=2, help="timed calls per way, mode and round")
    parser.add_argument("--rounds", type=int, default=5, help="alternations per process")
    parser.add_argument("--processes", type=int, default=2, help="new processes per backend")
    parser.add_argument("--output-dir", default=os.path.join(HERE, "results"))
    parser.add_argument("--report", metavar="JSON", help="Only print the table of an earlier run.")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--built-first", choices=WAYS, default=WAYS[0], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args)
    if args.report:
        with open(args.report) as f:
            print_table(json.load(f))
        return 0
    import run

    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    for backend in backends:
        if backend not in BACKENDS:
            parser.error(f"unknown backend {backend!r}; choose from {', '.join(BACKENDS)}")
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    summary = {"date_utc": stamp, "machine": common.host_info(), "variant": args.variant,
               "forward_batch": args.forward_batch, "train_batch": args.train_batch, "threads": args.threads,
               "warmup": args.warmup, "repeats": args.repeats, "rounds": args.rounds, "processes": args.processes,
               "load_at_start": common.load_average(), "command": " ".join(sys.argv)}
    results = []
    started = time.perf_counter()
    log_path = os.path.join(args.output_dir, f"patch-projection-{stamp}.log")
    os.makedirs(args.output_dir, exist_ok=True)
    with open(log_path, "w") as log:
        for index in range(args.processes):
            for backend in backends if index % 2 == 0 else list(reversed(backends)):
                env = {**run.child_env(args.threads), "KERAS_BACKEND": backend}
                command = [args.python, os.path.abspath(__file__), "--worker", "--variant", args.variant,
                           "--forward-batch", str(args.forward_batch), "--train-batch", str(args.train_batch),
                           "--threads", str(args.threads), "--warmup", str(args.warmup),
                           "--repeats", str(args.repeats), "--rounds", str(args.rounds),
                           "--built-first", WAYS[index % 2]]
                result = run.run_worker(command, env, log)
                result.setdefault("backend", backend)
                results.append(result)
                if "error" in result:
                    status = f"{result['error']}\n{result['stderr_tail']}"
                else:
                    status = " ".join(
                        f"{mode} {statistics.median(ratios([result], backend, mode, 'images_per_s')):.3f}"
                        for mode in ("forward", "train"))
                print(f"[{time.perf_counter() - started:6.0f}s] process {index + 1} {backend}: folded/rank-3 "
                      f"{status} (load {common.load_average():.1f})", flush=True)
    summary["raw"] = results
    summary["table"] = {b: {f"{mode}_{key}": ratios(results, b, mode, key) for mode in ("forward", "train")
                            for key in ("images_per_s", "images_per_cpu_s")} for b in backends}
    path = common.write_summary(summary, args.output_dir, f"patch-projection-{stamp}.json")
    print_table(summary)
    print(f"\nwrote {path} (worker output: {log_path})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
