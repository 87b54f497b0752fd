"""keras_vit's imports flow one way: no cycles, lower layers never import higher ones.

Only module-level imports count: imports inside functions are the sanctioned
way for a lower layer to reach a higher one lazily (`from_preset` imports
`keras_vit.presets` when it is called). The graph is read with `ast`, so no
module is imported to check it.
"""

import ast
import os

import keras_vit

ROOT = os.path.dirname(os.path.abspath(keras_vit.__file__))
# Lower first: a package may import module-level only from packages left of it.
ORDER = ("utils", "layers", "models", "convert", "presets", "commands")


def _module_name(path):
    relative = os.path.relpath(path, os.path.dirname(ROOT))[: -len(".py")].replace(os.sep, ".")
    return relative[: -len(".__init__")] if relative.endswith(".__init__") else relative


def module_level_imports():
    """`{module: set of keras_vit modules it imports at module level}`."""
    graph = {}
    for directory, _, files in os.walk(ROOT):
        for name in files:
            if not name.endswith(".py"):
                continue
            path = os.path.join(directory, name)
            module = _module_name(path)
            package = module if name == "__init__.py" else module.rsplit(".", 1)[0]
            with open(path, encoding="utf-8") as file:
                tree = ast.parse(file.read(), path)
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
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


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
        source = _subpackage(module)
        if source not in ORDER:
            continue
        for target in targets:
            destination = _subpackage(target)
            if destination in ORDER and ORDER.index(destination) > ORDER.index(source):
                wrong.append(f"{module} imports {target}")
    assert not wrong, "imports against the layering " + " < ".join(ORDER) + ":\n" + "\n".join(sorted(wrong))


def test_the_checker_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
