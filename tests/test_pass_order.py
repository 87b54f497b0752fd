"""The order a pass hands its modules to the workers in: last time's longest first (tests/conftest.py)."""

import types

import pytest

from tests import conftest, module_durations

pytestmark = pytest.mark.one_backend("the order of collected test ids, plain Python")


def test_durations_output_is_summed_by_module():
    lines = [
        "============================= slowest durations =============================",
        "12.50s call     tests/a/test_x.py::test_one[case::with colons]",
        "2.00s setup    tests/a/test_x.py::test_one[case::with colons]",
        "0.50s teardown tests/b/test_y.py::TestClass::test_two",
        "(4193 durations < 0.005s hidden.  Use -vv to show these durations.)",
    ]
    assert module_durations.seconds_by_module(lines) == {"tests/a/test_x.py": 14.5, "tests/b/test_y.py": 0.5}


def test_longest_modules_go_first_and_keep_their_tests_together_in_order(monkeypatch):
    monkeypatch.setattr(module_durations, "read", lambda backend: {"short.py": 1.0, "long.py": 50.0})
    ids = ["new.py::a", "short.py::a", "long.py::a", "short.py::b", "long.py::b", "other_new.py::a", "new.py::b"]
    items = [types.SimpleNamespace(nodeid=nodeid) for nodeid in ids]
    conftest._longest_modules_first(items)
    # Timed modules longest first; modules not timed yet after them, in the order they were collected.
    assert [item.nodeid for item in items] == [
        "long.py::a", "long.py::b", "short.py::a", "short.py::b", "new.py::a", "new.py::b", "other_new.py::a"]
