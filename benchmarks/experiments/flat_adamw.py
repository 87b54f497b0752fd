"""AdamW over all weights at once (one flat update) against Keras' per-weight update, on every backend.

Keras' AdamW updates each weight on its own: on JAX, XLA's CPU backend
compiles each weight's update into loop fusions of its own, about half of the
990 loop fusions of a ViT-S/16 training step (issue 51). The flat way
concatenates every gradient, moment and weight into one vector, runs the Adam
step once over it, and slices the results back (as PyTorch's `foreach` and
fused AdamW work over lists of tensors). The same arithmetic in the same
order; this measures which trains faster.

The flat way is set on the optimizer of one of two models in each process
(`_backend_update_step` of that instance, so the package is not edited to try
it) on jax and tensorflow. On torch keras_vit's AdamW already runs torch's
fused Adam kernel over all weights, which the flat way leaves as it is: the
torch rows are the same code timed twice, a check of the method's noise.
In each round each way is timed `--repeats` training steps, the order of the
two reversed every other round; `--processes` repeats it in new processes
(which way is built first alternates). Before timing, both models train one
step from the same weights and the largest weight difference is recorded.
On jax, one more process per way counts the loop fusions of the compiled
training step.

    PYTHONPATH=. .venv/bin/python benchmarks/experiments/flat_adamw.py
    PYTHONPATH=. .venv/bin/python benchmarks/experiments/flat_adamw.py --backends jax --rounds 6 --processes 2

Writes `benchmarks/results/flat-adamw-<UTC time>.json`.
"""

import argparse
import datetime
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import types

EXPERIMENTS = os.path.dirname(os.path.abspath(__file__))
HERE = os.path.dirname(EXPERIMENTS)  # benchmarks/: common.py, keras_worker.py, results/
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, EXPERIMENTS)
sys.path.insert(0, ROOT)

import common  # noqa: E402

WAYS = ("per_weight", "flat")
BACKENDS = ("jax", "torch", "tensorflow")


def flat_update_step(self, grads, trainable_variables, learning_rate):
    """Keras' Adam step (after its weight decay) over one flat vector of every weight.

    The same formulas as `keras.optimizers.Adam.update_step`, in the same
    order: `m += (g - m) * (1 - beta_1)`, `v += (g**2 - v) * (1 - beta_2)`,
    `w -= m * alpha / (sqrt(v) + epsilon)`, with
    `alpha = lr * sqrt(1 - beta_2**t) / (1 - beta_1**t)`.
    """
    from keras import ops

    if self.amsgrad or any(v.dtype != "float32" for v in trainable_variables):
        return type(self)._backend_update_step(self, grads, trainable_variables, learning_rate)
    step = ops.cast(self.iterations + 1, "float32")
    lr = ops.cast(learning_rate, "float32")
    alpha = lr * ops.sqrt(1 - ops.power(ops.cast(self.beta_2, "float32"), step)) / (
        1 - ops.power(ops.cast(self.beta_1, "float32"), step))
    indices = [self._get_variable_index(v) for v in trainable_variables]
    momentums = [self._momentums[i] for i in indices]
    velocities = [self._velocities[i] for i in indices]

    def flat(tensors):
        return ops.concatenate([ops.reshape(ops.cast(t, "float32"), (-1,)) for t in tensors], axis=0)

    g, m, v, w = flat(grads), flat(momentums), flat(velocities), flat(trainable_variables)
    m = m + (g - m) * (1 - self.beta_1)
    v = v + (ops.square(g) - v) * (1 - self.beta_2)
    w = w - m * alpha / (ops.sqrt(v) + self.epsilon)
    start = 0
    for variable, momentum, velocity in zip(trainable_variables, momentums, velocities):
        size = 1
        for dim in variable.shape:
            size *= dim
        for target, values in ((momentum, m), (velocity, v), (variable, w)):
            self.assign(target, ops.reshape(values[start:start + size], variable.shape))
        start += size


def _build(way, args, keras, backend):
    from keras_vit.models import ViTClassifier
    from keras_vit.workflows.optimizers import AdamW

    model = ViTClassifier.from_variant(args.variant, num_classes=common.NUM_CLASSES, activation=None)
    optimizer = AdamW(learning_rate=1e-4, weight_decay=0.05)
    if way == "flat" and backend != "torch":
        optimizer._backend_update_step = types.MethodType(flat_update_step, optimizer)
    model.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  jit_compile=backend != "torch")  # as run.py: XLA on jax and tensorflow, eager on torch
    return model


def worker(args):
    import keras
    import numpy as np

    import keras_worker

    backend = keras.backend.backend()
    keras_worker.set_threads(backend, args.threads)
    rng = np.random.default_rng(0)
    images = rng.uniform(0, 255, (args.train_batch, 224, 224, 3)).astype("float32")
    labels = rng.integers(0, common.NUM_CLASSES, (args.train_batch,)).astype("int32")
    if args.count_fusions:
        import jax_experiments

        model = _build(args.count_fusions, args, keras, backend)
        model.train_on_batch(images, labels)
        counts = jax_experiments.fusion_counts(args.dump_dir) or {}
        loops = sum(n for k, n in counts.items() if k.startswith("fusion:kLoop"))
        common.emit({"backend": backend, "way": args.count_fusions, "loop_fusions": loops,
                     "all_fusions": sum(n for k, n in counts.items() if k.startswith("fusion:"))})
        return
    models, first_call = {}, {}
    for way in WAYS if args.built_first == WAYS[0] else tuple(reversed(WAYS)):
        models[way] = _build(way, args, keras, backend)
    # Same start, one step each: the flat way must compute Keras' update.
    models["flat"].set_weights(models["per_weight"].get_weights())
    for way in WAYS:
        start = time.perf_counter()
        models[way].train_on_batch(images, labels)
        first_call[way] = time.perf_counter() - start
    difference = max(float(np.abs(np.asarray(a) - np.asarray(b)).max())
                     for a, b in zip(models["flat"].get_weights(), models["per_weight"].get_weights()))
    for _ in range(args.warmup):
        for way in WAYS:
            models[way].train_on_batch(images, labels)
    rounds = []
    for index in range(args.rounds):
        order = WAYS if index % 2 == 0 else tuple(reversed(WAYS))
        result = {"order": order, "load": common.load_average()}
        for way in order:
            wall, cpu = common.time_calls(lambda m=models[way]: m.train_on_batch(images, labels), 0, args.repeats)
            result[way] = {"images_per_s": statistics.median(args.train_batch / t for t in wall),
                           "images_per_cpu_s": statistics.median(args.train_batch / t for t in cpu), "seconds": wall}
        rounds.append(result)
    common.emit({"backend": backend, "threads": args.threads, "built_first": args.built_first,
                 "first_call_seconds": first_call, "max_weight_difference_after_one_step": difference,
                 "rounds": rounds, "peak_rss_mib": common.peak_rss_mib()})


def ratios(results, backend, key):
    """flat / per-weight of each round of each process of `backend`."""
    return [r["flat"][key] / r["per_weight"][key]
            for result in results if result.get("backend") == backend and "rounds" in result
            for r in result["rounds"]]


def print_table(summary):
    from patch_projection import median_interval

    print(f"\nViT {summary['variant']} float32 training, batch {summary['train_batch']}, {summary['threads']} "
          f"threads, {summary['processes']} process(es) x {summary['rounds']} rounds x {summary['repeats']} steps "
          f"per way; load {summary['load_at_start']:.1f} at start, {summary['load_at_end']:.1f} at end")
    print("flat / per-weight per round: median (90% bootstrap interval of the median) [min-max] n")
    for backend, row in summary["table"].items():
        cells = []
        for key in ("images_per_s", "images_per_cpu_s"):
            values = row[key]
            if not values:
                cells.append("-")
                continue
            low, high = median_interval(values)
            cells.append(f"{statistics.median(values):.3f} ({low:.3f}-{high:.3f}) "
                         f"[{min(values):.2f}-{max(values):.2f}] {len(values)}")
        extra = f"; max weight difference after one step {row['max_weight_difference']}"
        if row.get("loop_fusions"):
            extra += f"; loop fusions {row['loop_fusions']}"
        print(f"{backend:11} wall {cells[0]:>34}  per CPU-s {cells[1]:>34}{extra}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--python", default=sys.executable, help="Python of the env with keras_vit.")
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--variant", default="ViT-Ti/16", choices=tuple(common.TIMM_NAMES)[:3])
    parser.add_argument("--train-batch", type=int, default=4)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3, help="timed steps per way and round")
    parser.add_argument("--rounds", type=int, default=6, help="alternations per process")
    parser.add_argument("--processes", type=int, default=2, help="new processes per backend")
    parser.add_argument("--output-dir", default=os.path.join(HERE, "results"))
    parser.add_argument("--report", metavar="JSON", help="Only print the table of an earlier run.")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--built-first", choices=WAYS, default=WAYS[0], help=argparse.SUPPRESS)
    parser.add_argument("--count-fusions", choices=WAYS, help=argparse.SUPPRESS)
    parser.add_argument("--dump-dir", help=argparse.SUPPRESS)
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
               "train_batch": args.train_batch, "threads": args.threads, "warmup": args.warmup,
               "repeats": args.repeats, "rounds": args.rounds, "processes": args.processes,
               "load_at_start": common.load_average(), "command": " ".join(sys.argv)}
    results, counts = [], []
    started = time.perf_counter()
    os.makedirs(args.output_dir, exist_ok=True)
    log_path = os.path.join(args.output_dir, f"flat-adamw-{stamp}.log")
    base = [args.python, os.path.abspath(__file__), "--worker", "--variant", args.variant,
            "--train-batch", str(args.train_batch), "--threads", str(args.threads)]
    with open(log_path, "w") as log:
        for index in range(args.processes):
            for backend in backends if index % 2 == 0 else list(reversed(backends)):
                env = {**run.child_env(args.threads), "KERAS_BACKEND": backend}
                command = base + ["--warmup", str(args.warmup), "--repeats", str(args.repeats),
                                  "--rounds", str(args.rounds), "--built-first", WAYS[index % 2]]
                result = run.run_worker(command, env, log)
                log.flush()  # each process's output on disk as it ends: a stopped run keeps what it measured
                result.setdefault("backend", backend)
                results.append(result)
                status = (f"{result['error']}\n{result.get('stderr_tail', '')}" if "error" in result else
                          f"train {statistics.median(ratios([result], backend, 'images_per_s')):.3f}, weights "
                          f"differ by {result['max_weight_difference_after_one_step']:.1e}")
                print(f"[{time.perf_counter() - started:6.0f}s] process {index + 1} {backend}: flat/per-weight "
                      f"{status} (load {common.load_average():.1f})", flush=True)
        if "jax" in backends:
            for way in WAYS:
                dump = tempfile.mkdtemp(prefix="flat-adamw-dump-")
                env = {**run.child_env(args.threads), "KERAS_BACKEND": "jax",
                       "XLA_FLAGS": f"--xla_dump_to={dump} --xla_dump_hlo_module_re=.*train_step.*"}
                result = run.run_worker(base + ["--count-fusions", way, "--dump-dir", dump], env, log)
                shutil.rmtree(dump, ignore_errors=True)
                counts.append(result)
                print(f"[{time.perf_counter() - started:6.0f}s] jax {way}: {result.get('loop_fusions')} loop fusions "
                      f"of {result.get('all_fusions')}", flush=True)
    summary["load_at_end"] = common.load_average()
    summary["raw"] = results
    summary["fusions"] = counts
    summary["table"] = {}
    for b in backends:
        row = {key: ratios(results, b, key) for key in ("images_per_s", "images_per_cpu_s")}
        row["max_weight_difference"] = max((r["max_weight_difference_after_one_step"] for r in results
                                            if r.get("backend") == b and "rounds" in r), default=None)
        if b == "jax":
            row["loop_fusions"] = {c.get("way"): c.get("loop_fusions") for c in counts}
        summary["table"][b] = row
    path = common.write_summary(summary, args.output_dir, f"flat-adamw-{stamp}.json")
    print_table(summary)
    print(f"\nwrote {path} (worker output: {log_path})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
