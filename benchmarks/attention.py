"""Attention-op latency and memory vs tokens: every SSOG backend (steered / fixed / axial fields) and RBF attention
against ``F.scaled_dot_product_attention``.

    python benchmarks/attention.py --threads 2                       # CPU: definition, torch and cpu backends
    python benchmarks/attention.py --device cuda                     # GPU: d384 / 6 heads / R4 / batch 64 / bf16

``--paths`` names the SSOG backends of :func:`ssog_core.ops.ssog_apply` to measure: ``definition``
(:func:`ssog_core.field.apply_field`, the einsums as defined), ``torch`` (the PyTorch path), ``cpu`` (the fused
C kernels: steered factorized fields on CPU tensors) and ``triton`` (the fused Triton kernels: CUDA). Each row runs
a layer built with ``backend=path``, so a row measures the backend it names or is left out with the dispatcher's
reason (e.g. ``cpu`` for a fixed or axial field); an unknown name is refused. ``--kinds`` adds ``rbf``: RBF
attention (:func:`ssog_core.ops.rbf_attention`) with its ``torch`` backend, and ``triton`` where that path is
asked for.

Each row times the operator alone (no projections): SDPA and RBF on ``q, k, v`` of shape (B, H, N, d); SSOG as a
layer calls it (``benchmarks/common.py:ssog_layer_op``: :meth:`~ssog_core.nn.attention.SSOGAttention.attend` of
``x`` (B, N, H·d) and ``v`` (B, N, H, d): the probes' GEMM, the steering, the field's preparation and their backward
included; steered: every tap; fixed: no taps; axial: every tap, atoms mixed per axis). The forward and
forward+backward latencies are medians (CUDA: ``triton.testing.do_bench`` with CUDA graphs when available;
CPU: over interleaved rounds, wall clock or, with ``--clock cpu --threads 1``, the thread's CPU time). Memory
is the peak allocated beyond the live inputs (CUDA: the caching allocator's peak; CPU: the peak of live
tensors created inside the op, tracked through the dispatcher), also in multiples of the size of v. The C
kernels' per-thread scratch (``malloc``, invisible to the dispatcher, kept between calls) is reported apart, in
the ``scratch`` column: its size per thread is ``4·N·R·(7 + 3·max(Gh, Gw) + d)`` bytes in fp32. On CUDA
every row also gets its roofline floor (``floor_us`` below, H200 ceilings) and achieved/floor. A batch that
does not fit is halved until it does.

Writes ``attention_<tag>.csv``, ``attention_<tag>.md`` and ``attention_<tag>.png`` into ``--out`` (tag:
``--tag``, else the device type).
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import statistics
import time
import weakref
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from ssog_core.checkpoint.files import atomic_write
from ssog_core.ops import dispatch, rbf_attention

from common import add_run_flags, apply_run_flags, provenance, ssog_layer_op, write_csv

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
PATHS = ("definition", "torch", "cpu", "triton")  # the SSOG backends, in the order of the tables
KINDS = ("steered", "fixed", "axial", "rbf")
# the definition backend's name in ssog_core.ops.dispatch (it was called "reference")
DEFINITION = "definition" if "definition" in dispatch.SSOG_BACKENDS else "reference"


def grid_of(n: int) -> tuple[int, int]:
    """The square token grid of ``n`` tokens."""
    side = math.isqrt(n)
    if side * side != n:
        raise argparse.ArgumentTypeError(f"{n} tokens are not a square grid")
    return side, side


def tokens_arg(text: str) -> int:
    n = int(text)
    grid_of(n)
    return n


def scratch_bytes(n: int, r: int, d: int, dtype: torch.dtype) -> int:
    """The C kernels' scratch per thread (``scratch_bytes`` in ``ssog_cpu.c``), allocated with malloc."""
    return torch.finfo(dtype).bits // 8 * n * r * (7 + 3 * max(grid_of(n)) + d)


# H200 ceilings: bf16 tensor, HBM, ex2/MUFU, fp32 instructions per second
TC, HBM, MUFU, FP32 = 790e12, 4.3e12, 3.9e12, 30e12


def floor_us(kind: str, b: int, n: int, h: int, d: int, r: int, train: bool) -> float:
    """Roofline floor of one attention op in µs: the largest of FLOP, byte and exp2 time at the ceilings, bf16."""
    gh, gw = grid_of(n)
    dm = h * d
    if kind in ("sdpa", "rbf"):  # RBF attention is SDPA on vectors one element wider
        flops = 4 * b * n * n * dm
        nbytes = 4 * b * n * dm * 2
        exps = b * h * n * n
        if train:
            flops, nbytes, exps = flops * 3.5, nbytes * 2 + 2 * b * h * n * 4, exps * 2
        return max(flops / TC, nbytes / HBM, exps / MUFU) * 1e6
    ro = 1 if kind == "axial" else r
    flops = 2 * b * ro * n * (gh + gw) * dm
    nbytes = 2 * b * n * dm * 2
    if kind == "fixed":
        if train:
            flops, nbytes = flops * 3.5, nbytes * 2.5
        return max(flops / TC, nbytes / HBM) * 1e6
    weights = b * h * n * r * (gh + gw)  # steered: every per-query weight costs one exp2 and ~6 fp32 instructions
    nbytes += b * n * 5 * r * h * 4
    exps, instr = weights, 6 * weights
    if train:
        flops *= 3.5
        nbytes += 2 * b * n * dm * 2 + b * n * (5 * r * h * 4 + r * h * 4)
        exps, instr = 3 * weights, 24 * weights
    return max(flops / TC, nbytes / HBM, exps / MUFU, instr / FP32) * 1e6


class PeakLive(TorchDispatchMode):
    """Peak bytes of tensors created inside the mode that are alive at the same time (CPU memory proxy)."""

    def __init__(self) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0
        self._seen: set[int] = set()

    def _release(self, key: int, nbytes: int) -> None:
        self.live -= nbytes
        self._seen.discard(key)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and t.device.type == "cpu":
                storage = t.untyped_storage()
                key = storage.data_ptr()
                if key and key not in self._seen:
                    self._seen.add(key)
                    self.live += storage.nbytes()
                    weakref.finalize(storage, self._release, key, storage.nbytes())
        self.peak = max(self.peak, self.live)
        return out


def _ops(path: str, kind: str, b: int, n: int, h: int, d: int, r: int, device, dtype, train: bool) -> Callable:
    """A closure running one forward (and backward when ``train``)."""
    if kind in ("sdpa", "rbf"):
        q, k, v = (torch.randn(b, h, n, d, device=device, dtype=dtype, requires_grad=train) for _ in range(3))

        def op():
            if kind == "sdpa":
                return F.scaled_dot_product_attention(q, k, v)
            return rbf_attention(q, k, v, backend=path)

    else:  # the op as a layer calls it: probes, steering and the field's preparation included
        backend = DEFINITION if path == "definition" else path
        mode = "axial" if kind == "axial" else "factorized"
        op, _ = ssog_layer_op(b, grid_of(n), h, d, r, kind != "fixed", device, dtype, backend, mode)
        if not train:
            op = torch.no_grad()(op)

    def run():
        y = op()
        if train:
            y.backward(torch.ones_like(y))

    return run


def unavailable(path: str, kind: str, n: int, h: int, d: int, r: int, device, dtype) -> str | None:
    """Why this backend cannot run this row (the dispatcher's reason, from a one-image call), or ``None``."""
    if kind == "sdpa":
        return None
    if kind == "rbf" and path not in dispatch.RBF_BACKENDS:
        return f"RBF attention has no {path} backend"
    try:
        _ops(path, kind, 1, n, h, d, r, device, dtype, False)()
    except dispatch.BackendUnavailable as err:
        return str(err)
    return None


def _time_cuda(fn: Callable) -> float:
    import triton.testing

    try:
        return triton.testing.do_bench_cudagraph(fn, rep=100)
    except Exception:  # graph capture can fail for ops that synchronise; plain events are still fine
        return triton.testing.do_bench(fn, rep=100)


def _peak_bytes(fn: Callable, device: torch.device) -> int:
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        fn()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base
    with PeakLive() as probe:
        fn()
    return probe.peak


def measure_cuda(path: str, kind: str, b: int, n: int, h: int, d: int, r: int, device, dtype) -> dict:
    """One row on the GPU (GPU timings are stable, so jobs run one after the other)."""
    row = {"path": path, "kind": kind, "tokens": n, "batch": b}
    v_bytes = b * n * h * d * torch.finfo(dtype).bits // 8
    for train in (False, True):
        tag = "fwdbwd" if train else "fwd"
        fn = _ops(path, kind, b, n, h, d, r, device, dtype, train)
        row[f"{tag}_ms"] = _time_cuda(fn)
        peak = _peak_bytes(fn, device)
        row[f"{tag}_peak_mb"] = peak / 2**20
        row[f"{tag}_peak_over_v"] = peak / v_bytes
        del fn
    return row


def measure_cpu(
    jobs: list[tuple[str, str]], b: int, n: int, h: int, d: int, r: int, dtype, repeats: int, clock: str = "wall"
) -> list:
    """All rows of one size on the CPU, timed interleaved (every round runs every job once, in a rotating order)
    so that load from other processes hits all of them alike."""
    device = torch.device("cpu")
    v_bytes = b * n * h * d * torch.finfo(dtype).bits // 8
    fns = {(p, k, t): _ops(p, k, b, n, h, d, r, device, dtype, t) for p, k in jobs for t in (False, True)}
    times: dict[tuple, list[float]] = {key: [] for key in fns}
    keys = list(fns)
    for fn in fns.values():
        fn()
    now = time.thread_time if clock == "cpu" else time.perf_counter
    for i in range(repeats):
        for key in keys[i % len(keys) :] + keys[: i % len(keys)]:
            t0 = now()
            fns[key]()
            times[key].append(now() - t0)
    rows = []
    for p, k in jobs:
        row = {"path": p, "kind": k, "tokens": n, "batch": b}
        for train in (False, True):
            tag = "fwdbwd" if train else "fwd"
            row[f"{tag}_ms"] = statistics.median(times[(p, k, train)]) * 1e3
            peak = _peak_bytes(fns[(p, k, train)], device)
            row[f"{tag}_peak_mb"] = peak / 2**20
            row[f"{tag}_peak_over_v"] = peak / v_bytes
        if p == "cpu":  # per thread, and no more threads than (image, head) pairs run
            scratch = scratch_bytes(n, r, d, dtype) * min(torch.get_num_threads(), b * h)
            row["scratch_mb"], row["scratch_over_v"] = scratch / 2**20, scratch / v_bytes
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", choices=sorted(DTYPES), help="default: bfloat16 on CUDA, float32 on CPU")
    ap.add_argument("--batch", type=int, help="default: 64 on CUDA, 2 on CPU")
    ap.add_argument(
        "--tokens", type=tokens_arg, nargs="+", help="square grids (default 196 576 1024 4096 16384; CPU 256 1024 4096)"
    )
    ap.add_argument(
        "--paths",
        nargs="+",
        choices=PATHS,
        metavar="PATH",
        help=f"SSOG backends, of {', '.join(PATHS)} (default: triton torch definition on CUDA, "
        "definition torch cpu on the CPU)",
    )
    ap.add_argument("--kinds", nargs="+", choices=KINDS, metavar="KIND", default=list(KINDS), help=", ".join(KINDS))
    ap.add_argument("--heads", type=int, default=6)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--atoms", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=7, help="CPU timing rounds (every job once per round)")
    add_run_flags(ap)
    args = ap.parse_args(argv)
    command, stamp = provenance(argv)
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    apply_run_flags(ap, args, device)
    dtype = DTYPES[args.dtype or ("bfloat16" if cuda else "float32")]
    batch0 = args.batch or (64 if cuda else 2)
    tokens = args.tokens or ([196, 576, 1024, 4096, 16384] if cuda else [256, 1024, 4096])
    paths = [p for p in PATHS if p in (args.paths or (["triton", "torch", "definition"] if cuda else PATHS[:3]))]
    h, d, r = args.heads, args.head_dim, args.atoms

    rows, skipped = [], {}
    for n in tokens:
        jobs = [("sdpa", "sdpa")]
        for kind in args.kinds:
            # RBF attention: its torch backend always, its Triton kernels where the triton path is asked for
            for p in ["torch", *(["triton"] if "triton" in paths else [])] if kind == "rbf" else paths:
                if p == "definition" and n > 1024:
                    # the definition builds every per-query kernel of every atom at once: B·N·H·R·(Gh+Gw) weights
                    # and their gradients, minutes and gigabytes beyond 1024 tokens
                    skipped[(p, kind)] = "left out above 1024 tokens: it builds every per-query kernel at once"
                    continue
                why = unavailable(p, kind, n, h, d, r, device, dtype)
                if why is None:
                    jobs.append((p, kind))
                else:
                    skipped.setdefault((p, kind), why)
        if not cuda:
            new = measure_cpu(jobs, batch0, n, h, d, r, dtype, args.repeats, args.clock)
        else:
            new = []
            for path, kind in jobs:
                b = batch0
                while True:
                    try:
                        row = measure_cuda(path, kind, b, n, h, d, r, device, dtype)
                        break
                    except torch.OutOfMemoryError:
                        if b == 1:
                            raise
                        b //= 2
                        torch.cuda.empty_cache()
                row["fwd_floor_us"] = floor_us(kind, b, n, h, d, r, False)
                row["fwdbwd_floor_us"] = floor_us(kind, b, n, h, d, r, True)
                row["fwd_achieved_over_floor"] = row["fwd_ms"] * 1e3 / row["fwd_floor_us"]
                row["fwdbwd_achieved_over_floor"] = row["fwdbwd_ms"] * 1e3 / row["fwdbwd_floor_us"]
                new.append(row)
        for row in new:
            print(
                f"N={n:>6} {row['path']:>9} {row['kind']:<8} B={row['batch']:<3} fwd {row['fwd_ms']:9.3f} ms  "
                f"fwd+bwd {row['fwdbwd_ms']:9.3f} ms  peak fwd {row['fwd_peak_mb']:8.1f} MB "
                f"({row['fwd_peak_over_v']:.2f}× v)",
                flush=True,
            )
        rows += new
    for row in rows:  # speed-up against SDPA at the same size and batch
        sdpa = next(x for x in rows if x["kind"] == "sdpa" and x["tokens"] == row["tokens"])
        scale = sdpa["batch"] / row["batch"]
        row["fwd_speedup_vs_sdpa"] = sdpa["fwd_ms"] / (row["fwd_ms"] * scale)
        row["fwdbwd_speedup_vs_sdpa"] = sdpa["fwdbwd_ms"] / (row["fwdbwd_ms"] * scale)

    args.out.mkdir(parents=True, exist_ok=True)
    tag = args.tag or device.type
    order = [k for row in rows for k in row]
    fields = sorted(set(order), key=order.index)

    write_csv(args.out / f"attention_{tag}.csv", rows, fields)
    dev_name = torch.cuda.get_device_name(device) if cuda else (platform.processor() or "cpu")
    notes = [f"* {p} / {k}: {why}" for (p, k), why in skipped.items()]
    for line in notes:
        print("not measured:", line[2:], flush=True)
    lines = [
        f"Attention op only, {h} heads × d{d}, R{r}, {str(dtype).removeprefix('torch.')}, {dev_name}, "
        f"torch {torch.__version__}, {os.cpu_count()} CPUs / {torch.get_num_threads()} threads"
        f"{', CPU-time clock' if args.clock == 'cpu' else ''}. "
        f"Peak = memory beyond the live inputs, also in multiples of v; scratch = the C kernels' malloc'd "
        f"scratch of all threads, kept between calls. {stamp}, `{command}`.",
        "",
    ]
    head = (
        "| N | path | kind | B | fwd ms | fwd+bwd ms | speed-up vs SDPA fwd | vs SDPA fwd+bwd | peak fwd MB (×v) "
        "| peak fwd+bwd MB (×v) | scratch MB (×v) |"
    )
    sep = "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"
    if cuda:
        head += " fwd/floor | fwd+bwd/floor |"
        sep += "---:|---:|"
    lines += [head, sep]
    for row in rows:
        line = (
            f"| {row['tokens']} | {row['path']} | {row['kind']} | {row['batch']} | {row['fwd_ms']:.3f} | "
            f"{row['fwdbwd_ms']:.3f} | {row['fwd_speedup_vs_sdpa']:.2f} | {row['fwdbwd_speedup_vs_sdpa']:.2f} | "
            f"{row['fwd_peak_mb']:.1f} ({row['fwd_peak_over_v']:.2f}) | "
            f"{row['fwdbwd_peak_mb']:.1f} ({row['fwdbwd_peak_over_v']:.2f}) | "
            + (f"{row['scratch_mb']:.1f} ({row['scratch_over_v']:.2f}) |" if "scratch_mb" in row else "— |")
        )
        if cuda:
            line += f" {row['fwd_achieved_over_floor']:.2f} | {row['fwdbwd_achieved_over_floor']:.2f} |"
        lines.append(line)
    if notes:
        lines += ["", "Not measured:", "", *notes]
    atomic_write(args.out / f"attention_{tag}.md", lambda tmp: Path(tmp).write_text("\n".join(lines) + "\n"))
    _plot(rows, args.out / f"attention_{tag}.png", f"{dev_name}, {str(dtype).removeprefix('torch.')}")
    print("\n".join(lines))


STYLES = {"triton": "-s", "cpu": "-D", "torch": "--^", "definition": ":x"}


def _plot(rows: list[dict], out: Path, title: str) -> None:
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=False)
    series = sorted({(r["path"], r["kind"]) for r in rows})
    for ax, tag, label in zip(axes, ("fwd", "fwdbwd"), ("forward", "forward + backward"), strict=True):
        for path, kind in series:
            pts = sorted(
                (r["tokens"], r[f"{tag}_ms"] / r["batch"]) for r in rows if (r["path"], r["kind"]) == (path, kind)
            )
            style = "k-o" if kind == "sdpa" else STYLES[path]
            name = "SDPA" if kind == "sdpa" else ("RBF" if kind == "rbf" else f"SSOG {kind}") + f" ({path})"
            ax.plot(*zip(*pts, strict=True), style, label=name)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ticks = sorted({r["tokens"] for r in rows})
        ax.set_xticks(ticks, [str(t) for t in ticks])
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_xlabel("tokens N")
        ax.set_ylabel("ms per image")
        ax.set_title(f"{label} — {title}")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    atomic_write(out, lambda tmp: fig.savefig(tmp, dpi=120, format="png"))
    plt.close(fig)


if __name__ == "__main__":
    main()
