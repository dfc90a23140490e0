"""``benchmarks/attention.py`` at a tiny size: every CPU backend gets its row (the C kernels included), a backend
that cannot run a field kind is left out with the dispatcher's reason, and an unknown path is refused."""

from __future__ import annotations

import csv
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "attention.py"
pytestmark = pytest.mark.slow  # each test starts the benchmark in a fresh interpreter


def _run(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("SSOG_BACKEND", "RBF_BACKEND", "TRITON_INTERPRET")}
    env["PYTHONPATH"] = str(ROOT)  # this checkout's ssog_core
    cmd = [sys.executable, str(SCRIPT), *args]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)


def test_every_cpu_backend_is_measured(tmp_path: Path) -> None:
    proc = _run("--tokens", "16", "--heads", "2", "--head-dim", "8", "--repeats", "1", "--threads", "1",
                "--out", str(tmp_path), "--tag", "tiny")  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = list(csv.DictReader((tmp_path / "attention_tiny.csv").open()))
    measured = {(r["path"], r["kind"]) for r in rows}
    expected = {("sdpa", "sdpa"), ("torch", "rbf")}
    expected |= {(p, k) for p in ("definition", "torch") for k in ("steered", "fixed", "axial")}
    if os.environ.get("CC") or any(shutil.which(cc) for cc in ("cc", "gcc", "clang")):  # the C kernels build
        expected.add(("cpu", "steered"))
        (cpu,) = (r for r in rows if r["path"] == "cpu")
        assert float(cpu["scratch_mb"]) > 0
    assert measured == expected
    table = (tmp_path / "attention_tiny.md").read_text()
    assert "cpu / fixed: " in table and "cpu / axial: " in table  # left out, with the reason
    assert (tmp_path / "attention_tiny.png").exists()


def test_an_unknown_path_is_refused(tmp_path: Path) -> None:
    proc = _run("--paths", "torch", "reference-einsum", "--out", str(tmp_path))
    assert proc.returncode == 2
    assert "invalid choice: 'reference-einsum'" in proc.stderr
    assert not list(tmp_path.iterdir())
