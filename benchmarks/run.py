"""`make bench`: keras_vit on torch, jax and tensorflow against timm and Hugging Face.

For each ViT variant this runs every framework in its own process, in an
interleaved order (keras_vit[torch], timm, keras_vit[jax], hf,
keras_vit[tensorflow], hf[keras env]; the next round in reverse), so that a change in the
machine's load hits all of them alike. Every process gets the same
environment variables and thread count (for jax, whose XLA has no thread
flag, a thread count below the CPUs allowed is set as CPU affinity, for every
worker alike). Each process times the forward pass
(inference) and then a full training step, and records its peak resident
memory. The results of all rounds are pooled: the table shows the median
images/s with the range (min-max) over all timed calls, and the achieved
GFLOP/s against this machine's float32 matmul rate.

What explains a host's results is recorded with them, in the JSON and the
printed table: the CPU model and its flags (AVX-512, VNNI, bf16, AMX), each
framework's own 2048x2048 float32 matmul rate (which differs a lot between
hosts of the same kind), and the thread placement of every worker. Every
XLA worker (jax, tensorflow) also reports its XLA_FLAGS as received and the
options XLA read back from them (`xla_flags.py`): a word in XLA_FLAGS that is
not a flag stops XLA's parser silently, so the driver refuses one.

By default both precisions run: float32, then mixed bfloat16 (keras_vit
under the `mixed_bfloat16` policy, the references under
`torch.autocast(bfloat16)`), each with its own table. Then the time to
first prediction: a new process that imports, builds and predicts once, per
backend against timm's (jax with and without its persistent compilation
cache). `--device gpu` runs the same on an accelerator (CUDA torch, jax or
tensorflow with a GPU) and stops with a clear message when there is none.

    python benchmarks/run.py --python .venv/bin/python --ref-python .venv-ref/bin/python

Writes `benchmarks/results/bench-<UTC time>.json` and `benchmarks/results/latest.json`.
"""

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import common  # noqa: E402
import xla_flags  # noqa: E402

# Set by child_env when a worker runs on fewer CPUs than the driver may use; run_worker applies it.
CPUS_VARIABLE = "KERAS_VIT_BENCH_CPUS"

# "hf[keras env]" is Hugging Face again, on the keras_vit env's torch build
# (timm cannot run there: it needs torchvision, which needs the reference
# env's CUDA torch build); it shows how much the torch build itself matters.
REFERENCES = ("timm", "hf", "hf[keras env]")
# Interleaved so no framework always runs first or last in a round.
# "keras_vit[torch in ref env]" is keras_vit's torch backend on the reference
# env's torch build, timm's: the like-for-like comparison with timm.
ORDER = ("keras_vit[torch]", "timm", "keras_vit[jax]", "hf", "keras_vit[tensorflow]", "hf[keras env]",
         "keras_vit[torch in ref env]", "keras_vit[torch compiled]", "timm[compiled]",
         "keras_vit[torch compiled in ref env]")
KERAS_FRAMEWORKS = {"keras_vit[torch]": "torch", "keras_vit[jax]": "jax", "keras_vit[tensorflow]": "tensorflow",
                    "keras_vit[torch in ref env]": "torch"}
# Under torch.compile: keras_vit through `compile(jit_compile=True)` (Keras wraps its
# train / predict step in torch.compile), timm through `torch.compile(model)`.
COMPILED_KERAS = {"keras_vit[torch compiled]": "torch", "keras_vit[torch compiled in ref env]": "torch"}
# Compiling costs ~0.5-1.5 min per model and mode on 2 cores: the compiled rows run for
# the sizes issue 23 asks about, in float32 only.
COMPILED_VARIANTS = ("ViT-S/16", "ViT-B/16")
# (forward batch, training batch): sized for a 2-core CPU and a ~15 minute run.
BATCHES = {"ViT-Ti/16": (16, 8), "ViT-S/16": (8, 4), "ViT-B/16": (4, 2), "R50+ViT-B/16": (4, 2)}
# Hugging Face transformers 5 has no ViT hybrid (ViTHybrid was removed): timm alone.
UNAVAILABLE = {("hf", "R50+ViT-B/16"), ("hf[keras env]", "R50+ViT-B/16")}


def is_compiled(framework):
    return "compiled" in framework


def runs_in(framework, variant, precision):
    """Whether `framework` has a row for this variant and precision."""
    if (framework, variant) in UNAVAILABLE:
        return False
    return not is_compiled(framework) or (variant in COMPILED_VARIANTS and precision == "float32")
def worker_cpus(threads):
    """The CPUs a worker may use: the first `threads` allowed ones, or `None` (all) when there are no more.

    XLA has no thread-count flag: jax's CPU client makes one pool thread per
    CPU the process may run on. So a thread count below the CPUs allowed is
    set as CPU affinity, and given to every worker alike (torch and
    TensorFlow also get their thread counts).
    """
    allowed = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    return None if not allowed or threads >= len(allowed) else allowed[:threads]


def child_env(threads, xla_flag_text=None):
    """One environment for every worker: same thread counts, same OPENBLAS_* and XLA_FLAGS (inherited)."""
    env = dict(os.environ)
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "TF_NUM_INTRAOP_THREADS"):
        env[name] = str(threads)
    env["TF_NUM_INTEROP_THREADS"] = "1"
    # The caller's own XLA flags pass through, checked: a word that is not a flag would silently switch
    # off every flag after it. Nothing is added for threads (XLA has no such flag; see worker_cpus).
    flags = xla_flags.build(env.get("XLA_FLAGS", "") if xla_flag_text is None else xla_flag_text)
    if flags:
        env["XLA_FLAGS"] = flags
    else:
        env.pop("XLA_FLAGS", None)
    cpus = worker_cpus(threads)
    if cpus:
        env[CPUS_VARIABLE] = ",".join(map(str, cpus))
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def xla_line(result):
    """What an XLA worker received in XLA_FLAGS and the options XLA read back (its probe's dump)."""
    parsed = " ".join(f"--{name}={value}" for name, value in sorted(result["xla_parsed"].items()))
    return f"XLA_FLAGS received: {result.get('xla_flags') or '(none)'!r}; XLA's options in force: {parsed or '(defaults)'}"


def run_worker(command, env, log):
    cpus = env.get(CPUS_VARIABLE)
    # Affinity is set in the child before it starts Python (what `taskset -c` does).
    pin = (lambda: os.sched_setaffinity(0, [int(c) for c in cpus.split(",")])) if cpus else None
    start = time.perf_counter()
    proc = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, preexec_fn=pin)
    elapsed = time.perf_counter() - start
    log.write(f"$ {' '.join(command)}\n{proc.stdout}\n{proc.stderr}\n")
    for line in proc.stdout.splitlines():
        if line.startswith("BENCH_RESULT "):
            result = json.loads(line[len("BENCH_RESULT "):])
            result["process_seconds"] = elapsed
            return result
    tail = "\n".join(proc.stderr.strip().splitlines()[-15:])
    return {"error": f"exit code {proc.returncode}", "stderr_tail": tail, "process_seconds": elapsed}


def worker_command(framework, variant, args, precision="float32"):
    forward_batch, train_batch = BATCHES[variant]
    common_args = [
        "--variant", variant,
        "--forward-batch", str(args.forward_batch or forward_batch),
        "--train-batch", str(args.train_batch or train_batch),
        "--warmup", str(args.warmup),
        "--repeats", str(args.repeats),
        "--threads", str(args.threads),
        "--device", args.device,
    ]
    if framework in KERAS_FRAMEWORKS or framework in COMPILED_KERAS:
        backend = {**KERAS_FRAMEWORKS, **COMPILED_KERAS}[framework]
        python = args.ref_python if framework.endswith("ref env]") else args.python
        # On torch, jit_compile=True means torch.compile: its own rows. The eager
        # rows run as Keras defaults to on torch ("auto" = eager).
        if backend == "torch":
            jit = "true" if is_compiled(framework) else "auto"
        else:
            jit = args.jit_compile
        return [python, os.path.join(HERE, "keras_worker.py"), *common_args, "--jit-compile", jit,
                "--dtype-policy", precision, "--optimizer", args.optimizer], backend
    if precision == "mixed_bfloat16":
        common_args.append("--autocast-bfloat16")
    if framework == "hf[keras env]":
        return [args.python, os.path.join(HERE, "reference_worker.py"), "--impl", "hf", *common_args], None
    if framework == "timm[compiled]":
        return [args.ref_python, os.path.join(HERE, "reference_worker.py"), "--impl", "timm", "--torch-compile",
                *common_args], None
    return [args.ref_python, os.path.join(HERE, "reference_worker.py"), "--impl", framework, *common_args], None


def pool(results):
    """Merge one framework's results from several rounds."""
    ok = [r for r in results if "error" not in r]
    if not ok:
        return results[-1]
    merged = dict(ok[0])
    for mode in ("forward", "train"):
        if mode not in ok[0]:
            continue
        batch = ok[0][mode]["batch"]
        wall = [t for r in ok for t in r[mode]["seconds"]]
        cpu = [t for r in ok for t in r[mode]["cpu_seconds"]]
        merged[mode] = {"batch": batch, **common.summarize((wall, cpu), batch),
                        "peak_rss_mib": max(r[mode]["peak_rss_mib"] for r in ok)}
    merged["peak_rss_mib"] = max(r["peak_rss_mib"] for r in ok)
    merged["rounds"] = len(ok)
    merged["load"] = [r.get("load_before") for r in ok] + [ok[-1].get("load_after")]
    return merged


def ceiling(args, env):
    """Each framework's own float32 matmul GFLOP/s, in both envs (numpy also without OPENBLAS_*)."""
    script = os.path.join(HERE, "matmul_ceiling.py")
    runs = []
    bare = {k: v for k, v in env.items() if k not in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")}
    jobs = ((args.python, env, "keras env"), (args.ref_python, env, "ref env"),
            (args.python, bare, "keras env, no OPENBLAS_*"))
    for python, environment, label in jobs:
        command = [python, script, "--threads", str(args.threads), "--device", args.device]
        if label.endswith("OPENBLAS_*"):
            command += ["--frameworks", "numpy"]
        with open(os.devnull, "w") as devnull:
            result = run_worker(command, environment, devnull)
        if "error" not in result:
            result["python"] = python
            result["env"] = label
            runs.append(result)
    per_framework = {}
    for r in runs:
        for key, value in r.items():
            if key.endswith("_gflops") and value:
                name = f"{key[:-len('_gflops')]} ({r['env']})"
                per_framework[name] = max(value, per_framework.get(name, 0.0))
    rates = list(per_framework.values())
    return {"gflops": max(rates) if rates else None, "per_framework": per_framework, "runs": runs}


# The matmul each framework's model runs on: its own rate explains its speed.
OWN_MATMUL = {
    "keras_vit[torch]": "torch (keras env)", "keras_vit[jax]": "jax (keras env)",
    "keras_vit[tensorflow]": "tensorflow (keras env)", "keras_vit[torch in ref env]": "torch (ref env)",
    "timm": "torch (ref env)", "hf": "torch (ref env)", "hf[keras env]": "torch (keras env)",
    "keras_vit[torch compiled]": "torch (keras env)", "keras_vit[torch compiled in ref env]": "torch (ref env)",
    "timm[compiled]": "torch (ref env)",
}


def machine():
    return {**common.host_info(), "platform": platform.platform(), "placement": common.placement(),
            "openblas_env": {k: v for k, v in os.environ.items() if k.startswith("OPENBLAS_")}}


def host_lines(summary):
    """The lines that say what explains this host's numbers."""
    m = summary["machine"]
    ceiling_ = summary.get("ceiling") or {}
    rates = ceiling_.get("per_framework") or {}
    if not rates:  # an older result file: one best rate
        rates = {"best": summary.get("ceiling_gflops") or 0.0}
    flags = ", ".join(m.get("flags", [])) or "unknown"
    placement = m.get("placement", {})
    lines = [
        f"host: {m.get('cpu')}, {m.get('nproc')} logical CPUs, {m.get('memory_gib', '?')} GiB; flags: {flags}; "
        f"device: {summary.get('device', 'cpu')}",
        f"threads per framework: {summary['threads']}; allowed CPUs: {placement.get('affinity', '?')}; "
        f"worker CPUs: {summary.get('worker_cpus') or 'all allowed'}; "
        f"load average at start: {summary.get('load_at_start', '?')}",
        f"XLA_FLAGS given to every worker: {summary.get('xla_flags') or '(none)'} "
        "(each XLA worker's line shows the options XLA read back)",
        "float32 2048x2048 matmul GFLOP/s, each framework's own: "
        + ", ".join(f"{name} {value:.0f}" for name, value in sorted(rates.items(), key=lambda kv: -kv[1])),
    ]
    return lines


def fmt_rate(block):
    if block is None:
        return "-"
    return f"{block['images_per_s']:.2f} [{block['images_per_s_min']:.2f}-{block['images_per_s_max']:.2f}]"


def tables_of(summary):
    """`{precision: {"results": ...}}`, also for result files written before precisions had tables."""
    if "tables" in summary:
        return summary["tables"]
    precision = "mixed_bfloat16" if summary.get("mixed_bfloat16") else "float32"
    return {precision: {"results": summary["results"]}}


def own_rate(summary, framework):
    rates = (summary.get("ceiling") or {}).get("per_framework") or {}
    return rates.get(OWN_MATMUL.get(framework)) or summary.get("ceiling_gflops")


def report(summary):
    """Print the host lines, then per precision the per-framework and ratio tables; return the ratios."""
    lines = host_lines(summary)
    all_ratios = {}
    precision = None
    for precision, table in tables_of(summary).items():
        lines += ["", f"== {precision} =="]
        header = (f"{'variant':12} {'framework':28} {'fwd img/s [min-max]':>24} {'GFLOP/s':>8} {'%own':>5} "
                  f"{'train img/s [min-max]':>24} {'GFLOP/s':>8} {'%own':>5} {'peak RSS MiB':>12} {'(model)':>8}")
        lines.append(header)
        lines.append("-" * len(header))
        ratios = {}
        for variant, frameworks in table["results"].items():
            flops = common.forward_flops(variant) / 1e9
            for name, r in frameworks.items():
                if "error" in r:
                    lines.append(f"{variant:12} {name:28} ERROR {r['error']}: {r.get('stderr_tail', '')[-300:]}")
                    continue
                peak = own_rate(summary, name)
                cells = []
                for mode, factor in (("forward", 1), ("train", 3)):
                    block = r.get(mode)
                    if block is None:
                        cells += ["-", "-", "-"]
                        continue
                    gflops = block["images_per_s"] * flops * factor
                    cells += [fmt_rate(block), f"{gflops:.1f}", f"{100 * gflops / peak:.0f}" if peak else "-"]
                memory = r.get("device_peak_mib") or r["peak_rss_mib"]
                model_rss = r["peak_rss_mib"] - r["rss_after_import_mib"]
                lines.append(f"{variant:12} {name:28} {cells[0]:>24} {cells[1]:>8} {cells[2]:>5} "
                             f"{cells[3]:>24} {cells[4]:>8} {cells[5]:>5} {memory:>12.0f} {model_rss:>8.0f}")
            ratios[variant] = variant_ratios(frameworks)
        all_ratios[precision] = ratios
        lines.append("(%own: achieved GFLOP/s against that framework's own float32 matmul rate on this host; "
                     "peak memory is the accelerator's with --device gpu)")
        lines.append("")
        lines.append("keras_vit / reference (forward vs the fastest of timm, hf and hf[keras env]; train vs timm and "
                     "vs the best; memory = peak RSS vs timm, and model part (peak - after import) vs timm):")
        header = (f"{'variant':12} {'backend':17} {'forward':>8} {'train/timm':>10} {'train/best':>10} {'RSS':>6} "
                  f"{'RSS(model)':>10} {'fwd/CPU-s':>9} {'train/CPU-s':>11}")
        lines.append(header)
        lines.append("-" * len(header))
        for variant, per_backend in ratios.items():
            for backend, r in per_backend.items():
                def cell(key, target=None):
                    value = r.get(key)
                    if value is None:
                        return "-"
                    mark = ""
                    if target is not None and precision == "float32":
                        mark = " " if (value <= target if key.startswith("rss") else value >= target) else "!"
                    return f"{value:.2f}{mark}"
                t = target_for(backend.split(" ")[0], variant)
                lines.append(f"{variant:12} {backend:17} {cell('forward', t.get('forward')):>8} "
                             f"{cell('train_vs_timm', t.get('train')):>10} {cell('train_vs_best'):>10} "
                             f"{cell('rss_vs_timm', t.get('memory')):>6} {cell('rss_model_vs_timm'):>10} "
                             f"{cell('forward_cpu'):>9} {cell('train_cpu'):>11}")
    if "float32" in all_ratios:
        lines.append("('!' marks a missed float32 target of issue 17: torch forward >= 1.0 (0.9 hybrid), training "
                     ">= 0.9 (Ti/16 none, hybrid 0.8), RSS <= 1.2; jax >= 1.0 both, RSS <= 1.2; tensorflow RSS <= 1.3; "
                     "/CPU-s columns: images per CPU-second vs the best reference)")
    compiled = compiled_rows(summary)
    if compiled:
        lines += [""] + compiled_lines(compiled)
    first = summary.get("first_prediction")
    if first:
        lines += [""] + first_prediction_lines(first)
    text = "\n".join(lines)
    print(text)
    return all_ratios, text


def target_for(backend, variant):
    """Issue 17's targets for one backend and variant (ratios against timm)."""
    hybrid = common.is_hybrid(variant)
    if backend == "torch":
        train = {"ViT-S/16": 0.9, "ViT-B/16": 0.9, "R50+ViT-B/16": 0.8}.get(variant)
        return {"forward": 0.9 if hybrid else 1.0, "train": train, "memory": 1.2}
    if backend == "jax":
        return {"forward": 1.0, "train": 1.0, "memory": 1.2}
    if backend == "tensorflow":
        return {"memory": 1.3}
    return {}


# Issue 23's targets for compiled keras_vit's forward pass: >= 1.0x timm eager, >= 0.9x timm compiled.
COMPILED_TARGETS = {"vs_timm": 1.0, "vs_timm_compiled": 0.9}


def compiled_rows(summary):
    """Compiled keras_vit against timm eager and timm under torch.compile, per variant (float32).

    Returns a list of dicts (one per compiled keras_vit run): images/s and
    the two ratios for the forward pass and the training step, and the first
    call's seconds (compiling) apart from the timed calls.
    """
    table = tables_of(summary).get("float32")
    if not table:
        return []
    rows = []
    for variant, frameworks in table["results"].items():
        def rate(name, mode):
            r = frameworks.get(name)
            return r[mode]["images_per_s"] if r and "error" not in r and mode in r else None

        for name in (*COMPILED_KERAS, "timm[compiled]"):
            r = frameworks.get(name)
            if r is None:
                continue
            row = {"variant": variant, "framework": name, "error": r.get("error")}
            for mode in ("forward", "train"):
                mine = rate(name, mode)
                row[mode] = mine
                row[f"{mode}_first_call_seconds"] = r.get(f"{mode}_first_call_seconds")
                for key, reference in (("vs_timm", "timm"), ("vs_timm_compiled", "timm[compiled]")):
                    theirs = rate(reference, mode)
                    row[f"{mode}_{key}"] = mine / theirs if mine and theirs and name != reference else None
            rows.append(row)
    return rows


def compiled_lines(rows):
    lines = ["torch.compile (float32): keras_vit with compile(jit_compile=True) against timm eager and timm under "
             "torch.compile; 'compile s' is the first call (compiling), kept out of the timed calls:"]
    header = (f"{'variant':12} {'framework':38} {'fwd img/s':>9} {'/timm':>6} {'/timm c':>7} {'compile s':>9} "
              f"{'train img/s':>11} {'/timm':>6} {'/timm c':>7} {'compile s':>9}")
    lines += [header, "-" * len(header)]

    def ratio(row, key):
        value = row.get(key)
        if value is None:
            return "-"
        target = COMPILED_TARGETS.get(key.split("_", 1)[1]) if key.startswith("forward") else None
        return f"{value:.2f}" + ("" if target is None else (" " if value >= target else "!"))

    def number(value, digits=2):
        return "-" if value is None else f"{value:.{digits}f}"

    for row in rows:
        if row["error"]:
            lines.append(f"{row['variant']:12} {row['framework']:38} ERROR {row['error']}")
            continue
        lines.append(f"{row['variant']:12} {row['framework']:38} {number(row['forward']):>9} "
                     f"{ratio(row, 'forward_vs_timm'):>6} {ratio(row, 'forward_vs_timm_compiled'):>7} "
                     f"{number(row['forward_first_call_seconds'], 1):>9} {number(row['train']):>11} "
                     f"{ratio(row, 'train_vs_timm'):>6} {ratio(row, 'train_vs_timm_compiled'):>7} "
                     f"{number(row['train_first_call_seconds'], 1):>9}")
    lines.append("('!' marks a miss of issue 23's forward targets: compiled keras_vit >= 1.0x timm eager and "
                 ">= 0.9x timm compiled; 'in ref env' runs on timm's own torch build)")
    return lines


def first_prediction_lines(first):
    lines = [f"time to first prediction ({first['variant']}, one image; a new process: interpreter, imports, build "
             f"with random weights, first compiled call; median of {first['rounds']} round(s)):"]
    header = f"{'framework':34} {'import s':>9} {'build s':>8} {'1st call s':>10} {'total s':>8} {'vs timm':>8}"
    lines += [header, "-" * len(header)]
    timm = first["results"].get("timm", {}).get("total_seconds")
    for name, r in first["results"].items():
        if "error" in r:
            lines.append(f"{name:34} ERROR {r['error']}: {r.get('stderr_tail', '')[-200:]}")
            continue
        ratio = f"{r['total_seconds'] / timm:.2f}" if timm else "-"
        mark = "" if name == "timm" or not timm else (" " if r["total_seconds"] <= 2 * timm else "!")
        lines.append(f"{name:34} {r['import_seconds']:>9.2f} {r['build_seconds']:>8.2f} "
                     f"{r['first_call_seconds']:>10.2f} {r['total_seconds']:>8.2f} {ratio + mark:>8}")
    lines.append("('!' marks a miss of issue 17's target: at most 2x timm's time; 'import' includes the interpreter)")
    return lines


def markdown(summary):
    """The tables of `report` as Markdown, for docs/performance.md."""
    rows = []
    for precision, table in tables_of(summary).items():
        rows += [f"**{precision}**", "",
                 "| variant | framework | forward img/s [min-max] | train img/s [min-max] | peak RSS MiB |",
                 "| --- | --- | --- | --- | --- |"]
        for variant, frameworks in table["results"].items():
            for name, r in frameworks.items():
                if "error" in r:
                    rows.append(f"| {variant} | {name} | error: {r['error']} | | |")
                    continue
                rows.append(f"| {variant} | {name} | {fmt_rate(r.get('forward'))} | {fmt_rate(r.get('train'))} "
                            f"| {r['peak_rss_mib']:.0f} |")
        rows += ["", "| variant | keras_vit on | forward | train vs timm | train vs best | peak RSS vs timm "
                     "| forward per CPU-s | train per CPU-s |",
                 "| --- | --- | --- | --- | --- | --- | --- | --- |"]
        keys = ("forward", "train_vs_timm", "train_vs_best", "rss_vs_timm", "forward_cpu", "train_cpu")
        for variant, frameworks in table["results"].items():
            for backend, r in variant_ratios(frameworks).items():
                cells = [f"{r[k]:.2f}" if r.get(k) is not None else "-" for k in keys]
                rows.append(f"| {variant} | {backend} | " + " | ".join(cells) + " |")
        rows.append("")
    compiled = compiled_rows(summary)
    if compiled:
        rows += ["| variant | compiled | forward img/s | vs timm | vs timm compiled | compile s | train img/s "
                 "| vs timm | vs timm compiled | compile s |",
                 "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for r in compiled:
            if r["error"]:
                continue
            cells = [r["forward"], r["forward_vs_timm"], r["forward_vs_timm_compiled"], r["forward_first_call_seconds"],
                     r["train"], r["train_vs_timm"], r["train_vs_timm_compiled"], r["train_first_call_seconds"]]
            rows.append(f"| {r['variant']} | {r['framework']} | "
                        + " | ".join("-" if c is None else f"{c:.2f}" for c in cells) + " |")
        rows.append("")
    first = summary.get("first_prediction")
    if first:
        rows += ["| framework | import s | build s | first call s | total s | vs timm |",
                 "| --- | --- | --- | --- | --- | --- |"]
        timm = first["results"].get("timm", {}).get("total_seconds")
        for name, r in first["results"].items():
            if "error" in r:
                continue
            ratio = f"{r['total_seconds'] / timm:.2f}" if timm else "-"
            rows.append(f"| {name} | {r['import_seconds']:.2f} | {r['build_seconds']:.2f} | "
                        f"{r['first_call_seconds']:.2f} | {r['total_seconds']:.2f} | {ratio} |")
    return "\n".join(rows)


def variant_ratios(frameworks):
    def rate(name, mode):
        r = frameworks.get(name)
        if not r or "error" in r or mode not in r:
            return None
        return r[mode]["images_per_s"]

    def cpu_rate(name, mode):
        r = frameworks.get(name)
        if not r or "error" in r or mode not in r:
            return None
        return r[mode].get("images_per_cpu_s")

    out = {}
    for name, backend in KERAS_FRAMEWORKS.items():
        label = backend if name == f"keras_vit[{backend}]" else f"{backend} (ref env)"
        if name not in frameworks or "error" in frameworks[name]:
            continue
        k = frameworks[name]
        entry = {}
        refs_fwd = [v for v in (rate(ref, "forward") for ref in REFERENCES) if v]
        refs_train = [v for v in (rate(ref, "train") for ref in REFERENCES) if v]
        if rate(name, "forward") and refs_fwd:
            entry["forward"] = rate(name, "forward") / max(refs_fwd)
        # Same ratios per CPU-second (all threads): less sensitive to other
        # processes taking the cores on a shared machine.
        for mode in ("forward", "train"):
            mine, refs = cpu_rate(name, mode), [v for v in (cpu_rate(ref, mode) for ref in REFERENCES) if v]
            if mine and refs:
                entry[f"{mode}_cpu"] = mine / max(refs)
        if rate(name, "train") and rate("timm", "train"):
            entry["train_vs_timm"] = rate(name, "train") / rate("timm", "train")
        if rate(name, "train") and refs_train:
            entry["train_vs_best"] = rate(name, "train") / max(refs_train)
        timm = frameworks.get("timm")
        if timm and "error" not in timm:
            entry["rss_vs_timm"] = k["peak_rss_mib"] / timm["peak_rss_mib"]
            entry["rss_model_vs_timm"] = ((k["peak_rss_mib"] - k["rss_after_import_mib"])
                                          / (timm["peak_rss_mib"] - timm["rss_after_import_mib"]))
        out[label] = entry
    return out


FIRST_PREDICTION = ("timm", "keras_vit[torch]", "keras_vit[jax]", "keras_vit[jax] cached", "keras_vit[tensorflow]")


def first_prediction(args, env, log, variant, frameworks):
    """Time to first prediction, each in a new process, interleaved over rounds; medians per framework."""
    import tempfile

    script = os.path.join(HERE, "first_prediction.py")
    names = [n for n in FIRST_PREDICTION if n.replace(" cached", "") in frameworks]
    raw = {name: [] for name in names}
    with tempfile.TemporaryDirectory(prefix="keras-vit-jax-cache-") as cache:
        # Fill the cache once, so every "cached" run finds it (as a user's second run does).
        warm = [args.python, script, "--impl", "keras_vit", "--variant", variant, "--threads", str(args.threads),
                "--device", args.device, "--jax-cache-dir", cache]
        if "keras_vit[jax] cached" in names:
            run_worker(warm, {**env, "KERAS_BACKEND": "jax"}, log)
        for round_index in range(args.rounds):
            order = list(names) if round_index % 2 == 0 else list(reversed(names))
            for name in order:
                command = [args.ref_python if name == "timm" else args.python, script,
                           "--impl", "timm" if name == "timm" else "keras_vit", "--variant", variant,
                           "--threads", str(args.threads), "--device", args.device, "--started", "0"]
                environment = dict(env)
                if name != "timm":
                    environment["KERAS_BACKEND"] = name.split("[")[1].split("]")[0]
                if name.endswith("cached"):
                    command += ["--jax-cache-dir", cache]
                command[command.index("--started") + 1] = repr(time.time())
                result = run_worker(command, environment, log)
                raw[name].append(result)
                status = result.get("error") or f"{result['total_seconds']:.2f} s"
                print(f"first prediction {variant} {name} round {round_index + 1}: {status} "
                      f"(load {common.load_average():.1f})", flush=True)
    results = {}
    for name, runs in raw.items():
        ok = [r for r in runs if "error" not in r]
        if not ok:
            results[name] = runs[-1] if runs else {"error": "not run"}
            continue
        results[name] = {key: statistics.median(
            (r["interpreter_seconds"] + r["import_seconds"]) if key == "import_seconds" else r[key] for r in ok)
            for key in ("import_seconds", "build_seconds", "first_call_seconds", "total_seconds", "peak_rss_mib")}
        results[name]["rounds"] = len(ok)
        results[name]["load"] = [r.get("load_before") for r in ok]
    return {"variant": variant, "rounds": args.rounds, "results": results, "raw": raw}


def check_device(args, env):
    """With --device gpu, stop before anything runs if neither env sees an accelerator."""
    probe = ("import sys\nfound = []\n"
             "try:\n import torch; found += ['torch'] if torch.cuda.is_available() else []\nexcept ImportError: pass\n"
             "try:\n import jax; found += ['jax'] if jax.default_backend() == 'gpu' else []\nexcept ImportError: pass\n"
             "print(','.join(found))")
    seen = {}
    for label, python in (("keras env", args.python), ("ref env", args.ref_python)):
        proc = subprocess.run([python, "-c", probe], env=env, capture_output=True, text=True)
        seen[label] = [f for f in proc.stdout.strip().split(",") if f]
    if not any(seen.values()):
        raise SystemExit(
            "run.py --device gpu: no accelerator found: neither torch.cuda.is_available() nor jax's GPU backend "
            f"in {args.python} (keras env) or {args.ref_python} (ref env). Run on a machine with a GPU and "
            "CUDA builds of torch / jax (pip install 'jax[cuda12]', a CUDA torch wheel), or leave out --device gpu."
        )
    return seen


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--python", default=sys.executable, help="Python of the env with keras_vit's deps.")
    parser.add_argument("--ref-python", default=os.path.join(ROOT, ".venv-ref", "bin", "python"),
                        help="Python of the env with timm and transformers.")
    parser.add_argument("--variants", default=",".join(BATCHES))
    parser.add_argument("--frameworks", default=",".join(ORDER))
    parser.add_argument("--rounds", type=int, default=1, help="Interleaved rounds; samples are pooled.")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--forward-batch", type=int, default=None, help="Override the per-variant batch.")
    parser.add_argument("--train-batch", type=int, default=None, help="Override the per-variant batch.")
    parser.add_argument("--jit-compile", default="true", choices=("auto", "true", "false"),
                        help="keras_vit's compile(jit_compile=...) on jax and tensorflow ('true' = XLA); "
                             "torch always runs eagerly.")
    parser.add_argument("--precisions", default="float32,mixed_bfloat16",
                        help="Comma-separated: float32, mixed_bfloat16 (keras_vit under the mixed_bfloat16 policy, "
                             "the references under torch.autocast(bfloat16)); one table each.")
    parser.add_argument("--mixed-bfloat16", action="store_true", help="Same as --precisions mixed_bfloat16.")
    parser.add_argument("--optimizer", default="keras_vit", choices=("keras_vit", "keras"),
                        help="keras_vit's AdamW: keras_vit.workflows.optimizers.AdamW (fused update on torch, the default) "
                             "or keras.optimizers.AdamW.")
    parser.add_argument("--device", default="cpu", choices=("cpu", "gpu"),
                        help="gpu: the accelerator (CUDA torch; jax / tensorflow with a GPU). Stops with a clear "
                             "message when there is none.")
    parser.add_argument("--first-prediction", default="ViT-S/16", metavar="VARIANT",
                        help="Variant for the time-to-first-prediction table; 'none' to skip it.")
    parser.add_argument("--skip-tables", action="store_true",
                        help="Only the host lines and the time-to-first-prediction table.")
    parser.add_argument("--output-dir", default=os.path.join(HERE, "results"))
    parser.add_argument("--report", metavar="JSON", help="Only print the tables of an earlier (or partial) run.")
    parser.add_argument("--markdown", action="store_true", help="With --report: print Markdown tables.")
    args = parser.parse_args(argv)
    if args.report:
        with open(args.report) as f:
            summary = json.load(f)
        if "raw_tables" in summary and "tables" not in summary:  # a partial run: pool what it has
            summary["tables"] = {p: {"results": {v: {f: pool(rs) for f, rs in per.items() if rs}
                                                 for v, per in table.items()}}
                                 for p, table in summary["raw_tables"].items()}
        elif "results" not in summary and "tables" not in summary:  # an older partial run
            summary["results"] = {v: {f: pool(rs) for f, rs in per.items() if rs}
                                  for v, per in summary["raw"].items()}
        if args.markdown:
            print(markdown(summary))
        else:
            report(summary)
        return 0

    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    frameworks = [f.strip() for f in args.frameworks.split(",") if f.strip()]
    precisions = (["mixed_bfloat16"] if args.mixed_bfloat16
                  else [p.strip() for p in args.precisions.split(",") if p.strip()])
    for variant in variants:
        if variant not in BATCHES:
            parser.error(f"unknown variant {variant!r}; choose from {', '.join(BATCHES)}")
    for framework in frameworks:
        if framework not in ORDER:
            parser.error(f"unknown framework {framework!r}; choose from {', '.join(ORDER)}")
    for precision in precisions:
        if precision not in ("float32", "mixed_bfloat16"):
            parser.error(f"unknown precision {precision!r}; choose from float32, mixed_bfloat16")
    if args.first_prediction != "none" and args.first_prediction not in BATCHES:
        parser.error(f"unknown --first-prediction variant {args.first_prediction!r}; choose from "
                     f"{', '.join(BATCHES)} or none")
    try:
        env = child_env(args.threads)
    except ValueError as error:
        parser.error(str(error))
    accelerators = check_device(args, env) if args.device == "gpu" else None
    os.makedirs(args.output_dir, exist_ok=True)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    log_path = os.path.join(args.output_dir, f"bench-{stamp}.log")
    partial_path = os.path.join(args.output_dir, f"bench-{stamp}.partial.json")
    started = time.perf_counter()

    print(f"load average at start: {common.load_average()}", flush=True)
    summary = {
        "date_utc": stamp,
        "machine": machine(),
        "load_at_start": common.load_average(),
        "device": args.device,
        "accelerators": accelerators,
        "threads": args.threads,
        "worker_cpus": env.get(CPUS_VARIABLE),
        "xla_flags": env.get("XLA_FLAGS", ""),
        "jit_compile": args.jit_compile,
        "optimizer": args.optimizer,
        "precisions": precisions,
        "repeats": args.repeats,
        "warmup": args.warmup,
        "rounds": args.rounds,
        "batches": {v: BATCHES[v] for v in variants},
        "flop_count": "analytic matmul + attention FLOPs (2 per multiply-add); training step = 3x forward",
    }
    summary["ceiling"] = ceiling(args, env)
    summary["ceiling_gflops"] = summary["ceiling"]["gflops"]
    print("\n".join(host_lines(summary)), flush=True)

    raw = {p: {v: {f: [] for f in frameworks if runs_in(f, v, p)} for v in variants} for p in precisions}
    with open(log_path, "w") as log:
        for precision in [] if args.skip_tables else precisions:
            for variant in variants:
                for round_index in range(args.rounds):
                    order = [f for f in ORDER if f in raw[precision][variant]]
                    if round_index % 2:
                        order.reverse()
                    for framework in order:
                        command, backend = worker_command(framework, variant, args, precision)
                        environment = dict(env)
                        if backend:
                            environment["KERAS_BACKEND"] = backend
                        result = run_worker(command, environment, log)
                        raw[precision][variant][framework].append(result)
                        status = result.get("error") or (
                            f"fwd {fmt_rate(result.get('forward'))} img/s, "
                            f"train {fmt_rate(result.get('train'))} img/s, peak {result['peak_rss_mib']:.0f} MiB"
                        )
                        print(f"[{time.perf_counter() - started:6.0f}s] {precision} {variant} {framework} round "
                              f"{round_index + 1}: {status} (load {common.load_average():.1f})", flush=True)
                        if result.get("xla_parsed") is not None:
                            print(f"         {xla_line(result)}", flush=True)
                # Keep what is done so far if the run is cut short.
                with open(partial_path, "w") as f:
                    json.dump({**summary, "raw_tables": raw}, f, indent=1)
        if args.first_prediction != "none":
            summary["first_prediction"] = first_prediction(args, env, log, args.first_prediction, frameworks)
    summary["tables"] = {p: {"results": {v: {f: pool(rs) for f, rs in per.items()} for v, per in raw[p].items()},
                             "raw": raw[p]} for p in ([] if args.skip_tables else precisions)}
    summary["wall_seconds"] = time.perf_counter() - started
    summary["load_at_end"] = common.load_average()
    print()
    summary["ratios"], summary["table"] = report(summary)
    path = os.path.join(args.output_dir, f"bench-{stamp}.json")
    for target in (path, os.path.join(args.output_dir, "latest.json")):
        with open(target, "w") as f:
            json.dump(summary, f, indent=1)
    if os.path.exists(partial_path):
        os.remove(partial_path)
    print(f"\nwrote {path} (worker logs: {log_path}); {summary['wall_seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
