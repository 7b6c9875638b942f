"""The installed ``mvc`` command, run as a real subprocess, end to end."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch


def _mvc_command() -> list:
    script = Path(sys.executable).with_name("mvc")
    found = str(script) if script.exists() else shutil.which("mvc")
    if not found:
        pytest.fail("the mvc console script is not installed; run pip install -e .")
    return [found]


def run(cwd, *args, code=0, command=None):
    proc = subprocess.run((command or _mvc_command()) + [str(a) for a in args], cwd=cwd,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == code, (args, proc.stdout, proc.stderr)
    return proc


def test_installed_command_round_trip(tmp_path):
    run(tmp_path, "init", "--chunk-size", "256")
    weights = {"layer.weight": torch.randn(32, 32), "layer.bias": torch.randn(32)}
    torch.save(weights, tmp_path / "ckpt.pt")
    out = run(tmp_path, "commit", "ckpt.pt", "-m", "step one", "--step", "1", "--metric", "loss=1.25").stdout
    assert "step one" in out
    first_bias = weights["layer.bias"].clone()
    weights["layer.bias"] += 1
    torch.save(weights, tmp_path / "ckpt.pt")
    run(tmp_path, "commit", "ckpt.pt", "-m", "step two", "--step", "2")
    log = json.loads(run(tmp_path, "log", "--json").stdout)
    assert [c["step"] for c in log] == [2, 1]
    run(tmp_path, "checkout", "HEAD~1", "-o", "back.safetensors")
    from safetensors.torch import load_file
    back = load_file(str(tmp_path / "back.safetensors"))
    assert torch.equal(back["layer.weight"], weights["layer.weight"])
    assert torch.equal(back["layer.bias"], first_bias)
    # piped output: no progress bar escape codes, plain lines
    assert "\x1b" not in out and "\r" not in out


def test_errors_are_one_line_without_traceback(tmp_path):
    proc = run(tmp_path, "log", code=1)
    assert proc.stderr.startswith("mvc: error: not an mvc repository")
    assert "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1
    run(tmp_path, "init")
    proc = run(tmp_path, "show", "deadbeef", code=1)
    assert "unknown revision" in proc.stderr and "Traceback" not in proc.stderr
    run(tmp_path, "no-such-command", code=2)


def test_python_dash_m(tmp_path):
    out = run(tmp_path, "--version", command=[sys.executable, "-m", "mvc"]).stdout
    assert "mvc" in out


def test_hooks_package_imports_after_install(tmp_path):
    proc = subprocess.run([sys.executable, "-c", "import mvc_hooks, mvc; print('ok')"], cwd=tmp_path,
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": ""})
    assert proc.stdout.strip() == "ok", proc.stderr


def test_cli_starts_without_torch(tmp_path):
    # log, show, status, fsck ... read only metadata: importing torch would
    # cost them over a second of start-up each
    code = "import sys, mvc.cli; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], cwd=tmp_path).returncode == 0


def test_wheel_carries_both_packages(tmp_path):
    root = Path(__file__).resolve().parents[1]
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                            str(root), "-w", str(tmp_path / "wheel")], capture_output=True, text=True)
    if build.returncode != 0:
        pytest.fail(f"building the wheel failed: {build.stderr[-500:]}")
    import zipfile
    (wheel,) = (tmp_path / "wheel").glob("mvc_checkpoints-*.whl")
    zipfile.ZipFile(wheel).extractall(tmp_path / "site")
    code = "import mvc, mvc_hooks, mvc.cli; print(mvc_hooks.__file__)"
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(tmp_path / "site")})
    assert proc.returncode == 0, proc.stderr
    assert Path(proc.stdout.strip()).is_relative_to(tmp_path / "site")
    assert "mvc = mvc.cli:main" in next((tmp_path / "site").glob("*.dist-info/entry_points.txt")).read_text()
    # every module of the source tree is in the wheel (a subpackage missing from pyproject would not be)
    sources = {p.relative_to(root).as_posix() for p in (root / "mvc").rglob("*.py")}
    sources |= {"mvc_hooks/" + p.relative_to(root / "hooks").as_posix() for p in (root / "hooks").rglob("*.py")}
    shipped = set(zipfile.ZipFile(wheel).namelist())
    assert sources <= shipped, sorted(sources - shipped)
