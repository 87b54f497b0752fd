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
TIMM_NAMES = {"Ti": "vit_tiny_patch16_224", "S": "vit_small_patch16_224", "B": "vit_base_patch16_224"}
IMAGE_SIZE = 224
PATCH_SIZE = 16
NUM_CLASSES = 1000


def size_of(variant):
    """`"ViT-S/16"` -> `"S"`."""
    return variant.split("-")[1].split("/")[0]


def forward_flops(variant, image_size=IMAGE_SIZE, patch_size=PATCH_SIZE, num_classes=NUM_CLASSES):
    """Multiply-adds x 2 of one image's forward pass (matmuls and attention only).

    LayerNorm, GELU, softmax and additions are a few percent and left out, as
    FLOP counts of ViT usually do; the backward pass is taken as twice the
    forward, so a training step is 3x this.
    """
    cfg = SIZES[size_of(variant)]
    d, m, layers = cfg["hidden_dim"], cfg["mlp_dim"], cfg["num_layers"]
    n = (image_size // patch_size) ** 2
    t = n + 1
    embed = 2 * n * (patch_size * patch_size * 3) * d
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


def load_average():
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


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
