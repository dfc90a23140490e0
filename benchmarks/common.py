"""What the benchmark scripts share: the flags that set up a timing run and the provenance line of each table."""

from __future__ import annotations

import argparse
import contextlib
import csv
import datetime
import json
import os
import sys
import time
from pathlib import Path

import torch

from ssog_core.checkpoint.files import atomic_write
from ssog_core.field import Field

RESULTS = Path(__file__).resolve().parent / "results"


def add_run_flags(ap: argparse.ArgumentParser) -> None:
    """``--threads``, ``--clock``, ``--out`` and ``--tag``."""
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: leave the default)")
    ap.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="CPU only: the thread's CPU time (needs --threads 1; robust to load from other processes)",
    )
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--tag", help="output file suffix (default: the device type, e.g. cpu or cuda)")


def apply_run_flags(ap: argparse.ArgumentParser, args: argparse.Namespace, device: torch.device) -> None:
    """Set the thread count; refuse a CPU-time clock that would not measure the one thread doing the work."""
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.clock == "cpu" and (torch.get_num_threads() != 1 or device.type != "cpu"):
        ap.error("--clock cpu measures one CPU thread: use it with --threads 1 on the CPU")


def provenance(argv: list[str] | None) -> tuple[str, str]:
    """The command that reproduces this run (with a forced ``SSOG_BACKEND``) and the UTC time stamp."""
    command = "python " + " ".join([Path(sys.argv[0]).as_posix(), *(sys.argv[1:] if argv is None else argv)])
    if os.environ.get("SSOG_BACKEND"):
        command = f"SSOG_BACKEND={os.environ['SSOG_BACKEND']} {command}"
    return command, datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def write_csv(path: Path, rows: list[dict], fields: list[str]) -> None:
    """The rows as CSV, written atomically (a temporary file renamed into place)."""

    def write(tmp: str) -> None:
        with open(tmp, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=fields)
            w.writeheader()
            w.writerows(rows)

    atomic_write(path, write)


def rand_field(b: int, grid: tuple[int, int], h: int, r: int, steered: bool, device, grad: bool) -> Field:
    """A random field (fixed, or steered per token) for the op benchmarks, the same on every run."""
    gh, gw = grid
    lead = (b, gh, gw) if steered else ()
    g = torch.Generator().manual_seed(0)
    mu = torch.randn(*lead, h, r, 2, generator=g) * 1.5
    sigma = torch.rand(*lead, h, r, 2, generator=g) * 1.5 + 0.4
    log_lam = torch.randn(*lead, h, r, generator=g)
    tensors = [t.to(device).requires_grad_(grad) for t in (mu, sigma, log_lam)]
    return Field(*tensors, torch.tensor(0.8, device=device))


def ssog_layer_op(b: int, grid: tuple[int, int], h: int, d: int, r: int, steered: bool, device, dtype,
                  backend: str | None, mode: str = "factorized"):  # fmt: skip
    """The SSOG op as a layer calls it: ``(op, params)`` with ``op()`` = an :class:`SSOGAttention`'s
    :meth:`~ssog_core.nn.attention.SSOGAttention.attend` of fixed random ``x`` and ``v`` ``(B, N, H, d)`` (the probes,
    the field's preparation and steering included; the value and output projections not), and ``params`` the tensors
    a training step differentiates (``v``, ``x`` and the layer's parameters but the two projections)."""
    from ssog_core.field import TAPS
    from ssog_core.nn.attention import SSOGAttention

    gh, gw = grid
    g = torch.Generator().manual_seed(0)
    layer = SSOGAttention(h * d, h, r, field=mode, steer=TAPS if steered else (), cold_init=False, backend=backend)
    with torch.no_grad():
        for name, p in layer.named_parameters():
            if name.split(".")[0] in ("mu_delta", "sigma_delta", "lambda_gate"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.02)
    layer = layer.to(device)
    x = torch.randn(b, gh * gw, h * d, generator=g).to(device=device, dtype=dtype).requires_grad_(True)
    v = torch.randn(b, gh * gw, h, d, generator=g).to(device=device, dtype=dtype).requires_grad_(True)
    params = [v, x, *(p for n, p in layer.named_parameters() if not n.startswith(("v.", "out.")))]

    half = dtype in (torch.bfloat16, torch.float16)

    def op():
        with torch.autocast(torch.device(device).type, dtype, enabled=half):  # the probe GEMM as in training
            return layer.attend(x, v, grid)

    return op, params


def write_report(out: Path, results: dict, table: str) -> None:
    """The markdown table at ``out`` and the raw results beside it as ``.json``."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(table, encoding="utf-8")
    out.with_suffix(".json").write_text(json.dumps(results, indent=2), encoding="utf-8")
    print(table)


def timer(device: torch.device, clock: str = "wall"):
    """A function that runs ``fn`` once and returns its time in seconds: wall time, or (``clock="cpu"``, one CPU
    thread only) the thread's CPU time, which time slices lost to other processes do not inflate."""
    if device.type == "cuda":

        def run(fn) -> float:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            return start.elapsed_time(end) / 1e3

    else:
        now = time.thread_time if clock == "cpu" else time.perf_counter

        def run(fn) -> float:
            t0 = now()
            fn()
            return now() - t0

    return run


def load_average() -> str:
    """The 1-minute load average (``n/a`` where /proc is missing): other processes' share of the CPUs."""
    with contextlib.suppress(OSError):
        return Path("/proc/loadavg").read_text().split(" ")[0]
    return "n/a"
