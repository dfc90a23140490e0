"""RBF attention vs dot-product SDPA: latency and peak memory against sequence length.

    python benchmarks/rbf.py                 # CPU section (always) and GPU section (when CUDA is present)
    python benchmarks/rbf.py --device cpu --lengths 256,1024,4096

Methods (q, k, v of shape (B, H, N, D)):

* ``sdpa``        — ``F.scaled_dot_product_attention`` (dot product; the fused kernel of the device);
* ``sdpa-qknorm`` — the same after RMS-normalising q and k (the usual cure for key-magnitude dominance; GPU only);
* ``rbf-torch``   — :func:`ssog_core.ops.rbf_torch.rbf_attention_torch`: SDPA on augmented vectors, no N × N tensor;
* ``rbf-triton``  — the fused Triton kernels (GPU only);
* ``rbf-dense``   — the naive formula with an explicit N × N distance matrix (the memory baseline; CPU only, N ≤ 2048).

Latency: median over interleaved repeats on CPU, ``triton.testing.do_bench`` on GPU; ``fwd+bwd`` is one
forward and one backward pass. Peak memory: on GPU ``torch.cuda.max_memory_allocated`` above the inputs; on
CPU the growth of the process's peak resident set during one forward + backward, measured in a fresh child
process per point (so it includes allocator slack; compare methods, not absolute bytes). Before timing on GPU
the script checks the Triton kernels against the float64 oracle (forward and gradients) and prints the errors.

Writes ``benchmarks/results/rbf_{cpu,gpu}.json`` and ``.png``, and prints Markdown tables for RESULTS_RBF.md.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from ssog_core.ops.rbf_torch import rbf_attention_torch, rbf_gamma

ROOT = Path(__file__).resolve().parents[1]

RESULTS = ROOT / "benchmarks" / "results"


def rbf_dense(q, k, v, causal):
    """softmax(−γ‖q − k‖²) v with the full distance matrix (what torch.cdist-style code does)."""
    logits = -rbf_gamma(q.shape[-1]) * torch.cdist(q, k).square()
    if causal:
        n = q.shape[-2]
        logits = logits.masked_fill(torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return torch.softmax(logits, -1) @ v


def sdpa(q, k, v, causal):
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


def sdpa_qknorm(q, k, v, causal):
    d = q.shape[-1]
    return F.scaled_dot_product_attention(F.rms_norm(q, (d,)), F.rms_norm(k, (d,)), v, is_causal=causal)


def rbf_triton(q, k, v, causal):
    from ssog_core.ops.rbf_triton import rbf_attention_triton

    return rbf_attention_triton(q, k, v, causal)


METHODS = {"sdpa": sdpa, "sdpa-qknorm": sdpa_qknorm, "rbf-torch": rbf_attention_torch, "rbf-triton": rbf_triton}
METHODS["rbf-dense"] = rbf_dense
CPU_METHODS = ("sdpa", "rbf-torch", "rbf-dense")
GPU_METHODS = ("sdpa", "sdpa-qknorm", "rbf-torch", "rbf-triton")


def inputs(b, h, n, d, dtype, device, grad=True):
    torch.manual_seed(0)
    return [torch.randn(b, h, n, d, dtype=dtype, device=device, requires_grad=grad) for _ in range(3)]


def fwd_flops(b, h, n, d, causal) -> float:
    """Matmul FLOPs of one forward (FlashAttention's convention: 4·B·H·N²·D, halved when causal)."""
    return 4 * b * h * n * n * d / (2 if causal else 1)


# --- CPU -------------------------------------------------------------------------------------------------


def cpu_times(fns: dict, reps: int) -> dict[str, float]:
    """Median milliseconds of each callable, measured interleaved (one call of each per round) so that a
    busy machine's drifting load hits every method alike."""
    for fn in fns.values():
        fn()  # warm-up
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            t = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t)
    return {name: statistics.median(ts) * 1e3 for name, ts in times.items()}


def _status_mib(key: str) -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) / 1024 for line in f if line.startswith(key))


def cpu_peak_child(method: str, b: int, h: int, n: int, d: int, causal: bool) -> None:
    """Child process: print the peak-RSS growth (MiB) of one forward + backward of ``method``.

    Linux: the high-water mark is reset (``/proc/self/clear_refs``) just before the call, so import-time
    peaks do not hide it; elsewhere the lifetime peak (``ru_maxrss``) is used.
    """
    fn = METHODS[method]
    small = inputs(b, h, 64, d, torch.float32, "cpu")
    fn(*small, causal).sum().backward()  # load kernels and thread pools before measuring
    q, k, v = inputs(b, h, n, d, torch.float32, "cpu")
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        before = _status_mib("VmRSS:")
        fn(q, k, v, causal).sum().backward()
        peak = _status_mib("VmHWM:") - before
    except OSError:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        fn(q, k, v, causal).sum().backward()
        peak = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    print(json.dumps({"peak_mib": peak}))


def cpu_peak(method: str, b: int, h: int, n: int, d: int, causal: bool) -> float:
    cmd = [sys.executable, __file__, "--child", f"{method},{b},{h},{n},{d},{int(causal)}"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=600).stdout
    return json.loads(out.strip().splitlines()[-1])["peak_mib"]


def cpu_calls(fn, q, k, v, causal: bool):
    """A forward-only and a forward + backward callable for one method."""

    def forward():
        with torch.no_grad():
            fn(q, k, v, causal)

    def step():
        q.grad = k.grad = v.grad = None
        fn(q, k, v, causal).sum().backward()

    return forward, step


def run_cpu(lengths, b, h, d, reps) -> list[dict]:
    rows = []
    for causal in (False, True):
        for n in lengths:
            methods = [m for m in CPU_METHODS if not (m == "rbf-dense" and n > 2048)]
            calls = {m: cpu_calls(METHODS[m], *inputs(b, h, n, d, torch.float32, "cpu"), causal) for m in methods}
            fwd = cpu_times({m: c[0] for m, c in calls.items()}, reps)
            both = cpu_times({m: c[1] for m, c in calls.items()}, reps)
            for m in methods:
                peak = cpu_peak(m, b, h, n, d, causal)
                row = dict(device="cpu", method=m, causal=causal, n=n, fwd_ms=fwd[m], fwd_bwd_ms=both[m], peak_mib=peak)
                rows.append(row)
                print(json.dumps(row), flush=True)
    return rows


# --- GPU -------------------------------------------------------------------------------------------------


def gpu_check(dtype) -> list[str]:
    """The fused kernels against the float64 oracle on GPU: relative errors of o, dq, dk, dv."""
    from ssog_core.ops.rbf_triton import rbf_attention_triton

    lines = []
    for n, d, causal in ((1000, 64, True), (1023, 64, False), (777, 32, True), (513, 128, False)):
        q, k, v = inputs(2, 4, n, d, dtype, "cuda")
        do = torch.randn_like(q)
        out = rbf_attention_triton(q, k, v, causal)
        got = [out, *torch.autograd.grad(out, (q, k, v), do)]
        qd, kd, vd = (t.detach().double().requires_grad_() for t in (q, k, v))  # the same rounded inputs
        ref_out = rbf_attention_torch(qd, kd, vd, causal)
        ref = [ref_out, *torch.autograd.grad(ref_out, (qd, kd, vd), do.double())]
        errs = [float((g.double() - r).abs().max() / r.abs().max()) for g, r in zip(got, ref, strict=True)]
        case = f"{str(dtype)[6:]} N{n} D{d} {'causal' if causal else 'full'}"
        lines.append(f"{case}: o/dq/dk/dv rel err " + " ".join(f"{e:.1e}" for e in errs))
    return lines


def gpu_point(fn, q, k, v, causal: bool) -> tuple[float, float, float]:
    """do_bench forward and forward + backward milliseconds, and the peak MiB above the inputs."""
    from triton.testing import do_bench

    do = torch.randn_like(q)

    def forward():
        with torch.no_grad():
            fn(q, k, v, causal)

    def step():
        fn(q, k, v, causal).backward(do)

    fwd, both = do_bench(forward), do_bench(step, grad_to_none=[q, k, v])
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    step()
    torch.cuda.synchronize()
    return fwd, both, (torch.cuda.max_memory_allocated() - base) / 2**20


def run_gpu(lengths, b, h, d, dtype) -> list[dict]:
    rows = []
    for causal in (False, True):
        for n in lengths:
            for method in GPU_METHODS:
                try:
                    fwd, both, peak = gpu_point(METHODS[method], *inputs(b, h, n, d, dtype, "cuda"), causal)
                except torch.OutOfMemoryError:
                    fwd = both = peak = float("nan")
                torch.cuda.empty_cache()
                flops = fwd_flops(b, h, n, d, causal)
                row = dict(
                    device=torch.cuda.get_device_name(),
                    method=method,
                    causal=causal,
                    n=n,
                    fwd_ms=fwd,
                    fwd_bwd_ms=both,
                    peak_mib=peak,
                    fwd_tflops=flops / fwd / 1e9,
                    fwd_bwd_tflops=3.5 * flops / both / 1e9,  # backward = 2.5 × forward FLOPs
                )
                rows.append(row)
                print(json.dumps(row), flush=True)
    return rows


# --- output ----------------------------------------------------------------------------------------------


def markdown(rows: list[dict], title: str) -> str:
    methods = list(dict.fromkeys(r["method"] for r in rows))
    out = [f"### {title}", ""]
    for causal in (False, True):
        sel = [r for r in rows if r["causal"] == causal]
        if not sel:
            continue
        out += [f"**{'causal' if causal else 'non-causal'}** — fwd ms / fwd+bwd ms / peak MiB", ""]
        out.append("| N | " + " | ".join(methods) + " |")
        out.append("|---:|" + "---:|" * len(methods))
        for n in sorted({r["n"] for r in sel}):
            cells = []
            for m in methods:
                r = next((r for r in sel if r["n"] == n and r["method"] == m), None)
                cells.append("—" if r is None else f"{r['fwd_ms']:.2f} / {r['fwd_bwd_ms']:.2f} / {r['peak_mib']:.0f}")
            out.append(f"| {n} | " + " | ".join(cells) + " |")
        out.append("")
    return "\n".join(out)


def plot(rows: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    panels = (("fwd_ms", "forward (ms)"), ("fwd_bwd_ms", "fwd+bwd (ms)"), ("peak_mib", "peak MiB"))
    for ax, (key, label) in zip(axes, panels, strict=True):
        for i, m in enumerate(dict.fromkeys(r["method"] for r in rows)):
            for causal, style in ((False, "-o"), (True, "--s")):
                sel = sorted((r for r in rows if r["method"] == m and r["causal"] == causal), key=lambda r: r["n"])
                if sel:
                    ax.plot([r["n"] for r in sel], [r[key] for r in sel], style, color=f"C{i}", ms=3,
                            label=f"{m}{' causal' if causal else ''}")  # fmt: skip
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length N")
        ax.set_title(label)
        ax.grid(alpha=0.3, which="both")
    axes[0].legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def save(rows: list[dict], name: str, title: str) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(rows, indent=1))
    plot(rows, RESULTS / f"{name}.png", title)
    print("\n" + markdown(rows, title) + f"\nwrote {RESULTS / name}.json and .png\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=("all", "cpu", "cuda"), default="all")
    ap.add_argument("--lengths", help="comma-separated N (default: CPU 256..4096, GPU 512..16384)")
    ap.add_argument("--batch", type=int, help="B (default: CPU 1, GPU 4)")
    ap.add_argument("--heads", type=int, help="H (default: CPU 4, GPU 8)")
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--reps", type=int, default=5, help="CPU repeats per point")
    ap.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16", help="GPU dtype")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        method, *nums = args.child.split(",")
        b, h, n, d, causal = (int(x) for x in nums)
        cpu_peak_child(method, b, h, n, d, bool(causal))
        return

    def parse(s: str | None) -> list[int] | None:
        return [int(x) for x in s.split(",")] if s else None

    d = args.head_dim
    if args.device in ("all", "cpu"):
        lengths = parse(args.lengths) or [256, 512, 1024, 2048, 4096]
        b, h = args.batch or 1, args.heads or 4
        title = f"CPU ({torch.get_num_threads()} threads), fp32, B={b} H={h} D={d}"
        save(run_cpu(lengths, b, h, d, args.reps), "rbf_cpu", title)
    if args.device in ("all", "cuda"):
        if not torch.cuda.is_available():
            if args.device == "cuda":
                sys.exit("no CUDA device: the GPU section needs one")
            print("no CUDA device: GPU section skipped")
            return
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
        print("\n".join(["correctness of the fused kernels vs the float64 oracle:", *gpu_check(dtype)]))
        lengths = parse(args.lengths) or [512, 1024, 2048, 4096, 8192, 16384]
        b, h = args.batch or 4, args.heads or 8
        title = f"{torch.cuda.get_device_name()}, {args.dtype}, B={b} H={h} D={d}"
        save(run_gpu(lengths, b, h, d, dtype), "rbf_gpu", title)


if __name__ == "__main__":
    main()
