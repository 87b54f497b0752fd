"""`make bench`: keras_vit on torch, jax and tensorflow against timm and Hugging Face.

For each ViT variant this runs every framework in its own process, in an
interleaved order (keras_vit[torch], timm, keras_vit[jax], hf,
keras_vit[tensorflow], hf[keras env]; the next round in reverse), so that a change in the
machine's load hits all of them alike. Every process gets the same
environment variables and thread count. Each process times the forward pass
(inference) and then a full training step, and records its peak resident
memory. The results of all rounds are pooled: the table shows the median
images/s with the range (min-max) over all timed calls, and the achieved
GFLOP/s against this machine's float32 matmul rate.

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

# "hf[keras env]" is Hugging Face again, on the keras_vit env's torch build
# (timm cannot run there: it needs torchvision, which needs the reference
# env's CUDA torch build); it shows how much the torch build itself matters.
REFERENCES = ("timm", "hf", "hf[keras env]")
# Interleaved so no framework always runs first or last in a round.
# "keras_vit[torch in ref env]" is keras_vit's torch backend on the reference
# env's torch build, timm's: the like-for-like comparison with timm.
ORDER = ("keras_vit[torch]", "timm", "keras_vit[jax]", "hf", "keras_vit[tensorflow]", "hf[keras env]",
         "keras_vit[torch in ref env]")
KERAS_FRAMEWORKS = {"keras_vit[torch]": "torch", "keras_vit[jax]": "jax", "keras_vit[tensorflow]": "tensorflow",
                    "keras_vit[torch in ref env]": "torch"}
# (forward batch, training batch): sized for a 2-core CPU and a ~15 minute run.
BATCHES = {"ViT-Ti/16": (16, 8), "ViT-S/16": (8, 4), "ViT-B/16": (4, 2), "R50+ViT-B/16": (4, 2)}
# Hugging Face transformers 5 has no ViT hybrid (ViTHybrid was removed): timm alone.
UNAVAILABLE = {("hf", "R50+ViT-B/16"), ("hf[keras env]", "R50+ViT-B/16")}
# Targets of issue 7 (ViT-S/16): keras_vit / reference.
TARGETS = {
    "torch": {"forward": 1.0, "train": 0.9},
    "jax": {"forward": 1.0, "train": 1.0},
    "tensorflow": {"forward": 0.8, "train": 0.8},
    "memory": 1.2,
}


def child_env(threads):
    """One environment for every worker: same thread counts, same OPENBLAS_* (inherited)."""
    env = dict(os.environ)
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "TF_NUM_INTRAOP_THREADS"):
        env[name] = str(threads)
    env["TF_NUM_INTEROP_THREADS"] = "1"
    # XLA's CPU thread pool (jax) sized like the others.
    multi = "true" if threads > 1 else "false"
    xla = f"--xla_cpu_multi_thread_eigen={multi} intra_op_parallelism_threads={threads}"
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " " + xla).strip()
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def run_worker(command, env, log):
    start = time.perf_counter()
    proc = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    log.write(f"$ {' '.join(command)}\n{proc.stdout}\n{proc.stderr}\n")
    for line in proc.stdout.splitlines():
        if line.startswith("BENCH_RESULT "):
            result = json.loads(line[len("BENCH_RESULT "):])
            result["process_seconds"] = elapsed
            return result
    tail = "\n".join(proc.stderr.strip().splitlines()[-15:])
    return {"error": f"exit code {proc.returncode}", "stderr_tail": tail, "process_seconds": elapsed}


def worker_command(framework, variant, args):
    forward_batch, train_batch = BATCHES[variant]
    common_args = [
        "--variant", variant,
        "--forward-batch", str(args.forward_batch or forward_batch),
        "--train-batch", str(args.train_batch or train_batch),
        "--warmup", str(args.warmup),
        "--repeats", str(args.repeats),
        "--threads", str(args.threads),
    ]
    if framework in KERAS_FRAMEWORKS:
        backend = KERAS_FRAMEWORKS[framework]
        python = args.ref_python if framework.endswith("ref env]") else args.python
        # jit_compile on torch means torch.compile, which recompiles Keras layers
        # endlessly; the torch backend runs eagerly ("auto"), as Keras defaults to.
        jit = "auto" if backend == "torch" else args.jit_compile
        policy = "mixed_bfloat16" if args.mixed_bfloat16 else "float32"
        return [python, os.path.join(HERE, "keras_worker.py"), *common_args, "--jit-compile", jit,
                "--dtype-policy", policy], backend
    if args.mixed_bfloat16:
        common_args.append("--autocast-bfloat16")
    if framework == "hf[keras env]":
        return [args.python, os.path.join(HERE, "reference_worker.py"), "--impl", "hf", *common_args], None
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
    """Best float32 matmul GFLOP/s, in both envs, and numpy also without OPENBLAS_CORETYPE."""
    script = os.path.join(HERE, "matmul_ceiling.py")
    runs = []
    bare = {k: v for k, v in env.items() if k not in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")}
    for python, environment in ((args.python, env), (args.ref_python, env), (args.python, bare)):
        with open(os.devnull, "w") as devnull:
            result = run_worker([python, script, "--threads", str(args.threads)], environment, devnull)
        if "error" not in result:
            result["python"] = python
            result["openblas_env"] = environment is env
            runs.append(result)
    return {"gflops": max(r["gflops"] for r in runs) if runs else None, "runs": runs}


def machine():
    cpu = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "platform": platform.platform(),
        "openblas_env": {k: v for k, v in os.environ.items() if k.startswith("OPENBLAS_")},
    }


def fmt_rate(block):
    if block is None:
        return "-"
    return f"{block['images_per_s']:.2f} [{block['images_per_s_min']:.2f}-{block['images_per_s_max']:.2f}]"


def report(summary):
    """Print the per-framework table and the ratio table; return the ratios."""
    lines = []
    peak = summary["ceiling_gflops"]
    lines.append(
        f"machine: {summary['machine']['nproc']} cores, {summary['machine']['cpu']}; threads={summary['threads']}; "
        f"float32 matmul ceiling {peak:.1f} GFLOP/s" if peak else "matmul ceiling: n/a"
    )
    header = (f"{'variant':12} {'framework':28} {'fwd img/s [min-max]':>24} {'GFLOP/s':>8} {'%peak':>6} "
              f"{'train img/s [min-max]':>24} {'GFLOP/s':>8} {'%peak':>6} {'peak RSS MiB':>12} {'(model)':>8}")
    lines.append(header)
    lines.append("-" * len(header))
    ratios = {}
    for variant, frameworks in summary["results"].items():
        flops = common.forward_flops(variant) / 1e9
        for name, r in frameworks.items():
            if "error" in r:
                lines.append(f"{variant:12} {name:28} ERROR {r['error']}: {r.get('stderr_tail', '')[-300:]}")
                continue
            cells = []
            for mode, factor in (("forward", 1), ("train", 3)):
                block = r.get(mode)
                if block is None:
                    cells += ["-", "-", "-"]
                    continue
                gflops = block["images_per_s"] * flops * factor
                cells += [fmt_rate(block), f"{gflops:.1f}", f"{100 * gflops / peak:.0f}" if peak else "-"]
            model_rss = r["peak_rss_mib"] - r["rss_after_import_mib"]
            lines.append(f"{variant:12} {name:28} {cells[0]:>24} {cells[1]:>8} {cells[2]:>6} "
                         f"{cells[3]:>24} {cells[4]:>8} {cells[5]:>6} {r['peak_rss_mib']:>12.0f} {model_rss:>8.0f}")
        ratios[variant] = variant_ratios(frameworks)
    lines.append("")
    lines.append("keras_vit / reference (forward vs the fastest of timm, hf and hf[keras env]; train vs timm and vs the best; "
                 "memory = peak RSS vs timm, and model part (peak - after import) vs timm):")
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
                if target is not None and variant == "ViT-S/16":
                    mark = " " if (value <= target if key.startswith("rss") else value >= target) else "!"
                return f"{value:.2f}{mark}"
            t = TARGETS.get(backend.split(" ")[0], {})
            lines.append(f"{variant:12} {backend:17} {cell('forward', t.get('forward')):>8} "
                         f"{cell('train_vs_timm', t.get('train')):>10} {cell('train_vs_best'):>10} "
                         f"{cell('rss_vs_timm', TARGETS['memory']):>6} {cell('rss_model_vs_timm'):>10} "
                         f"{cell('forward_cpu'):>9} {cell('train_cpu'):>11}")
    lines.append("('!' marks a missed ViT-S/16 target: torch fwd>=1.0 train>=0.9, jax fwd/train>=1.0, "
                 "tensorflow>=0.8, RSS<=1.2; /CPU-s columns: images per CPU-second vs the best reference)")
    text = "\n".join(lines)
    print(text)
    return ratios, text


def markdown(summary):
    """The two tables of `report` as Markdown, for the README."""
    rows = ["| variant | framework | forward img/s [min-max] | train img/s [min-max] | peak RSS MiB |",
            "| --- | --- | --- | --- | --- |"]
    for variant, frameworks in summary["results"].items():
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
    for variant, frameworks in summary["results"].items():
        for backend, r in variant_ratios(frameworks).items():
            cells = [f"{r[k]:.2f}" if r.get(k) is not None else "-" for k in keys]
            rows.append(f"| {variant} | {backend} | " + " | ".join(cells) + " |")
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
    parser.add_argument("--mixed-bfloat16", action="store_true",
                        help="keras_vit under the mixed_bfloat16 dtype policy, the references under "
                             "torch.autocast(bfloat16)")
    parser.add_argument("--output-dir", default=os.path.join(HERE, "results"))
    parser.add_argument("--report", metavar="JSON", help="Only print the tables of an earlier (or partial) run.")
    parser.add_argument("--markdown", action="store_true", help="With --report: print Markdown tables.")
    args = parser.parse_args(argv)
    if args.report:
        with open(args.report) as f:
            summary = json.load(f)
        if "results" not in summary:  # a partial run: pool what it has
            summary["results"] = {v: {f: pool(rs) for f, rs in per.items() if rs}
                                  for v, per in summary["raw"].items()}
        if args.markdown:
            print(markdown(summary))
        else:
            report(summary)
        return 0

    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    frameworks = [f.strip() for f in args.frameworks.split(",") if f.strip()]
    for variant in variants:
        if variant not in BATCHES:
            parser.error(f"unknown variant {variant!r}; choose from {', '.join(BATCHES)}")
    for framework in frameworks:
        if framework not in ORDER:
            parser.error(f"unknown framework {framework!r}; choose from {', '.join(ORDER)}")
    env = child_env(args.threads)
    os.makedirs(args.output_dir, exist_ok=True)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    log_path = os.path.join(args.output_dir, f"bench-{stamp}.log")
    started = time.perf_counter()

    print(f"load average at start: {common.load_average()}", flush=True)
    summary = {
        "date_utc": stamp,
        "machine": machine(),
        "threads": args.threads,
        "jit_compile": args.jit_compile,
        "mixed_bfloat16": args.mixed_bfloat16,
        "repeats": args.repeats,
        "warmup": args.warmup,
        "rounds": args.rounds,
        "batches": {v: BATCHES[v] for v in variants},
        "flop_count": "analytic matmul + attention FLOPs (2 per multiply-add); training step = 3x forward",
    }
    summary["ceiling"] = ceiling(args, env)
    summary["ceiling_gflops"] = summary["ceiling"]["gflops"]
    print(f"float32 matmul ceiling: {summary['ceiling_gflops']} GFLOP/s", flush=True)

    raw = {v: {f: [] for f in frameworks if (f, v) not in UNAVAILABLE} for v in variants}
    with open(log_path, "w") as log:
        for variant in variants:
            for round_index in range(args.rounds):
                order = [f for f in ORDER if f in raw[variant]]
                if round_index % 2:
                    order.reverse()
                for framework in order:
                    command, backend = worker_command(framework, variant, args)
                    environment = dict(env)
                    if backend:
                        environment["KERAS_BACKEND"] = backend
                    result = run_worker(command, environment, log)
                    raw[variant][framework].append(result)
                    status = result.get("error") or (
                        f"fwd {fmt_rate(result.get('forward'))} img/s, "
                        f"train {fmt_rate(result.get('train'))} img/s, peak {result['peak_rss_mib']:.0f} MiB"
                    )
                    print(f"[{time.perf_counter() - started:6.0f}s] {variant} {framework} round {round_index + 1}: "
                          f"{status} (load {common.load_average():.1f})", flush=True)
            # Keep what is done so far if the run is cut short.
            with open(os.path.join(args.output_dir, f"bench-{stamp}.partial.json"), "w") as f:
                json.dump({**summary, "raw": raw}, f, indent=1)
    summary["results"] = {v: {f: pool(rs) for f, rs in per.items()} for v, per in raw.items()}
    summary["raw"] = raw
    summary["wall_seconds"] = time.perf_counter() - started
    print()
    summary["ratios"], summary["table"] = report(summary)
    path = os.path.join(args.output_dir, f"bench-{stamp}.json")
    for target in (path, os.path.join(args.output_dir, "latest.json")):
        with open(target, "w") as f:
            json.dump(summary, f, indent=1)
    partial = os.path.join(args.output_dir, f"bench-{stamp}.partial.json")
    if os.path.exists(partial):
        os.remove(partial)
    print(f"\nwrote {path} (worker logs: {log_path}); {summary['wall_seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
