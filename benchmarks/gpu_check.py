"""The GPU check: prove the fused kernels right on the device, then benchmark them, then record the results.

    python benchmarks/gpu_check.py                  # check, bench, results (Triton JIT compiles dominate the time)
    python benchmarks/gpu_check.py --steps check    # only the correctness checks
    python benchmarks/gpu_check.py --steps bench results

Steps (each fails loudly: a non-zero exit and the reason on stderr):

1. ``compile`` (not run by default) — register / shared-memory report of every kernel for this GPU's architecture;
2. ``check`` — every kernel (steered factorized with each kind of tap subset, fixed, axial; fp32 with
   ``input_precision="ieee"`` and bf16/fp16; odd and benchmark-sized grids; R 1, 4, 8; head_dim 16–128;
   strided values) against the float64 definition on the GPU, forward and all gradients; dispatch picks
   Triton for CUDA tensors; the analysis path's A·V equals the fused output; ``torch.compile(fullgraph=True)``
   (Inductor) forward and backward through the custom ops;
3. ``bench`` — ``benchmarks/attention.py`` and ``benchmarks/model.py`` on the GPU;
4. ``results`` — rewrites the GPU section of ``benchmarks/RESULTS.md`` (GPU, versions, date, command, tables).
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import subprocess
import sys
import time
import traceback
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from ssog_core.attention import SSOGAttention  # noqa: E402
from ssog_core.checkpoint import atomic_write  # noqa: E402
from tests.ops_reference import FieldLeaves, grads, reference_apply, reference_matrix  # noqa: E402

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


DEVICE = torch.device("cuda")
COMPILE_BACKEND = "inductor"


def _log(msg: str) -> None:
    print(msg, flush=True)


def _check_case(case) -> str | None:
    from ssog_core.ops.triton_ssog import apply_triton

    b, grid, h, r, d, taps, mode, dtype, rtol = case
    dev = DEVICE
    leaves = FieldLeaves(b, grid, h, r, taps)
    for k, t in leaves.leaves.items():
        leaves.leaves[k] = t.detach().to(dev).requires_grad_(True)
    gh, gw = grid
    wide = torch.randn(b, gh * gw, h, 2 * d, dtype=torch.float64, device=dev)
    v = wide[..., d:].detach().requires_grad_(True)  # strided, like a slice of a fused projection
    dy = torch.randn(b, gh * gw, h, d, dtype=torch.float64, device=dev)
    inputs = [v, *leaves.tensors()]
    expected = reference_apply(v.to(dtype).double(), leaves.field(), grid, mode)  # same rounded input
    want = grads(expected, inputs, dy)
    out = apply_triton(v.to(dtype), leaves.field(torch.float32), grid, mode)
    got = grads(out, inputs, dy)
    problems = []
    for name, a, e in zip(["output", "v", *leaves.names()], [out, *got], [expected, *want], strict=True):
        tol = rtol if name == "output" else (10 * rtol if e.dim() else max(10 * rtol, 2e-3))
        err = ((a.double() - e).abs().max() / e.abs().max().clamp_min(1e-12)).item()
        if not torch.isfinite(a).all() or err > tol:
            problems.append(f"{name}: rel err {err:.2e} > {tol:.0e}")
    return "; ".join(problems) or None


def _check_dispatch_and_analysis() -> str | None:
    from ssog_core.ops.dispatch import choose_backend, ssog_apply

    dev = DEVICE
    problems = []
    for mode in ("factorized", "axial"):
        attn = SSOGAttention(24, 3, 4, field=mode, cold_init=False).to(dev).eval()
        torch.nn.init.normal_(attn.mu_delta.weight, std=0.3)
        x = torch.randn(2, 35, 24, device=dev)
        with torch.no_grad():
            field = attn.field(x, (7, 5))
            v = attn.v(x).view(2, 35, 3, 8)
            if choose_backend(v, field, (7, 5), mode) != "triton":
                problems.append(f"{mode}: {dev.type} tensors did not dispatch to triton")
            a = attn.attention_matrix(x, (7, 5))
            av = torch.einsum("bhnm,bmhd->bnhd", a, v)
            fused = ssog_apply(v, field, (7, 5), mode)
            if not torch.allclose(av, fused, rtol=1e-4, atol=1e-5):
                problems.append(f"{mode}: A·V differs from the fused output by {(av - fused).abs().max():.2e}")
            ref = reference_matrix(field, (7, 5), mode, batch=2)
            if not torch.allclose(a.double(), ref, rtol=1e-5, atol=1e-6):
                problems.append(f"{mode}: attention_matrix differs from the definition")
    return "; ".join(problems) or None


def _check_compile() -> str | None:
    dev = DEVICE
    problems = []
    for mode, taps in (("factorized", ALL), ("axial", ALL), ("factorized", ())):
        torch._dynamo.reset()
        attn = SSOGAttention(48, 3, 4, field=mode, steer=taps, cold_init=False).to(dev)
        if taps:
            torch.nn.init.normal_(attn.mu_delta.weight, std=0.3)
        x = torch.randn(4, 35, 48, device=dev)

        def loss(module, inp):
            return module(inp, (7, 5)).square().mean()

        eager = loss(attn, x)
        g_eager = torch.autograd.grad(eager, list(attn.parameters()))
        compiled = torch.compile(loss, fullgraph=True, backend=COMPILE_BACKEND)
        out = compiled(attn, x)
        g_comp = torch.autograd.grad(out, list(attn.parameters()))
        if not torch.allclose(out, eager, rtol=1e-4, atol=1e-5):
            problems.append(f"{mode} {taps}: compiled forward differs")
        names = [n for n, _ in attn.named_parameters()]
        for p, a, e in zip(names, g_comp, g_eager, strict=True):
            if not torch.allclose(a, e, rtol=1e-3, atol=1e-5):
                problems.append(f"{mode} {taps}: compiled grad of {p} differs by {(a - e).abs().max():.2e}")
    return "; ".join(problems) or None


def step_compile() -> None:
    major, minor = torch.cuda.get_device_capability()
    arch = str(major * 10 + minor)
    _run([sys.executable, "-m", "ssog_core.ops.triton_compile", "--arch", arch], "compile report")


def step_check(quick: bool = False) -> None:
    torch.set_float32_matmul_precision("highest")  # fp32 dots with input_precision="ieee"
    failures = []
    cases = [c for c in CASES if c[1][0] * c[1][1] <= 64] if quick else CASES
    checks = [(f"case {c[:7]} {str(c[7]).removeprefix('torch.')}", lambda c=c: _check_case(c)) for c in cases]
    checks += [("dispatch + analysis parity", _check_dispatch_and_analysis), ("torch.compile", _check_compile)]
    for name, fn in checks:
        t0 = time.time()
        try:
            problem = fn()
        except Exception:
            problem = traceback.format_exc(limit=6)
        status = "ok" if problem is None else "FAILED"
        _log(f"[{status:>6}] {name} ({time.time() - t0:.1f} s){'' if problem is None else ': ' + problem}")
        if problem is not None:
            failures.append(name)
    if failures:
        sys.exit(f"GPU check FAILED for {len(failures)} case(s): {failures}")
    _log(f"all {len(checks)} GPU checks passed")


def _run(cmd: list[str], what: str) -> None:
    _log("$ " + " ".join(cmd))
    proc = subprocess.run(cmd, cwd=ROOT)
    if proc.returncode:
        sys.exit(f"{what} FAILED (exit {proc.returncode}): {' '.join(cmd)}")


def step_bench(out: Path) -> None:
    _run([sys.executable, str(HERE / "attention.py"), "--device", "cuda", "--out", str(out)], "attention benchmark")
    _run(
        [sys.executable, str(HERE / "model.py"), "--device", "cuda", "--dtype", "bfloat16", "--batch", "64",
         "--rounds", "20", "--out", str(out)],
        "model benchmark",
    )  # fmt: skip


def step_results(out: Path, command: str) -> None:
    import triton

    for name in ("attention_cuda.md", "model_cuda.md"):
        if not (out / name).exists():
            sys.exit(f"results FAILED: {out / name} is missing (run the bench step first)")
    props = torch.cuda.get_device_properties(0)
    section = "\n".join(
        [
            BEGIN,
            "## GPU",
            "",
            f"* GPU: {props.name} ({props.total_memory / 2**30:.0f} GiB, sm_{props.major}{props.minor}); "
            f"torch {torch.__version__}, CUDA {torch.version.cuda}, triton {triton.__version__}",
            f"* date: {datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}",
            f"* command: `{command}`",
            "* correctness: every case of `benchmarks/gpu_check.py` passed on this GPU (forward and all gradients "
            "against the float64 definition)",
            "",
            "### Attention op (`benchmarks/attention.py --device cuda`)",
            "",
            (out / "attention_cuda.md").read_text().strip(),
            "",
            "![latency vs tokens](results/attention_cuda.png)",
            "",
            "### Whole model (`benchmarks/model.py --device cuda --dtype bfloat16 --batch 64`)",
            "",
            (out / "model_cuda.md").read_text().strip(),
            END,
        ]
    )
    results = HERE / "RESULTS.md"
    text = results.read_text() if results.exists() else f"# Benchmark results\n\n{BEGIN}\n{END}\n"
    if BEGIN not in text:
        text += f"\n{BEGIN}\n{END}\n"
    text = re.sub(re.escape(BEGIN) + ".*?" + re.escape(END), lambda _: section, text, flags=re.S)
    atomic_write(results, lambda tmp: Path(tmp).write_text(text))
    _log(f"wrote the GPU section of {results}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", nargs="+", default=["check", "bench", "results"],
                    choices=["compile", "check", "bench", "results"])  # fmt: skip
    ap.add_argument("--out", type=Path, default=HERE / "results")
    ap.add_argument(
        "--dry-run-cpu",
        action="store_true",
        help="run the check step's small cases on the CPU (needs TRITON_INTERPRET=1): tests this script",
    )
    args = ap.parse_args(argv)
    if args.dry_run_cpu:
        global DEVICE, COMPILE_BACKEND
        if os.environ.get("TRITON_INTERPRET") != "1" or args.steps != ["check"]:
            sys.exit("--dry-run-cpu runs only `--steps check`, with TRITON_INTERPRET=1 set")
        DEVICE, COMPILE_BACKEND = torch.device("cpu"), "aot_eager"
        step_check(quick=True)
        return
    if not torch.cuda.is_available():
        sys.exit("gpu_check needs a CUDA device; torch.cuda.is_available() is False")
    command = "python benchmarks/gpu_check.py" + ("" if argv is None and len(sys.argv) == 1 else " " + " ".join(
        sys.argv[1:] if argv is None else argv))  # fmt: skip
    _log(f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}, CUDA {torch.version.cuda}")
    for step in args.steps:
        t0 = time.time()
        _log(f"== {step}")
        if step == "compile":
            step_compile()
        elif step == "check":
            step_check()
        elif step == "bench":
            step_bench(args.out)
        else:
            step_results(args.out, command)
        _log(f"== {step} done in {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
