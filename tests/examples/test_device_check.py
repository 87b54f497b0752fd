"""The GPU check (`benchmarks/device_check.sh`): its CPU smoke, its refusal without a GPU, its wheels check.

The check itself runs on a borrowed GPU machine, rarely; the smoke runs the
same script here with tiny sizes on the CPU, so a change that breaks it shows
in `make test` and not in the one GPU run of a session.
"""

import importlib.util
import json
import os
import stat
import subprocess
import sys
import zipfile

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SCRIPT = os.path.join(ROOT, "benchmarks", "device_check.sh")


def load_device_check():
    spec = importlib.util.spec_from_file_location("device_check", os.path.join(ROOT, "benchmarks", "device_check.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
@pytest.mark.one_backend("the smoke sets KERAS_BACKEND=torch in processes of its own")
def test_cpu_smoke_runs_every_phase_and_writes_its_results(tmp_path):
    out = tmp_path / "out"
    env = {key: value for key, value in os.environ.items() if not key.startswith("PYTEST_")}
    env.update(PYTHON=sys.executable, OUT=str(out))
    completed = subprocess.run(["bash", SCRIPT, "--cpu-smoke", "--backends", "torch"], cwd=ROOT, env=env,
                               capture_output=True, text=True, timeout=900)
    output = completed.stdout + completed.stderr
    assert completed.returncode == 0, output[-4000:]
    assert completed.stdout.strip().splitlines()[-1].startswith("device_check: all checks passed"), output[-2000:]
    with open(out / "device-check.json") as f:
        results = json.load(f)
    assert results["mode"] == "cpu-smoke" and results["problems"] == []
    phases = results["phases"]
    assert set(phases) == {"env", "tests[torch]", "bf16[torch]", "finetune[torch]", "bench"}
    assert phases["env"]["probe"]["torch"]["tiny_backbone"].endswith("tiny-torch.keras")  # the probe wrote it
    assert phases["tests[torch]"]["counts"].get("passed") == 1
    assert phases["bf16[torch]"]["mixed_bfloat16"]["relative_error"] <= 2e-2
    losses = phases["finetune[torch]"]["losses"]
    assert losses[-1] < losses[0] and phases["finetune[torch]"]["same_top1"]
    table = phases["bench"]["table"]
    assert set(table) == {"timm", "keras-torch-eager"}  # no torch.compile in the smoke; no jax asked for
    for row in table.values():
        assert row["forward_images_per_s"] > 0 and row["train_images_per_s"] > 0
        assert any("scaled_dot_product" in name for name in row["attention_kernels"]), row["attention_kernels"]
    assert table["keras-torch-eager"]["train_ratio_to_timm"] > 0
    markdown = (out / "device-check.md").read_text()
    assert "| keras-torch-eager |" in markdown and "Problems: none" in markdown


@pytest.mark.one_backend("a shell script's refusal, before any framework is imported")
def test_without_a_gpu_it_refuses_at_once_in_one_line(tmp_path):
    # An nvidia-smi that finds no GPU, as on a machine with the tools but no driver.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed because it could not communicate with the driver'\n"
                    "exit 9\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    out = tmp_path / "out"
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", OUT=str(out), PYTHON=sys.executable)
    completed = subprocess.run(["bash", SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert completed.returncode == 3
    assert completed.stdout == ""
    lines = completed.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("device_check: no GPU here") and "--cpu-smoke" in lines[0]
    assert not out.exists()  # nothing written, nothing started


def _wheel(folder, name, version, requires=(), tag="py3-none-any"):
    path = os.path.join(folder, f"{name}-{version}-{tag}.whl")
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(
        f"Requires-Dist: {r}\n" for r in requires)
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(f"{name}-{version}.dist-info/METADATA", metadata)
    return path


@pytest.mark.one_backend("reads zip files and a requirements list")
def test_wheels_check_names_a_second_version_a_missing_requirement_and_a_wrong_pin(tmp_path, capsys):
    device_check = load_device_check()
    requirements = tmp_path / "device.txt"
    requirements.write_text("# pins\nkeras==3.15.1\nnamex==0.1.0\n")
    good = tmp_path / "good"
    good.mkdir()
    _wheel(good, "keras", "3.15.1", ["absl-py", "numpy", "namex", "optree", "ml-dtypes", 'rich; extra == "x"'])
    _wheel(good, "namex", "0.1.0")
    _wheel(good, "optree", "0.20.0", ["typing-extensions>=4.10.0", 'typing-extensions>=4.12.0; python_version >= "3.13"'],
           tag="cp312-cp312-manylinux_2_27_x86_64.manylinux_2_28_x86_64")
    assert device_check.check_wheels(str(good), str(requirements)) == []
    assert "3 wheels" in capsys.readouterr().out

    bad = tmp_path / "bad"
    bad.mkdir()
    _wheel(bad, "keras", "3.14.0", ["namex", "some-package-the-machine-lacks>=1"])
    _wheel(bad, "namex", "0.1.0")
    _wheel(bad, "namex", "0.0.9")
    _wheel(bad, "optree", "0.20.0", tag="cp311-cp311-manylinux_2_28_x86_64")
    problems = device_check.check_wheels(str(bad), str(requirements))
    assert any("two versions of namex" in p for p in problems), problems
    assert any("needs some-package-the-machine-lacks" in p for p in problems), problems
    assert any("not for CPython 3.12" in p for p in problems), problems
    assert any("pin keras==3.15.1 but the folder has 3.14.0" in p for p in problems), problems
