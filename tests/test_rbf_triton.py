"""The fused RBF Triton kernels, checked in child processes (see tests/rbf_triton_checks.py).

TRITON_INTERPRET must be set before Triton is imported and would leak into every other test module of an
xdist worker, so each group runs in its own interpreter process with its own environment.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = [  # the kernels run under the interpreter or compile: seconds each
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed"),
]


def run_group(group: str, interpret: bool) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "RBF_BACKEND")}
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    env["TRITON_DEFAULT_FP_FUSION"] = "1"  # the current default, stated to silence Triton 3.9's warning
    proc = subprocess.run(
        [sys.executable, "-m", "tests.rbf_triton_checks", group],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, f"{group} failed:\n{proc.stdout}\n{proc.stderr[-4000:]}"
    print(proc.stdout)
    return proc.stdout


def test_kernels_fp32_forward_and_gradients_match_float64_oracle():
    out = run_group("fp32", interpret=True)
    assert out.count("ok ") == 8


def test_kernels_half_precision_within_twice_the_oracle_error():
    out = run_group("half", interpret=True)
    assert out.count("ok ") == 4


def test_custom_ops_pass_opcheck_and_torch_compile():
    out = run_group("compile", interpret=True)
    assert "ok opcheck" in out and "ok torch.compile" in out


def test_kernels_compile_for_sm90_without_spills():
    out = run_group("sm90", interpret=False)
    assert out.count("ok sm_90") == 3
