"""Seconds each test module took in each backend's pass, for the order the passes hand modules out in.

`make test` runs each pass in 2 workers with `--dist loadscope`: a module goes whole to the next free
worker. Handed out in collection order (or xdist's default, most tests first), a long module with few
tests (a multi-process job, the differential configurations) came last and ran for minutes while the
other worker sat idle. tests/conftest.py puts the modules of a pass in order of the seconds they took
last time, longest first (longest-processing-time-first scheduling), from tests/module_durations.json;
a module the file does not name (a new one) goes after those it names, in collection order. The file
only orders: a stale or missing entry costs time, never a result.

Refresh it from a pass's `--durations=0` output (the last full pass on the idle host is best):

    KERAS_BACKEND=jax make test-jax PYTEST_ARGS=--durations=0 | tee jax.log
    python -m tests.module_durations jax jax.log
"""

import argparse
import collections
import json
import os
import re

FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "module_durations.json")
# `--durations` lines: "12.34s call     tests/x/test_y.py::test_z[case]".
_LINE = re.compile(r"^\s*(\d+(?:\.\d+)?)s\s+(?:setup|call|teardown)\s+(\S+?\.py)::")


def read(backend):
    """`{module path: seconds}` for `backend`'s pass, from tests/module_durations.json (empty when absent)."""
    try:
        with open(FILE) as file:
            return json.load(file).get(backend, {})
    except FileNotFoundError:
        return {}


def seconds_by_module(lines):
    """The seconds of every setup, call and teardown in pytest `--durations` output, summed by module."""
    totals = collections.Counter()
    for line in lines:
        match = _LINE.match(line)
        if match:
            totals[match.group(2)] += float(match.group(1))
    return totals


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("backend", choices=("tensorflow", "jax", "torch"))
    parser.add_argument("log", help="a pass's output with --durations=0 (or --durations=N: only those tests)")
    arguments = parser.parse_args(argv)
    with open(arguments.log) as file:
        totals = seconds_by_module(file)
    if not totals:
        raise SystemExit(f"{arguments.log} has no --durations lines: run the pass with PYTEST_ARGS=--durations=0")
    try:
        with open(FILE) as file:
            table = json.load(file)
    except FileNotFoundError:
        table = {}
    table[arguments.backend] = {module: round(seconds, 1) for module, seconds in totals.most_common()}
    with open(FILE, "w") as file:
        json.dump(table, file, indent=1, sort_keys=True)
        file.write("\n")
    print(f"{FILE}: {len(totals)} modules, {sum(totals.values()):.0f} s for {arguments.backend}")


if __name__ == "__main__":
    main()
