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
import json
import math
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


def problem_jobs(
    grid: tuple[int, int], head_dim: int, atoms: int, mode: str, dtype: torch.dtype, heads: int = 6, batch: int = 2
) -> dict[str, list]:
    """The kernel launches of each timed job of one problem (:func:`ssog_core.ops.ssog_triton.problem_jobs`)."""
    from ssog_core.ops import ssog_triton as ts

    return ts.problem_jobs(grid, head_dim, atoms, mode, dtype, heads, batch)


def problem_launches(
    grid: tuple[int, int], head_dim: int, atoms: int, mode: str, dtype: torch.dtype, heads: int = 6, batch: int = 2
) -> list:
    """Every distinct kernel launch of one problem once (:func:`ssog_core.ops.ssog_triton.problem_launches`)."""
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


def compile_launch(launch, arch: int = 90, num_warps: int | None = None):
    """Compile one launch for ``sm_<arch>`` exactly as the JIT would (Triton's on-disk cache serves repeats)."""
    if interpreting():
        raise RuntimeError("compile-only checks need a process without TRITON_INTERPRET=1")
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    sig, consts, attrs = _specialise(launch)
    options = launch.options | ({"num_warps": num_warps} if num_warps else {})
    return triton.compile(ASTSource(launch.kernel, sig, consts, attrs), target=GPUTarget("cuda", arch, 32),
                          options=options)  # fmt: skip


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
    shape = f"{grid[0]}x{grid[1]} d{head_dim} R{atoms} {mode} {str(dtype).removeprefix('torch.')}"
    reports = []
    for launch in problem_launches(grid, head_dim, atoms, mode, dtype):
        k = compile_launch(launch, arch, num_warps)
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


# ------------------------------------------------------------------------------------- the cost report (--report)

MEASURED = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "gpu_ops_cuda.csv"
MEASURED_OPS = {"ssog-steered kernel": "steered", "ssog-fixed kernel": "fixed"}  # the op rows the model predicts


@dataclass(frozen=True)
class Problem:
    """One benchmark problem: the attention op on ``batch`` images of ``grid`` tokens, ``heads`` × ``head_dim``."""

    grid: tuple[int, int]
    head_dim: int
    atoms: int
    mode: str = "factorized"
    dtype: str = "bfloat16"
    heads: int = 6
    batch: int = 64

    @property
    def label(self) -> str:
        axial = " axial" if self.mode == "axial" else ""
        return f"{self.grid[0]}x{self.grid[1]} d{self.head_dim} R{self.atoms}{axial} {self.dtype} B{self.batch}"

    def jobs(self) -> dict[str, list]:
        d = getattr(torch, self.dtype)
        return problem_jobs(self.grid, self.head_dim, self.atoms, self.mode, d, self.heads, self.batch)


def _memory_bytes(launch) -> int:
    """Bytes of the tensors a launch touches, each once (its span in memory: a broadcast tensor counts once)."""
    spans = {}
    for a in launch.args:
        if isinstance(a, torch.Tensor):
            span = 1 + sum((n - 1) * st for n, st in zip(a.shape, a.stride(), strict=True))
            spans[id(a)] = span * a.element_size()
    return sum(spans.values())


def analyse_launch(problem: Problem, job: str, index: int, arch: int) -> dict:
    """Compile one launch of ``problem`` and read its cost (:mod:`ssog_core.ops.triton_cost`); a plain dict, so
    that a process pool can return it."""
    from ssog_core.ops import triton_cost as tc

    launch = problem.jobs()[job][index]
    k = compile_launch(launch, arch)
    usage = _resource_usage(k.asm["cubin"])
    warps = k.metadata.num_warps
    runtime = [n for n in launch.kernel.arg_names if n not in launch.constexprs]
    ints = {n: a for n, a in zip(runtime, launch.args, strict=True) if isinstance(a, int)}
    loops, ir_straight = tc.ir_loops(k.asm["ttir"], ints)
    sloops, straight = tc.sass_loops(_nvidia_tool("nvdisasm", k.asm["cubin"], "-c", "-hex"))
    dyn = tc.dynamic_mix(loops, ir_straight, sloops, straight, warps)
    ir_exp2 = ir_straight.exp2 + sum(lp.trips * lp.exp2 for lp in loops)
    sass_exp2 = dyn.per_thread.ex2 * warps * tc.WARP
    if sass_exp2 < 0.95 * ir_exp2:  # the anchoring's own check (more is a replicated layout: real work)
        dyn.unmatched.append(f"exp2 lanes per program: IR {ir_exp2}, machine code {sass_exp2:.0f}")
    key = dyn.key
    return dict(
        kernel=launch.name,
        regs=usage["REG"],
        stack=usage["STACK"],
        shared=k.metadata.shared,
        warps=warps,
        programs=math.prod(launch.grid),
        memory_bytes=_memory_bytes(launch),
        exp2_per_program=ir_exp2,
        machine_exp2_per_program=sass_exp2,
        mix=vars(dyn.per_thread),
        key_loop=None
        if key is None
        else dict(trips=key.trips, sass_per_ex2=key.sass_per_ex2, per_iteration=vars(key.per_iteration)),
        unmatched=dyn.unmatched,
    )


def _analyse(task: tuple) -> dict:
    return analyse_launch(*task)


def _task_key(problem: Problem, job: str, index: int, arch: int, launch) -> tuple:
    """What decides the compiled code and its loop bounds: equal keys compile once."""
    sig, consts, attrs = _specialise(launch)
    ints = tuple(a for a in launch.args if isinstance(a, int))
    spec = (repr(sorted(sig.items())), repr(sorted(consts.items())), repr(attrs), repr(sorted(launch.options.items())))
    return (launch.kernel.fn.__name__, *spec, ints, math.prod(launch.grid), _memory_bytes(launch), arch)


def _shown(path: Path) -> str:
    """``path`` as a report records it: relative to the working directory when inside it (no machine's folders)."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return Path(path).name


def measured_rows(path: Path) -> list[dict]:
    """The measured SSOG kernel rows of a GPU run (``benchmarks/results/gpu_ops_cuda.csv``): op, field, shape and
    the forward and forward + backward milliseconds."""
    import csv

    if not path.is_file():
        return []
    rows = []
    with path.open(newline="") as f:
        for r in csv.DictReader(f):
            if r["op"] in MEASURED_OPS:
                side = math.isqrt(int(r["tokens"]))
                prob = Problem((side, side), int(r["head_dim"]), int(r["atoms"]), heads=int(r["heads"]),
                               batch=int(r["batch"]))  # fmt: skip
                for what, col in (("forward", "fwd_ms"), ("forward + backward", "fwdbwd_ms")):
                    if r[col]:
                        rows.append(dict(op=r["op"], field=MEASURED_OPS[r["op"]], what=what, problem=prob,
                                         ms=float(r[col])))  # fmt: skip
    return rows


def _kernel_seconds(k: dict, cal) -> tuple[float, str]:
    from ssog_core.ops import triton_cost as tc

    mix = tc.Mix(**k["mix"])
    per_sm, _ = tc.programs_per_sm(k["regs"], k["shared"], k["warps"])
    return tc.kernel_time(mix, k["warps"], k["programs"], max(per_sm, 1), k["memory_bytes"], cal)


def job_seconds(kernels: list[dict], cal) -> float:
    """Predicted seconds of a job: its kernels one after another."""
    return sum(_kernel_seconds(k, cal)[0] for k in kernels)


def _job_kernels(result: dict, field: str, what: str) -> list[dict]:
    jobs = [f"{field} forward"] + ([f"{field} backward"] if what != "forward" else [])
    return [k for job in jobs for k in result["jobs"][job]]


def calibrate(rows: list[dict], results: dict[str, dict]):
    """The latency constants (:class:`ssog_core.ops.triton_cost.Calibration`) that minimise the squared log error
    of the predicted over the measured times: a log-spaced grid, refined twice around its best point; per row the
    prediction and its error."""
    from ssog_core.ops import triton_cost as tc

    rows = [r for r in rows if r["problem"].label in results and "refused" not in results[r["problem"].label]]
    if not rows:
        return None, []
    kernels = [_job_kernels(results[r["problem"].label], r["field"], r["what"]) for r in rows]

    def loss(x: tuple[float, float]) -> float:
        cal = tc.Calibration(10 ** x[0], 10 ** x[1])
        return sum(math.log(job_seconds(ks, cal) * 1e3 / r["ms"]) ** 2 for ks, r in zip(kernels, rows, strict=True))

    best, step = (1.0, 2.0), 1.0  # log10 of (cycles per instruction, cycles per global access)
    for _ in range(4):
        pts = [(best[0] + step * i / 4, best[1] + step * j / 4) for i in range(-8, 9) for j in range(-8, 9)]
        best = min(pts, key=loss)
        step /= 4
    cal = tc.Calibration(10 ** best[0], 10 ** best[1])
    return cal, predicted_rows(rows, results, cal)


def predicted_rows(rows: list[dict], results: dict[str, dict], cal) -> list[dict]:
    """Each measured row (of the problems compiled and not refused) with the prediction of ``cal`` beside it."""
    rows = [r for r in rows if r["problem"].label in results and "refused" not in results[r["problem"].label]]
    out = []
    for r in rows:
        pred = job_seconds(_job_kernels(results[r["problem"].label], r["field"], r["what"]), cal) * 1e3
        out.append(dict(op=r["op"], what=r["what"], shape=r["problem"].label, measured_ms=r["ms"],
                        predicted_ms=pred, error=pred / r["ms"] - 1))  # fmt: skip
    return out


def cost_report(problems: list[Problem], arch: int = 90, workers: int | None = None,
                measured: Path | None = MEASURED, calibration=None) -> dict:  # fmt: skip
    """Compile every kernel of every problem (a process pool; Triton's on-disk cache makes repeats cheap), read
    their cost and predict each job's time with ``calibration`` (a :class:`ssog_core.ops.triton_cost.Calibration`),
    else with the constants fitted on the measured rows of ``measured`` (their problems are compiled too; the rows
    are shown beside today's predictions either way). A problem the dispatcher refuses is reported with the
    reason."""
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    from ssog_core.ops import triton_cost as tc
    from ssog_core.ops.dispatch import shared_memory_problem

    rows = measured_rows(measured) if measured else []
    wanted = list(dict.fromkeys([*problems, *(r["problem"] for r in rows)]))
    limit = SHARED_LIMIT.get(arch, 101376)
    results: dict[str, dict] = {}
    tasks: dict[tuple, tuple] = {}
    slots: list[tuple[str, str, int, tuple]] = []
    for prob in wanted:
        refused = shared_memory_problem(prob.grid, prob.head_dim, prob.atoms, prob.mode, getattr(torch, prob.dtype),
                                        limit)  # fmt: skip
        if refused:
            results[prob.label] = dict(problem=vars(prob), refused=refused)
            continue
        results[prob.label] = dict(problem=vars(prob), jobs={})
        for job, launches in prob.jobs().items():
            for i, launch in enumerate(launches):
                key = _task_key(prob, job, i, arch, launch)
                tasks.setdefault(key, (prob, job, i, arch))
                slots.append((prob.label, job, i, key))
    keys = list(tasks)
    n = workers or min(len(keys), os.cpu_count() or 1)
    if n > 1 and len(keys) > 1:
        with ProcessPoolExecutor(n, mp_context=get_context("spawn")) as pool:
            done = dict(zip(keys, pool.map(_analyse, [tasks[k] for k in keys]), strict=True))
    else:
        done = {k: _analyse(tasks[k]) for k in keys}
    for label, job, _, key in slots:
        results[label]["jobs"].setdefault(job, []).append(done[key])
    cal, fitted = calibrate(rows, results)
    if calibration is not None:
        cal, fitted = calibration, predicted_rows(rows, results, calibration)
    for res in results.values():
        if cal is None or "refused" in res:
            continue
        for kernels in res["jobs"].values():
            for k in kernels:
                per_sm, why = tc.programs_per_sm(k["regs"], k["shared"], k["warps"])
                k["programs_per_sm"], k["programs_per_sm_limit"] = per_sm, why
                seconds, bound = _kernel_seconds(k, cal)
                k["predicted_us"], k["bound"] = seconds * 1e6, bound
                mix = tc.Mix(**k["mix"])
                hidden = tc.overlapped_time(mix, k["warps"], k["programs"], max(per_sm, 1), k["memory_bytes"], cal)
                k["overlapped_bound_us"] = hidden[0] * 1e6  # uncalibrated: overlapped loads not charged
                k["waves"] = -(-k["programs"] // (tc.SMS * max(per_sm, 1)))
                cycles = tc.wave_cycles(tc.Mix(**k["mix"]), k["warps"], max(per_sm, 1), cal)
                k["bounds_us"] = {b: k["waves"] * c / tc.CLOCK_HZ * 1e6 for b, c in cycles.items()}
        res["predicted_ms"] = {job: job_seconds(ks, cal) * 1e3 for job, ks in res["jobs"].items()}
        res["overlapped_bound_ms"] = {job: sum(k["overlapped_bound_us"] for k in ks) / 1e3
                                      for job, ks in res["jobs"].items()}  # fmt: skip
    errors = [abs(f["error"]) for f in fitted]
    return dict(
        arch=arch,
        triton=_triton_version(),
        problems=[p.label for p in problems],
        calibration=None if cal is None else dict(
            cycles_per_instruction=cal.cycles_per_instruction, cycles_per_global_access=cal.cycles_per_global_access,
            fitted=calibration is None, measured=_shown(measured) if measured else None, rows=fitted,
            max_error=max(errors, default=0.0), rms_error=math.sqrt(sum(e * e for e in errors) / max(len(errors), 1))),
        results=results,
        constants={k: getattr(tc, k) for k in ("SMS", "CLOCK_HZ", "HBM_BYTES_PER_S", "ISSUE_PER_CLOCK",
                                               "MUFU_LANES_PER_CLOCK", "TENSOR_MACS_PER_CLOCK",
                                               "SHARED_WAVEFRONTS_PER_CLOCK", "REGISTERS_PER_SM", "SHARED_PER_SM",
                                               "MAX_WARPS_PER_SM", "MAX_PROGRAMS_PER_SM")},
    )  # fmt: skip


def _fmt(x: float | None, digits: int = 1) -> str:
    return "—" if x is None else f"{x:.{digits}f}"


def _loads(per: dict | None) -> str:
    if not per:
        return "—"
    return f"{per['loads_same_iteration']:.1f} / {per['loads_ahead']:.1f} / {per['loads_overlapped']:.1f}"


def _stores(per: dict | None) -> str:
    return f"{per['stores_narrow']:.1f} / {per['stores_vector']:.1f}" if per else "—"


def cost_markdown(report: dict, command: str) -> str:
    """The report as Markdown: the model, the calibration with its error per measured row, then per problem and
    kernel the resources, occupancy, key-loop costs and the predicted time with the bound that sets it."""
    from ssog_core.ops import triton_cost as tc

    c = report["constants"]
    out = [
        f"`{command}`",
        "",
        f"sm_{report['arch']}, triton {report['triton']}. Model per launch: time = max(waves × max(issue, MUFU, "
        "tensor, shared, latency) cycles / clock, HBM bytes / bandwidth); per wave of the resident programs: issue = "
        f"warp-instructions / {c['ISSUE_PER_CLOCK']}, MUFU = MUFU lanes / {c['MUFU_LANES_PER_CLOCK']}, tensor = HMMA "
        f"multiply-adds / {c['TENSOR_MACS_PER_CLOCK']}, shared = 128-byte wavefronts / "
        f"{c['SHARED_WAVEFRONTS_PER_CLOCK']}, latency = one warp's instructions × CPI + its global-memory accesses "
        "× CPG (both calibrated); "
        f"{c['SMS']} SMs at {c['CLOCK_HZ'] / 1e9:.2f} GHz, {c['HBM_BYTES_PER_S'] / 1e12:.1f} TB/s; a job's time is "
        "the sum of its launches.",
        "",
    ]
    cal = report["calibration"]
    if cal is None:
        out += ["No measured rows to calibrate on: no predicted times.", ""]
    elif not cal["rows"]:
        out += [f"No measured rows to compare with; CPI = {cal['cycles_per_instruction']:.2f}, CPG = "
                f"{cal['cycles_per_global_access']:.0f} (the H200 run's constants).", ""]  # fmt: skip
    else:
        source = Path(cal["measured"]).name
        how = (
            f"Calibration on {len(cal['rows'])} measured rows of `{source}` (H200)"
            if cal.get("fitted", True)
            else f"Constants fitted on the kernels the H200 rows of `{source}` measured (`--fit` refits them on "
            "today's kernels: only right once the rows are measured from them); the rows are those kernels' times, "
            "the predictions today's kernels'"
        )
        out += [
            f"{how}: CPI = {cal['cycles_per_instruction']:.2f} cycles per warp-instruction, CPG = "
            f"{cal['cycles_per_global_access']:.0f} cycles per global-memory access; "
            f"{'error' if cal.get('fitted', True) else 'difference'} max {cal['max_error']:.0%}, "
            f"RMS {cal['rms_error']:.0%}.",
            "",
            "| op | shape | measured ms | predicted ms | error |",
            "|---|---|---:|---:|---:|",
        ]
        out += [f"| {f['op']} {f['what']} | {f['shape']} | {f['measured_ms']:.3f} | {f['predicted_ms']:.3f} | "
                f"{f['error']:+.0%} |" for f in cal["rows"]]  # fmt: skip
        out.append("")
    out += [
        "Key-loop columns per iteration: loads = global loads waited for in their own iteration / issued ahead "
        "(waited for after the back edge) / of those overlapped (at least half an iteration's instructions between "
        "issue and wait); STS = shared-memory stores single (8/16/32-bit) / vector (64/128-bit, STSM). *Overlap "
        "bound*: an uncalibrated reading, not a prediction — the same model with the overlapped loads not charged "
        "(the calibration's kernels had none, so CPG says nothing about them).",
        "",
        "| shape | job | kernel | REG | shared B | warps | programs/SM (limit) | programs | waves "
        "| SASS/EX2 key loop | BAR/iter | shared B/iter | loads/iter | STS/iter | instr/program | predicted µs | bound "
        "| overlap bound µs |",
        "|---|---|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    for label in report["problems"]:
        res = report["results"][label]
        if "refused" in res:
            out.append(f"| {label} | — | refused: {res['refused']} |" + " |" * 15)
            continue
        for job, kernels in res["jobs"].items():
            for k in kernels:
                key = k["key_loop"]
                per = key["per_iteration"] if key else None
                per_sm = k.get("programs_per_sm") or tc.programs_per_sm(k["regs"], k["shared"], k["warps"])[0]
                why = k.get("programs_per_sm_limit") or tc.programs_per_sm(k["regs"], k["shared"], k["warps"])[1]
                note = " ⚠" if k["unmatched"] else ""
                out.append(
                    f"| {label} | {job} | {k['kernel']}{note} | {k['regs']} | {k['shared']} | {k['warps']} | "
                    f"{per_sm} ({why}) | {k['programs']} | {k.get('waves', '—')} | "
                    f"{_fmt(key and key['sass_per_ex2'])} | {_fmt(per and per['barriers'])} | "
                    f"{_fmt(per and per['shared_bytes'] * k['warps'], 0)} | {_loads(per)} | {_stores(per)} | "
                    f"{k['mix']['instr'] * k['warps']:.0f} | {_fmt(k.get('predicted_us'))} | {k.get('bound', '—')} | "
                    f"{_fmt(k.get('overlapped_bound_us'))} |"
                )
        if "predicted_ms" in res:
            jobs = ", ".join(f"{job} {ms:.3f} ms" for job, ms in res["predicted_ms"].items())
            out.append(f"| {label} | predicted | {jobs} |" + " |" * 15)
            bound = ", ".join(f"{job} {ms:.3f} ms" for job, ms in res["overlapped_bound_ms"].items())
            out.append(f"| {label} | overlap bound (uncalibrated) | {bound} |" + " |" * 15)
    warned = [(lbl, k["kernel"], u) for lbl, r in report["results"].items() if "jobs" in r
              for ks in r["jobs"].values() for k in ks for u in k["unmatched"]]  # fmt: skip
    if warned:
        out += ["", "⚠ loops the model could not anchor (their counts are lower bounds):"]
        out += [f"* {lbl} {kernel}: {u}" for lbl, kernel, u in dict.fromkeys(warned)]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", type=int, default=90, help="CUDA compute capability, e.g. 80 or 90")
    ap.add_argument("--grid", type=int, nargs=2, action="append", help="grid Gh Gw (repeatable)")
    ap.add_argument("--atoms", type=int, nargs="+", help="atoms per head (default 4; the report: 1 2 4 8)")
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--mode", choices=("factorized", "axial", "both"), help="default both; the report: factorized")
    ap.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), default="bfloat16")
    ap.add_argument("--num-warps", type=int, help="default: the launchers' NUM_WARPS")
    ap.add_argument("--out", type=Path, help="also write the report (a markdown table) to this file")
    ap.add_argument("--report", action="store_true", help="the cost report (docs/KERNELS.md §3) instead")
    ap.add_argument("--json", type=Path, help="--report: also write it as JSON to this file")
    ap.add_argument("--workers", type=int, help="--report: compile processes (default: one per CPU)")
    ap.add_argument("--measured", type=Path, default=MEASURED, help="--report: the measured GPU rows")
    ap.add_argument(
        "--fit",
        action="store_true",
        help="--report: fit the constants on the measured rows (default: "
        "the H200 run's, triton_cost.H200_CALIBRATION; refit only on rows measured from today's kernels)",
    )
    ap.add_argument("--batch", type=int, default=64, help="--report, --ceilings: images (the benchmark's 64)")
    ap.add_argument("--heads", type=int, default=6, help="--report, --ceilings: heads (the benchmark's 6)")
    ap.add_argument(
        "--ceilings",
        action="store_true",
        help="the forward's throughput ceilings of SDPA, a dense SSOG tile and the factorized kernels (no compile; "
        "docs/KERNELS.md §3)",
    )
    args = ap.parse_args(argv)
    command = " ".join(["python -m ssog_core.ops.triton_compile", *(argv if argv is not None else sys.argv[1:])])
    if args.ceilings:
        grids = [tuple(g) for g in args.grid] if args.grid else list(REPORT_GRIDS)
        if min([*(n for g in grids for n in g), *(args.atoms or [1]), args.head_dim, args.batch, args.heads]) < 1:
            ap.error("--ceilings: grid sides, atoms, --head-dim, --batch and --heads must be at least 1")
        from ssog_core.ops.triton_cost import CLOCK_HZ, SMS, ceilings_table

        atoms = args.atoms or list(REPORT_ATOMS)
        lines = [
            f"`{command}`",
            "",
            f"Forward pass, {args.batch} images × {args.heads} heads, d{args.head_dim}, on {SMS} SMs at "
            f"{CLOCK_HZ / 1e9:g} GHz: each design's throughput ceiling (docs/KERNELS.md §3), not a prediction.",
            "",
            *ceilings_table(grids, atoms, args.head_dim, args.batch * args.heads),
        ]
        print("\n".join(lines))
        if args.out:
            _write(args.out, "\n".join(lines) + "\n")
        return 0
    if args.report:
        return _report_main(args, command)
    args.atoms = args.atoms or [4]
    args.mode = args.mode or "both"
    grids = [tuple(g) for g in args.grid] if args.grid else [(14, 14), (24, 24), (32, 32), (64, 64), (128, 128)]
    modes = ("factorized", "axial") if args.mode == "both" else (args.mode,)
    dtype = getattr(torch, args.dtype)
    limit = SHARED_LIMIT.get(args.arch, 101376)
    lines = [
        f"`{command}`",
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
        for mode, atoms in [(m, a) for m in modes for a in args.atoms]:
            try:
                reports = compile_kernels(grid, args.head_dim, atoms, mode, dtype, args.arch, args.num_warps)
            except Exception as e:  # report every failing shape, then fail
                failed += 1
                lines.append(f"FAILED {grid} {mode}: {type(e).__name__}: {str(e).splitlines()[0]}")
                print(lines[-1], flush=True)
                continue
            bound = shared_memory_estimate(*grid, args.head_dim, atoms, mode == "axial", dtype.itemsize)
            for r in reports:
                over = r.shared > limit or r.shared > bound
                failed += over
                note = f" FAILED: shared memory {r.shared} > limit {limit} or estimate {bound}" if over else ""
                lines.append(r.row() + note)
                print(lines[-1], flush=True)
    if args.out:
        _write(args.out, "\n".join(lines) + "\n")
    return 1 if failed else 0


def _write(path: Path, text: str) -> None:
    """Write ``text`` atomically (a temporary file renamed over ``path``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


REPORT_GRIDS = ((14, 14), (32, 32), (64, 64))  # the benchmark's 196, 1024 and 4096 tokens
REPORT_ATOMS = (1, 2, 4, 8)


def _report_main(args: argparse.Namespace, command: str) -> int:
    """``--report``: the cost report of every kernel of the benchmark problems (or those asked for)."""
    grids = [tuple(g) for g in args.grid] if args.grid else REPORT_GRIDS
    modes = ("factorized", "axial") if args.mode == "both" else (args.mode or "factorized",)
    problems = [Problem(g, args.head_dim, a, m, args.dtype, args.heads, args.batch)
                for g in grids for a in (args.atoms or REPORT_ATOMS) for m in modes]  # fmt: skip
    from ssog_core.ops import triton_cost as tc

    calibration = None if args.fit else tc.H200_CALIBRATION
    report = cost_report(problems, args.arch, args.workers, args.measured, calibration)
    text = cost_markdown(report, command)
    print(text, end="", flush=True)
    if args.out:
        _write(args.out, text)
    if args.json:
        _write(args.json, json.dumps(report, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
