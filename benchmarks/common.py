"""Helpers shared by the benchmark workers: model sizes, FLOP counts, timing.

This file imports no framework, so the keras_vit workers (in `.venv`) and the
timm / Hugging Face workers (in `.venv-ref`) can both use it.
"""

import json
import os
import resource
import statistics
import sys
import time

# Width, depth, heads, MLP size: the paper's Table 1 (the same numbers as
# keras_vit.models.variants, repeated here so the reference env needs no keras).
SIZES = {
    "Ti": {"hidden_dim": 192, "num_layers": 12, "num_heads": 3, "mlp_dim": 768},
    "S": {"hidden_dim": 384, "num_layers": 12, "num_heads": 6, "mlp_dim": 1536},
    "B": {"hidden_dim": 768, "num_layers": 12, "num_heads": 12, "mlp_dim": 3072},
}
TIMM_NAMES = {
    "ViT-Ti/16": "vit_tiny_patch16_224",
    "ViT-S/16": "vit_small_patch16_224",
    "ViT-B/16": "vit_base_patch16_224",
    "R50+ViT-B/16": "vit_base_r50_s16_224",
}
# The hybrid's BiT ResNet stem: blocks per stage (keras_vit.models.variants).
HYBRID_STAGE_DEPTHS = {"R50+ViT-B/16": (3, 4, 9)}
IMAGE_SIZE = 224
PATCH_SIZE = 16
NUM_CLASSES = 1000


def size_of(variant):
    """`"ViT-S/16"` -> `"S"` (and `"R50+ViT-B/16"` -> `"B"`)."""
    return variant.split("ViT-")[1].split("/")[0]


def is_hybrid(variant):
    return variant in HYBRID_STAGE_DEPTHS


def bit_stem_flops(stage_depths, image_size=IMAGE_SIZE, width=64):
    """FLOPs of the BiT ResNet stem of a hybrid (convolutions only).

    Root: 7x7 stride-2 conv to `width` channels, then a stride-2 max pool.
    Stage i: bottleneck units of width `width * 2**i` and 4x that output;
    the first unit of every stage after the first has stride 2 (in its 3x3
    conv) and every stage's first unit a 1x1 projection shortcut.

    Returns:
        `(flops, output_size, output_channels)`.
    """
    size = -(-image_size // 2)
    flops = 2 * size * size * 7 * 7 * 3 * width
    size = -(-size // 2)
    channels = width
    for stage, depth in enumerate(stage_depths):
        mid = width * 2**stage
        out = 4 * mid
        for unit in range(depth):
            stride = 2 if unit == 0 and stage > 0 else 1
            out_size = -(-size // stride)
            flops += 2 * size * size * channels * mid  # 1x1 reduce, before the stride
            flops += 2 * out_size * out_size * 9 * mid * mid  # 3x3, strided
            flops += 2 * out_size * out_size * mid * out  # 1x1 expand
            if unit == 0:
                flops += 2 * out_size * out_size * channels * out  # projection shortcut
            channels, size = out, out_size
    return flops, size, channels


def forward_flops(variant, image_size=IMAGE_SIZE, patch_size=PATCH_SIZE, num_classes=NUM_CLASSES):
    """Multiply-adds x 2 of one image's forward pass (matmuls and attention only).

    LayerNorm, GELU, softmax and additions are a few percent and left out, as
    FLOP counts of ViT usually do; the backward pass is taken as twice the
    forward, so a training step is 3x this.
    """
    cfg = SIZES[size_of(variant)]
    d, m, layers = cfg["hidden_dim"], cfg["mlp_dim"], cfg["num_layers"]
    if is_hybrid(variant):
        # 1x1 "patches" of the stem's feature map.
        stem, size, channels = bit_stem_flops(HYBRID_STAGE_DEPTHS[variant], image_size)
        n = size * size
        embed = stem + 2 * n * channels * d
    else:
        n = (image_size // patch_size) ** 2
        embed = 2 * n * (patch_size * patch_size * 3) * d
    t = n + 1
    per_layer = 2 * t * d * 3 * d + 2 * 2 * t * t * d + 2 * t * d * d + 2 * 2 * t * d * m
    head = 2 * d * num_classes
    return embed + layers * per_layer + head


def peak_rss_mib():
    """Peak resident set size of this process so far, in MiB (Linux: ru_maxrss is KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def current_rss_mib():
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def time_calls(fn, warmup, repeats):
    """Call `fn` `warmup` times untimed, then `repeats` times.

    Returns `(wall_seconds, cpu_seconds)`, one entry per timed call. CPU time
    (all threads of this process) is kept because on a shared machine wall
    time also counts the time other processes held the cores.
    """
    for _ in range(warmup):
        fn()
    wall, cpu = [], []
    for _ in range(repeats):
        start, start_cpu = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    return wall, cpu


def summarize(timed, batch):
    """Images/s median and spread (min, max) from `time_calls`' output."""
    wall, cpu = timed
    rates = sorted(batch / t for t in wall)
    return {
        "seconds": wall,
        "cpu_seconds": cpu,
        "images_per_s": statistics.median(rates),
        "images_per_s_min": rates[0],
        "images_per_s_max": rates[-1],
        "images_per_cpu_s": statistics.median(batch / t for t in cpu),
    }


def measure(fn, batch, args):
    """Time `fn` (one batch of `batch` images) the way every worker reports it.

    Returns `(first_call_seconds, summary)`: the first call alone (compilation
    or tracing included), then the median/spread of `args.repeats` calls after
    `args.warmup` more, with the peak resident memory so far.
    """
    start = time.perf_counter()
    fn()
    first_call_seconds = time.perf_counter() - start
    times = time_calls(fn, args.warmup, args.repeats)
    return first_call_seconds, {"batch": batch, **summarize(times, batch), "peak_rss_mib": peak_rss_mib()}


# CPU features that decide which matmul kernels a framework can use.
CPU_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "avx512_fp16",
             "amx_tile", "amx_bf16", "amx_int8")


def host_info():
    """The CPU model, its relevant flags, cores, caches and memory (Linux /proc and /sys)."""
    info = {"cpu": "unknown", "flags": [], "nproc": os.cpu_count()}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name" and info["cpu"] == "unknown":
                    info["cpu"] = value.strip()
                elif key == "flags" and not info["flags"]:
                    present = set(value.split())
                    info["flags"] = [flag for flag in CPU_FLAGS if flag in present]
                    info["hypervisor"] = "hypervisor" in present
    except OSError:
        pass
    try:
        with open("/proc/meminfo") as f:
            info["memory_gib"] = round(int(f.readline().split()[1]) / 2**20, 1)
    except (OSError, ValueError, IndexError):
        pass
    try:
        base = "/sys/devices/system/cpu/cpu0/topology/thread_siblings_list"
        with open(base) as f:
            info["cpu0_thread_siblings"] = f.read().strip()
    except OSError:
        pass
    return info


def placement():
    """Where this process may run and how many threads it has (thread placement)."""
    result = {"affinity": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None}
    try:
        result["os_threads"] = len(os.listdir("/proc/self/task"))
    except OSError:
        pass
    for name in ("OMP_NUM_THREADS", "OMP_PROC_BIND", "OMP_PLACES", "KMP_AFFINITY", "GOMP_CPU_AFFINITY", "XLA_FLAGS"):
        if os.environ.get(name):
            result[name] = os.environ[name]
    return result


def load_average():
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def write_summary(summary, output_dir, filename):
    """Note the load at the end in `summary` and write it as JSON to `output_dir/filename`; the path."""
    summary["load_at_end"] = load_average()
    os.makedirs(output_dir, exist_ok=True)
    path = os.path.join(output_dir, filename)
    with open(path, "w") as f:
        json.dump(summary, f, indent=1)
    return path


def emit(result):
    """Print the worker's result as one JSON line the driver picks out."""
    sys.stdout.write("BENCH_RESULT " + json.dumps(result) + "\n")
    sys.stdout.flush()


def add_common_arguments(parser):
    parser.add_argument("--variant", default="ViT-S/16")
    parser.add_argument("--forward-batch", type=int, default=16)
    parser.add_argument("--train-batch", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--skip-train", action="store_true")
    parser.add_argument("--skip-forward", action="store_true")
    parser.add_argument("--device", choices=("cpu", "gpu"), default="cpu",
                        help="gpu: the accelerator (CUDA torch, jax or tensorflow with a GPU); fails if none")
