import os
import shutil
import tempfile

# The JAX pass shares one XLA compilation cache between its tests, its 2 workers and the JAX processes
# they start: a function compiled once (the same model's train step in another test, another process of
# a job, the rerun after a kill) is read back instead of compiled again, the very program XLA made the
# first time. Set before Keras imports JAX; an empty directory per run, removed when it ends.
# KERAS_VIT_TEST_JAX_CACHE=0 turns it off.
_OWN_JAX_CACHE = None
if os.environ.get("KERAS_BACKEND") == "jax" and os.environ.get("KERAS_VIT_TEST_JAX_CACHE") != "0" \
        and not os.environ.get("JAX_COMPILATION_CACHE_DIR"):
    _OWN_JAX_CACHE = tempfile.mkdtemp(prefix="keras_vit-tests-xla-cache-")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _OWN_JAX_CACHE
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"  # the default (1 s) would skip most
    os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "0"

# The JAX pass compiles hundreds of small programs (each test's model, its train, predict and evaluate
# steps), and XLA's CPU compiler spent most of the pass optimising them: LLVM's optimisation passes and the
# fusion emitters' pipeline cost far more than the few milliseconds each tiny step then runs. These two flags
# (the JAX pass only, never a user's) cut a tiny ViT's fit + predict + evaluate compile from ~6.8 to ~2.2 CPU
# seconds, tests/models/test_model_contract.py from 164 to 72 and the whole jax pass from 2,008 CPU seconds
# to 1,016 (docs/testing.md, "How long it takes"); a ViT-B forward runs ~1.7 times slower,
# and its outputs differ from the default build's by ~2e-7 (float rounding; no tolerance was changed).
# The processes the tests start take them from KERAS_VIT_TEST_XLA_FLAGS (tests/distribution/jobs.py), since
# they drop the test's own XLA_FLAGS. KERAS_VIT_TEST_FAST_XLA=0 turns them off.
TEST_XLA_FLAGS = "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false"
if os.environ.get("KERAS_BACKEND") == "jax" and os.environ.get("KERAS_VIT_TEST_FAST_XLA") != "0" \
        and "KERAS_VIT_TEST_XLA_FLAGS" not in os.environ:
    os.environ["KERAS_VIT_TEST_XLA_FLAGS"] = TEST_XLA_FLAGS
    os.environ["XLA_FLAGS"] = " ".join([TEST_XLA_FLAGS, os.environ.get("XLA_FLAGS", "")]).strip()

# Under pytest-xdist the cores are shared between the workers: each worker's OpenMP pool (PyTorch's CPU
# operations, oneDNN, BLAS) gets its share instead of every core. Two pools of every core spin against
# each other: PyTorch tests beside another worker ran up to 10 times slower. Set before Keras imports them.
if os.environ.get("PYTEST_XDIST_WORKER") and "OMP_NUM_THREADS" not in os.environ:
    _workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    os.environ["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // _workers))

import keras  # noqa: E402
import pytest  # noqa: E402

from tests import module_durations  # noqa: E402

# `make test` runs the suite once per backend. A test whose subject does not depend on the backend
# (argument parsing, file-system checks, numpy-only readers, the docs' text, packaging) carries
# `@pytest.mark.one_backend("<why, in one phrase>")` and runs in one pass only, the least loaded.
ONE_BACKEND = "torch"


def pytest_report_header(config):
    return f"keras {keras.__version__}, KERAS_BACKEND={keras.backend.backend()}"


def pytest_collection_modifyitems(config, items):
    _check_and_apply_one_backend(items)
    _longest_modules_first(items)


def _longest_modules_first(items):
    # `-n 2 --dist loadscope` hands a module whole to the next free worker, in the order collected here. In
    # xdist's default order (most tests first) the long jobs with few tests (the differential configurations,
    # the multi-process jobs) came last, one worker running them for minutes while the other sat idle. The
    # longest first (last time's seconds, tests/module_durations.py) leaves short modules for the end. Only
    # the order changes; a module's tests stay together and in their own order (the sort is stable).
    seconds = module_durations.read(keras.backend.backend())
    first_seen = {}
    for index, item in enumerate(items):
        first_seen.setdefault(item.nodeid.split("::", 1)[0], index)

    def order(item):
        module = item.nodeid.split("::", 1)[0]
        if module in seconds:
            return (0, -seconds[module], first_seen[module])
        return (1, 0.0, first_seen[module])  # not timed yet (a new module): after the timed ones

    items.sort(key=order)


def _check_and_apply_one_backend(items):
    for item in items:
        marker = item.get_closest_marker("one_backend")
        if marker is None:
            continue
        if len(marker.args) != 1 or not isinstance(marker.args[0], str) or not marker.args[0].strip():
            raise pytest.UsageError(f"{item.nodeid}: one_backend needs the reason the subject is backend-independent")
        if keras.backend.backend() != ONE_BACKEND:
            item.add_marker(pytest.mark.skip(
                reason=f"backend-independent {marker.args[0]}; the {ONE_BACKEND} pass runs it"))


def pytest_unconfigure(config):
    if _OWN_JAX_CACHE:
        shutil.rmtree(_OWN_JAX_CACHE, ignore_errors=True)


@pytest.fixture(autouse=True)
def _fresh_keras_state():
    """Each test starts from float32 and a clean name scope."""
    keras.config.set_dtype_policy("float32")
    yield
    keras.config.set_dtype_policy("float32")
    keras.utils.clear_session(free_memory=False)  # a full gc per test costs seconds with three frameworks loaded


backend = keras.backend.backend()
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
