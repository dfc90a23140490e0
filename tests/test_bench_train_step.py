"""``benchmarks/train_step.py --trained`` at a tiny batch: the three bundled converged pointer14 models each get a
step time, the table says where they came from, and another grid is refused (the models have their own)."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "train_step.py"
pytestmark = pytest.mark.slow  # the benchmark runs in a fresh interpreter


def _run(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("SSOG_BACKEND", "TRITON_INTERPRET")}
    env["PYTHONPATH"] = str(ROOT)
    cmd = [sys.executable, str(SCRIPT), *args]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)


def test_trained_models_are_measured_at_their_grid(tmp_path: Path) -> None:
    proc = _run("--trained", "--rounds", "2", "--batch", "2", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (row,) = csv.DictReader((tmp_path / "train_step_cpu_1thread_trained.csv").open())
    assert row["grid"] == "14×14" and all(float(row[f"{v}_ms"]) > 0 for v in ("steered", "fixed", "dot"))
    assert "bundled converged pointer14 models" in (tmp_path / "train_step_cpu_1thread_trained.md").read_text()


def test_trained_refuses_another_grid(tmp_path: Path) -> None:
    proc = _run("--trained", "--grid", "20", "--out", str(tmp_path))
    assert proc.returncode == 2 and "14×14" in proc.stderr
    assert not list(tmp_path.iterdir())
