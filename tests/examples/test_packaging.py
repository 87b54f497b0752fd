"""What a user installs: the distribution's name, license and files, as `python -m build` makes them."""

import email.parser
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile

import pytest

pytestmark = pytest.mark.one_backend("packaging: the distribution's name, metadata and files")

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
# Where users meet install lines: error messages in the package, the README, docs and examples.
HINT_PLACES = ("keras_vit", "docs", "examples", "README.md")
# A bare `keras-vit` (or keras_vit / keras.vit: the index treats them as one name) after `pip install`.
OLD_NAME = re.compile(r"(?<![\w.-])keras[-_.]vit(?![\w-])(?!/)")


def project_table():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as file:
        return tomllib.load(file)["project"]


def hint_files():
    for place in HINT_PLACES:
        path = os.path.join(ROOT, place)
        if os.path.isfile(path):
            yield path
        for folder, _, names in os.walk(path):
            for name in names:
                if name.endswith((".py", ".md", ".ipynb")):
                    yield os.path.join(folder, name)


def test_install_lines_name_the_distribution():
    name = project_table()["name"]
    assert name != "keras-vit", "keras-vit on the package index is another project"
    found, wrong = 0, []
    for path in hint_files():
        with open(path, encoding="utf-8") as file:
            text = file.read()
        for line in re.findall(r"pip install[^\n]*", text):
            if "vit" not in line.replace("keras_vit.", ""):
                continue
            found += name in line
            if OLD_NAME.search(line.replace(name, "")):
                wrong.append(f"{os.path.relpath(path, ROOT)}: {line.strip()}")
    assert not wrong, f"install lines that name another project instead of {name}:\n" + "\n".join(wrong)
    assert found >= 3  # the README, the notebook and the error messages say it


def _source_copy(destination):
    """The project as a fresh clone has it (no virtualenvs, build output or caches)."""
    ignore = shutil.ignore_patterns(".git", ".venv*", "build", "dist", "*.egg-info", "__pycache__",
                                    ".pytest_cache", ".ipynb_checkpoints")
    shutil.copytree(ROOT, destination, ignore=ignore)
    return destination


@pytest.mark.slow  # builds an sdist and a wheel from it (~10 s)
def test_wheel_and_sdist_build_and_pass_twine_check(tmp_path):
    pytest.importorskip("build")
    pytest.importorskip("twine")
    project = project_table()
    source = _source_copy(tmp_path / "src")
    out = tmp_path / "dist"
    # --no-isolation: the test environment's setuptools, no download (pyproject asks for >= 77).
    subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(source)],
                   check=True, capture_output=True, text=True)
    wheels, sdists = sorted(out.glob("*.whl")), sorted(out.glob("*.tar.gz"))
    assert len(wheels) == 1 and len(sdists) == 1
    import keras_vit

    assert project["dynamic"] == ["version"]  # read from keras_vit.__version__, the one source
    stem = f"{project['name'].replace('-', '_')}-{keras_vit.__version__}"
    assert wheels[0].name == f"{stem}-py3-none-any.whl" and sdists[0].name == f"{stem}.tar.gz"

    check = subprocess.run([sys.executable, "-m", "twine", "check", "--strict", str(wheels[0]), str(sdists[0])],
                           capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr

    with zipfile.ZipFile(wheels[0]) as wheel:
        names = wheel.namelist()
        info = f"{stem}.dist-info"
        metadata = email.parser.Parser().parsestr(wheel.read(f"{info}/METADATA").decode())
        license_text = wheel.read(f"{info}/licenses/LICENSE").decode()
        entry_points = wheel.read(f"{info}/entry_points.txt").decode()

    # The package and its metadata, nothing else: no tests, benchmarks, scripts or examples.
    assert {name.split("/")[0] for name in names} == {"keras_vit", info}
    package = sorted(
        os.path.relpath(os.path.join(folder, name), ROOT).replace(os.sep, "/")
        for folder, _, files in os.walk(os.path.join(ROOT, "keras_vit")) for name in files
        if name.endswith(".py") or name == "imagenet_classes.txt"
    )
    assert sorted(n for n in names if n.startswith("keras_vit/")) == package

    assert metadata["Name"] == project["name"]
    assert metadata["Version"] == keras_vit.__version__
    assert metadata["License-Expression"] == "Apache-2.0"
    assert metadata["License-File"] == "LICENSE"
    assert not [c for c in metadata.get_all("Classifier") if c.startswith("License ::")]  # PEP 639: the expression only
    assert metadata["Requires-Python"] == project["requires-python"]
    assert "jax" in metadata.get_all("Provides-Extra")
    assert "Apache License" in license_text and "Version 2.0, January 2004" in license_text
    with open(os.path.join(ROOT, "LICENSE"), encoding="utf-8") as file:
        assert license_text == file.read()
    assert re.search(r"^keras-vit = keras_vit\.cli:main$", entry_points, re.M)
    # The long description is the README, rendered by the index as Markdown.
    assert metadata["Description-Content-Type"] == "text/markdown"
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as file:
        assert metadata.get_payload().strip() == file.read().strip()

    # The source archive is the whole project, so its tests run from it.
    with tarfile.open(sdists[0]) as sdist:
        members = {name.split("/", 1)[1] for name in sdist.getnames() if "/" in name}
    assert {"LICENSE", "README.md", "pyproject.toml", "Makefile", "requirements/constraints.txt",
            "examples/colab_presets.ipynb", "tests/examples/test_packaging.py",
            "keras_vit/presets/imagenet_classes.txt"} <= members
    assert not [m for m in members if "__pycache__" in m or m.endswith(".pyc")]
