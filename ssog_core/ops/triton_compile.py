"""Compile every SSOG Triton kernel for a CUDA target without a GPU (docs/KERNELS.md §4).

    python -m ssog_core.ops.triton_compile                 # sm_90, the benchmark shapes, bf16
    python -m ssog_core.ops.triton_compile --arch 80 --grid 14 14 --atoms 4 --head-dim 64

Run it in a process *without* ``TRITON_INTERPRET``. Each kernel is compiled from the launch the custom ops would
make (built on ``meta`` tensors, with the JIT's argument specialisation). The report gives the PTX's tensor-core
instructions (``mma.sync`` / ``wgmma``) and, from Triton's bundled ``cuobjdump`` and ``nvdisasm``, the registers,
stack, spill bytes (``STL``), shared memory, static SASS instructions and ``MUFU.EX2`` count of the cubin, and
their ratio over the whole kernel and over one key-loop iteration — so register blow-ups, instruction bloat and
compile failures show up on a CPU-only machine. ``--out`` also writes the markdown table to a file. Exits
non-zero if any kernel fails to compile or needs more shared memory than the target has or than
:func:`ssog_core.ops.triton_tiles.shared_memory_estimate` allows.
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from ssog_core.ops.env import interpreting
from ssog_core.ops.triton_tiles import shared_memory_estimate

SHARED_LIMIT = {80: 166912, 86: 101376, 89: 101376, 90: 232448}  # opt-in shared memory per block, bytes
HEADER = (
    "| kernel | shape | mma.sync | wgmma | REG | STACK | SPILL | SHARED | SASS | EX2 | SASS/EX2 | key loop SASS/EX2 "
    "| loop SASS per EX2 |"
)


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
    sass: SassCounts

    def row(self) -> str:
        """One markdown table row (columns of :data:`HEADER`)."""
        ratio = f"{self.per_ex2:.1f}" if self.per_ex2 else "—"
        loop = f"{self.loop_per_ex2:.1f}" if self.loop_per_ex2 else "—"
        cells = [
            self.kernel,
            self.shape,
            self.mma_sync,
            self.wgmma,
            self.regs,
            self.stack,
            self.sass.spill_bytes,
            self.shared,
            self.sass.instr,
            self.sass.ex2,
            ratio,
            f"{self.sass.loop_instr}/{self.sass.loop_ex2}",
            loop,
        ]
        return "| " + " | ".join(map(str, cells)) + " |"

    @property
    def per_ex2(self) -> float | None:
        """SASS instructions per ``MUFU.EX2``, whole kernel (``None`` without exponentials)."""
        return self.sass.instr / self.sass.ex2 if self.sass.ex2 else None

    @property
    def loop_per_ex2(self) -> float | None:
        """SASS instructions per ``MUFU.EX2`` in one iteration of the key loop."""
        return self.sass.loop_instr / self.sass.loop_ex2 if self.sass.loop_ex2 else None


def _nvidia_tool(name: str, cubin: bytes, *flags: str) -> str:
    """Run one of the CUDA binary tools that ship inside the Triton wheel on a cubin; its stdout."""
    import triton

    exe = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cubin)
    try:
        return subprocess.run([str(exe), *flags, f.name], capture_output=True, text=True, check=True).stdout
    finally:
        os.unlink(f.name)


_INSTR = re.compile(r"^\s+/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)")
_BRANCH = re.compile(r"\bBRA\s+`\((\.L_x_\d+)\)")


@dataclass
class SassCounts:
    """Static SASS counts of one kernel: instructions (NOP padding excluded) and ``MUFU.EX2``, over the whole
    kernel and over one iteration of its key loop (the outermost loop holding the most exponentials: unrolling,
    peeling and prologues distort whole-kernel ratios, the loop body is what runs per key chunk)."""

    instr: int
    ex2: int
    loop_instr: int
    loop_ex2: int
    spill_bytes: int  # bytes written by local-memory stores (STL): the kernels keep no local arrays, so spills


def sass_counts(sass: str) -> SassCounts:
    """Count instructions and exponentials in ``nvdisasm -c`` output."""
    lines = sass.splitlines()
    labels = {line[:-1]: n for n, line in enumerate(lines) if line.startswith(".L_x_") and line.endswith(":")}
    ops = [(n, m.group(1)) for n, line in enumerate(lines) if (m := _INSTR.match(line)) and m.group(1) != "NOP"]

    def count(lo: int, hi: int) -> tuple[int, int]:
        inside = [op for n, op in ops if lo <= n <= hi]
        return len(inside), sum(op == "MUFU.EX2" for op in inside)

    loops = []  # (first line, backward branch line) of every loop
    for n, line in enumerate(lines):
        m = _BRANCH.search(line)
        if m and labels.get(m.group(1), n + 1) < n:
            loops.append((labels[m.group(1)], n))
    outer = [a for a in loops if not any(b != a and b[0] <= a[0] and a[1] <= b[1] for b in loops)]
    instr, ex2 = count(0, len(lines))
    best = max(outer, key=lambda a: (count(*a)[1], a[1] - a[0]), default=None)
    loop_instr, loop_ex2 = count(*best) if best else (0, 0)
    width = {"64": 8, "128": 16, "U8": 1, "S8": 1, "U16": 2, "S16": 2}
    spill = sum(width.get(op.split(".")[1] if "." in op else "", 4) for _, op in ops if op.split(".")[0] == "STL")
    return SassCounts(instr, ex2, loop_instr, loop_ex2, spill)


def _triton_version() -> str:
    import triton

    return triton.__version__


def _resource_usage(cubin: bytes) -> dict[str, int]:
    out = _nvidia_tool("cuobjdump", cubin, "--dump-resource-usage")
    usage = {}
    for key in ("REG", "STACK", "SHARED", "LOCAL"):
        m = re.search(rf"\b{key}:(\d+)", out.split("Function", 1)[-1])
        usage[key] = int(m.group(1)) if m else -1
    return usage


def problem_launches(
    grid: tuple[int, int], head_dim: int, atoms: int, mode: str, dtype: torch.dtype, heads: int = 6, batch: int = 2
) -> list:
    """Every kernel launch of one problem, built on ``meta`` tensors as the custom ops build them
    (:func:`ssog_core.ops.ssog_triton.problem_launches`)."""
    from ssog_core.ops import ssog_triton as ts

    return ts.problem_launches(grid, head_dim, atoms, mode, dtype, heads, batch)


def _specialise(launch) -> tuple[dict, dict, dict]:
    """Signature, constexprs and attributes of a launch as Triton's JIT derives them from the argument values."""
    from triton.backends.compiler import BaseBackend
    from triton.runtime.jit import native_specialize_impl

    fn = launch.kernel
    sig, consts, attrs = {}, dict(launch.constexprs), {}
    runtime = [n for n in fn.arg_names if n not in launch.constexprs]
    for name, value in zip(runtime, launch.args, strict=True):
        kind, spec = native_specialize_impl(BaseBackend, value, False, True, True)
        if kind == "constexpr":
            consts[name] = spec
        else:
            sig[name] = kind
            if spec == "D":
                attrs[(fn.arg_names.index(name),)] = [["tt.divisibility", 16]]
    for name in consts:
        sig[name] = "constexpr"
    return sig, consts, attrs


def compile_kernels(
    grid: tuple[int, int],
    head_dim: int,
    atoms: int,
    mode: str,
    dtype: torch.dtype,
    arch: int = 90,
    num_warps: int | None = None,
) -> list[KernelReport]:
    """Compile every kernel of one problem shape (:func:`problem_launches`)."""
    if interpreting():
        raise RuntimeError("compile-only checks need a process without TRITON_INTERPRET=1")
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    shape = f"{grid[0]}x{grid[1]} d{head_dim} R{atoms} {mode} {str(dtype).removeprefix('torch.')}"
    reports = []
    for launch in problem_launches(grid, head_dim, atoms, mode, dtype):
        sig, consts, attrs = _specialise(launch)
        src = ASTSource(launch.kernel, sig, consts, attrs)
        options = launch.options | ({"num_warps": num_warps} if num_warps else {})
        k = triton.compile(src, target=GPUTarget("cuda", arch, 32), options=options)
        ptx = k.asm["ptx"]
        usage = _resource_usage(k.asm["cubin"])
        reports.append(
            KernelReport(
                launch.name,
                shape,
                ptx.count("mma.sync"),
                ptx.count("wgmma.mma_async"),
                ptx.count("ex2.approx"),
                usage["REG"],
                usage["STACK"],
                usage["LOCAL"],
                k.metadata.shared,
                sass_counts(_nvidia_tool("nvdisasm", k.asm["cubin"], "-c")),
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
    ap.add_argument("--out", type=Path, help="also write the report (a markdown table) to this file")
    args = ap.parse_args(argv)
    grids = [tuple(g) for g in args.grid] if args.grid else [(14, 14), (24, 24), (32, 32), (64, 64), (128, 128)]
    modes = ("factorized", "axial") if args.mode == "both" else (args.mode,)
    dtype = getattr(torch, args.dtype)
    limit = SHARED_LIMIT.get(args.arch, 101376)
    lines = [
        f"`python -m ssog_core.ops.triton_compile {' '.join(argv if argv is not None else sys.argv[1:])}`".replace(
            " `", "`"
        ),
        f"sm_{args.arch}, num_warps {args.num_warps or 'default'}, triton {_triton_version()}, "
        f"{datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}. REG registers per thread; "
        "STACK stack frame bytes; SPILL bytes stored by local-memory (STL) instructions; SHARED bytes per program "
        f"(limit {limit}); SASS static instructions (NOP padding excluded); EX2 `MUFU.EX2` count; /EX2 the two "
        "ratios over the whole kernel and over one iteration of the key loop.",
        "",
        HEADER,
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for line in lines:
        print(line, flush=True)
    failed = 0
    for grid in grids:
        for mode in modes:
            try:
                reports = compile_kernels(grid, args.head_dim, args.atoms, mode, dtype, args.arch, args.num_warps)
            except Exception as e:  # report every failing shape, then fail
                failed += 1
                lines.append(f"FAILED {grid} {mode}: {type(e).__name__}: {str(e).splitlines()[0]}")
                print(lines[-1], flush=True)
                continue
            bound = shared_memory_estimate(*grid, args.head_dim, args.atoms, mode == "axial", dtype.itemsize)
            for r in reports:
                over = r.shared > limit or r.shared > bound
                failed += over
                note = f" FAILED: shared memory {r.shared} > limit {limit} or estimate {bound}" if over else ""
                lines.append(r.row() + note)
                print(lines[-1], flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("\n".join(lines) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
