"""No function of keras_vit takes a path *or* a claim (issue 50, item 2).

A function that writes an output takes one of two things: a path, which it
claims in its first lines (`keras_vit.writer.files.claim`), or the claim a
command made at its start (a `Destination`), which it writes through. One
that takes either and branches on `isinstance(x, Destination)` hides from
its caller which checks ran when, and is the reason a claim was once made
twice. The package's source is read with `ast` (nothing is imported): the
only `isinstance(..., Destination)` left is a refusal, an `if` whose body
raises (a path given where a claim is required, as `fit_resumable` does).

On 2026-11-29's main (7e21226) it listed 6: `save_figure`,
`export_huggingface`, `export_model`, `save_to_preset`,
`save_lora_weights` and `files.save_model`.
"""

import ast

import pytest

from tests.package_source import package_modules


def _is_destination_test(node):
    """`isinstance(x, Destination)` or `isinstance(x, files.Destination)`."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "isinstance"
            and len(node.args) == 2):
        return False
    kind = node.args[1]
    return (isinstance(kind, ast.Name) and kind.id == "Destination") or (
        isinstance(kind, ast.Attribute) and kind.attr == "Destination")


def _refusal(statement):
    """An `if` whose only effect is to raise: it refuses one of the two, it does not take both."""
    return (isinstance(statement, ast.If) and not statement.orelse and len(statement.body) == 1
            and isinstance(statement.body[0], ast.Raise))


def path_or_claim_branches(tree, module):
    """`module:line function` of each `isinstance(..., Destination)` that is not a refusal."""
    found = []

    def visit(node, function, statement):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            function = node.name
        if isinstance(node, ast.stmt):
            statement = node
        if _is_destination_test(node) and not (_refusal(statement) and _inside(node, statement.test)):
            found.append(f"{module}:{node.lineno} {function}")
        for child in ast.iter_child_nodes(node):
            visit(child, function, statement)

    visit(tree, "<module>", None)
    return found


def _inside(node, tree):
    return any(child is node for child in ast.walk(tree))


@pytest.mark.one_backend("reads the package's source")
def test_no_function_takes_a_path_or_a_claim():
    found = [place for _, module, tree in package_modules() for place in path_or_claim_branches(tree, module)]
    assert not found, (
        "These functions take a path or a claim and branch on which: give the public function a path only (it "
        "claims it first) and write through a function that takes the claim only, which a command that claimed "
        "its output at its start calls.\n" + "\n".join(found))


@pytest.mark.one_backend("reads the package's source")
def test_the_scan_tells_a_branch_from_a_refusal():
    source = '''
def both(model, path):
    destination = path if isinstance(path, Destination) else claim(path, FILE)
    destination.save(model)

def also_both(model, directory):
    if not isinstance(directory, files.Destination):
        directory = claim(directory, "preset")
    write(model, directory)

def refuses(run):
    if run is not None and not isinstance(run, files.Destination):
        raise ValueError("`run` is the run directory's claim")
'''
    assert path_or_claim_branches(ast.parse(source), "m.py") == ["m.py:3 both", "m.py:7 also_both"]


def second_guessed_saves(tree, module):
    """`module:line` of each `save_for_job(write, claim)` whose `write` claims a path or asks which claim it got.

    The job's engine alone decides who writes (`save_for_job`): it hands `write` the claim to write through
    (the caller's, or its discarded twin in scratch). A `write` that compares what it got (`target is
    destination`, `target != path`) or claims what it got (`claim(target, ...)`) decides again.
    """
    functions = {node.name: node for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef,
                                                                                ast.AsyncFunctionDef))}
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "save_for_job" and node.args):
            continue
        write = node.args[0]
        body = functions.get(write.id) if isinstance(write, ast.Name) else write
        if body is None:
            continue
        given = {argument.arg for argument in body.args.args}  # the name of the claim `write` is handed
        for inner in ast.walk(body):
            if isinstance(inner, ast.Compare):
                used = [inner.left, *inner.comparators]
            elif isinstance(inner, ast.Call) and getattr(inner.func, "id", getattr(inner.func, "attr", None)) == "claim":
                used = inner.args
            else:
                continue
            if any(isinstance(name, ast.Name) and name.id in given for name in used):
                found.append(f"{module}:{node.lineno}")
                break
    return found


@pytest.mark.one_backend("reads the package's source")
def test_who_writes_in_a_job_is_decided_by_the_engine_alone():
    # main (7ed6047): finetuning.py's output and best/ saves, training.write_model and the epoch backup each
    # asked which claim `save_for_job` had handed them and claimed the scratch path themselves.
    found = [place for _, module, tree in package_modules() for place in second_guessed_saves(tree, module)]
    assert not found, ("These saves decide again who writes: write through the claim `save_for_job` hands "
                       "`write`, whichever it is.\n" + "\n".join(found))


@pytest.mark.one_backend("reads the package's source")
def test_the_scan_finds_a_write_that_decides_again():
    source = '''
def f(model, destination):
    engine.save_for_job(lambda target: write(model, destination if target is destination else claim(target)),
                        destination)

def g(model, run):
    def write(target):
        if target != run.path:
            return
        run.save()
    engine.save_for_job(write, run)

def h(model, destination):
    engine.save_for_job(lambda claimed: write(model, claimed), destination)
'''
    assert second_guessed_saves(ast.parse(source), "m.py") == ["m.py:3", "m.py:11"]
