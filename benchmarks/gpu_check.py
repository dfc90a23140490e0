"""The GPU check: prove the fused kernels right on the device, benchmark them fairly, record the results.

    python benchmarks/gpu_check.py --budget-s 480      # the prepared command: check, bench, profile, results
    python benchmarks/gpu_check.py --steps check       # only the correctness checks
    TRITON_INTERPRET=1 python benchmarks/gpu_check.py --dry-run-cpu --out /tmp/gc   # this script, without a GPU

Steps:

1. ``compile`` (not run by default) — the compile report of every kernel for this GPU's architecture;
2. ``check`` — every kernel against the float64 definition (forward and all gradients; fp32 with
   ``input_precision="ieee"``, bf16, fp16; odd and benchmark-sized grids; R 1–8; head_dim 8–128; strided values),
   dispatch and analysis parity, ``torch.compile(fullgraph=True)``, and one SSOG layer's forward + backward
   captured in a CUDA graph (which fails on any per-call host→device copy or synchronisation), and the heavy
   jobs (validation edits, head importance, head fields, accuracy) on a GPU worker against a CPU worker
   (``ssog_core.runtime.jobs.run_job`` with ``device="cuda"`` and ``"cpu"``): their largest differences;
3. ``bench`` — the attention op (SSOG as a layer calls it, the probes, steering and field preparation included,
   its field kernels alone, and SDPA with each backend pinned: flash and cuDNN where available) and the whole d384
   ViT, SSOG against its dot twin, both replayed from CUDA graphs (no launch overhead for either; eager times
   beside them);
4. ``profile`` — one steered SSOG layer's forward + backward under ``torch.profiler``: its operations and kernels by
   device time (``gpu_profile_cuda.md``), to say where the time the benchmark measures goes;
5. ``results`` — rewrites the GPU section of ``benchmarks/RESULTS.md`` from what was measured.

A failed check is reported and the run goes on; the exit status is non-zero at the end if anything failed. Every
check and benchmark row is appended to ``gpu_check.jsonl`` in ``--out`` the moment it finishes, and the CSV tables
are rewritten after each row, so a time-out keeps what was measured. ``--budget-s`` bounds the whole run: items that
would not fit are skipped (and listed as skipped).

``--dry-run-cpu`` runs every step at tiny sizes on the CPU (kernels under Triton's interpreter) and, for the
device plumbing, every check case on the ``meta`` device (a CPU tensor mixed into a device computation raises
there as it would on CUDA); results go to ``--out``, never into ``benchmarks/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from unittest import mock

import torch
import torch.nn.functional as F

from ssog_core.checkpoint.files import atomic_write, replace_section
from ssog_core.nn.attention import SSOGAttention
from ssog_core.nn.config import SEED_CONFIGS
from ssog_core.nn.vit import ViT
from ssog_core.ops.env import interpreting
from ssog_core.testing.oracles import FieldLeaves, grads, oracle_apply, oracle_matrix

from common import rand_field, ssog_layer_op, write_csv

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

ALL = ("mu", "sigma", "lambda")
BEGIN, END = "<!-- GPU-RESULTS:BEGIN -->", "<!-- GPU-RESULTS:END -->"

# (batch, grid, heads, atoms, head_dim, taps, mode, dtype, rtol)
CASES = [
    (2, (7, 5), 3, 4, 16, ALL, "factorized", torch.float32, 2e-5),
    (2, (7, 5), 3, 4, 16, (), "factorized", torch.float32, 2e-5),
    (2, (5, 7), 1, 1, 24, ("mu",), "factorized", torch.float32, 2e-5),
    (2, (9, 1), 2, 8, 8, ("sigma", "lambda"), "factorized", torch.float32, 2e-5),
    (2, (7, 5), 3, 4, 16, ALL, "axial", torch.float32, 2e-5),
    (2, (7, 5), 3, 4, 16, (), "axial", torch.float32, 2e-5),
    (2, (14, 14), 6, 4, 64, ALL, "factorized", torch.bfloat16, 3e-2),
    (2, (14, 14), 6, 4, 64, (), "factorized", torch.bfloat16, 3e-2),
    (2, (14, 14), 6, 4, 64, ALL, "axial", torch.bfloat16, 3e-2),
    (2, (14, 14), 6, 4, 64, ALL, "factorized", torch.float16, 3e-2),
    (1, (32, 32), 2, 4, 128, ALL, "factorized", torch.bfloat16, 3e-2),
    (1, (32, 32), 2, 8, 64, ALL, "factorized", torch.float32, 5e-5),
    (1, (64, 64), 1, 4, 64, ALL, "factorized", torch.bfloat16, 3e-2),
    (1, (64, 48), 1, 2, 64, ALL, "axial", torch.float32, 5e-5),
]
GRIDS = {196: (14, 14), 1024: (32, 32), 4096: (64, 64)}


def _log(msg: str) -> None:
    print(msg, flush=True)


class Run:
    """Where results go and how much time is left: every record is appended to ``gpu_check.jsonl`` at once."""

    def __init__(self, out: Path, budget_s: float, device: torch.device) -> None:
        self.out, self.device = out, device
        self.deadline = time.monotonic() + budget_s
        out.mkdir(parents=True, exist_ok=True)
        self.log_path = out / "gpu_check.jsonl"
        self.log_path.write_text("")
        self.checks: list[dict] = []
        self.ops: list[dict] = []
        self.models: list[dict] = []
        self.jobs: list[dict] = []
        self.skipped: list[str] = []
        self.profiled: str | None = None

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def fits(self, what: str, need_s: float) -> bool:
        """Whether ``need_s`` seconds are left for ``what``; if not it is recorded as skipped."""
        if self.left() >= need_s:
            return True
        self.skipped.append(what)
        self.record("skipped", {"what": what, "left_s": round(self.left(), 1)})
        _log(f"[  skip] {what}: {self.left():.0f} s left of the budget, about {need_s:.0f} s needed")
        return False

    def record(self, kind: str, row: dict) -> None:
        with self.log_path.open("a") as f:
            f.write(json.dumps({"kind": kind, **row}, default=str) + "\n")


# ----------------------------------------------------------------------------------------------------------------
# check


def _rel_err(a: torch.Tensor, e: torch.Tensor) -> float:
    return ((a.double() - e).abs().max() / e.abs().max().clamp_min(1e-12)).item()


def _check_case(case, dev: torch.device) -> str | None:
    """One kernel configuration against the float64 definition; on ``meta`` only shapes, dtypes and devices."""
    from ssog_core.ops.ssog_triton import apply_triton

    b, grid, h, r, d, taps, mode, dtype, rtol = case
    leaves = FieldLeaves(b, grid, h, r, taps, device=dev)
    gh, gw = grid
    wide = torch.randn(b, gh * gw, h, 2 * d, dtype=torch.float64).to(dev)
    v = wide[..., d:].detach().requires_grad_(True)  # strided, like a slice of a fused projection
    dy = torch.randn(b, gh * gw, h, d, dtype=torch.float64).to(dev)
    inputs = [v, *leaves.tensors()]
    expected = oracle_apply(v.to(dtype).double(), leaves.field(), grid, mode)  # same rounded input
    want = grads(expected, inputs, dy)
    out = apply_triton(v.to(dtype), leaves.field(torch.float32), grid, mode)
    got = grads(out, inputs, dy)
    problems = []
    for name, a, e in zip(["output", "v", *leaves.names()], [out, *got], [expected, *want], strict=True):
        if a.shape != e.shape or a.device != e.device:
            problems.append(f"{name}: {tuple(a.shape)} on {a.device}, expected {tuple(e.shape)} on {e.device}")
        elif dev.type != "meta":
            tol = rtol if name == "output" else (10 * rtol if e.dim() else max(10 * rtol, 2e-3))
            err = _rel_err(a, e)
            if not torch.isfinite(a).all() or err > tol:
                problems.append(f"{name}: rel err {err:.2e} > {tol:.0e}")
    if out.dtype != dtype:
        problems.append(f"output dtype {out.dtype}, expected {dtype}")
    return "; ".join(problems) or None


def _check_dispatch_and_analysis(dev: torch.device) -> str | None:
    from ssog_core.ops.dispatch import choose_ssog_backend, ssog_apply

    problems = []
    for mode in ("factorized", "axial"):
        attn = SSOGAttention(24, 3, 4, field=mode, cold_init=False).to(dev).eval()
        torch.nn.init.normal_(attn.mu_delta.weight, std=0.3)
        x = torch.randn(2, 35, 24).to(dev)
        with torch.no_grad():
            field = attn.field_of(x, (7, 5))
            v = attn.v(x).view(2, 35, 3, 8)
            if choose_ssog_backend(v, field, (7, 5), mode) != "triton":
                problems.append(f"{mode}: {dev.type} tensors did not dispatch to triton")
            a = attn.attention_matrix(x, (7, 5))
            av = torch.einsum("bhnm,bmhd->bnhd", a, v)
            fused = ssog_apply(v, field, (7, 5), mode)
            ref = oracle_matrix(field, (7, 5), mode, batch=2)
            if dev.type == "meta":
                continue
            if not torch.allclose(av, fused, rtol=1e-4, atol=1e-5):
                problems.append(f"{mode}: A·V differs from the fused output by {(av - fused).abs().max():.2e}")
            if not torch.allclose(a.double(), ref, rtol=1e-5, atol=1e-6):
                problems.append(f"{mode}: attention_matrix differs from the definition")
    return "; ".join(problems) or None


# the float64 check's tolerance per dtype (bf16: autocast, as `train` runs on a GPU): the layer's output
# elementwise (rtol, atol) and each parameter's gradient relative to its largest float64 entry
COMPILE_TOLERANCE = {torch.float32: (1e-4, 1e-5, 1e-3), torch.bfloat16: (3e-2, 1e-2, 6e-2)}
COMPILE_LAYERS = (("factorized", ALL), ("axial", ALL), ("factorized", ()))


def check_compile(
    dev: torch.device, backend: str, dtype: torch.dtype = torch.float32, layers: tuple = COMPILE_LAYERS
) -> str | None:
    """``torch.compile(fullgraph=True)`` of an SSOG layer against the same layer eager, in ``dtype`` (bf16 under
    autocast): eager and compiled each against the float64 layer on the PyTorch path, and compiled against eager,
    each within the dtype's :data:`COMPILE_TOLERANCE` — the output elementwise, every parameter's gradient (the
    steering projections included: each starts away from zero, so that every parameter has a gradient to compare)
    relative to its largest float64 entry. A failure says which of the two is off the float64 answer, so one GPU
    run tells a compiler problem from a kernel one."""
    rtol, atol, gtol = COMPILE_TOLERANCE[dtype]
    problems = []
    for mode, taps in layers:
        torch._dynamo.reset()
        torch.manual_seed(0)
        attn = SSOGAttention(48, 3, 4, field=mode, steer=taps, cold_init=False).to(dev)
        for probe in ("mu_delta", "sigma_delta", "lambda_gate"):  # the steering projections of the taps
            if hasattr(attn, probe):
                torch.nn.init.normal_(getattr(attn, probe).weight, std=0.3)
                torch.nn.init.normal_(getattr(attn, probe).bias, std=0.3)
        exact = SSOGAttention(48, 3, 4, field=mode, steer=taps, cold_init=False, backend="torch").to(dev).double()
        exact.load_state_dict(attn.state_dict())
        x = torch.randn(4, 35, 48).to(dev)
        what = f"{mode} {taps} {str(dtype).removeprefix('torch.')}"

        def forward(module, inp):
            with torch.autocast(dev.type, dtype=dtype, enabled=dtype != torch.float32):
                return module(inp, (7, 5)).float()

        y64 = exact(x.double(), (7, 5))
        g64 = torch.autograd.grad(y64.square().mean(), list(exact.parameters()))
        names = [name for name, _ in attn.named_parameters()]
        for name, e in zip(names, g64, strict=True):
            if not e.abs().max() > 0:
                problems.append(f"{what}: the float64 grad of {name} is zero (nothing to compare)")
        got = {}
        for how, fn in (("eager", forward), ("compiled", torch.compile(forward, fullgraph=True, backend=backend))):
            y = fn(attn, x)
            grads = torch.autograd.grad(y.square().mean(), list(attn.parameters()))
            got[how] = (y.double(), [g.double() for g in grads])
        for how, (y, grads), (yr, refs) in (
            ("eager", got["eager"], (y64, g64)),
            ("compiled", got["compiled"], (y64, g64)),
            ("compiled vs eager", got["compiled"], got["eager"]),
        ):
            if not torch.allclose(y, yr, rtol=rtol, atol=atol):
                problems.append(f"{what}: {how} forward off by {(y - yr).abs().max():.2e}")
            for name, g, r, e in zip(names, grads, refs, g64, strict=True):
                rel = ((g - r).abs().max() / e.abs().max().clamp_min(1e-30)).item()
                if not rel <= gtol:
                    off = "" if how == "compiled vs eager" else " off float64"
                    problems.append(f"{what}: {how} grad of {name}{off} by {rel:.1e} of its largest")
    return "; ".join(problems) or None


def _check_graph_capture(dev: torch.device) -> str | None:
    """One steered SSOG layer, forward + backward, captured in a CUDA graph and replayed: a per-call host→device
    copy or a synchronisation makes the capture fail; the replay must reproduce the eager result."""
    torch.manual_seed(0)
    attn = SSOGAttention(384, 6, 4, cold_init=False).to(dev)
    torch.nn.init.normal_(attn.mu_delta.weight, std=0.05)
    x = torch.randn(8, 196, 384, device=dev)

    def step() -> torch.Tensor:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = attn(x, (14, 14))
        y.float().square().mean().backward()
        return y

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            attn.zero_grad(set_to_none=False)
            ref = step().detach().clone()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    attn.zero_grad(set_to_none=False)
    with torch.cuda.graph(graph):
        y = step()
    attn.zero_grad(set_to_none=False)
    graph.replay()
    torch.cuda.synchronize()
    err = (y.float() - ref.float()).abs().max().item()
    return None if err <= 1e-3 else f"graph replay differs from eager by {err:.2e}"


class _HereChannel:
    """A job's channel inside this process (``ssog_core.runtime.jobs.run_job`` asks it for progress and the stop
    flag)."""

    def report(self, done: int, total: int) -> None:
        pass

    def stopped(self) -> bool:
        return False


def _tensors(value: object, path: str = "") -> list[tuple[str, torch.Tensor]]:
    """Every number in a job's result with its path (tensors, and Python numbers as 0-d tensors; through
    dataclasses, dicts, lists and tuples), in a fixed order."""
    if isinstance(value, torch.Tensor):
        return [(path, value)]
    if isinstance(value, (bool, int, float)):
        return [(path, torch.tensor(value, dtype=torch.float64 if isinstance(value, float) else torch.int64))]
    if isinstance(value, dict):
        return [t for k in sorted(value, key=str) for t in _tensors(value[k], f"{path}[{k!r}]")]
    if isinstance(value, (list, tuple)):
        return [t for i, v in enumerate(value) for t in _tensors(v, f"{path}[{i}]")]
    if hasattr(value, "__dataclass_fields__"):
        return [t for name in value.__dataclass_fields__ for t in _tensors(getattr(value, name), f"{path}.{name}")]
    return []


JOB_TOLERANCE = 1e-3  # largest absolute difference accepted between a GPU worker's floats and a CPU worker's
# The fitted atoms' parameters (μ, σ, λ of an AtomFit) are reported, not held to JOB_TOLERANCE: the fit's objective is
# flat along some directions, so on a CPU a 1e-6 relative change of the weights already moves μ and σ by up to 4e-3
# cells while the fields, shares and the fit's loss move by under 1e-5 (tests/test_head_fields.py). The loss, which
# is compared, says whether the GPU's fit is as good.
FIT_PARAMETERS = re.compile(r"\.fits\[\d+\]\.(mu|sigma|lam)$")


def compare_results(here: object, there: object) -> dict | None:
    """A CPU worker's result against a GPU worker's: the largest float difference outside the fitted atom parameters
    and where it is, the integers that differ, the fitted atom parameters' largest difference (None: none in the
    result); None when the two differ in structure or shape or the GPU's is not back on the CPU."""
    a, b = _tensors(here), _tensors(there)
    if len(a) != len(b):
        return None
    pairs = [(p, x, y) for (p, x), (q, y) in zip(a, b, strict=True) if p == q]
    if len(pairs) != len(a) or any(x.shape != y.shape or y.device.type != "cpu" for _, x, y in pairs):
        return None
    floats = {p: (x.double() - y.double()).abs().max().item() for p, x, y in pairs if x.is_floating_point()}
    held = {path: d for path, d in floats.items() if not FIT_PARAMETERS.search(path)}
    where = max(held, key=held.get, default="")
    return {
        "max_abs_diff": held.get(where, 0.0),
        "where": where,
        "integers_differing": sum(int((x != y).sum()) for _, x, y in pairs if not x.is_floating_point()),
        "tensors": len(a),
        "fit_parameters_max_abs_diff": max((d for p, d in floats.items() if FIT_PARAMETERS.search(p)), default=None),
    }


def _check_jobs_on_gpu(run: Run) -> str | None:
    """The heavy jobs of the app on a GPU worker against a CPU worker with the same thread cap: every float in
    their results compared (largest absolute difference recorded), every integer or boolean counted where it
    differs (a prediction on a near-tie may flip)."""
    from ssog_core.checkpoint.format import load_checkpoint
    from ssog_core.interventions import heavy
    from ssog_core.interventions.result import InterventionRequest
    from ssog_core.runtime.jobs import ModelRef, run_job

    ref = ModelRef.of(ROOT / "checkpoints" / "matched_ssog_layouts.safetensors", load_checkpoint)
    edits = [{"op": "ablate_head", "layer": 1, "head": 0}, {"op": "close_gate", "layer": 0, "head": 1, "tap": "mu"}]
    device = "cuda" if run.device.type == "cuda" else "cpu"  # the dry run: the plumbing, CPU against CPU
    n = 64 if device == "cuda" else 4
    jobs = {
        f"validation edits ({n} images)": (heavy.intervene, (ref, InterventionRequest(edits, eval_images=n))),
        f"head importance ({n // 2} images, zero)": (heavy.importance, (ref, n // 2, "zero", None)),
        f"head fields ({n // 4} images, 2 atoms)": (heavy.head_fields, (ref, n // 4, None, 2)),
        f"accuracy ({n} images)": (heavy.accuracy, (ref, n)),
    }
    problems = []
    # the dry run's CPU worker computes as a CPU worker does, not through Triton's interpreter (hours for a sweep)
    plain = {} if device == "cuda" else {"TRITON_INTERPRET": "0"}
    for name, (fn, args) in jobs.items():
        with mock.patch.dict(os.environ, plain):
            here, there = (run_job(fn, args, {}, _HereChannel(), 1, d) for d in ("cpu", device))
        row = compare_results(here, there)
        if row is None:
            problems.append(f"{name}: the GPU result is not the CPU result's shape, or not back on the CPU")
            continue
        row = {"job": name, **row}
        run.record("job_on_gpu", row)
        run.jobs.append(row)
        worst, where, fit = row["max_abs_diff"], row["where"], row["fit_parameters_max_abs_diff"]
        _log(
            f"         {name}: largest float difference {worst:.2e} (in {where or '-'}), {row['integers_differing']} "
            f"integers differ ({row['tensors']} tensors)"
            + ("" if fit is None else f"; fitted atom parameters differ by up to {fit:.2e}")
        )
        if worst > JOB_TOLERANCE:
            problems.append(f"{name}: floats differ by up to {worst:.2e} in {where} (> {JOB_TOLERANCE:g})")
    return "; ".join(problems) or None


def step_check(run: Run, quick: bool = False) -> None:
    dev = run.device
    torch.set_float32_matmul_precision("highest")  # fp32 dots with input_precision="ieee"
    cases = [c for c in CASES if c[1][0] * c[1][1] <= 64] if quick else CASES
    checks: list[tuple[str, Callable[[], str | None], float]] = [
        (f"case {c[:7]} {str(c[7]).removeprefix('torch.')} on {dev.type}", lambda c=c: _check_case(c, dev), 8.0)
        for c in cases
    ]
    checks.append(("dispatch + analysis parity", lambda: _check_dispatch_and_analysis(dev), 10.0))
    if dev.type == "cuda":
        checks.append(("torch.compile (inductor)", lambda: check_compile(dev, "inductor"), 60.0))
        steered = COMPILE_LAYERS[:1]
        checks.append(
            ("torch.compile (inductor), bf16", lambda: check_compile(dev, "inductor", torch.bfloat16, steered), 30.0)
        )
        checks.append(("CUDA-graph capture of an SSOG layer fwd+bwd", lambda: _check_graph_capture(dev), 10.0))
        checks.append(("heavy jobs on a GPU worker against a CPU worker", lambda: _check_jobs_on_gpu(run), 90.0))
    else:  # the dry run: one backend that needs no C++ compiler, and every case's plumbing on the meta device
        quick = COMPILE_LAYERS[:1]
        checks.append(("torch.compile (aot_eager)", lambda: check_compile(dev, "aot_eager", layers=quick), 30.0))
        meta = torch.device("meta")
        checks += [
            (f"case {c[:7]} {str(c[7]).removeprefix('torch.')} on meta", lambda c=c: _check_case(c, meta), 1.0)
            for c in CASES
        ]
        checks.append(("dispatch + analysis parity on meta", lambda: _check_dispatch_and_analysis(meta), 1.0))
        checks.append(("heavy jobs through run_job (CPU against CPU)", lambda: _check_jobs_on_gpu(run), 30.0))
    for name, fn, need in checks:
        if not run.fits(f"check {name}", need):
            continue
        t0 = time.time()
        try:
            problem = fn()
        except Exception:
            problem = traceback.format_exc(limit=8)
        ok = problem is None
        row = {"check": name, "ok": ok, "seconds": round(time.time() - t0, 1), "problem": problem}
        run.checks.append(row)
        run.record("check", row)
        _log(f"[{'ok' if ok else 'FAILED':>6}] {name} ({row['seconds']} s){'' if ok else ': ' + problem}")
    failed = sum(not c["ok"] for c in run.checks)
    _log(f"{len(run.checks) - failed} of {len(run.checks)} checks passed")


# ----------------------------------------------------------------------------------------------------------------
# bench


def _sdpa_backends(dev: torch.device) -> dict[str, object]:
    from torch.nn.attention import SDPBackend

    if dev.type == "cuda":
        return {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}
    return {"math": SDPBackend.MATH}


def _timer(dev: torch.device, fn: Callable[[], object], graph: bool) -> tuple[float, str]:
    """Milliseconds per call of ``fn`` and how they were measured: a CUDA-graph replay (no launch overhead), CUDA
    events around eager calls, or (CPU) the wall clock."""
    if dev.type != "cuda":  # the dry run: one warm-up and one timed call
        fn()
        times = []
        for _ in range(1):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return statistics.median(times) * 1e3, "wall clock"
    import triton.testing

    if graph:
        try:
            return triton.testing.do_bench_cudagraph(fn, rep=60), "CUDA graph"
        except Exception as e:  # noted in the row: a capture failure is itself a finding
            _log(f"        CUDA-graph capture failed ({type(e).__name__}: {str(e).splitlines()[0][:120]}); events")
            torch.cuda.synchronize()
            return triton.testing.do_bench(fn, rep=60), f"events (graph capture failed: {type(e).__name__})"
    return triton.testing.do_bench(fn, rep=60), "events"


def _op_jobs(n: int, b: int, h: int, d: int, r: int, dtype: torch.dtype, dev: torch.device) -> dict[str, Callable]:
    """name → a closure that builds its inputs (once, outside the timing) and returns ``(fwd, fwdbwd)`` closures."""
    from torch.nn.attention import sdpa_kernel

    from ssog_core.ops import ssog_triton as ts
    from ssog_core.ops import triton_tiles

    grid = GRIDS.get(n, (int(n**0.5), int(n**0.5)))
    gh, gw = grid
    jobs: dict[str, Callable] = {}
    for name, backend in _sdpa_backends(dev).items():

        def sdpa(backend=backend):
            q, k, v = (torch.randn(b, h, n, d, device=dev, dtype=dtype, requires_grad=True) for _ in range(3))
            go = torch.randn(b, h, n, d, device=dev, dtype=dtype)

            def fwd():
                with sdpa_kernel(backend), torch.no_grad():
                    return F.scaled_dot_product_attention(q, k, v)

            def fwdbwd():
                with sdpa_kernel(backend):
                    y = F.scaled_dot_product_attention(q, k, v)
                return torch.autograd.grad(y, (q, k, v), go)

            return fwd, fwdbwd

        jobs[f"sdpa-{name}"] = sdpa

    def ssog_layer(steered: bool):
        def build():  # the op as a layer calls it: probes, steering and the field's preparation, both ways
            op, params = ssog_layer_op(b, grid, h, d, r, steered, dev, dtype, None)
            go = torch.randn(b, n, h, d, device=dev, dtype=dtype)

            def fwd():
                with torch.no_grad():
                    return op()

            def fwdbwd():
                return torch.autograd.grad(op(), params, go, allow_unused=True)

            return fwd, fwdbwd

        return build

    kept = {"STEERED_HALF_ROWS": triton_tiles.STEERED_HALF_ROWS, "FOUR_WARPS": triton_tiles.FOUR_WARPS}

    def ssog_kernel(**tiling: bool):
        flags = kept | tiling  # triton_tiles' switches, the forward and the backward launched under them

        def build():  # the field kernels alone, on a given per-token field (ssog::fwd / ssog::bwd)
            field = rand_field(b, grid, h, r, True, dev, grad=True)
            v = torch.randn(b, n, h, d, device=dev, dtype=dtype, requires_grad=True)
            go = torch.randn(b, n, h, d, device=dev, dtype=dtype)
            inputs = (v, field.mu, field.sigma, field.log_lam)

            def fwd():
                with torch.no_grad(), mock.patch.multiple(triton_tiles, **flags):
                    return ts.field_fwd(v, field.mu, field.sigma, field.log_lam, field.tau, gh, gw)[0]

            def fwdbwd():
                with mock.patch.multiple(triton_tiles, **flags):
                    y = ts.field_fwd(v, field.mu, field.sigma, field.log_lam, field.tau, gh, gw)[0]
                    return torch.autograd.grad(y, inputs, go)

            return fwd, fwdbwd

        return build

    jobs["ssog-steered op"] = ssog_layer(True)
    jobs["ssog-fixed op"] = ssog_layer(False)
    jobs["ssog-steered kernel"] = ssog_kernel()
    jobs["ssog-steered kernel, full rows"] = ssog_kernel(STEERED_HALF_ROWS=False)  # before STEERED_HALF_ROWS
    cfg = ts._config(gh, gw, d, r, False, dtype)
    if any(triton_tiles.kernel_warps(cfg, k, dtype.itemsize) == 4 for k in triton_tiles.FOUR_WARP_TILES):
        jobs["ssog-steered kernel, eight warps"] = ssog_kernel(FOUR_WARPS=False)  # where FOUR_WARPS changes a kernel
    return jobs


def _bench_ops(run: Run, tokens: list[int], b: int, h: int, d: int, dtype: torch.dtype) -> None:
    dev = run.device
    r = 4
    for n in tokens:
        if not run.fits(f"op bench at {n} tokens", 25.0 if dev.type == "cuda" else 5.0):
            continue
        for name, build in _op_jobs(n, b, h, d, r, dtype, dev).items():
            row: dict = {"tokens": n, "op": name, "batch": b, "heads": h, "head_dim": d, "atoms": r}
            fwd = fwdbwd = None  # the closures hold their inputs: released before the next row
            try:
                fwd, fwdbwd = build()
                row["fwd_ms"], row["timer"] = _timer(dev, fwd, graph=True)
                if fwdbwd is not None:
                    row["fwdbwd_ms"], _ = _timer(dev, fwdbwd, graph=True)
            except Exception as e:  # e.g. a pinned SDPA backend this GPU or dtype does not have
                row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}" if str(e) else type(e).__name__
            run.ops.append(row)
            run.record("op", row)
            _write_tables(run)
            _log(f"N={n:>5} {name:<20} " + ("ERROR " + row["error"] if "error" in row else
                 f"fwd {row['fwd_ms']:8.3f} ms" + (f"  fwd+bwd {row['fwdbwd_ms']:8.3f} ms" if "fwdbwd_ms" in row
                                                    else "") + f"  ({row['timer']})"))  # fmt: skip
            fwd = fwdbwd = None
            if dev.type == "cuda":
                torch.cuda.empty_cache()


def _bench_models(run: Run, imgs: list[int], b: int, dtype: torch.dtype, cfg_override: dict) -> None:
    """The d384 ViT, SSOG (all taps) against its dot twin: forward (inference mode) and a training step, each
    replayed from a CUDA graph (both models lose their launch overhead alike) and eager."""
    dev = run.device
    for img in imgs:
        if not run.fits(f"model bench at {img}²", 40.0 if dev.type == "cuda" else 10.0):
            continue
        for name in ("ssog", "dot"):
            cfg = SEED_CONFIGS[f"d384-{name}-all" if name == "ssog" else "d384-dot"][0]
            cfg = cfg.replace(img_size=(img, img), **cfg_override)
            tokens = (img // cfg.patch_size) ** 2
            row: dict = {"model": name, "img": img, "tokens": tokens, "batch": b, "dtype": str(dtype)[6:]}
            try:
                torch.manual_seed(0)
                model = ViT(cfg).to(dev)
                x = torch.rand(b, 3, img, img, device=dev)
                labels = torch.randint(0, cfg.num_classes, (b,), device=dev)

                def fwd(model=model, x=x):
                    with torch.inference_mode(), torch.autocast(dev.type, dtype=dtype, enabled=dtype != torch.float32):
                        return model(x)

                def train(model=model, x=x, labels=labels):
                    with torch.autocast(dev.type, dtype=dtype, enabled=dtype != torch.float32):
                        out = model(x)
                    torch.nn.functional.cross_entropy(out.float(), labels).backward()

                model.eval()
                row["fwd_ms"], row["fwd_timer"] = _timer(dev, fwd, graph=True)
                row["fwd_eager_ms"], _ = _timer(dev, fwd, graph=False)
                model.train()
                row["train_ms"], row["train_timer"] = _timer(dev, train, graph=True)
                row["train_eager_ms"], _ = _timer(dev, train, graph=False)
            except Exception as e:
                row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}" if str(e) else type(e).__name__
            run.models.append(row)
            run.record("model", row)
            _write_tables(run)
            _log(f"{name:>4} {img}² ({tokens} tokens) " + ("ERROR " + row["error"] if "error" in row else
                 f"fwd {row['fwd_ms']:.2f} ms (eager {row['fwd_eager_ms']:.2f})  train step {row['train_ms']:.2f} "
                 f"ms (eager {row['train_eager_ms']:.2f})"))  # fmt: skip
            if dev.type == "cuda":
                torch.cuda.empty_cache()


def _sdpa_ms(run: Run, n: int, key: str) -> float | None:
    rows = [r for r in run.ops if r["tokens"] == n and r["op"].startswith("sdpa") and key in r]
    return min(r[key] for r in rows) if rows else None


def _op_table(run: Run) -> list[str]:
    lines = [
        "| N | op | fwd ms | fwd+bwd ms | best SDPA / this, fwd | fwd+bwd | timer |",
        "|---:|---|---:|---:|---:|---:|---|",
    ]
    for r in run.ops:
        if "error" in r:
            lines.append(f"| {r['tokens']} | {r['op']} | — | — | | | not available: {r['error']} |")
            continue
        sf, sb = _sdpa_ms(run, r["tokens"], "fwd_ms"), _sdpa_ms(run, r["tokens"], "fwdbwd_ms")
        fb = r.get("fwdbwd_ms")
        ratio_f = f"{sf / r['fwd_ms']:.2f}" if sf else ""
        ratio_b = f"{sb / fb:.2f}" if sb and fb else ""
        fb_s = f"{fb:.3f}" if fb is not None else "—"
        lines.append(
            f"| {r['tokens']} | {r['op']} | {r['fwd_ms']:.3f} | {fb_s} | {ratio_f} | {ratio_b} | {r['timer']} |"
        )
    return lines


def _model_table(run: Run) -> list[str]:
    lines = [
        "| tokens | model | fwd ms (graph) | fwd ms (eager) | train step ms (graph) | train step ms (eager) | timer |",
        "|---:|---|---:|---:|---:|---:|---|",
    ]
    for r in run.models:
        if "error" in r:
            lines.append(f"| {r['tokens']} | {r['model']} | — | — | — | — | error: {r['error']} |")
        else:
            lines.append(
                f"| {r['tokens']} | {r['model']} | {r['fwd_ms']:.2f} | {r['fwd_eager_ms']:.2f} | {r['train_ms']:.2f} | "
                f"{r['train_eager_ms']:.2f} | {r['fwd_timer']} / {r['train_timer']} |"
            )
    return lines


def _write_tables(run: Run) -> None:
    """The CSVs and the markdown tables of everything measured so far (rewritten atomically after every row)."""
    for name, rows in (("gpu_ops", run.ops), ("gpu_model", run.models)):
        if rows:
            fields = sorted({k for row in rows for k in row}, key=lambda k: (k not in rows[0], k))
            write_csv(run.out / f"{name}_{run.device.type}.csv", rows, fields)
    text = "\n".join(["### Attention op", "", *_op_table(run), "", "### Whole model", "", *_model_table(run), ""])
    atomic_write(run.out / f"gpu_check_{run.device.type}.md", lambda tmp: Path(tmp).write_text(text))


def step_bench(run: Run, dry: bool) -> None:
    if dry:  # tiny shapes on the CPU: the same code, meaningless times
        _bench_ops(run, [16], 1, 1, 8, torch.float32)
        _bench_models(run, [32], 1, torch.float32, dict(depth=1, dim=48))
        return
    _bench_ops(run, [196, 1024, 4096], 64, 6, 64, torch.bfloat16)
    _bench_models(run, [224, 512], 64, torch.bfloat16, {})


PROFILED_STEPS = 5


def step_profile(run: Run, dry: bool) -> None:
    """Where a steered SSOG layer's time goes: its forward + backward (d384 = 6 heads × d64, R4, 1024 tokens, batch
    64, bf16 autocast; a tiny layer in the dry run) under ``torch.profiler``, the operations and kernels by their own
    device time per step (top 20) into ``gpu_profile_{device}.md``: the field kernels beside the steering kernels
    and the PyTorch operations around them."""
    from torch.profiler import ProfilerActivity, profile

    dev = run.device
    cuda = dev.type == "cuda"
    if not run.fits("profile of one steered layer", 20.0 if cuda else 5.0):
        return
    b, grid, dim, heads = (1, (4, 4), 48, 3) if dry else (64, (32, 32), 384, 6)
    attn = SSOGAttention(dim, heads, 4, steer=ALL, cold_init=False).to(dev)
    x = torch.randn(b, grid[0] * grid[1], dim, device=dev, requires_grad=True)

    def step() -> None:
        with torch.autocast(dev.type, torch.bfloat16, enabled=cuda):
            y = attn(x, grid)
        y.float().square().mean().backward()

    for _ in range(3):  # compiles the kernels, warms the allocator
        step()
    if cuda:
        torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]) as prof:
        for _ in range(PROFILED_STEPS):
            step()
        if cuda:
            torch.cuda.synchronize()
    own = "self_device_time_total" if cuda else "self_cpu_time_total"
    events = sorted(
        (e for e in prof.key_averages() if getattr(e, own) > 0), key=lambda e: getattr(e, own), reverse=True
    )
    total = sum(getattr(e, own) for e in events)
    per_step = PROFILED_STEPS * 1e3  # microseconds over all steps → milliseconds per step
    rows = [
        {"name": e.key[:90], "calls_per_step": e.count / PROFILED_STEPS, "ms_per_step": getattr(e, own) / per_step,
         "share": getattr(e, own) / total}
        for e in events[:20]
    ]  # fmt: skip
    for row in rows:
        run.record("profile", row)
    shape = f"{heads} heads × d{dim // heads}, R4, {grid[0] * grid[1]} tokens, batch {b}"
    lines = [
        f"# One steered SSOG layer, forward + backward ({shape}{', bf16 autocast' if cuda else ''}), {dev.type}",
        "",
        f"`python benchmarks/gpu_check.py` (profile step), {_environment(dev)}; own {'device' if cuda else 'CPU'} time "
        f"per step, mean of {PROFILED_STEPS} steps; all operations together: {total / 1e3 / PROFILED_STEPS:.3f} ms.",
        "",
        "| operation or kernel | calls per step | ms per step | share |",
        "|---|---:|---:|---:|",
        *(f"| `{r['name']}` | {r['calls_per_step']:g} | {r['ms_per_step']:.4f} | {r['share']:.1%} |" for r in rows),
    ]
    path = run.out / f"gpu_profile_{dev.type}.md"
    atomic_write(path, lambda tmp: Path(tmp).write_text("\n".join(lines) + "\n"))
    run.profiled = path.name
    _log(f"profile: {len(rows)} rows into {path} ({total / 1e3 / PROFILED_STEPS:.3f} ms per step)")


# ----------------------------------------------------------------------------------------------------------------
# results


def _environment(dev: torch.device) -> str:
    import triton

    versions = f"torch {torch.__version__}, triton {triton.__version__}"
    if dev.type != "cuda":
        return f"CPU dry run ({dev.type}), {versions}"
    props = torch.cuda.get_device_properties(dev)
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else "n/a"
    return (
        f"{props.name} ({props.total_memory / 2**30:.0f} GiB, sm_{props.major}{props.minor}); {versions}, "
        f"CUDA {torch.version.cuda}, cuDNN {cudnn}"
    )


def _job_summary(job: dict) -> str:
    fit = job.get("fit_parameters_max_abs_diff")
    return f"{job['job']} {job['max_abs_diff']:.1e}, {job['integers_differing']}" + (
        "" if fit is None else f" (fitted atom parameters, not held to {JOB_TOLERANCE:g}: {fit:.1e} cells)"
    )


def step_results(run: Run, command: str, results: Path, dry: bool) -> None:
    failed = [c for c in run.checks if not c["ok"]]
    checks = (
        f"{len(run.checks) - len(failed)} of {len(run.checks)} checks passed"
        + ("" if not failed else "; FAILED: " + "; ".join(f"{c['check']}: {c['problem'][:200]}" for c in failed))
        if run.checks
        else "not run"
    )
    section = [
        BEGIN,
        "## GPU",
        "",
        f"* machine: {_environment(run.device)}",
        f"* date: {datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}",
        f"* command: `{command}`",
        f"* correctness (`gpu_check.py` check step, float64 definition): {checks}",
        f"* skipped for the time budget: {', '.join(run.skipped) or 'nothing'}",
        "* where one steered layer's time goes: " + (f"`results/{run.profiled}`" if run.profiled else "not profiled"),
        "* heavy jobs on a GPU worker against a CPU worker (largest float difference; integers that differ): "
        + ("; ".join(_job_summary(j) for j in run.jobs) or "not run"),
        "* timing: kernels and models replayed from CUDA graphs (the timer column says so; `events` means eager calls "
        "timed with CUDA events); SDPA pinned to one backend per row; SSOG `op` rows time the op as a layer calls "
        "it (probe GEMM, steering and field preparation included, both ways), `kernel` rows the field kernels alone",
        "",
        "### Attention op: "
        + ("1 head × d8, R4, batch 1, fp32 (dry run)" if dry else "6 heads × d64, R4, batch 64, bf16"),
        "",
        *_op_table(run),
        "",
        "### Whole "
        + ("d48 ViT, 1 layer, batch 1, fp32 (dry run)" if dry else "d384 ViT, batch 64, bf16 autocast")
        + " (SSOG: all taps, R4; dot twin)",
        "",
        *_model_table(run),
        END,
    ]
    if not results.exists():
        atomic_write(results, lambda tmp: Path(tmp).write_text("# Benchmark results\n"))
    replace_section(results, (BEGIN, END), "\n".join(section))
    _log(f"wrote the GPU section of {results}")


def step_compile() -> None:
    major, minor = torch.cuda.get_device_capability()
    cmd = [sys.executable, "-m", "ssog_core.ops.triton_compile", "--arch", str(major * 10 + minor)]
    _log("$ " + " ".join(cmd))
    if subprocess.run(cmd, cwd=ROOT).returncode:
        _log("[FAILED] compile report")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", nargs="+", default=["check", "bench", "profile", "results"],
                    choices=["compile", "check", "bench", "profile", "results"])  # fmt: skip
    ap.add_argument("--out", type=Path, default=HERE / "results")
    ap.add_argument("--budget-s", type=float, default=480.0, help="wall-clock budget of the whole run (default 8 min)")
    ap.add_argument("--dry-run-cpu", action="store_true",
                    help="every step at tiny sizes on the CPU and every check case on the meta device (needs "
                         "TRITON_INTERPRET=1); writes only into --out")  # fmt: skip
    args = ap.parse_args(argv)
    command = " ".join(["python benchmarks/gpu_check.py", *(sys.argv[1:] if argv is None else argv)])
    if args.dry_run_cpu:
        if not interpreting():
            ap.error("--dry-run-cpu needs TRITON_INTERPRET=1 (the kernels run under Triton's interpreter)")
        if args.out.resolve() == (HERE / "results").resolve():
            ap.error("--dry-run-cpu writes its results into --out: pass a scratch folder")
        dev = torch.device("cpu")
    else:
        if not torch.cuda.is_available():
            ap.error("gpu_check needs a CUDA device (torch.cuda.is_available() is False); see --dry-run-cpu")
        dev = torch.device("cuda")
        _log(f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}, CUDA {torch.version.cuda}")
    run = Run(args.out, args.budget_s, dev)
    for step in args.steps:
        t0 = time.time()
        _log(f"== {step} ({run.left():.0f} s of the budget left)")
        try:
            if step == "compile":
                step_compile()
            elif step == "check":
                step_check(run, quick=args.dry_run_cpu)
            elif step == "bench":
                step_bench(run, args.dry_run_cpu)
            elif step == "profile":
                step_profile(run, args.dry_run_cpu)
            else:
                results = args.out / "RESULTS.md" if args.dry_run_cpu else HERE / "RESULTS.md"
                step_results(run, command, results, args.dry_run_cpu)
        except Exception:  # a broken step must not cost the others (or what was measured)
            run.checks.append({"check": f"step {step}", "ok": False, "problem": traceback.format_exc(limit=8)})
            _log(f"[FAILED] step {step}:\n{traceback.format_exc(limit=8)}")
        _log(f"== {step} done in {time.time() - t0:.0f} s")
    failed = [c["check"] for c in run.checks if not c["ok"]]
    if failed:
        _log(f"gpu_check: {len(failed)} FAILED: {failed}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
