import json

import keras
import pytest

from tests.convert.helpers import fixture_path


@pytest.fixture(scope="session")
def manifest():
    with open(fixture_path("MANIFEST.json")) as handle:
        return json.load(handle)


@pytest.fixture(autouse=True)
def _fresh_keras_state():
    """As tests/conftest.py, without a full `gc.collect()` after every test.

    With torch, TensorFlow and transformers imported, a full collection takes
    seconds on a loaded machine, which here would cost more than the tests;
    the models these tests build are tiny.
    """
    keras.config.set_dtype_policy("float32")
    yield
    keras.config.set_dtype_policy("float32")
    keras.utils.clear_session(free_memory=False)
