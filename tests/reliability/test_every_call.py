"""Promise: at a kill, an ENOSPC or an EACCES at any file-system call of any writer, the old output or the
new one is whole, a rerun writes the new one, nothing not ours changes and nothing is left that blocks the
next save (tests/reliability/fault_harness.py counts the calls and runs the cases).

CI runs the harness's fixed sample (`CI_PLAN`) once, in one driver process; each (writer, mode, property)
is a test over the sample's cases. `make test-writers` runs every writer at every call in the three modes.
A case known to fail is `xfail(strict=True)`: the test turns red when the writer is fixed, to be unmarked.
"""

import json
import os
import subprocess
import sys

import pytest

from tests.reliability import fault_harness

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
one_backend = pytest.mark.one_backend("the writers' file logic; the harness drives its own torch process")

# What the harness finds on main, by (writer, mode, property): each a defect of the writer to fix (none known).
KNOWN = {}


@pytest.fixture(scope="module")
def sample(tmp_path_factory):
    """The harness's CI sample, run once in a driver of its own (a torch process it forks for each case)."""
    out = tmp_path_factory.mktemp("harness") / "results.json"
    env = {**os.environ, "KERAS_BACKEND": "torch", "PYTHONPATH": ROOT, "TF_CPP_MIN_LOG_LEVEL": "3"}
    env.pop("PYTEST_XDIST_WORKER", None)
    driver = subprocess.run([sys.executable, "-m", "tests.reliability.fault_harness", "--plan", "ci", "--json",
                             str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert driver.returncode == 0 and out.exists(), driver.stdout[-3000:] + driver.stderr[-3000:]
    with open(out) as file:
        return json.load(file)


def _params():
    for writer, modes in fault_harness.CI_PLAN.items():
        if writer.startswith("broken-"):
            continue
        for mode in modes:
            for prop in fault_harness.PROPERTIES:
                if prop == "clear_error" and mode == "kill":
                    continue
                reason = KNOWN.get((writer, mode, prop))
                marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
                yield pytest.param(writer, mode, prop, marks=marks, id=f"{writer}-{mode}-{prop}")


def _failures(result, mode, prop):
    return [f"call {case['at']} ({case['call']}): {case['verdict'][prop]}"
            for case in result["cases"] if case["mode"] == mode and case["verdict"][prop]]


@one_backend
@pytest.mark.slow
@pytest.mark.parametrize("writer,mode,prop", list(_params()))
def test_every_counted_call_holds(sample, writer, mode, prop):
    result = sample[writer]
    cases = [case for case in result["cases"] if case["mode"] == mode]
    assert cases, f"the sample ran no {mode} case of {writer} ({len(result['calls'])} calls counted)"
    failures = _failures(result, mode, prop)
    assert not failures, f"{writer}, {mode}, {prop}: {len(failures)} of {len(cases)} cases:\n" + "\n".join(failures[:8])


@one_backend
@pytest.mark.slow
def test_the_harness_counts_the_writers_calls(sample):
    # A preset's save makes its staging directory, writes and fsyncs each file, and swaps it in: if the
    # counter missed a kind of call, the kill cases would never land on it.
    calls = [call.split()[0] for call in sample["preset"]["calls"]]
    for kind in ("mkdir", "open", "write", "fsync", "replace", "exchange", "h5py.File", "rmdir"):
        assert kind in calls, f"no {kind} counted in a preset's save: {sorted(set(calls))}"
    assert "rename" in [call.split()[0] for call in sample["preset-no-exchange"]["calls"]]


@one_backend
@pytest.mark.slow
def test_a_kill_between_the_fallbacks_renames_is_sampled_and_named_by_the_next_load(sample):
    # The window the fallback cannot close (no directory at the path): CI kills at each rename and exchange,
    # and the one case that needs the `mv` the next load names to be whole is counted apart, not hidden.
    cases = sample["preset-no-exchange"]["cases"]
    renames = [case["at"] for case in cases if case["mode"] == "kill" and case["call"].startswith("rename")]
    assert len(renames) >= 2, f"the sample did not kill at the fallback's renames: {renames}"
    assert [case["at"] for case in cases if case["whole_after_load"]] == [max(renames)]


@one_backend
@pytest.mark.slow
@pytest.mark.parametrize("writer", ["broken-in-place", "broken-remove-then-rename"])
def test_the_harness_fails_on_a_writer_known_to_be_wrong(sample, writer):
    # Keras writing the .keras zip at its final name, and a writer that removes the old file before renaming
    # the new one in: a kill between leaves part of a file, or none. The harness must see it.
    broken = [case for case in sample[writer]["cases"] if case["verdict"]["whole"]]
    assert broken, f"the harness passed {writer}: {sample[writer]['cases']}"


@one_backend
def test_a_run_of_writes_to_one_file_is_cut_to_its_first_second_and_last():
    calls = ["mkdir d", "open f", "write f", "write f", "write f", "write f", "fsync", "write g", "replace f"]
    assert fault_harness.distinct_calls(calls) == [1, 2, 3, 4, 6, 7, 8, 9]
    assert fault_harness.distinct_calls(calls, all_writes=True) == list(range(1, 10))
    assert fault_harness.choose_calls(calls, every=3, offset=1) == [2, 6, 9]
