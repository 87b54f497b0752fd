"""The GPU check: keras_vit's tests, a fine-tuning run and ViT-B/16 timings on one GPU, in one command.

Run by `benchmarks/device_check.sh` (which installs the wheels the GPU machine
lacks and puts this checkout on PYTHONPATH), within about 8 minutes:

1. **env**: which torch, jax and keras run, the GPU's name, and that each
   backend puts a Keras tensor on the GPU.
2. **tests** (torch and jax, side by side): a slice of the test suite on the
   GPU: the layer and model parity tests against the numpy reference and the
   timm / Hugging Face fixtures, `.keras` round trips, masked patch
   prediction, hybrids. float32 matmuls at full precision
   (`JAX_DEFAULT_MATMUL_PRECISION=highest`, `NVIDIA_TF32_OVERRIDE=0`: TF32
   would round each product to 10 mantissa bits), so the tests' own 1e-4
   tolerance applies unchanged.
3. **bfloat16**: a small ViT under `mixed_bfloat16` against the numpy
   reference in float32: relative error ||out - ref|| / ||ref|| at most
   `BF16_RELATIVE_TOLERANCE` (bfloat16 keeps 8 bits of mantissa, 2**-8 =
   0.4% per rounding; a few roundings per block give ~1%), and the default
   float32 precision's error reported beside it.
4. **finetune** (torch and jax, side by side): `keras-vit finetune` trains a
   ViT-Ti from scratch on a generated folder on the GPU for a few dozen
   steps; the loss must fall, and the preset it writes must give the same
   predictions when reloaded on the CPU.
5. **bench**: ViT-B/16 at 224 in bfloat16, forward at batch 256 and a
   training step at batch 128: keras_vit on torch (eager and
   `jit_compile=True`) and on jax against timm (`torch.autocast` bfloat16,
   its `F.scaled_dot_product_attention`), one process each, built and
   compiled side by side, then timed in interleaved rounds (the order
   rotates each round); images/s, the ratio to timm, peak GPU memory of each
   process. Then each names the attention kernels it ran: torch's profiler's
   CUDA kernel names, JAX's optimized HLO's custom calls.

Every phase runs in processes of its own under a timeout, inside one overall
budget; the JSON and the markdown table are rewritten after each phase, so a
hang or a crash still leaves what was measured. The last line printed names
the first failed check (exit status 1), or says all passed.

    bash benchmarks/device_check.sh                 # on the GPU machine
    bash benchmarks/device_check.sh --cpu-smoke     # here: the same script, tiny sizes, on the CPU
    python benchmarks/device_check.py --check-wheels .device-wheels --requirements requirements/device.txt

Writes `device-check.json`, `device-check.md` and `device-check.log` to
`$OUT` when set, else to `benchmarks/results/`.
"""

import argparse
import datetime
import json
import os
import queue
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

BF16_RELATIVE_TOLERANCE = 2e-2
# Same predictions on the GPU and the CPU: float32 both, full-precision matmuls on the GPU.
RELOAD_TOLERANCE = 1e-3
# The GPU machine's packages (docs: .library/device/KINDS.md, "Python packages already there"), normalised;
# a wheel's requirement is met by this list or by another wheel of the folder.
DEVICE_PACKAGES = frozenset("""
absl-py h5py ml-dtypes numpy packaging rich typing-extensions markdown-it-py mdurl pygments pytest pluggy
iniconfig pillow safetensors huggingface-hub scikit-learn torch jax jaxlib timm transformers
""".split())
WHEELS_LIMIT_MIB = 64
# The test slice: numerics against independent references, round trips, MPP, hybrids (none needs TensorFlow).
TEST_SLICE = (
    "tests/layers/test_layers_behaviour.py",
    "tests/layers/test_fused_ops.py",
    "tests/models/test_vit_models.py",
    "tests/convert/test_convert_timm.py",
    "tests/convert/test_convert_huggingface.py",
    "tests/mpp/test_masked_patch_predictor.py",
    "tests/hybrid/test_hybrid_models.py",
    "tests/hybrid/test_hybrid_convert.py",
)
# The CPU smoke runs one test of the slice: it checks the plumbing, not the numbers.
SMOKE_TEST = "tests/models/test_vit_models.py::test_backbone_matches_numpy_reference_forward_pass"
CONTENDERS = ("timm", "keras-torch-eager", "keras-torch-compiled", "keras-jax")
PREFIX = "DEVICE_CHECK "
# Kernel or custom-call names of fused attention: torch's flash / memory-efficient / cuDNN SDPA kernels
# (`flash_fwd_kernel`, `fmha_cutlassF...`, `cudnn_sdpa`...), XLA's `__cudnn$fmha...` custom calls.
FUSED_ATTENTION = re.compile(r"flash|fmha|efficient_attention|mem_eff|cudnn.*(sdpa|attn|attention|mha)", re.I)


# ---------------------------------------------------------------------------------------------- sizes


def sizes(smoke):
    if smoke:
        return {"bench_variant": "ViT-Ti/16", "bench_layers": 1, "image_size": 32, "forward_batch": 4, "train_batch": 2,
                "warmup": 1, "rounds": 2, "repeats": 2, "finetune_image_size": 16, "finetune_per_class": 8,
                "finetune_epochs": 3, "finetune_batch": 4, "bf16_image_size": 16}
    return {"bench_variant": "ViT-B/16", "bench_layers": None, "image_size": 224, "forward_batch": 256, "train_batch": 128,
            "warmup": 3, "rounds": 7, "repeats": 5, "finetune_image_size": 32, "finetune_per_class": 40,
            "finetune_epochs": 4, "finetune_batch": 8, "bf16_image_size": 32}


# ---------------------------------------------------------------------------------------------- wheels


def _normalise(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def check_wheels(folder, requirements):
    """Check a wheels folder for the GPU machine; returns a list of problems (empty when it is fit)."""
    import zipfile

    problems, names, sizes_bytes = [], {}, 0
    wheels = sorted(f for f in os.listdir(folder) if f.endswith(".whl"))
    for wheel in wheels:
        path = os.path.join(folder, wheel)
        sizes_bytes += os.path.getsize(path)
        name, version = wheel.split("-")[:2]
        name = _normalise(name)
        if name in names:
            problems.append(f"two versions of {name}: {names[name][0]} and {version} (pip would refuse both)")
        tags = wheel[:-4].split("-")[-3:]
        if not (tags[0] in ("py3", "cp312") and (tags[2] == "any" or "x86_64" in tags[2])):
            problems.append(f"{wheel} is not for CPython 3.12 on x86-64 Linux")
        with zipfile.ZipFile(path) as archive:
            metadata = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
            lines = archive.read(metadata).decode().splitlines()
        needs = []
        for line in lines:
            if line.startswith("Requires-Dist:") and "extra ==" not in line:
                requirement = line.split(":", 1)[1].strip()
                marker = requirement.split(";", 1)[1] if ";" in requirement else ""
                if "python_version >=" in marker and ("3.13" in marker or "3.15" in marker):
                    continue  # only for Pythons newer than the machine's 3.12
                needs.append(_normalise(re.split(r"[ ;<>=!~\[(]", requirement, maxsplit=1)[0]))
        names[name] = (version, needs)
    for name, (version, needs) in names.items():
        for need in needs:
            if need not in names and need not in DEVICE_PACKAGES:
                problems.append(f"{name} {version} needs {need}, which neither the GPU machine nor the folder has")
    with open(requirements) as f:
        pinned = [line.split("#")[0].strip() for line in f if line.split("#")[0].strip()]
    for pin in pinned:
        name, version = pin.split("==")
        got = names.get(_normalise(name), (None,))[0]
        if got != version:
            problems.append(f"requirements pin {pin} but the folder has {got or 'no wheel'}")
    mib = sizes_bytes / 2**20
    if mib >= WHEELS_LIMIT_MIB:
        problems.append(f"the wheels take {mib:.1f} MiB, over the {WHEELS_LIMIT_MIB} MiB the working tree may carry")
    for wheel in wheels:
        print(f"  {wheel}  {os.path.getsize(os.path.join(folder, wheel)) / 2**20:.2f} MiB")
    print(f"  {len(wheels)} wheels, {mib:.2f} MiB in all (limit {WHEELS_LIMIT_MIB} MiB)")
    return problems


# ---------------------------------------------------------------------------------------------- workers
# Each runs in its own process with KERAS_BACKEND set, and prints `DEVICE_CHECK {json}` lines.


def emit(message):
    sys.stdout.write(PREFIX + json.dumps(message) + "\n")
    sys.stdout.flush()


def _framework_versions():
    from importlib import metadata

    versions = {}
    for name in ("keras", "torch", "jax", "jaxlib", "timm", "transformers", "numpy"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def worker_probe(args):
    """Which device a Keras tensor lands on for this backend."""
    import keras
    from keras import ops

    import keras_vit

    backend = keras.backend.backend()
    x = ops.ones((2, 2))
    if backend == "torch":
        device = str(x.device)
        on_gpu = x.is_cuda
    else:
        device = str(list(x.devices())[0])
        on_gpu = list(x.devices())[0].platform == "gpu"
    message = {"backend": backend, "device": device, "on_gpu": on_gpu, "keras_file": keras.__file__,
               "keras_vit_file": keras_vit.__file__}
    if args.result:
        # The CPU smoke's 1-block backbone for its fine-tuning, written here: one Keras start fewer.
        sys.path.insert(0, ROOT)
        from tests.finetune.helpers import tiny_backbone_file

        tiny_backbone_file(args.result, image_size=args.image_size, dropout=0.0)
        message["tiny_backbone"] = args.result
    if args.bf16_image_size:
        # The CPU smoke's bfloat16 parity too (phase_bf16 reads it here): one Keras start fewer. The GPU run
        # starts the bf16 worker of its own.
        message["bf16"] = _bf16_parity(args.bf16_image_size)
    emit(message)


def worker_bf16(args):
    """A small ViT under mixed_bfloat16 and in float32 against the numpy reference."""
    emit(_bf16_parity(args.image_size))


def _bf16_parity(size):
    import keras
    import numpy as np

    sys.path.insert(0, ROOT)
    import keras_vit
    from tests import numpy_reference as ref
    from tests.models.model_helpers import randomise, reference_weights, to_numpy

    config = dict(image_size=size, patch_size=8, hidden_dim=64, num_layers=2, num_heads=4, mlp_dim=128)
    images = np.random.default_rng(1).uniform(0, 255, size=(4, size, size, 3)).astype("float32")
    result = {}
    for policy in ("float32", "mixed_bfloat16"):
        keras.config.set_dtype_policy(policy)
        backbone = keras_vit.ViTBackbone(**config)
        randomise(backbone, seed=0)
        got = to_numpy(backbone.predict(images, verbose=0)).astype("float64")
        expected = ref.vit_forward(images, reference_weights(backbone), patch=8, num_heads=4, epsilon=1e-6,
                                   mean=0.5, std=0.5, scale=1 / 255)
        result[policy] = {"relative_error": float(np.linalg.norm(got - expected) / np.linalg.norm(expected)),
                          "max_abs_error": float(np.abs(got - expected).max()),
                          "finite": bool(np.isfinite(got).all())}
    keras.config.set_dtype_policy("float32")
    return result


def worker_finetune_predict(args):
    """Load the fine-tuned preset and write its probabilities on a fixed batch to `args.result`."""
    import numpy as np

    import keras_vit

    size = args.image_size
    images = np.random.default_rng(7).uniform(0, 255, size=(6, size, size, 3)).astype("float32")
    # The CPU smoke loads and predicts a second time in this process (`--second-result`): both of its
    # "devices" are the CPU, and a second process would only start Keras again.
    for result in filter(None, (args.result, args.second_result)):
        model = keras_vit.ViTClassifier.from_preset(args.preset)
        probabilities = np.asarray(model.predict(images, verbose=0), dtype="float64")
        np.save(result, probabilities)
    emit({"saved": args.result, "shape": list(probabilities.shape)})


class _Contender:
    """One benchmark contender in its own process: build, warm up, then time on the driver's command."""

    def __init__(self, name, args):
        self.name, self.args = name, args
        self.smoke = args.cpu_smoke

    def build(self):
        import numpy as np

        args = self.args
        rng = np.random.default_rng(0)
        size = args.image_size
        self.forward_np = rng.uniform(0, 255, (args.forward_batch, size, size, 3)).astype("float32")
        self.train_np = rng.uniform(0, 255, (args.train_batch, size, size, 3)).astype("float32")
        self.labels_np = rng.integers(0, 1000, (args.train_batch,)).astype("int32")
        if self.name == "timm":
            self._build_timm()
        else:
            self._build_keras()

    def _build_timm(self):
        import torch

        self.device = "cpu" if self.smoke else "cuda"
        self.torch = torch
        try:
            import timm

            depth = {"depth": self.args.layers} if self.args.layers else {}
            self.model = timm.create_model(_TIMM_NAMES[self.args.variant], pretrained=False, num_classes=1000,
                                           img_size=self.args.image_size, **depth).to(self.device)
            self.reference = f"timm {timm.__version__}"
        except ImportError:
            if not self.smoke:
                raise
            # The CPU smoke's environment has no timm (it needs a CUDA torch): Hugging Face's ViT with SDPA
            # runs the same code path of this worker.
            import transformers

            hidden, layers, heads, mlp = _SIZES[self.args.variant]
            config = transformers.ViTConfig(image_size=self.args.image_size, patch_size=16, hidden_size=hidden,
                                            num_hidden_layers=self.args.layers or layers, num_attention_heads=heads,
                                            intermediate_size=mlp, num_labels=1000, attn_implementation="sdpa")
            hf = transformers.ViTForImageClassification(config)
            self.model = _LogitsOnly(hf).to(self.device)
            self.reference = f"transformers {transformers.__version__} (no timm here)"
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-4, fused=not self.smoke)
        to = dict(device=self.device)
        self.forward_x = torch.from_numpy(self.forward_np).permute(0, 3, 1, 2).contiguous().to(**to)
        self.train_x = torch.from_numpy(self.train_np).permute(0, 3, 1, 2).contiguous().to(**to)
        self.labels = torch.from_numpy(self.labels_np).long().to(**to)
        self.autocast = lambda: torch.autocast(self.device, dtype=torch.bfloat16)

    def _build_keras(self):
        import keras

        backend = keras.backend.backend()
        keras.config.set_dtype_policy("mixed_bfloat16")
        from keras_vit.models import ViTClassifier
        from keras_vit.workflows.optimizers import AdamW

        overrides = {"num_layers": self.args.layers} if self.args.layers else {}
        self.model = ViTClassifier.from_variant(self.args.variant, image_size=self.args.image_size,
                                                num_classes=1000, activation=None, **overrides)
        jit = {"keras-torch-eager": False, "keras-torch-compiled": True, "keras-jax": True}[self.name]
        self.model.compile(optimizer=AdamW(learning_rate=1e-4),
                           loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile=jit)
        self.reference = f"keras {keras.__version__} on {backend}, jit_compile={jit}"
        # The images live on the device, as timm's do: the timings leave out the host-to-device copy.
        if backend == "torch":
            import torch

            self.torch = torch
            device = "cpu" if self.smoke else "cuda"
            self.forward_x = torch.from_numpy(self.forward_np).to(device)
            self.train_x = torch.from_numpy(self.train_np).to(device)
            self.labels = torch.from_numpy(self.labels_np).to(device)
        else:
            import jax

            self.forward_x = jax.device_put(self.forward_np)
            self.train_x = jax.device_put(self.train_np)
            self.labels = jax.device_put(self.labels_np)

    def forward(self):
        if self.name == "timm":
            with self.torch.inference_mode(), self.autocast():
                out = self.model(self.forward_x)
            self._sync()
            return out
        return self.model.predict_on_batch(self.forward_x)  # numpy out: waits for the device

    def train(self):
        if self.name == "timm":
            with self.autocast():
                loss = self.torch.nn.functional.cross_entropy(self.model(self.train_x), self.labels)
            loss.backward()
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            self._sync()
            return float(loss)
        return self.model.train_on_batch(self.train_x, self.labels)  # the loss as a float: waits

    def _sync(self):
        if not self.smoke:
            self.torch.cuda.synchronize()

    def peak_mib(self):
        if self.smoke:
            return None
        if self.name == "keras-jax":
            import jax

            stats = jax.local_devices()[0].memory_stats() or {}
            return stats.get("peak_bytes_in_use", 0) / 2**20
        return self.torch.cuda.max_memory_allocated() / 2**20

    def attention_kernels(self):
        """Names of the attention kernels this contender ran, read from the profiler or the compiled program."""
        if self.name == "keras-jax":
            return _hlo_attention_calls(self.args.dump_dir)
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU] if self.smoke else [ProfilerActivity.CUDA]
        with profile(activities=activities) as prof:
            self.forward()
            self.train()
        names = sorted({event.key for event in prof.key_averages()})
        if self.smoke:
            # The CPU has no attention kernels of its own: the aten operator's name is what there is to read.
            return [n for n in names if "scaled_dot_product" in n or FUSED_ATTENTION.search(n)]
        return [n for n in names if FUSED_ATTENTION.search(n)]


class _LogitsOnly:
    """Hugging Face's classifier returning logits, as timm's model does (CPU smoke only)."""

    def __new__(cls, model):
        import torch

        class Wrapper(torch.nn.Module):
            def __init__(self, inner):
                super().__init__()
                self.inner = inner

            def forward(self, x):
                return self.inner(pixel_values=x).logits

        return Wrapper(model)


_TIMM_NAMES = {"ViT-Ti/16": "vit_tiny_patch16_224", "ViT-S/16": "vit_small_patch16_224",
               "ViT-B/16": "vit_base_patch16_224"}
_SIZES = {"ViT-Ti/16": (192, 12, 3, 768), "ViT-S/16": (384, 12, 6, 1536), "ViT-B/16": (768, 12, 12, 3072)}


def _hlo_custom_calls(dump_dir):
    """Every custom call's target in the optimized HLO XLA dumped."""
    found = set()
    for name in (os.listdir(dump_dir) if os.path.isdir(dump_dir) else ()):
        if "after_optimizations" in name and name.endswith(".txt"):
            with open(os.path.join(dump_dir, name), errors="replace") as f:
                for target in re.findall(r'custom_call_target="([^"]+)"', f.read()):
                    found.add(target)
    return sorted(found)


def _hlo_attention_calls(dump_dir):
    """The custom calls of fused attention in the optimized HLO XLA dumped (`__cudnn$fmha...`)."""
    return [target for target in _hlo_custom_calls(dump_dir) if FUSED_ATTENTION.search(target)]


def worker_bench(args):
    """One contender: build and warm up, then answer the driver's commands on stdin until `quit`."""
    import statistics

    contender = _Contender(args.contender, args)
    started = time.perf_counter()
    contender.build()
    first = {}
    for mode in ("forward", "train"):
        start = time.perf_counter()
        getattr(contender, mode)()
        first[mode] = time.perf_counter() - start
    for _ in range(args.warmup):
        contender.forward()
        contender.train()
    emit({"ready": True, "reference": contender.reference, "build_seconds": time.perf_counter() - started,
          "first_call_seconds": first})
    for line in sys.stdin:
        command = line.strip()
        if command == "quit":
            return
        if command in ("forward", "train"):
            batch = args.forward_batch if command == "forward" else args.train_batch
            seconds = []
            for _ in range(args.repeats):
                start = time.perf_counter()
                getattr(contender, command)()
                seconds.append(time.perf_counter() - start)
            emit({"mode": command, "seconds": seconds,
                  "images_per_s": batch / statistics.median(seconds)})
        elif command == "finish":
            kernels = contender.attention_kernels()
            custom_calls = _hlo_custom_calls(args.dump_dir) if args.dump_dir else None
            emit({"peak_mib": contender.peak_mib(), "attention_kernels": kernels, "custom_calls": custom_calls})


WORKERS = {"probe": worker_probe, "bf16": worker_bf16, "finetune-predict": worker_finetune_predict,
           "bench": worker_bench}


# ---------------------------------------------------------------------------------------------- driver


class Check:
    """The driver's record: results by phase, problems, the log; rewritten to disk after each phase."""

    def __init__(self, args):
        self.args = args
        self.smoke = args.cpu_smoke
        self.started = time.monotonic()
        self.deadline = self.started + args.budget
        self.lock = threading.Lock()
        self.results = {"date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                        "mode": "cpu-smoke" if self.smoke else "gpu", "sizes": sizes(self.smoke),
                        "backends": args.backends, "phases": {}, "problems": []}
        self.out = args.output_dir or os.environ.get("OUT") or os.path.join(HERE, "results")
        os.makedirs(self.out, exist_ok=True)
        self.log = open(os.path.join(self.out, "device-check.log"), "w")
        self.smoke_bf16 = {}  # by backend: the smoke's bfloat16 parity, which its probe computes

    def remaining(self):
        return self.deadline - time.monotonic()

    def say(self, text):
        line = f"[{time.monotonic() - self.started:6.1f}s] {text}"
        with self.lock:
            print(line, flush=True)
            self.log.write(line + "\n")
            self.log.flush()

    def record(self, phase, result, problems=()):
        with self.lock:
            result["seconds"] = round(time.monotonic() - self.started, 1)
            self.results["phases"][phase] = result
            for problem in problems:
                self.results["problems"].append(f"{phase}: {problem}")
            self._write()
        for problem in problems:
            self.say(f"FAILED {phase}: {problem}")

    def _write(self):
        path = os.path.join(self.out, "device-check.json")
        with open(path + ".tmp", "w") as f:
            json.dump(self.results, f, indent=1, default=str)
        os.replace(path + ".tmp", path)
        with open(os.path.join(self.out, "device-check.md"), "w") as f:
            f.write(markdown(self.results))

    def env(self, backend, extra=None):
        # Without the calling pytest's variables (the CPU smoke runs inside `make test`).
        env = {key: value for key, value in os.environ.items() if not key.startswith("PYTEST_")}
        env.update(KERAS_BACKEND=backend, PYTHONUNBUFFERED="1",
                   # Several JAX processes share the GPU: none takes 75% of its memory up front.
                   XLA_PYTHON_CLIENT_PREALLOCATE="false", TF_CPP_MIN_LOG_LEVEL="2")
        if self.smoke:
            env.update(CUDA_VISIBLE_DEVICES="", JAX_PLATFORMS="cpu")
        env.update(extra or {})
        return env

    def run(self, phase, command, env, timeout, log_name=None):
        """Run a command to its end (or its timeout); returns (returncode or None on timeout, output, messages)."""
        # The smoke runs on shared CPUs (`make test`'s workers beside it): its limits are three times the GPU's.
        timeout = max(5.0, min(timeout * (3 if self.smoke else 1), self.remaining()))
        self.say(f"{phase}: {' '.join(command[-4:]) if len(command) > 6 else ' '.join(command)} (up to {timeout:.0f} s)")
        # A session of its own, so a timeout ends its children too (pytest's workers, compilers).
        process = subprocess.Popen(command, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   text=True, start_new_session=True)
        try:
            output, _ = process.communicate(timeout=timeout)
            code = process.returncode
        except subprocess.TimeoutExpired:
            _kill_group(process)
            output, _ = process.communicate()
            code = None
        with self.lock:
            self.log.write(f"----- {phase}: {' '.join(command)}\n{output}\n----- exit {code}\n")
            self.log.flush()
        messages = [json.loads(line[len(PREFIX):]) for line in output.splitlines() if line.startswith(PREFIX)]
        return code, output, messages

    def worker(self, name, backend, *options, timeout=120, extra_env=None):
        command = [sys.executable, os.path.abspath(__file__), "--worker", name, *options]
        if self.smoke:
            command.append("--cpu-smoke")
        return self.run(f"{name}[{backend}]", command, self.env(backend, extra_env), timeout)


def _kill_group(process):
    """End a process started with `start_new_session=True` and everything it started."""
    import signal

    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _tail(output, lines=3):
    plain = re.sub(r"\x1b\[[0-9;]*m", "", output)  # Keras' progress bars colour their text
    return " | ".join(line.strip() for line in plain.strip().splitlines()[-lines:])


def _tiny_backbone_path(workdir, backend):
    return os.path.join(workdir, f"tiny-{backend}.keras")


def phase_env(check, workdir):
    versions = _framework_versions()
    gpu = None
    if shutil.which("nvidia-smi"):
        try:
            gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version",
                                  "--format=csv,noheader"], capture_output=True, text=True, timeout=30).stdout.strip()
        except subprocess.TimeoutExpired:
            gpu = "nvidia-smi timed out"
    result = {"python": sys.version.split()[0], "versions": versions, "gpu": gpu, "host": os.uname().nodename,
              "probe": {}}
    check.say(f"python {result['python']}; " + ", ".join(f"{k} {v}" for k, v in versions.items()) + f"; GPU: {gpu}")
    problems = []
    for backend in check.args.backends:
        options = []
        if check.smoke:  # the probe also writes the smoke's tiny backbone (phase_finetune) and runs its bf16 parity
            options = ["--result", _tiny_backbone_path(workdir, backend),
                       "--image-size", str(sizes(True)["finetune_image_size"]),
                       "--bf16-image-size", str(sizes(True)["bf16_image_size"])]
        code, output, messages = check.worker("probe", backend, *options, timeout=120)
        if code != 0 or not messages:
            problems.append(f"keras on {backend} did not start: {_tail(output)}")
            continue
        probe = messages[-1]
        if "bf16" in probe:
            check.smoke_bf16[backend] = probe.pop("bf16")
        result["probe"][backend] = probe
        check.say(f"keras on {backend}: a tensor lands on {probe['device']} (keras from {probe['keras_file']})")
        if not check.smoke and not probe["on_gpu"]:
            problems.append(f"keras on {backend} puts tensors on {probe['device']}, not the GPU")
    check.record("env", result, problems)
    return not problems


def phase_tests(check, backend):
    smoke = check.smoke
    selection = [SMOKE_TEST] if smoke else list(TEST_SLICE)
    options = ["-q", "-p", "no:cacheprovider", "-o", "addopts=", "-rfE"]
    if not smoke:
        try:
            import xdist  # noqa: F401

            options += ["-n", "3", "--dist", "loadscope"]
        except ImportError:
            options += ["-p", "no:xdist"]
    else:
        options += ["-n", "0"] if _has_xdist() else []
    extra = {"JAX_DEFAULT_MATMUL_PRECISION": "highest", "NVIDIA_TF32_OVERRIDE": "0"}
    code, output, _ = check.run(f"tests[{backend}]", [sys.executable, "-m", "pytest", *options, *selection],
                                check.env(backend, extra), timeout=300 if not smoke else 60)
    summary = next((line for line in reversed(output.strip().splitlines())
                    if re.search(r"\b(passed|failed|error|skipped)\b", line)), "")
    counts = {key: int(n) for n, key in re.findall(r"(\d+) (passed|failed|errors?|skipped)", summary)}
    failures = [line for line in output.splitlines() if line.startswith(("FAILED", "ERROR"))]
    result = {"summary": summary.strip("= "), "counts": counts, "failures": failures[:20]}
    problems = []
    if code is None:
        problems.append(f"pytest on {backend} ran past its timeout ({summary or 'no summary'})")
    elif code != 0:
        problems.append(f"pytest on {backend}: {summary.strip('= ') or _tail(output)}"
                        + (f"; first: {failures[0]}" if failures else ""))
    elif not counts.get("passed"):
        problems.append(f"pytest on {backend} passed nothing ({summary})")
    check.say(f"tests[{backend}]: {result['summary']}")
    check.record(f"tests[{backend}]", result, problems)


def _has_xdist():
    try:
        import xdist  # noqa: F401

        return True
    except ImportError:
        return False


def phase_bf16(check, backend):
    size = sizes(check.smoke)["bf16_image_size"]
    if check.smoke:  # the probe ran it (phase_env)
        parity = check.smoke_bf16.get(backend)
        code, output, messages = 0, "the probe returned no bfloat16 parity", [parity] if parity else []
    else:
        code, output, messages = check.worker("bf16", backend, "--image-size", str(size), timeout=150)
    problems = []
    if code != 0 or not messages:
        problems.append(f"the bfloat16 parity worker failed: {_tail(output)}")
        check.record(f"bf16[{backend}]", {}, problems)
        return
    result = messages[-1]
    bf16 = result["mixed_bfloat16"]
    if not bf16["finite"] or not bf16["relative_error"] <= BF16_RELATIVE_TOLERANCE:
        problems.append(f"mixed_bfloat16 relative error {bf16['relative_error']:.2e} over {BF16_RELATIVE_TOLERANCE}")
    result["tolerance"] = BF16_RELATIVE_TOLERANCE
    check.say(f"bf16[{backend}]: relative error float32 (default precision) {result['float32']['relative_error']:.1e}, "
              f"mixed_bfloat16 {bf16['relative_error']:.1e} (limit {BF16_RELATIVE_TOLERANCE})")
    check.record(f"bf16[{backend}]", result, problems)


def phase_finetune(check, backend, workdir):
    s = sizes(check.smoke)
    sys.path.insert(0, ROOT)
    from tests.finetune.helpers import write_folder

    folder = write_folder(os.path.join(workdir, f"folder-{backend}"), classes=3, per_class=s["finetune_per_class"],
                          size=(s["finetune_image_size"],) * 2)
    output = os.path.join(workdir, f"finetuned-{backend}")
    problems, result = [], {}
    if check.smoke:
        # ViT-Ti's 12 blocks take minutes on shared CPUs: the smoke fine-tunes a 1-block backbone through the
        # same command, preset and reload.
        # The probe (phase_env) wrote it.
        source = _tiny_backbone_path(workdir, backend)
        if not os.path.isfile(source):
            check.record(f"finetune[{backend}]", result, [f"the probe did not write the tiny backbone {source}"])
            return
        model = ["--preset", source]
    else:
        model = ["--variant", "ViT-Ti/16"]
    command = [sys.executable, "-m", "keras_vit", "finetune", folder, *model,
               "--image-size", str(s["finetune_image_size"]), "--recipe", "adamw", "--effective-batch-size", "0",
               "--epochs", str(s["finetune_epochs"]), "--batch-size", str(s["finetune_batch"]), "--no-crop",
               "--no-flip", "--workers", "2", "--output", output]
    code, out, _ = check.run(f"finetune[{backend}]", command,
                             check.env(backend, {"JAX_DEFAULT_MATMUL_PRECISION": "highest",
                                                 "NVIDIA_TF32_OVERRIDE": "0"}), timeout=300)
    if code != 0:
        problems.append(f"keras-vit finetune {'timed out' if code is None else f'exited {code}'}: {_tail(out)}")
        check.record(f"finetune[{backend}]", result, problems)
        return
    import csv

    with open(os.path.join(output + ".run", "log.csv")) as f:
        rows = list(csv.DictReader(f))
    losses = [float(row["loss"]) for row in rows]
    result["losses"] = losses
    train_images = int(round(3 * s["finetune_per_class"] * 0.8))
    result["steps"] = len(losses) * -(-train_images // s["finetune_batch"])
    if not losses or not losses[-1] < losses[0]:
        problems.append(f"the loss did not fall: {losses}")
    predictions = {}
    paths = {where: os.path.join(workdir, f"predictions-{backend}-{where}.npy") for where in ("gpu", "cpu")}
    runs = [("gpu", {"JAX_DEFAULT_MATMUL_PRECISION": "highest", "NVIDIA_TF32_OVERRIDE": "0"}, ()),
            ("cpu", {"CUDA_VISIBLE_DEVICES": "", "JAX_PLATFORMS": "cpu"}, ())]
    if check.smoke:  # both "devices" are the CPU there: one process loads and predicts twice
        runs = [("cpu", runs[1][1], ("--second-result", paths["gpu"]))]
    for where, extra, more in runs:
        code, out, _ = check.worker("finetune-predict", backend, "--preset", output, "--result", paths[where], *more,
                                    "--image-size", str(s["finetune_image_size"]), timeout=120, extra_env=extra)
        if code != 0:
            problems.append(f"the preset did not reload and predict on the {where}: {_tail(out)}")
            break
    else:
        import numpy as np

        predictions = {where: np.load(path) for where, path in paths.items()}
    if len(predictions) == 2:
        import numpy as np

        gap = float(np.abs(predictions["gpu"] - predictions["cpu"]).max())
        same_classes = bool((predictions["gpu"].argmax(-1) == predictions["cpu"].argmax(-1)).all())
        result.update({"reload_max_abs_difference": gap, "same_top1": same_classes})
        if not (gap <= RELOAD_TOLERANCE and same_classes):
            problems.append(f"the preset predicts differently on the CPU: max difference {gap:.2e} "
                            f"(limit {RELOAD_TOLERANCE}), same top-1: {same_classes}")
    result["model"] = "a 1-block backbone" if check.smoke else "ViT-Ti/16"
    check.say(f"finetune[{backend}]: {result['model']}, {result.get('steps')} steps, loss {losses[0]:.3f} -> {losses[-1]:.3f}; "
              f"reloaded on the CPU: max difference {result.get('reload_max_abs_difference', float('nan')):.1e}")
    check.record(f"finetune[{backend}]", result, problems)


class _Process:
    """A bench worker process with a reader thread, so every wait has a timeout."""

    def __init__(self, check, name, command, env):
        self.check, self.name = check, name
        self.process = subprocess.Popen(command, env=env, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, text=True, bufsize=1, start_new_session=True)
        self.messages, self.tail = queue.Queue(), []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.process.stdout:
            if line.startswith(PREFIX):
                self.messages.put(json.loads(line[len(PREFIX):]))
            else:
                self.tail = (self.tail + [line.rstrip()])[-40:]
                with self.check.lock:
                    self.check.log.write(f"[{self.name}] {line}")
        self.messages.put(None)  # the process ended

    def ask(self, command, timeout):
        if command:
            self.process.stdin.write(command + "\n")
            self.process.stdin.flush()
        try:
            scale = 3 if self.check.smoke else 1
            message = self.messages.get(timeout=max(1.0, min(timeout * scale, self.check.remaining())))
        except queue.Empty:
            raise RuntimeError(f"no answer to {command or 'start'} within {timeout:.0f} s")
        if message is None:
            raise RuntimeError(f"the process ended: {' | '.join(self.tail[-3:])}")
        return message

    def stop(self):
        try:
            self.process.stdin.write("quit\n")
            self.process.stdin.flush()
            self.process.wait(timeout=20)
        except (OSError, subprocess.TimeoutExpired):
            _kill_group(self.process)
            self.process.wait()


def start_bench(check, workdir):
    """Start the contenders: they build and compile while the correctness phases run (timed later, alone)."""
    s = sizes(check.smoke)
    # The CPU smoke leaves out torch.compile: on a CPU it builds C++ for minutes, and its path through this
    # script is the eager contender's with jit_compile=True.
    wanted = [c for c in CONTENDERS if ("jax" if c == "keras-jax" else "torch") in check.args.backends
              and not (check.smoke and c == "keras-torch-compiled")]
    processes = {}
    for name in wanted:
        backend = "jax" if name == "keras-jax" else "torch"
        extra = {}
        options = ["--contender", name, "--variant", s["bench_variant"], "--image-size", str(s["image_size"]),
                   "--forward-batch", str(s["forward_batch"]), "--train-batch", str(s["train_batch"]),
                   "--warmup", str(s["warmup"]), "--repeats", str(s["repeats"])]
        if s["bench_layers"]:
            options += ["--layers", str(s["bench_layers"])]
        if name == "keras-jax":
            dump = os.path.join(workdir, "xla-dump")
            # Only the training and prediction steps: Keras' eager initialisers each compile a module too.
            extra["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + f" --xla_dump_to={dump} --xla_dump_hlo_as_text"
                                  " --xla_dump_hlo_module_re=.*(train|predict).*").strip()
            options += ["--dump-dir", dump]
        command = [sys.executable, os.path.abspath(__file__), "--worker", "bench", *options]
        if check.smoke:
            command.append("--cpu-smoke")
        check.say(f"bench: starting {name}")
        processes[name] = _Process(check, name, command, check.env(backend, extra))
    return processes, time.monotonic()


def phase_bench(check, processes, started):
    s = sizes(check.smoke)
    setup, problems, rounds, finish = {}, [], [], {}
    try:
        # Built and compiled side by side; each must be ready within the setup time, leaving the rounds theirs.
        setup_deadline = min(started + 360.0 * (3 if check.smoke else 1), time.monotonic() + check.remaining() - 70)
        for name in list(processes):
            try:
                setup[name] = processes[name].ask(None, setup_deadline - time.monotonic())
                check.say(f"bench: {name} ready in {setup[name]['build_seconds']:.0f} s ({setup[name]['reference']})")
            except RuntimeError as error:
                problems.append(f"{name} did not start: {error}")
                processes.pop(name).stop()
        names = list(processes)
        for index in range(s["rounds"]):
            order = names[index % len(names):] + names[:index % len(names)] if names else []
            entry = {"order": order}
            for mode in ("forward", "train"):
                for name in order:
                    if name not in processes:
                        continue
                    try:
                        entry[f"{name}/{mode}"] = processes[name].ask(mode, 120)["images_per_s"]
                    except RuntimeError as error:
                        problems.append(f"{name} {mode}: {error}")
                        processes.pop(name).stop()
            rounds.append(entry)
            check.record("bench", _bench_summary(s, setup, rounds, {}), [])
        for name in list(processes):
            try:
                finish[name] = processes[name].ask("finish", 120)
            except RuntimeError as error:
                problems.append(f"{name} profile: {error}")
        for name, info in finish.items():
            kernels = info["attention_kernels"]
            check.say(f"bench: {name} attention: {', '.join(kernels) or 'no fused attention kernel'}")
            if not kernels and not (check.smoke and name == "keras-jax"):
                problems.append(f"{name} ran no fused attention kernel (profiler / optimized HLO)")
    finally:
        for process in processes.values():
            process.stop()
    summary = _bench_summary(s, setup, rounds, finish)
    check.record("bench", summary, problems)
    for line in bench_table(summary).splitlines():
        check.say(line)


def _bench_summary(s, setup, rounds, finish):
    import statistics

    table = {}
    for name in CONTENDERS:
        row = {}
        for mode in ("forward", "train"):
            values = [r[f"{name}/{mode}"] for r in rounds if f"{name}/{mode}" in r]
            if values:
                row[f"{mode}_images_per_s"] = statistics.median(values)
                row[f"{mode}_rounds"] = values
        if row or name in setup:
            row.update({"reference": setup.get(name, {}).get("reference"),
                        "first_call_seconds": setup.get(name, {}).get("first_call_seconds"),
                        "peak_mib": finish.get(name, {}).get("peak_mib"),
                        "attention_kernels": finish.get(name, {}).get("attention_kernels"),
                        "custom_calls": finish.get(name, {}).get("custom_calls")})
            table[name] = row
    for name, row in table.items():
        for mode in ("forward", "train"):
            base = table.get("timm", {}).get(f"{mode}_images_per_s")
            if base and f"{mode}_images_per_s" in row:
                row[f"{mode}_ratio_to_timm"] = row[f"{mode}_images_per_s"] / base
    return {"variant": s["bench_variant"], "image_size": s["image_size"], "forward_batch": s["forward_batch"],
            "train_batch": s["train_batch"], "rounds": len(rounds), "repeats": s["repeats"], "table": table}


def bench_table(summary):
    lines = [f"{summary['variant']} at {summary['image_size']}, bfloat16; forward batch {summary['forward_batch']}, "
             f"train batch {summary['train_batch']}; median of {summary['rounds']} interleaved rounds",
             "| contender | forward img/s | x timm | train img/s | x timm | peak GPU MiB | attention kernel |",
             "|---|---|---|---|---|---|---|"]

    def number(value, form):
        return format(value, form) if isinstance(value, (int, float)) else "-"

    for name, row in summary["table"].items():
        kernels = row.get("attention_kernels")
        kernel = "-" if kernels is None else (kernels[0][:60] if kernels else "none")
        lines.append(f"| {name} | {number(row.get('forward_images_per_s'), '.0f')} | "
                     f"{number(row.get('forward_ratio_to_timm'), '.2f')} | {number(row.get('train_images_per_s'), '.0f')}"
                     f" | {number(row.get('train_ratio_to_timm'), '.2f')} | {number(row.get('peak_mib'), '.0f')} | "
                     f"{kernel} |")
    return "\n".join(lines)


def markdown(results):
    phases = results["phases"]
    lines = [f"# keras_vit device check, {results['date_utc']} ({results['mode']})", ""]
    env = phases.get("env", {})
    if env:
        versions = ", ".join(f"{k} {v}" for k, v in env.get("versions", {}).items() if v)
        lines += [f"Python {env.get('python')}; {versions}; GPU: {env.get('gpu')}", ""]
    lines += ["| check | result |", "|---|---|"]
    for name, result in phases.items():
        if name.startswith("tests"):
            lines.append(f"| {name} | {result.get('summary')} |")
        elif name.startswith("bf16"):
            lines.append(f"| {name} | relative error float32 {result.get('float32', {}).get('relative_error', 0):.1e}, "
                         f"mixed_bfloat16 {result.get('mixed_bfloat16', {}).get('relative_error', 0):.1e} "
                         f"(limit {BF16_RELATIVE_TOLERANCE}) |")
        elif name.startswith("finetune"):
            losses = result.get("losses") or [float("nan")]
            lines.append(f"| {name} | {result.get('model')}, {result.get('steps')} steps, loss {losses[0]:.3f} -> {losses[-1]:.3f}, "
                         f"CPU reload max difference {result.get('reload_max_abs_difference', float('nan')):.1e} |")
    if "bench" in phases:
        lines += ["", bench_table(phases["bench"])]
    lines += ["", "Problems: " + ("; ".join(results["problems"]) if results["problems"] else "none")]
    return "\n".join(lines) + "\n"


def drive(args):
    check = Check(args)
    workdir = tempfile.mkdtemp(prefix="keras_vit-device-check-")
    check.say(f"device check ({check.results['mode']}), backends {', '.join(args.backends)}, "
              f"phases {', '.join(args.phases)}, budget {args.budget:.0f} s; writing to {check.out}")
    bench = None
    try:
        if phase_env(check, workdir):
            # Correctness side by side (the GPU has room for all) while the benchmark's contenders build and
            # compile; then the timings, with nothing else on the GPU.
            if "bench" in args.phases:
                bench = start_bench(check, workdir)
            threads = []
            for backend in args.backends:
                if "tests" in args.phases:
                    threads.append(threading.Thread(target=phase_tests, args=(check, backend)))
                if "finetune" in args.phases:
                    threads.append(threading.Thread(target=phase_finetune, args=(check, backend, workdir)))
                if "bf16" in args.phases:
                    threads.append(threading.Thread(target=phase_bf16, args=(check, backend)))
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            if bench:
                phase_bench(check, *bench)  # stops its processes, whatever happens
                bench = None
    except Exception as error:  # a bug of the driver itself: still one line, and what was measured is kept
        check.record("driver", {}, [f"{type(error).__name__}: {error}"])
        import traceback

        traceback.print_exc(file=check.log)
    finally:
        for process in (bench[0].values() if bench else ()):
            process.stop()
        shutil.rmtree(workdir, ignore_errors=True)
        check.results["total_seconds"] = round(time.monotonic() - check.started, 1)
        with check.lock:
            check._write()
    problems = check.results["problems"]
    check.say(f"wrote {os.path.join(check.out, 'device-check.json')} and device-check.md, device-check.log")
    if problems:
        print(f"device_check: FAILED ({len(problems)} problem(s)); first: {problems[0]}", flush=True)
        return 1
    print(f"device_check: all checks passed in {check.results['total_seconds']:.0f} s", flush=True)
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu-smoke", action="store_true", help="tiny sizes on the CPU: checks the script itself")
    parser.add_argument("--backends", default="torch,jax", help="comma-separated, of torch and jax")
    parser.add_argument("--phases", default="tests,bf16,finetune,bench", help="comma-separated phases to run")
    parser.add_argument("--budget", type=float, default=None,
                        help="seconds for everything (default: 460 on the GPU, 840 for the CPU smoke)")
    parser.add_argument("--output-dir", default=None, help="default: $OUT, else benchmarks/results")
    parser.add_argument("--check-wheels", metavar="DIR", help="only check a wheels folder for the GPU machine")
    parser.add_argument("--requirements", default=os.path.join(ROOT, "requirements", "device.txt"))
    # The workers' own options.
    parser.add_argument("--worker", choices=tuple(WORKERS), help=argparse.SUPPRESS)
    parser.add_argument("--contender", choices=CONTENDERS, help=argparse.SUPPRESS)
    parser.add_argument("--variant", default="ViT-B/16", help=argparse.SUPPRESS)
    parser.add_argument("--image-size", type=int, default=224, help=argparse.SUPPRESS)
    parser.add_argument("--forward-batch", type=int, default=256, help=argparse.SUPPRESS)
    parser.add_argument("--train-batch", type=int, default=128, help=argparse.SUPPRESS)
    parser.add_argument("--warmup", type=int, default=3, help=argparse.SUPPRESS)
    parser.add_argument("--repeats", type=int, default=5, help=argparse.SUPPRESS)
    parser.add_argument("--dump-dir", help=argparse.SUPPRESS)
    parser.add_argument("--layers", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--preset", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    parser.add_argument("--second-result", help=argparse.SUPPRESS)
    parser.add_argument("--bf16-image-size", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.check_wheels:
        problems = check_wheels(args.check_wheels, args.requirements)
        for problem in problems:
            print(f"device-wheels: {problem}", file=sys.stderr)
        return 1 if problems else 0
    if args.worker:
        return WORKERS[args.worker](args) or 0
    args.backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    args.phases = [p.strip() for p in args.phases.split(",") if p.strip()]
    for backend in args.backends:
        if backend not in ("torch", "jax"):
            parser.error(f"--backends takes torch and jax (the GPU machine has no TensorFlow). Received: {backend}")
    for phase in args.phases:
        if phase not in ("tests", "bf16", "finetune", "bench"):
            parser.error(f"--phases takes tests, bf16, finetune, bench. Received: {phase}")
    if args.budget is None:
        args.budget = 840.0 if args.cpu_smoke else 460.0
    if not args.cpu_smoke:
        problem = _no_gpu()
        if problem:
            print(f"device_check: no GPU here ({problem}); run it on the GPU machine, or pass --cpu-smoke",
                  file=sys.stderr)
            return 3
    return drive(args)


def _no_gpu():
    """Why there is no GPU to check, or None. Asks nvidia-smi: importing a framework would take seconds."""
    if not shutil.which("nvidia-smi"):
        return "nvidia-smi is not installed"
    try:
        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        return "nvidia-smi -L did not answer in 30 s"
    if listed.returncode != 0 or "GPU" not in listed.stdout:
        return f"nvidia-smi -L lists no GPU: {(listed.stdout + listed.stderr).strip()[:120]}"
    return None


if __name__ == "__main__":
    sys.exit(main())
