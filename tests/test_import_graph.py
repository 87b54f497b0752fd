"""keras_vit's imports flow one way: no cycles, lower layers never import higher ones.

Only module-level imports count: imports inside functions are the sanctioned
way for a lower layer to reach a higher one lazily (`from_preset` imports
`keras_vit.presets` when it is called). The graph is read with `ast`, so no
module is imported to check it.
"""

import ast
import os

import keras_vit
from tests.package_source import ROOT, package_modules

# Lower first: a module may import at module level only from its own level or
# the levels left of it (peers on one level do not import each other). Every subpackage and top-level module has a level;
# `test_every_module_has_a_level` keeps it that way. data, inspection and
# distribution are peers (none builds on another).
LEVELS = (
    ("integrations", "backend_choice"),  # backend_choice: the standard library only, run before Keras
    ("utils",),
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


def module_level_imports():
    """`{module: set of keras_vit modules it imports at module level}`."""
    graph = {}
    for path, _, tree in package_modules():
        module = _module_name(path)
        package = module if os.path.basename(path) == "__init__.py" else module.rsplit(".", 1)[0]
        targets = set()
        for node in tree.body:  # module level only, not function bodies
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(parts + ([base] if base else []))
                targets.add(base)
                targets.update(f"{base}.{alias.name}" for alias in node.names)
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


# Imports inside functions that reach a higher layer: each a facade, named here with its reason,
# so that no dependency of a lower layer on a higher one is hidden (an importlib string is one too).
UPWARD_INSIDE_FUNCTIONS = {
    ("keras_vit.models.inputs", "keras_vit.data.images"): "a model's image transform comes from the one image path",
    ("keras_vit.convert.loader", "keras_vit.presets.load"):
        "`keras_vit.convert.load_checkpoint` is a thin facade over the one reader, `presets.load_model`",
    ("keras_vit.presets.keras_vit_format", "keras_vit.data.images"):
        "a preset records the eval transform of the one image path",
    ("keras_vit.models.base", "keras_vit"): "`from_preset` / `save_to_preset` are thin facades over `presets`",
    ("keras_vit.presets.hub", "keras_vit"): "the download's user agent names the package version",
    ("keras_vit.presets.keras_vit_format", "keras_vit"): "a preset's metadata records the package version",
    ("keras_vit.cli", "keras_vit"): "the command line prints the package version",
    ("keras_vit.utils.files", "keras_vit.distribution"):
        "the one writer asks the job, at save time, whether this process writes or only takes part in a save",
    ("keras_vit.commands.explain", "keras_vit"): "`from keras_vit import inspection`, spelled through the package",
}


def upward_imports_inside_functions():
    """`{(module, target)}` for imports in function bodies that reach a higher layer."""
    found = set()
    for path, _, tree in package_modules():
        module = _module_name(path)
        top = set(map(id, tree.body))
        for node in ast.walk(tree):
            if id(node) in top:
                continue
            targets = []
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                targets = [node.module]
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            for target in targets:
                if not target.startswith("keras_vit"):
                    continue
                target_level = LEVEL.get(_subpackage(target))
                if target_level is not None and target_level > LEVEL[_subpackage(module)]:
                    found.add((module, target))
    return found


def test_upward_imports_inside_functions_are_the_listed_facades():
    found = upward_imports_inside_functions()
    unlisted = sorted(found - set(UPWARD_INSIDE_FUNCTIONS))
    assert not unlisted, "imports of a higher layer inside functions, not listed as facades:\n" + "\n".join(
        f"{module} imports {target}" for module, target in unlisted)
    assert not set(UPWARD_INSIDE_FUNCTIONS) - found, "listed facades that no longer exist: " + str(
        sorted(set(UPWARD_INSIDE_FUNCTIONS) - found))


def test_no_module_names_another_in_a_string():
    """`"module:function"` strings resolved with importlib hide a dependency from the graph above."""
    import re

    pattern = re.compile(r"^keras_vit(\.[a-z_0-9]+)+:[A-Za-z_0-9]+$")
    found = []
    for path, _, tree in package_modules():
        found += [f"{_module_name(path)}:{node.lineno} {node.value}" for node in ast.walk(tree)
                  if isinstance(node, ast.Constant) and isinstance(node.value, str) and pattern.match(node.value)]
    assert not found, "modules named by string:\n" + "\n".join(found)
