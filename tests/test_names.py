"""A name of the package means one thing (issue 35): a public module constant is not bound to two
different values in two modules (`METADATA_FILE` was a preset's "metadata.json" in one and an
export's "export.json" in another; `TARGETS` the pre-training targets and the loader's)."""

import ast
import collections

import pytest

from tests.package_source import package_modules

pytestmark = pytest.mark.one_backend("reads the package's source with ast")


def constants_with_two_values(sources):
    """`{NAME: {value source: [files]}}` for public upper-case constants bound to different values."""
    values = collections.defaultdict(lambda: collections.defaultdict(list))
    for _, relative, tree in sources:
        for node in tree.body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                name = node.targets[0].id
                if name.isupper() and not name.startswith("_"):
                    values[name][ast.unparse(node.value)].append(relative)
    return {name: dict(by_value) for name, by_value in values.items() if len(by_value) > 1}


def test_each_public_constant_means_one_thing():
    found = constants_with_two_values(package_modules())
    assert not found, "public constants bound to different values in different modules (rename one):\n" + "\n".join(
        f"{name}: " + "; ".join(f"{value} in {', '.join(files)}" for value, files in by_value.items())
        for name, by_value in sorted(found.items()))


def test_the_check_finds_a_constant_with_two_meanings():
    sources = [(None, "a.py", ast.parse('FILE = "metadata.json"\n_PRIVATE = 1\n')),
               (None, "b.py", ast.parse('FILE = "export.json"\n_PRIVATE = 2\nSAME = 1\n')),
               (None, "c.py", ast.parse("SAME = 1\n"))]
    assert constants_with_two_values(sources) == {"FILE": {"'metadata.json'": ["a.py"], "'export.json'": ["b.py"]}}
