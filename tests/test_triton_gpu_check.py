"""``benchmarks/gpu_check.py`` without a GPU: its dry run (kernels under the interpreter on the CPU, every check
case's device plumbing on the ``meta`` device) and its time budget, so that the first GPU run does not fail on
the script itself."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ssog_core.testing.oracles import FieldLeaves, oracle_apply

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"

needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")


def _run(out: Path, *extra: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "SSOG_BACKEND"}
    env.update(TRITON_INTERPRET="1", TRITON_DEFAULT_FP_FUSION="1", PYTHONPATH=str(ROOT))  # this checkout's ssog_core
    cmd = [sys.executable, str(SCRIPT), "--dry-run-cpu", "--out", str(out), *extra]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)


def test_oracle_stays_on_the_device_of_its_field() -> None:
    """The float64 definition built on a non-CPU device (meta): no CPU tensor mixed in (the first GPU run's bug)."""
    leaves = FieldLeaves(1, (5, 4), 2, 3, ("mu",), device="meta")
    v = torch.empty(1, 20, 2, 4, dtype=torch.float64, device="meta")
    for mode in ("factorized", "axial"):
        assert oracle_apply(v, leaves.field(), (5, 4), mode).device.type == "meta"
        assert oracle_apply(v, FieldLeaves(1, (5, 4), 2, 3, (), device="meta").field(), (5, 4), mode).is_meta


@pytest.mark.slow
@needs_triton
def test_dry_run_checks_benchmarks_and_writes_results(tmp_path: Path) -> None:
    proc = _run(tmp_path)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-3000:]
    records = [json.loads(line) for line in (tmp_path / "gpu_check.jsonl").read_text().splitlines()]
    checks = [r for r in records if r["kind"] == "check"]
    assert checks and all(r["ok"] for r in checks)
    assert any("on meta" in r["check"] for r in checks) and any("on cpu" in r["check"] for r in checks)
    ops = {r["op"] for r in records if r["kind"] == "op"}
    assert {
        "ssog-steered op",
        "ssog-fixed op",
        "ssog-steered kernel",
        "ssog-steered kernel, full rows",
        "sdpa-math",
    } <= ops
    assert {r["model"] for r in records if r["kind"] == "model" and "error" not in r} == {"ssog", "dot"}
    assert (tmp_path / "gpu_ops_cpu.csv").exists() and (tmp_path / "gpu_model_cpu.csv").exists()
    profile = [r for r in records if r["kind"] == "profile"]  # one steered layer's own time, by operation
    assert (
        profile
        and any(r["name"] == "ssog::bwd" for r in profile)
        and 0.5 < sum(r["share"] for r in profile) <= 1 + 1e-9
    )
    assert "| `ssog::bwd` |" in (tmp_path / "gpu_profile_cpu.md").read_text()
    jobs = [r for r in records if r["kind"] == "job_on_gpu"]  # the dry run: CPU against CPU, so bit for bit
    assert len(jobs) == 4 and all(r["max_abs_diff"] == 0 and r["integers_differing"] == 0 for r in jobs)
    results = (tmp_path / "RESULTS.md").read_text()
    assert "24 of 24 checks passed" in results and "validation edits (4 images) 0.0e+00, 0" in results


@pytest.mark.slow
@needs_triton
def test_an_exhausted_budget_skips_cleanly(tmp_path: Path) -> None:
    proc = _run(tmp_path, "--budget-s", "0")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-3000:]
    text = (tmp_path / "RESULTS.md").read_text()
    assert "skipped for the time budget: check case" in text and "op bench at 16 tokens" in text


def _gpu_check_module():
    sys.path.insert(0, str(SCRIPT.parent))  # the script imports ``common`` from beside it
    try:
        spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(SCRIPT.parent))
    return module


def _stats(seed: int, layers: int = 2, heads: int = 3):
    from ssog_core.analysis.head_as_field import AtomFit, HeadFieldStats

    g = torch.Generator().manual_seed(seed)

    def r(*shape: int) -> torch.Tensor:
        return torch.rand(*shape, generator=g, dtype=torch.float64) + 0.1

    fits = [AtomFit(r(heads, 2, 2), r(heads, 2, 2), r(heads, 2), r(heads)) for _ in range(layers)]
    per_head = [r(layers, heads) for _ in range(6)]  # distance, share_fit, share_field, share_uniform, entropy, prefix
    return HeadFieldStats((7, 5), (4.0, 4.0), 1, 16, *per_head, r(layers, heads, 13, 9), fits)


def test_a_gpu_worker_is_held_to_the_tolerance_except_in_the_fitted_atoms_parameters() -> None:
    """The comparison behind the GPU check's heavy jobs: every float is held, by path, except μ, σ, λ of a fit (a
    flat objective lets them move while the fit's loss, the fields and the shares stay), which are reported."""
    gc = _gpu_check_module()
    here = _stats(0)
    same = gc.compare_results(here, _stats(0))
    assert same["max_abs_diff"] == 0 and same["fit_parameters_max_abs_diff"] == 0 and same["integers_differing"] == 0

    moved = _stats(0)
    moved.fits[1].mu[2, 1, 0] += 0.05  # a fitted centre moves: reported, not held
    row = gc.compare_results(here, moved)
    assert row["max_abs_diff"] == 0 and abs(row["fit_parameters_max_abs_diff"] - 0.05) < 1e-12

    for change, path in ((lambda s: s.fits[0].loss, ".fits[0].loss"), (lambda s: s.share_field, ".share_field")):
        worse = _stats(0)
        change(worse).view(-1)[1] += 2e-3
        row = gc.compare_results(here, worse)
        assert (
            row["where"] == path and abs(row["max_abs_diff"] - 2e-3) < 1e-12 and row["max_abs_diff"] > gc.JOB_TOLERANCE
        )

    assert gc.compare_results(here, _stats(0, heads=4)) is None  # another shape: not the same result
    assert gc.compare_results({"a": 1.0, "b": 2}, {"a": 1.0, "c": 2}) is None  # another structure
    assert gc.compare_results({"n": torch.tensor([1, 2])}, {"n": torch.tensor([1, 3])})["integers_differing"] == 1
