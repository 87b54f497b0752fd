"""keras_vit's imports flow one way: no cycles, lower layers never import higher ones, and no
dependency hides inside a function.

The graph is read with `ast`, so no module is imported to check it. An import at module level
(with those under a module-level `if` or `try`) runs when its module is imported and is an edge of
the graph: it must flow from a lower layer to a higher one. An import of a keras_vit module inside
a function body runs later, when the function is called, and is invisible to that graph; each one
is therefore reported unless a listed reason covers it (`IMPORTS_INSIDE_FUNCTIONS` below).
"""

import ast
import os

import pytest

import keras_vit
from tests.package_source import ROOT, package_modules

pytestmark = pytest.mark.one_backend("reads the package's source with ast, imports nothing")

# Lower first: a module may import at module level only from its own level or
# the levels left of it (peers on one level do not import each other). Every subpackage and top-level module has a level;
# `test_every_module_has_a_level` keeps it that way. data, inspection and
# distribution are peers (none builds on another).
LEVELS = (
    ("integrations", "backend_choice"),  # backend_choice: the standard library only, run before Keras
    ("utils",),
    ("writer",),  # the one writer: every package above may write through it
    ("layers",),
    ("models",),
    ("convert",),
    ("presets",),
    ("data", "inspection", "distribution"),
    ("workflows",),
    ("commands",),
    ("cli",),
    ("__main__", None),  # None: the package's own __init__
)
LEVEL = {name: index for index, names in enumerate(LEVELS) for name in names}


def _module_name(path):
    relative = os.path.relpath(path, os.path.dirname(ROOT))[: -len(".py")].replace(os.sep, ".")
    return relative[: -len(".__init__")] if relative.endswith(".__init__") else relative


def _imports(tree):
    """`(import statement, name of the function it sits in or None)` for every import of `tree`."""

    def visit(node, function):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                yield child, function
            is_function = isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            yield from visit(child, child.name if is_function else function)

    return visit(tree, None)


def _named(node, package):
    """The dotted names one import statement brings in: modules, and for `from`, `module.name` too."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        parts = package.split(".")[: len(package.split(".")) - node.level + 1]
        base = ".".join(parts + ([base] if base else []))
    return [base] + [f"{base}.{alias.name}" for alias in node.names]


def _package(path, module):
    return module if os.path.basename(path) == "__init__.py" else module.rsplit(".", 1)[0]


def module_level_imports():
    """`{module: set of keras_vit modules it imports at module level}`."""
    graph = {}
    for path, _, tree in package_modules():
        module = _module_name(path)
        targets = set()
        for node, function in _imports(tree):
            if function is None:  # module level (a module-level `if` or `try` too), not function bodies
                targets.update(_named(node, _package(path, module)))
        graph[module] = {t for t in targets if t.startswith("keras_vit")}
    modules = set(graph)
    # Keep only names that are modules (drop imported functions and classes).
    return {m: {t for t in targets if t in modules and t != m} for m, targets in graph.items()}


def _subpackage(module):
    """`keras_vit.models.base` -> `models`; `keras_vit.cli` -> `cli`; `keras_vit` -> None."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def test_every_module_has_a_level():
    unplaced = sorted(m for m in module_level_imports() if _subpackage(m) not in LEVEL)
    assert not unplaced, f"modules outside LEVELS (give their package a level): {unplaced}"


def find_cycle(graph):
    """A list of modules forming a cycle, or None."""
    state = {}

    def visit(node, stack):
        state[node] = "open"
        stack.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == "open":
                return stack[stack.index(target):] + [target]
            if target not in state:
                cycle = visit(target, stack)
                if cycle:
                    return cycle
        stack.pop()
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node, [])
            if cycle:
                return cycle
    return None


def test_module_level_imports_have_no_cycle():
    # A package's __init__ importing its own submodules is not a cycle of concern;
    # drop edges from a package to its children, keep everything else.
    graph = {m: {t for t in targets if not t.startswith(m + ".")} for m, targets in module_level_imports().items()}
    assert find_cycle(graph) is None, f"import cycle: {' -> '.join(find_cycle(graph))}"


def test_imports_flow_from_lower_to_higher_layers():
    wrong = []
    for module, targets in module_level_imports().items():
        source = LEVEL[_subpackage(module)]
        for target in targets:
            destination = LEVEL[_subpackage(target)]
            peer = destination == source and _subpackage(target) != _subpackage(module)
            if destination > source or peer:
                wrong.append(f"{module} imports {target}")
    order = " < ".join("/".join(str(name) for name in names) for names in LEVELS)
    assert not wrong, f"imports against the layering {order}:\n" + "\n".join(sorted(wrong))


def test_the_checker_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


# === Imports inside functions ===
#
# An import of a keras_vit module inside a function body is reported unless one of these covers it.

# (a) Lazy command loading, a rule by module: `keras-vit --help` and the parser must not import Keras
# or a backend (seconds, and the backend is chosen from the command line first), so the command
# line and each command import the library inside `run` and the helpers it calls.
LAZY_COMMAND_LOADING = ("keras_vit.cli", "keras_vit.commands")

# (b) The models' preset facade: `from_preset` / `save_to_preset` on a model class are thin
# facades over `presets`, a higher layer (which builds the models it reads).
PRESET_FACADE = {
    ("keras_vit.models.base", "keras_vit.presets"): "`from_preset` / `save_to_preset` call `presets`",
}

# (c) A real import cycle: the target imports the module back at module level (the test checks
# that it still does, and names the cycle if not listed).
IMPORT_CYCLES = {
    ("keras_vit.presets.hub", "keras_vit"):
        "the download's user agent names `keras_vit.__version__`; the package's `__init__` imports `presets`",
    ("keras_vit.presets.keras_vit_format", "keras_vit"):
        "a preset's metadata records `keras_vit.__version__`; the package's `__init__` imports `presets`",
    ("keras_vit.workflows.agreement", "keras_vit"):
        "a job's processes compare `keras_vit.__version__`; the package's `__init__` imports `workflows`",
}

IMPORTS_INSIDE_FUNCTIONS = {
    **{pair: f"(b) preset facade: {why}" for pair, why in PRESET_FACADE.items()},
    **{pair: f"(c) import cycle: {why}" for pair, why in IMPORT_CYCLES.items()},
}


def imports_inside_functions(sources):
    """`[(module, target module, line, function)]` for the keras_vit imports in function bodies.

    Args:
        sources: iterable of `(path, module name, parsed tree)`; `path` tells a package's
            `__init__.py` (for relative imports).
    """
    sources = list(sources)
    modules = {module for _, module, _ in sources}
    found = []
    for path, module, tree in sources:
        for node, function in _imports(tree):
            if function is None:
                continue
            named = [name for name in _named(node, _package(path, module)) if name.startswith("keras_vit")]
            # `from keras_vit import presets` imports the module `keras_vit.presets`; `from
            # keras_vit.data.images import resize_images` the module `keras_vit.data.images`.
            targets = {name for name in named[1:] if name in modules} if isinstance(node, ast.ImportFrom) else set()
            if isinstance(node, ast.Import) or not targets and named:
                targets = set(named[:1]) if isinstance(node, ast.ImportFrom) else set(named)
            found += [(module, target, node.lineno, function) for target in sorted(targets)]
    return found


def _reaches(graph, start, goal):
    """A path of module-level imports from `start` to `goal`, or None."""
    paths, seen = [[start]], {start}
    while paths:
        path = paths.pop(0)
        if path[-1] == goal:
            return path
        for target in sorted(graph.get(path[-1], ())):
            if target not in seen:
                seen.add(target)
                paths.append(path + [target])
    return None


def unexplained_imports(found, graph, listed=None, cycles=None, lazy=LAZY_COMMAND_LOADING):
    """Problems with the imports inside functions: unlisted ones, stale entries, cycles that are not.

    Args:
        found: the result of `imports_inside_functions`.
        graph: the module-level graph, `module_level_imports()`.
        listed: `{(module, target): reason}`. Defaults to `IMPORTS_INSIDE_FUNCTIONS`.
        cycles: the listed pairs whose reason is a cycle. Defaults to `IMPORT_CYCLES`.
        lazy: module names (and their packages) whose imports inside functions load commands lazily.
    """
    listed = IMPORTS_INSIDE_FUNCTIONS if listed is None else listed
    cycles = IMPORT_CYCLES if cycles is None else cycles
    problems = []
    pairs = set()
    for module, target, line, function in found:
        if any(module == name or module.startswith(name + ".") for name in lazy):
            continue
        pairs.add((module, target))
        if (module, target) not in listed:
            cycle = _reaches(graph, target, module)
            why = f" (a module-level import would close the cycle {' -> '.join(cycle + [target])})" if cycle else ""
            problems.append(f"{module}:{line} imports {target} inside `{function}` with no listed reason{why}")
    problems += [f"listed but gone: {module} imports {target}" for module, target in sorted(set(listed) - pairs)]
    for module, target in sorted(set(cycles) & pairs):
        if _reaches(graph, target, module) is None:
            problems.append(f"{module} -> {target} is listed as a cycle, but {target} no longer imports {module} "
                            "at module level: move the import to module level")
    return problems


def _package_sources():
    return [(path, _module_name(path), tree) for path, _, tree in package_modules()]


def upward_imports_inside_functions(found, facade=PRESET_FACADE, lazy=LAZY_COMMAND_LOADING):
    """The imports inside functions that reach a higher layer, other than the models' preset facade.

    A lower layer that needs a higher one inside a function is a cycle in disguise (issue 50: `convert`
    reaching up into `presets`, which imports `convert`): invert it instead. The commands' lazy loading
    and the package's own `__init__` (read for `keras_vit.__version__`) are not layers of this order.
    """
    upward = []
    for module, target, line, function in found:
        if any(module == name or module.startswith(name + ".") for name in lazy) or target == "keras_vit":
            continue
        if LEVEL[_subpackage(target)] > LEVEL[_subpackage(module)] and (module, target) not in facade:
            upward.append(f"{module}:{line} imports {target} inside `{function}`")
    return upward


def test_no_lower_layer_reaches_up_inside_a_function():
    upward = upward_imports_inside_functions(imports_inside_functions(_package_sources()))
    assert not upward, "imports against the layering, hidden in functions:\n" + "\n".join(upward)


def test_the_checker_finds_an_upward_import_inside_a_function():
    found = _planted("keras_vit.convert.planted", "def load(path):\n    from keras_vit.presets.load import x\n")
    assert upward_imports_inside_functions(found) == [
        "keras_vit.convert.planted:2 imports keras_vit.presets.load inside `load`"]
    # The facade and the package's version are allowed; so is a command's lazy import.
    assert upward_imports_inside_functions(_planted("keras_vit.models.base", "def f():\n    from keras_vit import presets\n"
                                                    "    import keras_vit\n")) == []
    assert upward_imports_inside_functions(_planted("keras_vit.commands.p", "def run():\n    import keras_vit.presets\n")) == []


def test_imports_inside_functions_have_a_listed_reason():
    problems = unexplained_imports(imports_inside_functions(_package_sources()), module_level_imports())
    assert not problems, (
        "imports of keras_vit inside functions: move each to module level, or list its reason "
        "(lazy command loading, the preset facade, an import cycle):\n" + "\n".join(problems))


def _planted(module, source, path="planted.py"):
    return imports_inside_functions([(path, module, ast.parse(source))])


def test_the_checker_reports_an_import_inside_a_function_with_no_reason():
    found = _planted("keras_vit.models.planted", "import numpy\n\ndef resize(x):\n"
                     "    import os\n    from keras_vit.data.images import resize_images\n    return x\n")
    assert found == [("keras_vit.models.planted", "keras_vit.data.images", 5, "resize")]
    problems = unexplained_imports(found, {}, listed={}, cycles={})
    assert problems == ["keras_vit.models.planted:5 imports keras_vit.data.images inside `resize` with no "
                        "listed reason"]
    # Listed, it passes; a method's `from keras_vit import presets` names the module it imports.
    assert unexplained_imports(found, {}, listed={found[0][:2]: "why"}, cycles={}) == []
    method = _planted("keras_vit.models.planted", "class A:\n    def f(self):\n        from keras_vit import presets\n")
    assert method == [("keras_vit.models.planted", "keras_vit", 3, "f")]


def test_the_checker_lets_commands_load_lazily_and_names_a_cycle():
    command = _planted("keras_vit.commands.planted", "def run(args):\n    from keras_vit.workflows import export\n")
    assert command and unexplained_imports(command, {}, listed={}, cycles={}) == []
    # An import that would close a cycle at module level is still reported, with the cycle named.
    found = _planted("keras_vit.presets.planted", "def f():\n    import keras_vit.models.base\n")
    graph = {"keras_vit.models.base": {"keras_vit.presets"}, "keras_vit.presets": {"keras_vit.presets.planted"}}
    assert unexplained_imports(found, graph, listed={}, cycles={}) == [
        "keras_vit.presets.planted:2 imports keras_vit.models.base inside `f` with no listed reason (a module-level "
        "import would close the cycle keras_vit.models.base -> keras_vit.presets -> keras_vit.presets.planted "
        "-> keras_vit.models.base)"]
    # A listed cycle that is no longer one, and a listed import that is gone, are reported too.
    pair = ("keras_vit.presets.planted", "keras_vit.models.base")
    assert unexplained_imports(found, {}, listed={pair: "cycle", ("a", "b"): "x"}, cycles={pair: "cycle"}) == [
        "listed but gone: a imports b",
        "keras_vit.presets.planted -> keras_vit.models.base is listed as a cycle, but keras_vit.models.base no "
        "longer imports keras_vit.presets.planted at module level: move the import to module level"]


def test_no_module_names_another_in_a_string():
    """`"module:function"` strings resolved with importlib hide a dependency from the graph above."""
    import re

    pattern = re.compile(r"^keras_vit(\.[a-z_0-9]+)+:[A-Za-z_0-9]+$")
    found = []
    for path, _, tree in package_modules():
        found += [f"{_module_name(path)}:{node.lineno} {node.value}" for node in ast.walk(tree)
                  if isinstance(node, ast.Constant) and isinstance(node.value, str) and pattern.match(node.value)]
    assert not found, "modules named by string:\n" + "\n".join(found)
