"""The README is a short front door whose links and layout match the repository."""

import os
import re

import pytest

pytestmark = pytest.mark.one_backend("text and links of the README and docs")

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
# Written on other branches of the same release; drop a name here once its page or package has landed.


def read(path):
    with open(os.path.join(ROOT, path), encoding="utf-8") as file:
        return file.read()


def markdown_pages():
    yield "README.md"
    for name in sorted(os.listdir(os.path.join(ROOT, "docs"))):
        if name.endswith(".md"):
            yield f"docs/{name}"


def test_readme_is_short():
    assert len(read("README.md").splitlines()) <= 250


@pytest.mark.parametrize("page", list(markdown_pages()))
def test_relative_links_lead_somewhere(page):
    missing = []
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", read(page)):
        if re.match(r"^[a-z]+://", target):
            continue
        path = os.path.normpath(os.path.join(os.path.dirname(page), target)).replace(os.sep, "/")
        if not os.path.exists(os.path.join(ROOT, path)):
            missing.append(target)
    assert not missing, f"{page} links to files that do not exist: {missing}"


def test_every_docs_page_is_linked_from_the_readme():
    readme = read("README.md")
    unlinked = [page for page in markdown_pages() if page != "README.md" and f"]({page})" not in readme]
    assert not unlinked


def test_layout_matches_the_tree():
    block = re.search(r"## Layout\n\n```\n(.*?)```", read("README.md"), re.S).group(1)
    listed = set(re.findall(r"^  (\w+)/", block, re.M))
    packages = {name for name in os.listdir(os.path.join(ROOT, "keras_vit"))
                if os.path.isfile(os.path.join(ROOT, "keras_vit", name, "__init__.py"))}
    assert packages - listed == set(), "packages missing from the README's layout"
    assert listed - packages == set(), "the README's layout lists packages that do not exist"
    top = set(re.findall(r"^(\w+)/", block, re.M))
    assert top - {"keras_vit"} <= {name for name in os.listdir(ROOT) if os.path.isdir(os.path.join(ROOT, name))}
