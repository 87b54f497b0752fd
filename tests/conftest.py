import os

import keras
import pytest


def pytest_report_header(config):
    return f"keras {keras.__version__}, KERAS_BACKEND={keras.backend.backend()}"


@pytest.fixture(autouse=True)
def _fresh_keras_state():
    """Each test starts from float32 and a clean name scope."""
    keras.config.set_dtype_policy("float32")
    yield
    keras.config.set_dtype_policy("float32")
    keras.utils.clear_session(free_memory=False)  # a full gc per test costs seconds with three frameworks loaded


backend = keras.backend.backend()
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
