"""Which backend starts when the user has not said, and what TensorFlow may print in the command line.

`import keras_vit` on an install without TensorFlow (Keras' default) and with nothing configured picks an
installed backend, as the command line does, and says which on stderr; a configured choice is never
overridden. The command line hides TensorFlow's C++ start-up lines unless the user set
TF_CPP_MIN_LOG_LEVEL.
"""

import importlib.util
import io
import json
import os
import subprocess
import sys

import keras
import pytest

from keras_vit import backend_choice, cli
from tests.convert.helpers import fixture_path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# In the child: TensorFlow looks uninstalled. A None entry in sys.modules makes `import tensorflow` raise
# ModuleNotFoundError and `importlib.util.find_spec("tensorflow")` return None, as on a torch-only install.
WITHOUT_TENSORFLOW = "import sys; sys.modules['tensorflow'] = None\n"


def _installed(name):
    return importlib.util.find_spec(name) is not None


def _python(code, tmp_path, **env):
    """`python -c code` from the repository, without KERAS_BACKEND, with an empty Keras home."""
    environ = {k: v for k, v in os.environ.items() if k not in ("KERAS_BACKEND", "KERAS_HOME")}
    environ.update(PYTHONPATH=ROOT, KERAS_HOME=str(tmp_path / "keras-home"), **env)
    (tmp_path / "keras-home").mkdir(exist_ok=True)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=environ, cwd=tmp_path,
                          timeout=600)


# === The rule, with stand-ins for what is installed and configured ===


def _choose(environ, installed=(), configured=None, modules=(), argv=("script.py",)):
    stderr = io.StringIO()
    chosen = backend_choice.choose_backend_on_import(
        environ, installed=lambda name: name in installed, configured=lambda: configured, modules=set(modules),
        argv=list(argv), stderr=stderr)
    return chosen, stderr.getvalue()


@pytest.mark.parametrize("installed, expected", [
    ({"torch"}, "torch"),
    ({"jax", "torch"}, "jax"),
    ({"jax"}, "jax"),
])
@pytest.mark.one_backend("the backend rule with stand-ins; no backend starts")
def test_without_tensorflow_and_nothing_configured_an_installed_backend_is_chosen(installed, expected):
    environ = {}
    chosen, note = _choose(environ, installed)
    assert chosen == expected and environ == {"KERAS_BACKEND": expected}
    assert f"using the {expected} backend" in note and "KERAS_BACKEND" in note


@pytest.mark.parametrize("case, environ, installed, configured, modules, argv", [
    ("KERAS_BACKEND set", {"KERAS_BACKEND": "torch"}, {"jax", "torch"}, None, (), ("script.py",)),
    ("KERAS_BACKEND set to a missing one", {"KERAS_BACKEND": "tensorflow"}, {"jax"}, None, (), ("script.py",)),
    ("keras.json names one", {}, {"jax", "torch"}, "torch", (), ("script.py",)),
    ("Keras' default is installed", {}, {"jax", "torch", "tensorflow"}, None, (), ("script.py",)),
    ("Keras already imported", {}, {"jax"}, None, ("keras",), ("script.py",)),
    ("the command line decides", {}, {"jax"}, None, (), ("/usr/bin/keras-vit",)),
])
@pytest.mark.one_backend("the backend rule with stand-ins; no backend starts")
def test_a_choice_already_made_is_never_changed(case, environ, installed, configured, modules, argv):
    before = dict(environ)
    assert _choose(environ, installed, configured, modules, argv) == (None, "")
    assert environ == before


@pytest.mark.one_backend("the backend rule with stand-ins; no backend starts")
def test_no_backend_at_all_says_what_to_install():
    with pytest.raises(ImportError, match="pip install jax"):
        _choose({}, installed=())


# === The real import, in a process where TensorFlow is not installed ===


@pytest.mark.slow  # starts Python processes that import Keras
@pytest.mark.one_backend("runs its own processes, with the backend they choose")
def test_import_keras_vit_without_tensorflow_picks_an_installed_backend(tmp_path):
    expected = next(name for name in ("jax", "torch") if _installed(name))  # the preference: jax, then torch
    done = _python(WITHOUT_TENSORFLOW + "import keras_vit, keras\nprint('BACKEND', keras.backend.backend())",
                   tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"BACKEND {expected}" in done.stdout
    assert f"keras_vit: using the {expected} backend" in done.stderr


@pytest.mark.slow  # starts Python processes that import Keras
@pytest.mark.one_backend("runs its own processes, with the backend they choose")
def test_a_configured_backend_is_kept_without_a_word(tmp_path):
    if not _installed("torch"):
        pytest.skip("needs torch, the backend configured here (jax would be chosen otherwise)")
    code = WITHOUT_TENSORFLOW + "import keras_vit, keras\nprint('BACKEND', keras.backend.backend())"
    by_variable = _python(code, tmp_path, KERAS_BACKEND="torch")
    (tmp_path / "keras-home").mkdir(exist_ok=True)
    (tmp_path / "keras-home" / "keras.json").write_text(json.dumps({"backend": "torch"}))
    by_file = _python(code, tmp_path)
    for done in (by_variable, by_file):
        assert done.returncode == 0, done.stderr[-3000:]
        assert "BACKEND torch" in done.stdout and "using the" not in done.stderr
    # Keras imported first (with its backend fixed then): keras_vit changes nothing, not even the variable.
    # This process is such a one (Keras is imported): the rule `import keras_vit` runs, with this process's
    # modules, no KERAS_BACKEND, nothing configured and TensorFlow missing, leaves the choice alone. (A child
    # that imported Keras, dropped the variable and then imported keras_vit cost a third Keras start; the
    # call from `import keras_vit` to this rule is the child's of the test above.)
    environ, stderr = {}, io.StringIO()
    assert "keras" in sys.modules
    assert backend_choice.choose_backend_on_import(
        environ, installed=lambda name: name != "tensorflow" and _installed(name), configured=lambda: None,
        modules=sys.modules, argv=["script.py"], stderr=stderr) is None
    assert environ == {} and stderr.getvalue() == ""


# === TensorFlow's start-up lines in the command line ===


@pytest.mark.parametrize("line, chatter", [
    (b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n", True),
    (b"I0000 00:00:1795643830.098469    8857 cudart_stub.cc:31] Could not find cuda drivers on your machine, "
     b"GPU will not be used.\n", True),
    (b"E0000 00:00:1795643960.815666    9873 cuda_platform.cc:52] failed call to cuInit: INTERNAL: CUDA error: "
     b"Failed call to cuInit: UNKNOWN ERROR (303)\n", True),
    (b"2025-09-17 14:44:05.157831: I external/local_xla/xla/tsl/cuda/cudart_stub.cc:32] Could not find cuda "
     b"drivers on your machine, GPU will not be used.\n", True),
    (b"W0000 00:00:1758131045.228000 3722035 computation_placer.cc:177] computation placer already registered.\n",
     True),
    # A fatal record is the last thing a dying process says: it stays.
    (b"F0000 00:00:1795643960.815666    9873 cpu_feature_guard.cc:40] The TensorFlow library was compiled to use "
     b"AVX instructions, but these aren't available on your machine.\n", False),
    (b"keras-vit convert: error: no such checkpoint: x\n", False),
    (b"/site-packages/keras/src/x.py:12: UserWarning: something the user should read\n", False),
    (b"Image 0000 00:00:12 123 file.cc:1] looks like a record but is not one\n", False),
])
@pytest.mark.one_backend("text matching, no backend")
def test_what_counts_as_start_up_chatter(line, chatter):
    assert cli.is_start_up_chatter(line) is chatter


@pytest.mark.one_backend("environment handling, no backend")
def test_the_users_log_level_and_debug_are_left_alone():
    environ = {}
    assert cli.quiet_tensorflow_logs(environ) is True and environ == {"TF_CPP_MIN_LOG_LEVEL": "3"}
    environ = {"TF_CPP_MIN_LOG_LEVEL": "0"}
    assert cli.quiet_tensorflow_logs(environ) is False and environ == {"TF_CPP_MIN_LOG_LEVEL": "0"}
    environ = {}
    assert cli.quiet_tensorflow_logs(environ, debug=True) is False and environ == {}


@pytest.mark.slow  # starts the command line in a process
@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="TensorFlow's own start-up lines")
def test_a_tensorflow_command_prints_no_cuda_or_absl_lines(tmp_path):
    """Before: "Could not find cuda drivers" twice, absl's banner twice, cpu_feature_guard, and "failed call to
    cuInit: CUDA error" on a machine without a GPU. The conversion builds a model, so TensorFlow starts a device."""
    environ = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    environ.update(PYTHONPATH=ROOT, KERAS_BACKEND="tensorflow")
    done = subprocess.run([sys.executable, "-m", "keras_vit", "convert", fixture_path("cls_token"),
                           str(tmp_path / "m.keras")], capture_output=True, text=True, env=environ, timeout=600)
    assert done.returncode == 0, done.stderr
    assert "Wrote " in done.stdout
    for noise in ("cuInit", "cudart_stub", "absl::InitializeLog", "cpu_feature_guard"):
        assert noise not in done.stderr, done.stderr
    # Errors still come through, in the one style.
    missing = subprocess.run([sys.executable, "-m", "keras_vit", "convert", str(tmp_path / "none.safetensors"),
                              str(tmp_path / "x.keras")], capture_output=True, text=True, env=environ, timeout=600)
    assert missing.returncode == 2 and missing.stderr.startswith("keras-vit convert: error: no such checkpoint")
