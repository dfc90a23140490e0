"""Compile every SSOG Triton kernel for a CUDA target without a GPU (KERNELS.md §3.5).

    python -m ssog_core.ops.triton_compile                 # sm_90, the benchmark shapes, bf16
    python -m ssog_core.ops.triton_compile --arch 80 --grid 14 14 --atoms 4 --head-dim 64

Run it in a process *without* ``TRITON_INTERPRET``. For each kernel it reports what the PTX uses
(``mma.sync`` / ``wgmma`` tensor-core instructions, ``ex2.approx`` exponentials) and, from Triton's bundled
``cuobjdump``, the registers, stack, spilled local memory and shared memory of the cubin — so register
blow-ups and compile failures show up on a CPU-only machine. Exits non-zero if any kernel fails to compile.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

PTR_TYPES = {torch.float32: "*fp32", torch.bfloat16: "*bf16", torch.float16: "*fp16"}
SHARED_LIMIT = {80: 166912, 86: 101376, 89: 101376, 90: 232448}  # opt-in shared memory per block, bytes
VALUE_PTRS = {"v_ptr", "y_ptr", "dy_ptr", "dv_ptr"}


@dataclass
class KernelReport:
    kernel: str
    shape: str
    mma_sync: int
    wgmma: int
    ex2: int
    regs: int
    stack: int
    spill: int
    shared: int


def _signature(fn, constexprs: dict, dtype: torch.dtype) -> dict[str, str]:
    sig = {}
    for name in fn.arg_names:
        if name in constexprs:
            sig[name] = "constexpr"
        elif name.endswith("_ptr"):
            sig[name] = PTR_TYPES[dtype] if name in VALUE_PTRS else "*fp32"
        else:
            sig[name] = "i32"
    return sig


def _resource_usage(cubin: bytes) -> dict[str, int]:
    import triton

    exe = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cubin)
    try:
        out = subprocess.run([str(exe), "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
    finally:
        os.unlink(f.name)
    usage = {}
    for key in ("REG", "STACK", "SHARED", "LOCAL"):
        m = re.search(rf"\b{key}:(\d+)", out.split("Function", 1)[-1])
        usage[key] = int(m.group(1)) if m else -1
    return usage


def compile_kernels(
    grid: tuple[int, int],
    head_dim: int,
    atoms: int,
    mode: str,
    dtype: torch.dtype,
    arch: int = 90,
    num_warps: int | None = None,
) -> list[KernelReport]:
    """Compile the forward (steered and fixed), ``inv_zx`` and both backward kernels for one problem shape."""
    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        raise RuntimeError("compile-only checks need a process without TRITON_INTERPRET=1")
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from ssog_core.ops import triton_kernels as K
    from ssog_core.ops.triton_ssog import NUM_WARPS, _config, _fwd_cfg, _p2, col_tiles

    num_warps = num_warps or NUM_WARPS

    gh, gw = grid
    axial = mode == "axial"
    cfg = _config(gh, gw, head_dim, atoms, axial, dtype)
    kt, ic, wc = col_tiles(cfg, axial)
    fwd = dict(_fwd_cfg(cfg), AXIAL=axial)
    jobs = [
        ("fwd-steered", K._ssog_fwd_kernel, dict(fwd, FIXED=False)),
        ("fwd-fixed", K._ssog_fwd_kernel, dict(fwd, FIXED=True)),
        ("inv_zx", K._ssog_izx_kernel, {k: fwd[k] for k in ("R", "RO", "RP", "AXIAL", "WT", "KC")}),
        ("bwd-rows", K._ssog_bwd_rows_kernel, dict(fwd, RA=_p2(atoms))),
        (
            "bwd-cols",
            K._ssog_bwd_cols_kernel,
            {k: cfg[k] for k in ("R", "RO", "RP", "GHP", "DHP", "DOT", "PREC")}
            | dict(AXIAL=axial, KT=kt, IC=ic, WC=wc),
        ),
    ]
    shape = f"{gh}x{gw} d{head_dim} R{atoms} {mode} {str(dtype).removeprefix('torch.')}"
    reports = []
    for name, fn, constexprs in jobs:
        src = ASTSource(fn, _signature(fn, constexprs, dtype), constexprs)
        k = triton.compile(src, target=GPUTarget("cuda", arch, 32), options={"num_warps": num_warps})
        ptx = k.asm["ptx"]
        usage = _resource_usage(k.asm["cubin"])
        reports.append(
            KernelReport(
                name,
                shape,
                ptx.count("mma.sync"),
                ptx.count("wgmma.mma_async"),
                ptx.count("ex2.approx"),
                usage["REG"],
                usage["STACK"],
                usage["LOCAL"],
                k.metadata.shared,
            )
        )
    return reports


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", type=int, default=90, help="CUDA compute capability, e.g. 80 or 90")
    ap.add_argument("--grid", type=int, nargs=2, action="append", help="grid Gh Gw (repeatable)")
    ap.add_argument("--atoms", type=int, default=4)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--mode", choices=("factorized", "axial", "both"), default="both")
    ap.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), default="bfloat16")
    ap.add_argument("--num-warps", type=int, help="default: the launchers' NUM_WARPS")
    args = ap.parse_args(argv)
    grids = [tuple(g) for g in args.grid] if args.grid else [(14, 14), (24, 24), (32, 32), (64, 64), (128, 128)]
    modes = ("factorized", "axial") if args.mode == "both" else (args.mode,)
    dtype = getattr(torch, args.dtype)
    print(f"{'kernel':<12} {'shape':<36} {'mma.sync':>8} {'wgmma':>6} {'ex2':>5} {'REG':>4} {'STACK':>5} "
          f"{'LOCAL':>5} {'SHARED':>7}")  # fmt: skip
    failed = 0
    limit = SHARED_LIMIT.get(args.arch, 101376)
    for grid in grids:
        for mode in modes:
            try:
                reports = compile_kernels(grid, args.head_dim, args.atoms, mode, dtype, args.arch, args.num_warps)
            except Exception as e:  # report every failing shape, then fail
                failed += 1
                print(f"FAILED {grid} {mode}: {type(e).__name__}: {str(e).splitlines()[0]}", flush=True)
                continue
            for r in reports:
                over = r.shared > limit
                failed += over
                note = f"  FAILED: shared memory {r.shared} > {limit}" if over else ""
                print(f"{r.kernel:<12} {r.shape:<36} {r.mma_sync:>8} {r.wgmma:>6} {r.ex2:>5} {r.regs:>4} {r.stack:>5} "
                      f"{r.spill:>5} {r.shared:>7}{note}", flush=True)  # fmt: skip
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
