"""Promise: every error a user can cause on the command line is one or a few lines in one style,
`keras-vit <command>: error: <message>`, exit 2 for usage and 1 for failures, no traceback unless
`--debug` / KERAS_VIT_DEBUG=1; outputs are checked before any work and never overwrite the source."""

import os
import struct
import subprocess
import sys
import zlib

import numpy as np
import pytest

from keras_vit import cli
from keras_vit.commands import UsageError
from tests.convert.helpers import fixture_path
from tests.reliability.helpers import tiny_classifier

SOURCE = fixture_path("cls_token", "model.safetensors")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _png_chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def huge_png(path, width=20_000, height=20_000):
    """A few-hundred-byte PNG whose header declares width x height pixels (a decompression bomb)."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    idat = zlib.compress(b"\x00" * 1000)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", ihdr) + _png_chunk(b"IDAT", idat)
                     + _png_chunk(b"IEND", b""))
    return path


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    from PIL import Image

    directory = tmp_path_factory.mktemp("cli")
    tiny_classifier().save(directory / "tiny.keras")
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 255, (40, 30, 3), dtype=np.uint8)).save(directory / "photo.png")
    data = (directory / "photo.png").read_bytes()
    (directory / "truncated.png").write_bytes(data[: len(data) // 2])
    (directory / "notes.png").write_text("this is a text file, not a picture\n")
    (directory / "empty.jpg").write_bytes(b"")
    huge_png(directory / "bomb.png")
    (directory / "folder.png").mkdir()
    return directory


def run_cli(argv, capsys):
    code = cli.main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def assert_error_style(command, code, err, expected_code, phrase):
    assert code == expected_code, err
    assert err.startswith(f"keras-vit {command}: error: "), err
    assert phrase in err, err
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) <= 8, err


def test_predict_prints_top_classes(files, capsys):
    code, out, err = run_cli(["predict", files / "photo.png", "--preset", files / "tiny.keras", "--top", "2"], capsys)
    assert code == 0, err
    assert out.count("class ") == 2


PREDICT_CASES = [
    ("--top 0", ["photo.png", "--top", "0"], 2, "--top must be a positive integer"),
    ("--top -3", ["photo.png", "--top", "-3"], 2, "--top must be a positive integer"),
    ("--max-pixels 0", ["photo.png", "--max-pixels", "0"], 2, "--max-pixels must be a positive integer"),
    ("missing image", ["nowhere.png"], 2, "no such image file: "),
    ("text file as image", ["notes.png"], 1, "looks like a text file"),
    ("0-byte image", ["empty.jpg"], 1, "empty (0 bytes)"),
    ("decompression bomb", ["bomb.png"], 1, "20000 x 20000 = 400,000,000 pixels"),
    ("image over a lowered limit", ["photo.png", "--max-pixels", "100"], 1, "over the limit of 100"),
    ("truncated image", ["truncated.png"], 1, "truncated or corrupt"),
    ("directory as image", ["folder.png"], 1, "is a directory"),
]


@pytest.mark.parametrize("case", PREDICT_CASES, ids=[c[0] for c in PREDICT_CASES])
def test_predict_errors(files, capsys, case):
    _, argv, expected, phrase = case
    argv = [files / a if a.endswith((".png", ".jpg")) else a for a in argv]
    code, _, err = run_cli(["predict", *argv, "--preset", files / "tiny.keras"], capsys)
    assert_error_style("predict", code, err, expected, phrase)


@pytest.mark.parametrize("cut", ["half", "empty"])
def test_predict_truncated_keras_model(tmp_path, files, capsys, cut):
    data = (files / "tiny.keras").read_bytes()
    (tmp_path / "cut.keras").write_bytes(data[: len(data) // 2] if cut == "half" else b"")
    code, _, err = run_cli(["predict", files / "photo.png", "--preset", tmp_path / "cut.keras"], capsys)
    assert_error_style("predict", code, err, 1, "cut.keras")
    assert "File not found" not in err


def test_predict_truncated_preset_weights(tmp_path, files, capsys):
    import keras

    from keras_vit.presets import save_to_preset

    save_to_preset(keras.saving.load_model(files / "tiny.keras"), tmp_path / "preset")
    weights = tmp_path / "preset" / "model.weights.h5"
    weights.write_bytes(weights.read_bytes()[:1000])
    code, _, err = run_cli(["predict", files / "photo.png", "--preset", tmp_path / "preset"], capsys)
    assert_error_style("predict", code, err, 1, "model.weights.h5 is truncated or damaged")


@pytest.fixture()
def no_work(monkeypatch):
    """Fails the test if a conversion starts loading: output checks must come first."""
    import keras_vit.convert

    def refuse(*args, **kwargs):
        raise AssertionError("the checkpoint was loaded before the output path was checked")

    monkeypatch.setattr(keras_vit.convert, "load_checkpoint", refuse)


def test_convert_to_itself_is_refused(tmp_path, capsys, no_work):
    source = tmp_path / "model.safetensors"
    source.write_bytes(open(SOURCE, "rb").read())
    before = source.read_bytes()
    (tmp_path / "link.safetensors").symlink_to(source)
    (tmp_path / "sub").mkdir()
    spellings = [source, f"{tmp_path}/./model.safetensors", tmp_path / "sub" / ".." / "model.safetensors",
                 tmp_path / "link.safetensors"]
    for destination in spellings:
        code, _, err = run_cli(["convert", source, destination, "--no-head"], capsys)
        assert_error_style("convert", code, err, 2, "would replace or mix with what the command reads")
    # Into the directory that holds the source, as a Hugging Face directory (would write model.safetensors).
    code, _, err = run_cli(["convert", source, tmp_path, "--to", "huggingface"], capsys)
    assert_error_style("convert", code, err, 2, "would replace or mix with what the command reads")
    assert source.read_bytes() == before


def test_convert_hub_directory_into_itself(tmp_path, capsys, no_work):
    import shutil

    shutil.copytree(fixture_path("cls_token"), tmp_path / "hub")
    code, _, err = run_cli(["convert", tmp_path / "hub", tmp_path / "hub", "--to", "huggingface"], capsys)
    assert_error_style("convert", code, err, 2, "is the source")


CONVERT_CASES = [
    ("destination is a directory", ["{tmp}"], "--to", "keras", 2, "is a directory"),
    ("destination directory missing", ["{tmp}/missing/x.keras"], None, None, 2, "does not exist"),
    ("unknown output format", ["{tmp}/x.onnx"], None, None, 2, "Cannot tell the output format"),
    ("bad --image-size", ["{tmp}/x.keras", "--image-size", "big"], None, None, 2, "--image-size must be N or HxW"),
    ("zero --image-size", ["{tmp}/x.keras", "--image-size", "0x224"], None, None, 2, "positive sizes"),
    ("--num-heads 0", ["{tmp}/x.keras", "--num-heads", "0"], None, None, 2, "--num-heads must be a positive integer"),
    ("huggingface into a file", ["{tmp}/file.txt"], "--to", "huggingface", 2, "is not a directory"),
]


@pytest.mark.parametrize("case", CONVERT_CASES, ids=[c[0] for c in CONVERT_CASES])
def test_convert_output_checked_before_work(tmp_path, capsys, no_work, case):
    _, argv, flag, value, expected, phrase = case
    (tmp_path / "file.txt").write_text("keep me")
    argv = [a.format(tmp=tmp_path) for a in argv] + ([flag, value] if flag else [])
    code, _, err = run_cli(["convert", SOURCE, *argv], capsys)
    assert_error_style("convert", code, err, expected, phrase)
    assert (tmp_path / "file.txt").read_text() == "keep me"


def test_convert_missing_source(tmp_path, capsys):
    code, _, err = run_cli(["convert", tmp_path / "none.safetensors", tmp_path / "x.keras"], capsys)
    assert_error_style("convert", code, err, 2, "no such checkpoint")


def test_convert_failure_keeps_the_old_output(tmp_path, capsys, monkeypatch):
    """A conversion that fails while writing leaves the previous output intact and no temporary files."""
    import keras

    destination = tmp_path / "model.keras"
    destination.write_bytes(b"previous version")

    def broken_save(self, *args, **kwargs):
        with open(args[0], "wb") as handle:
            handle.write(b"half a zip")
        raise OSError(28, "No space left on device", str(args[0]))

    monkeypatch.setattr(keras.Model, "save", broken_save)
    code, _, err = run_cli(["convert", SOURCE, destination], capsys)
    assert_error_style("convert", code, err, 1, "No space left on device")
    assert destination.read_bytes() == b"previous version"
    assert sorted(os.listdir(tmp_path)) == ["model.keras"]


def test_presets_contradictory_filters(capsys):
    code, _, err = run_cli(["presets", "--with-head", "--backbones"], capsys)
    assert_error_style("presets", code, err, 2, "exclude each other")


def test_argparse_errors_share_the_style(capsys):
    # A value refused while parsing, and argparse's own refusals (an unknown choice, a missing argument).
    code, _, err = run_cli(["predict", "photo.png", "--top", "many", "--preset", "x"], capsys)
    assert_error_style("predict", code, err, 2, "--top must be a positive integer. Received: --top many")
    code, _, err = run_cli(["export", "m.keras", "--format", "tflite", "--out", "x"], capsys)
    assert_error_style("export", code, err, 2, "argument --format: invalid choice: 'tflite'")
    code, _, err = run_cli(["predict", "photo.png"], capsys)
    assert_error_style("predict", code, err, 2, "the following arguments are required: --preset")


def test_debug_shows_the_traceback(capsys, monkeypatch):
    code, _, err = run_cli(["presets", "--with-head", "--backbones", "--debug"], capsys)
    assert code == 2 and "Traceback" in err and err.rstrip().splitlines()[-1].startswith("keras-vit presets: error:")
    monkeypatch.setenv("KERAS_VIT_DEBUG", "1")
    code, _, err = run_cli(["presets", "--with-head", "--backbones"], capsys)
    assert code == 2 and "Traceback" in err


def test_unexpected_errors_say_how_to_see_more(capsys, monkeypatch):
    import keras_vit.commands.presets as presets

    def crash(args):
        raise RuntimeError("boom")

    monkeypatch.setattr(presets, "run", crash)
    code, _, err = run_cli(["presets"], capsys)
    assert code == 1 and "RuntimeError: boom" in err and "--debug" in err and "Traceback" not in err


def test_usage_error_is_a_value_error():
    assert issubclass(UsageError, ValueError)


# --- backend choice, --version and --help without a backend ---


@pytest.mark.parametrize(
    "environ, installed, configured, expected",
    [
        ({}, {"jax", "torch", "tensorflow"}, None, "jax"),
        ({}, {"torch", "tensorflow"}, None, "torch"),
        ({}, {"tensorflow"}, None, "tensorflow"),
        ({}, {"jax", "torch"}, "torch", "torch"),  # a backend the user set in keras.json
        ({}, {"jax"}, "torch", "jax"),  # ... unless it is not installed
    ],
)
def test_backend_auto_pick(environ, installed, configured, expected):
    environ = dict(environ)
    note = cli.choose_backend(environ, installed=lambda b: b in installed, configured=lambda: configured)
    assert environ["KERAS_BACKEND"] == expected and f"using the {expected} backend" in note


def test_backend_errors():
    with pytest.raises(ValueError, match="No Keras backend is installed"):
        cli.choose_backend({}, installed=lambda b: False, configured=lambda: None)
    with pytest.raises(ValueError, match="KERAS_BACKEND=jax but jax is not installed.*torch"):
        cli.choose_backend({"KERAS_BACKEND": "jax"}, installed=lambda b: b == "torch", configured=lambda: None)
    environ = {"KERAS_BACKEND": "torch"}
    assert cli.choose_backend(environ, installed=lambda b: True, configured=lambda: None) is None


def _python(code, env=None):
    environ = {k: v for k, v in os.environ.items() if k != "KERAS_BACKEND"}
    environ.update(env or {}, PYTHONPATH=ROOT)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=environ, timeout=300)


@pytest.mark.one_backend("the child runs without KERAS_BACKEND: the same process whatever the pass's backend")
def test_help_and_version_import_no_backend():
    code = (
        "import sys\n"
        "for argv in (['--help'], ['--version'], ['convert', '--help']):\n"
        "    sys.argv = ['keras-vit', *argv]\n"
        "    import keras_vit.cli\n"
        "    try:\n"
        "        keras_vit.cli.main(argv)\n"
        "    except SystemExit as exit:\n"
        "        assert exit.code == 0, exit.code\n"
        "print('IMPORTED', sorted(m for m in ('keras', 'jax', 'torch', 'tensorflow') if m in sys.modules))\n"
    )
    done = _python(code)
    assert done.returncode == 0, done.stderr
    assert "IMPORTED []" in done.stdout
    import keras_vit

    assert f"keras-vit {keras_vit.__version__}" in done.stdout


@pytest.mark.one_backend("the child runs without KERAS_BACKEND: the same process whatever the pass's backend")
def test_command_line_without_keras_backend_picks_one():
    done = subprocess.run([sys.executable, "-m", "keras_vit", "presets", "--backbones"], capture_output=True,
                          text=True, timeout=300, cwd=ROOT,
                          env={**{k: v for k, v in os.environ.items() if k != "KERAS_BACKEND"}, "PYTHONPATH": ROOT})
    assert done.returncode == 0, done.stderr
    assert "keras-vit: using the " in done.stderr and "presets." in done.stdout


def test_predict_rescales_for_a_model_built_for_unit_pixels(tmp_path, files, capsys):
    """A model whose preprocessing expects [0, 1] pixels gets the file's [0, 255] pixels rescaled, not silently
    fed out of range."""
    tiny_classifier(pixel_scale=1.0).save(tmp_path / "unit.keras")
    code, out, err = run_cli(["predict", files / "photo.png", "--preset", tmp_path / "unit.keras"], capsys)
    assert code == 0, err
    assert "expects pixels in [0, 1]; rescaling" in err and "class " in out


def test_convert_a_keras_model_to_timm(tmp_path, files, capsys):
    import keras

    from keras_vit.convert import load_checkpoint

    code, _, err = run_cli(["convert", files / "tiny.keras", tmp_path / "tiny.safetensors"], capsys)
    assert code == 0, err
    original = keras.saving.load_model(files / "tiny.keras")
    images = np.random.default_rng(1).uniform(0, 255, (2, 8, 8, 3)).astype("float32")
    converted = load_checkpoint(tmp_path / "tiny.safetensors", activation="softmax")
    np.testing.assert_allclose(keras.ops.convert_to_numpy(converted(images)),
                               keras.ops.convert_to_numpy(original(images)), atol=1e-5)
