"""Forward latency against the token count, and the power law it follows.

The SSOG post claims SSOG's cost grows near-linearly with the number of tokens (its field is two 1D passes, no N×N
matrix) while dot attention's grows quadratically. :func:`measure` times models at several image sizes on the
device they live on; :meth:`Latency.exponent` is the slope of log median time against log tokens (1 = linear,
2 = quadratic). The app's Scaling tab draws what this returns.
"""

from __future__ import annotations

import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np
import torch
from torch import nn

from ssog_core.nn.config import ViTConfig

GRID_FACTORS = (0.5, 1.0, 1.5, 2.0, 3.0)  # token grids measured, relative to the training grid's side
MAX_TOKENS = 4096  # beyond this a CPU forward of a demo model takes seconds: the curve's shape is clear before
WARMUP = 2  # untimed forwards of every model at a size before any is timed: allocations, caches, compilation
REPEATS = 15  # timed forwards per model and size: the median is plotted, the quartiles as its spread


class Timed(Protocol):
    """What :func:`measure` needs of a model: its name and attention kind (for the curve), the module, the device
    it lives on and its config (for the sizes)."""

    name: str
    kind: str
    model: nn.Module
    device: torch.device
    config: ViTConfig


Clock = Callable[[], float]  # seconds, as time.perf_counter
Forward = Callable[[Timed, torch.Tensor], None]


@dataclass
class Latency:
    """Every timed forward of one model at several token counts (ms), and their medians and quartiles."""

    name: str
    kind: str
    tokens: list[int] = field(default_factory=list)
    samples: list[list[float]] = field(default_factory=list)  # per token count, every timed forward (ms)

    def quantile(self, q: float) -> list[float]:
        return [float(np.quantile(s, q)) for s in self.samples]

    @property
    def ms(self) -> list[float]:
        """The median forward time at each token count."""
        return self.quantile(0.5)

    def exponent(self) -> float:
        """Slope of log median time against log tokens: 1 = linear, 2 = quadratic (NaN with fewer than two)."""
        return power_law_exponent(self.tokens, self.ms)


def power_law_exponent(x: Sequence[float], y: Sequence[float]) -> float:
    """The least-squares slope ``k`` of ``log y = k·log x + c``: ``y ∝ x^k`` (NaN with fewer than two points)."""
    if len(x) < 2:
        return float("nan")
    return float(np.polyfit(np.log(np.asarray(x, float)), np.log(np.asarray(y, float)), 1)[0])


def cpu_model() -> str:
    """The processor's name as the OS reports it (``/proc/cpuinfo`` on Linux)."""
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def machine(device: str) -> str:
    """What the timings ran on: the processor (or GPU) and torch's thread count."""
    chip = torch.cuda.get_device_name(torch.device(device)) if device.startswith("cuda") else cpu_model()
    return f"{chip}, {torch.get_num_threads()} torch thread(s)"


def forward(timed: Timed, x: torch.Tensor) -> None:
    """One forward of ``timed`` on ``x``, finished (a GPU is waited for) when it returns."""
    with torch.inference_mode():
        timed.model(x)
    if timed.device.type == "cuda":
        torch.cuda.synchronize(timed.device)


def sizes(timed: Timed) -> list[tuple[int, int]]:
    """Input sizes (H, W) to time: multiples of the patch around the training grid, up to MAX_TOKENS tokens."""
    (gh, gw), p = timed.config.grid, timed.config.patch_size
    out = []
    for f in GRID_FACTORS:
        h, w = max(1, round(gh * f)), max(1, round(gw * f))
        if h * w <= MAX_TOKENS and (h * p, w * p) not in out:
            out.append((h * p, w * p))
    return out


def measure(
    models: Sequence[Timed],
    repeats: int = REPEATS,
    warmup: int = WARMUP,
    clock: Clock = time.perf_counter,
    run: Forward = forward,
) -> list[Latency]:
    """Time every model at every size of :func:`sizes` on random inputs. Every (model, size) point is warmed up
    first; then each round times every point once, the order reversed every round (A B C …, … C B A). A point's
    runs are thus spread over the whole measurement: a slow spell of the machine (another job, a clock change)
    falls on every model and size alike and shows in each point's spread, rather than shifting one point's
    median."""
    plans = [sizes(m) for m in models]
    points = [(i, m, plans[i][k]) for k in range(max(map(len, plans), default=0))
              for i, m in enumerate(models) if k < len(plans[i])]  # fmt: skip
    inputs = [torch.rand(1, 3, h, w, device=m.device) for _, m, (h, w) in points]
    for _ in range(warmup):
        for (_, m, _), x in zip(points, inputs, strict=True):
            run(m, x)
    times: list[list[float]] = [[] for _ in points]
    order = list(range(len(points)))
    for r in range(repeats):
        for j in order if r % 2 == 0 else order[::-1]:
            t = clock()
            run(points[j][1], inputs[j])
            times[j].append((clock() - t) * 1e3)
    curves = [Latency(m.name, m.kind) for m in models]
    for (i, m, (h, w)), samples in zip(points, times, strict=True):
        p = m.config.patch_size
        curves[i].tokens.append((h // p) * (w // p))
        curves[i].samples.append(samples)
    return curves
