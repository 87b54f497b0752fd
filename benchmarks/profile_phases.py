"""Where a training step's time goes, phase by phase: keras_vit on jax against timm on torch.

    KERAS_BACKEND=jax PYTHONPATH=. .venv/bin/python benchmarks/profile_phases.py --impl keras
    .venv-ref/bin/python benchmarks/profile_phases.py --impl timm

`benchmarks/profile_torch.py` lists torch operators; XLA compiles a jax step
into one program, so an operator table says little there. This script splits
the step instead, timing each phase on its own:

- `forward`: inference (keras_vit: a jitted `stateless_call`; timm: `inference_mode`);
- `loss+grad`: forward with training on, loss and gradients (`jax.value_and_grad`
  jitted; timm: forward, cross-entropy, `backward()`);
- `optimizer`: one AdamW update from fixed gradients (Keras' `stateless_apply`
  jitted; timm: `torch.optim.AdamW.step()`);
- `step`: what users run (`train_on_batch`; timm: the whole loop).

For jax it also prints the compiled programs' FLOP counts (XLA's own cost
analysis), the GFLOP/s each phase reaches, and how many dot, convolution,
transpose and copy instructions the optimized programs hold (transposes and
copies are where a layout costs time). Pass XLA_FLAGS in the environment to
compare compiler settings. `--trace DIR` also records the gradient program
with `jax.profiler` (XLA's per-thunk trace events switched on) and prints
the time per kind of compiled operation (matmul fusions, copies, ...).
Medians of `--repeats` calls after `--warmup`, with the process's CPU seconds
per call beside wall-clock.
"""

import argparse
import collections
import glob
import gzip
import json
import os
import re
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import common  # noqa: E402


def timed(fn, warmup, repeats, sync=lambda result: result):
    """Median wall and CPU seconds of `repeats` calls after `warmup` calls (`sync` waits for the result)."""
    wall, cpu = common.time_calls(lambda: sync(fn()), warmup, repeats)
    return statistics.median(wall), statistics.median(cpu)


def hlo_histogram(compiled):
    """Counts of the instructions that matter for speed in an optimized XLA program."""
    text = compiled.as_text()
    counts = {}
    for name in ("dot", "convolution", "transpose", "copy", "fusion", "custom-call"):
        counts[name] = len(re.findall(rf"= \S+ {re.escape(name)}\(", text))
    return counts


def flops_of(compiled):
    analysis = compiled.cost_analysis()
    if isinstance(analysis, (list, tuple)):
        analysis = analysis[0] if analysis else {}
    return float((analysis or {}).get("flops", 0.0))


def thunk_time_by_kind(trace_dir, calls):
    """Milliseconds per call spent in each kind of XLA CPU thunk, from a perfetto trace.

    Thunk names are the compiled program's instruction names (`ynn_fusion.40`,
    `copy_bitcast_fusion.3`, ...); the numeric suffix is dropped to group them.
    """
    (path,) = glob.glob(os.path.join(trace_dir, "**", "perfetto_trace.json.gz"), recursive=True)[-1:]
    with gzip.open(path) as file:
        trace = json.load(file)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    runtime = ("ThunkExecutor", "SlinkyThreadPool", "PjitFunction", "CommonPjRt", "end: ")
    kinds = collections.Counter()
    for event in events:
        name = event.get("name", "")
        if event.get("ph") != "X" or name.startswith("$") or name.startswith(runtime):
            continue
        kinds[re.sub(r"[._]?\d+$", "", name)] += event.get("dur", 0) / 1e3 / calls
    return kinds


def keras_phases(args):
    os.environ.setdefault("KERAS_BACKEND", "jax")
    if args.trace:  # must be set before jax starts XLA
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_cpu_enable_xprof_traceme=true").strip()
    import jax
    import keras
    import numpy as np

    from keras_vit.models import ViTClassifier

    if keras.backend.backend() != "jax":
        raise SystemExit("--impl keras profiles the jax backend: run with KERAS_BACKEND=jax.")
    model = ViTClassifier.from_variant(args.variant, activation=None)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    optimizer = keras.optimizers.AdamW(1e-4)
    model.compile(optimizer=optimizer, loss=loss, metrics=[], jit_compile=True)
    rng = np.random.default_rng(0)
    images = rng.uniform(0, 255, (args.batch, 224, 224, 3)).astype("float32")
    labels = rng.integers(0, 1000, (args.batch,)).astype("int32")
    trainable = [v.value for v in model.trainable_variables]
    non_trainable = [v.value for v in model.non_trainable_variables]

    def predict(trainable, non_trainable, x):
        return model.stateless_call(trainable, non_trainable, x, training=False)[0]

    def loss_of(trainable, non_trainable, x, y):
        logits, _ = model.stateless_call(trainable, non_trainable, x, training=True)
        return loss(y, logits)

    optimizer.build(model.trainable_variables)
    optimizer_state = [v.value for v in optimizer.variables]

    def update(optimizer_state, grads, trainable):
        return optimizer.stateless_apply(optimizer_state, grads, trainable)

    programs = {
        "forward": (jax.jit(predict), (trainable, non_trainable, images)),
        "loss+grad": (jax.jit(jax.value_and_grad(loss_of)), (trainable, non_trainable, images, labels)),
    }
    grads = programs["loss+grad"][0](*programs["loss+grad"][1])[1]
    programs["optimizer"] = (jax.jit(update), (optimizer_state, grads, trainable))

    rows = {}
    for name, (fn, inputs) in programs.items():
        compiled = fn.lower(*inputs).compile()
        wall, cpu = timed(lambda: compiled(*inputs), args.warmup, args.repeats, jax.block_until_ready)
        rows[name] = {"wall": wall, "cpu": cpu, "flops": flops_of(compiled), "hlo": hlo_histogram(compiled)}
    if args.trace:  # before train_on_batch, which donates the variables' buffers
        gradients, inputs = programs["loss+grad"]
        with jax.profiler.trace(args.trace, create_perfetto_trace=True):
            for _ in range(args.repeats):
                jax.block_until_ready(gradients(*inputs))
        kinds = thunk_time_by_kind(args.trace, args.repeats)
        total = sum(kinds.values())
        print(f"loss+grad by kind of compiled operation (ms per call, {total:.1f} in all):")
        for kind, ms in kinds.most_common(12):
            print(f"  {ms:8.1f}  {100 * ms / total:5.1f}%  {kind}")
    wall, cpu = timed(lambda: model.train_on_batch(images, labels), args.warmup, args.repeats)
    rows["step (train_on_batch)"] = {"wall": wall, "cpu": cpu}
    return f"keras_vit[jax {jax.__version__}, XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}]", rows


def timm_phases(args):
    import torch

    from reference_worker import build

    torch.set_num_threads(args.threads)
    model = build("timm", args.variant)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    images = torch.randn(args.batch, 3, 224, 224)
    labels = torch.randint(0, 1000, (args.batch,))

    def forward():
        model.eval()
        with torch.inference_mode():
            return model(images)

    def loss_and_grad():
        model.train()
        optimizer.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(images), labels).backward()

    def step():
        loss_and_grad()
        optimizer.step()

    loss_and_grad()
    rows = {}
    for name, fn in (("forward", forward), ("loss+grad", loss_and_grad), ("optimizer", optimizer.step),
                     ("step (train_on_batch)", step)):
        wall, cpu = timed(fn, args.warmup, args.repeats)
        rows[name] = {"wall": wall, "cpu": cpu}
    return f"timm[torch {torch.__version__}, {torch.get_num_threads()} threads]", rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--impl", choices=("keras", "timm"), required=True)
    parser.add_argument("--variant", default="ViT-Ti/16")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="torch threads (jax: one per allowed CPU; use taskset -c to change it)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--trace", metavar="DIR", help="jax: trace the gradient program into DIR and summarise it")
    args = parser.parse_args(argv)

    label, rows = (keras_phases if args.impl == "keras" else timm_phases)(args)
    print(f"==== {label} {args.variant} batch={args.batch}")
    print(f"{'phase':<24}{'wall ms':>10}{'CPU ms':>10}{'GFLOP':>9}{'GFLOP/s':>9}  optimized program")
    for name, row in rows.items():
        flops = row.get("flops")
        rate = f"{flops / row['wall'] / 1e9:9.1f}" if flops else " " * 9
        gflop = f"{flops / 1e9:9.2f}" if flops else " " * 9
        hlo = " ".join(f"{k} {v}" for k, v in row.get("hlo", {}).items())
        print(f"{name:<24}{row['wall'] * 1e3:10.1f}{row['cpu'] * 1e3:10.1f}{gflop}{rate}  {hlo}")


if __name__ == "__main__":
    main()
