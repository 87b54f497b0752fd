import os

import keras
import pytest

# `make test` runs the suite once per backend. A test whose subject does not depend on the backend
# (argument parsing, file-system checks, numpy-only readers, the docs' text, packaging) carries
# `@pytest.mark.one_backend("<why, in one phrase>")` and runs in one pass only, the least loaded.
ONE_BACKEND = "torch"


def pytest_report_header(config):
    return f"keras {keras.__version__}, KERAS_BACKEND={keras.backend.backend()}"


def pytest_collection_modifyitems(config, items):
    for item in items:
        marker = item.get_closest_marker("one_backend")
        if marker is None:
            continue
        if len(marker.args) != 1 or not isinstance(marker.args[0], str) or not marker.args[0].strip():
            raise pytest.UsageError(f"{item.nodeid}: one_backend needs the reason the subject is backend-independent")
        if keras.backend.backend() != ONE_BACKEND:
            item.add_marker(pytest.mark.skip(
                reason=f"backend-independent {marker.args[0]}; the {ONE_BACKEND} pass runs it"))


@pytest.fixture(autouse=True)
def _fresh_keras_state():
    """Each test starts from float32 and a clean name scope."""
    keras.config.set_dtype_policy("float32")
    yield
    keras.config.set_dtype_policy("float32")
    keras.utils.clear_session(free_memory=False)  # a full gc per test costs seconds with three frameworks loaded


backend = keras.backend.backend()
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
