"""The fused Triton kernels without a GPU.

* Correctness: ``tests/triton_interp_cases.py`` runs in subprocesses with ``TRITON_INTERPRET=1`` (set before
  Triton decorates the kernels; a subprocess keeps it out of every other test module under xdist), in shards so
  that xdist workers share them.
* Compilation: every kernel compiles to PTX and a cubin for sm_90 (the real code generator, no interpreter),
  which catches what the interpreter forgives (non-constexpr globals, unsupported layouts, register spills).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CASES = Path(__file__).with_name("triton_interp_cases.py")

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")

SHARDS = {
    "fp32-factorized": "fp32 and factorized",
    "fp32-axial": "fp32 and axial",
    "half-and-edges": "half or far or validated or tiled",
    "ops-compile-dispatch": "opcheck or compile or dispatch or flop",
}


def _run(args: list[str], env_extra: dict[str, str], timeout: int) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "SSOG_BACKEND")}
    env.update(env_extra)
    env["TRITON_DEFAULT_FP_FUSION"] = "1"  # the current default, stated to silence Triton 3.9's warning
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


@pytest.mark.parametrize("shard", list(SHARDS))
def test_kernels_under_interpreter(shard: str) -> None:
    proc = _run(
        ["-m", "pytest", str(CASES), "-q", "-p", "no:cacheprovider", "-k", SHARDS[shard]],
        {"TRITON_INTERPRET": "1"},
        timeout=900,
    )
    assert proc.returncode == 0, f"interpreter cases failed:\n{proc.stdout[-6000:]}\n{proc.stderr[-3000:]}"
    assert " passed" in proc.stdout and " skipped" not in proc.stdout.splitlines()[-1], proc.stdout[-2000:]


@pytest.mark.parametrize("mode", ["factorized", "axial"])
def test_kernels_compile_for_sm90(mode: str) -> None:
    proc = _run(
        ["-m", "ssog_core.ops.triton_compile", "--arch", "90", "--grid", "7", "5", "--atoms", "3", "--head-dim",
         "24", "--dtype", "bfloat16", "--mode", mode],
        {},
        timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, f"compile-only check failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    rows = {}
    for line in proc.stdout.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if line.startswith("| ") and cells[2].isdigit():
            rows[cells[0]] = dict(zip(("mma", "wgmma", "regs", "stack", "spill", "shared", "sass", "ex2"),
                                      map(int, cells[2:10]), strict=True))  # fmt: skip
    assert set(rows) == {"fwd-steered", "fwd-fixed", "inv_zx", "bwd-rows", "bwd-cols"}, proc.stdout
    for name, row in rows.items():
        if mode == "factorized":  # the axial kernels still spill (docs/KERNELS.md)
            assert row["spill"] == 0 and row["stack"] == 0, f"{name} spills registers:\n{proc.stdout}"
        assert (row["mma"] > 0) == (name != "inv_zx"), f"{name}: tensor-core use unexpected:\n{proc.stdout}"
        assert (row["ex2"] > 0) == (name != "fwd-fixed"), f"{name}: exp2 use unexpected:\n{proc.stdout}"
