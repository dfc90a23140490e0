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

pytestmark = [  # the kernels run under the interpreter or compile: seconds each
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed"),
]

SHARDS = {
    "fp32-factorized": "fp32 and factorized",
    "fp32-axial": "fp32 and axial",
    "half-and-edges": "half or far or validated or tiled",
    "ops-compile-dispatch": "opcheck or compile or dispatch or flop or padded",
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


def _compile_report(*args: str) -> tuple[str, dict[str, dict[str, dict]]]:
    """Run the compile report; rows by shape and kernel."""
    proc = _run(["-m", "ssog_core.ops.triton_compile", "--arch", "90", "--dtype", "bfloat16", *args], {}, timeout=600)
    assert proc.returncode == 0, f"compile-only check failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    rows: dict[str, dict[str, dict]] = {}
    for line in proc.stdout.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| ") and len(cells) == 13 and cells[2].isdigit():
            ratio = float(cells[10]) if cells[10] != "—" else None
            loop = float(cells[12]) if cells[12] != "—" else None
            rows.setdefault(cells[1], {})[cells[0]] = dict(
                zip(("mma", "wgmma", "regs", "stack", "spill", "shared", "sass", "ex2"), map(int, cells[2:10]),
                    strict=True), per_ex2=ratio, loop_per_ex2=loop)  # fmt: skip
    return proc.stdout, rows


KERNELS = {"fwd-steered", "fwd-fixed", "bwd-rows", "bwd-cols", "steer", "steer-bwd"}  # factorized
AXIAL_KERNELS = {"fwd-steered", "fwd-fixed", "inv_zx", "bwd-rows", "bwd-cols"}
NO_DOTS = {"inv_zx", "steer", "steer-bwd"}
# static SASS instructions per MUFU.EX2 at 14×14 and 64×64 (d64, R4, bf16), whole kernel: the kernels build their
# per-(token, atom) terms from μ, σ, log λ and τ themselves (docs/KERNELS.md §2), and reach 47.1, 64.7 and 58.0 at
# most (§4; the key loop 12.5–25.4, 17.8–23.6, 32.2–32.4): these bounds keep them there. The steered forward's 47.1
# (32.0 before) is at 14×14, where it takes half the query rows per program (triton_tiles.STEERED_HALF_ROWS: the
# same setup over half the exponentials, for two programs per SM; docs/KERNELS.md §3)
MAX_SASS_PER_EX2 = {"fwd-steered": 48.0, "bwd-rows": 66.0, "bwd-cols": 59.0}


def test_factorized_kernels_compile_for_sm90_without_spills() -> None:
    """The factorized kernels at the smallest and largest benchmark grids (32×32 is in the saved report), compiled as
    the JIT would compile them: no register spills,
    tensor cores used, shared memory within the dispatcher's estimate (the script fails otherwise), and no more
    SASS instructions per exponential than today."""
    out, rows = _compile_report("--mode", "factorized", "--grid", "14", "14", "--grid", "64", "64", "--head-dim", "64",
                                "--atoms", "4")  # fmt: skip
    assert len(rows) == 2, out
    for shape, kernels in rows.items():
        assert set(kernels) == KERNELS, out
        for name, row in kernels.items():
            assert row["spill"] == 0 and row["stack"] == 0, f"{name} {shape} spills registers:\n{out}"
            assert (row["mma"] > 0) == (name not in NO_DOTS), f"{name}: tensor-core use unexpected:\n{out}"
            assert (row["ex2"] > 0) == (name != "fwd-fixed"), f"{name}: exp2 use unexpected:\n{out}"
            if name in MAX_SASS_PER_EX2:
                assert row["per_ex2"] <= MAX_SASS_PER_EX2[name], f"{name} {shape}: {row['per_ex2']} SASS/EX2:\n{out}"


def test_axial_kernels_compile_for_sm90() -> None:
    """The axial kernels at a small odd shape: they compile within the shared-memory estimate (they still spill)."""
    out, rows = _compile_report("--mode", "axial", "--grid", "7", "5", "--atoms", "3", "--head-dim", "24")
    assert set(next(iter(rows.values()))) == AXIAL_KERNELS, out


def test_dispatch_rejects_shapes_over_the_shared_memory_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a GPU with 101 KB of shared memory per program (sm_86/89) a 64×64 grid at d64 is refused with the reason,
    before any launch; a 7×5 grid at d16 still runs."""
    import torch

    from ssog_core.ops import dispatch
    from ssog_core.testing.oracles import FieldLeaves

    monkeypatch.setattr(dispatch, "interpreting", lambda: True)
    monkeypatch.setattr(dispatch, "shared_memory_limit", lambda device: 101376)
    for grid, d, ok in (((64, 64), 64, False), ((7, 5), 16, True)):
        field = FieldLeaves(1, grid, 2, 4, ("mu",), dtype=torch.float32).field()
        v = torch.empty(1, grid[0] * grid[1], 2, d, dtype=torch.bfloat16)
        problem = dispatch.ssog_triton_problem(v, field, grid, "factorized")
        assert (problem is None) == ok, problem
        if not ok:
            assert "shared memory" in problem and "101376" in problem
