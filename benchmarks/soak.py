"""Soak: 1,000 training steps of the digits model under mixed_bfloat16, per backend.

Checks what a short test cannot: that a long run stays finite (loss and every
weight) under `mixed_bfloat16`, and that resident memory (RSS) is flat after
warm-up, i.e. nothing grows per step (a leak in a callback, a retrace per
batch, a cache that never empties).

Usage:

    python benchmarks/soak.py                      # every installed backend, one process each
    python benchmarks/soak.py --backend jax        # one backend
    python benchmarks/soak.py --steps 200 --json soak.json

Each backend runs in its own process (KERAS_BACKEND is read once, at import).
The run fails (exit 1) when a loss or a weight is not finite, or when RSS
grows by more than `--max-growth` (default 5%) between the end of the warm-up
epoch and the end of the run. Timing is reported but never asserted.
"""

import argparse
import importlib.util
import json
import os
import platform
import subprocess
import sys
import time

import common  # benchmarks/ is this script's directory, first on sys.path

BACKENDS = ("jax", "torch", "tensorflow")
_PACKAGES = {"jax": "jax", "torch": "torch", "tensorflow": "tensorflow"}


def resident_mib():
    """Resident set size of this process in MiB (Linux /proc; ru_maxrss elsewhere, a peak)."""
    try:
        with open("/proc/self/statm") as handle:
            pages = int(handle.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError):
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak / (2**20 if sys.platform == "darwin" else 2**10)



def soak_one(steps, steps_per_epoch, batch_size, seed):
    """Train in this process (KERAS_BACKEND already set) and return the figures."""
    import keras
    import numpy as np

    from keras_vit.data import load_digits_split
    from keras_vit.workflows.digits_demo import build_digits_classifier

    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    (x_train, y_train), _ = load_digits_split(seed=seed)
    # Enough samples for `steps_per_epoch` full batches per epoch.
    repeats = -(-steps_per_epoch * batch_size // len(x_train))
    x = np.concatenate([x_train] * repeats)[: steps_per_epoch * batch_size]
    y = np.concatenate([y_train] * repeats)[: steps_per_epoch * batch_size]
    epochs = max(1, steps // steps_per_epoch)

    model = build_digits_classifier(seed=seed)
    model.compile(
        optimizer=keras.optimizers.AdamW(learning_rate=1e-3, weight_decay=0.05),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    rss = []
    times = []

    class Probe(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            rss.append(resident_mib())
            times.append(time.perf_counter())

    start = time.perf_counter()
    history = model.fit(x, y, batch_size=batch_size, epochs=epochs, shuffle=True, verbose=0, callbacks=[Probe()])
    losses = [float(v) for v in history.history["loss"]]
    finite_weights = all(bool(np.all(np.isfinite(keras.ops.convert_to_numpy(w.value).astype("float32"))))
                         for w in model.weights)
    steady = times[-1] - times[0]
    return {
        "backend": keras.backend.backend(),
        "policy": keras.mixed_precision.global_policy().name,
        "steps": epochs * steps_per_epoch,
        "batch_size": batch_size,
        "losses": losses,
        "final_accuracy": float(history.history["accuracy"][-1]),
        "finite_loss": all(np.isfinite(losses)),
        "finite_weights": finite_weights,
        "rss_mib_per_epoch": [round(v, 1) for v in rss],
        "rss_after_warmup_mib": round(rss[0], 1),
        "rss_end_mib": round(rss[-1], 1),
        "rss_growth": (rss[-1] - rss[0]) / rss[0],
        "seconds": round(times[-1] - start, 1),
        "steps_per_second_after_warmup": round((epochs - 1) * steps_per_epoch / steady, 1) if epochs > 1 else None,
        "host": common.host_info()["cpu"],
        "versions": {"keras": keras.__version__, "python": platform.python_version()},
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="all", choices=("all", *BACKENDS))
    parser.add_argument("--steps", type=int, default=1000, help="training steps (default: 1000)")
    parser.add_argument("--steps-per-epoch", type=int, default=100,
                        help="steps between RSS samples; the first epoch is the warm-up (default: 100)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-growth", type=float, default=0.05,
                        help="largest RSS growth after warm-up still called flat (default: 0.05)")
    parser.add_argument("--json", default=None, help="also write the results to this JSON file")
    parser.add_argument("--_worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.steps < 2 * args.steps_per_epoch:
        parser.error("--steps must cover at least two epochs of --steps-per-epoch (warm-up, then the soak)")

    if args._worker:
        print(json.dumps(soak_one(args.steps, args.steps_per_epoch, args.batch_size, args.seed)))
        return 0

    backends = BACKENDS if args.backend == "all" else (args.backend,)
    results = []
    for backend in backends:
        if importlib.util.find_spec(_PACKAGES[backend]) is None:
            print(f"{backend}: not installed, skipped")
            continue
        command = [sys.executable, os.path.abspath(__file__), "--_worker", "--steps", str(args.steps),
                   "--steps-per-epoch", str(args.steps_per_epoch), "--batch-size", str(args.batch_size),
                   "--seed", str(args.seed)]
        done = subprocess.run(command, env={**os.environ, "KERAS_BACKEND": backend}, capture_output=True, text=True)
        if done.returncode:
            print(f"{backend}: the worker failed:\n{done.stderr[-3000:]}")
            results.append({"backend": backend, "error": done.stderr[-3000:]})
            continue
        result = json.loads(done.stdout.strip().splitlines()[-1])
        results.append(result)
        print(f"{backend}: {result['steps']} steps ({result['policy']}), loss {result['losses'][0]:.3f} -> "
              f"{result['losses'][-1]:.3f}, finite loss {result['finite_loss']}, finite weights "
              f"{result['finite_weights']}; RSS {result['rss_after_warmup_mib']:.0f} MiB after warm-up -> "
              f"{result['rss_end_mib']:.0f} MiB at the end ({result['rss_growth']:+.1%}); "
              f"{result['seconds']} s; host {result['host']}")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(results, handle, indent=2)
    failed = [r["backend"] for r in results if "error" in r or not (r["finite_loss"] and r["finite_weights"])
              or r["rss_growth"] > args.max_growth]
    if failed:
        print(f"FAILED: {', '.join(failed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
