"""Latency against tokens (:mod:`ssog_core.analysis.latency`): the sizes timed, the interleaved measurement on a
real model, and the power-law fit against an independent float64 least-squares slope."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from ssog_core import ViT
from ssog_core.analysis import latency


def slope(x: np.ndarray, y: np.ndarray) -> float:
    """The least-squares slope of log y on log x from its closed form cov / var (float64)."""
    lx, ly = np.log(x.astype(np.float64)), np.log(y.astype(np.float64))
    dx = lx - lx.mean()
    return float((dx * (ly - ly.mean())).sum() / (dx * dx).sum())


@pytest.mark.parametrize("n", [2, 5, 7])
def test_power_law_exponent_matches_the_least_squares_slope(n):
    rng = np.random.default_rng(n)
    x = rng.uniform(10, 5000, n)
    y = 0.03 * x ** rng.uniform(0.5, 2.5) * rng.lognormal(0, 0.3, n)  # a power law with multiplicative noise
    assert latency.power_law_exponent(list(x), list(y)) == pytest.approx(slope(x, y), rel=1e-9, abs=1e-12)
    assert np.isnan(latency.power_law_exponent([100.0], [3.0]))
    curve = latency.Latency("m", "SSOG", [int(v) for v in x], [[float(v) * s for s in (0.9, 1.0, 1.3)] for v in y])
    assert curve.ms == pytest.approx(list(y)) and curve.exponent() == pytest.approx(slope(x.astype(int), y))


def test_sizes_cover_the_training_grid_on_an_odd_grid():
    """A 7×5 training grid (28×20 px, patch 4): ½×, 1×, 1.5×, 2×, 3× its sides, whole patches, rounded to even."""
    config = ViT(num_classes=3, img_size=(28, 20), patch_size=4, dim=8, depth=1, num_heads=2).config
    assert latency.sizes(SimpleNamespace(config=config)) == [(16, 8), (28, 20), (40, 32), (56, 40), (84, 60)]
    big = ViT(num_classes=3, img_size=(160, 160), patch_size=4, dim=8, depth=1, num_heads=2).config
    tokens = [(h // 4) * (w // 4) for h, w in latency.sizes(SimpleNamespace(config=big))]
    assert tokens == [400, 1600, 3600] and max(tokens) <= latency.MAX_TOKENS  # 80×80 and 120×120 grids left out


def test_measure_times_a_real_model_at_every_size():
    torch.manual_seed(0)
    model = ViT(num_classes=3, img_size=(28, 20), patch_size=4, dim=8, depth=1, num_heads=2, num_atoms=2).eval()
    timed = SimpleNamespace(name="tiny", kind="SSOG", model=model, device=torch.device("cpu"), config=model.config)
    seen = []

    def run(t, x):
        seen.append(tuple(x.shape))
        latency.forward(t, x)

    (curve,) = latency.measure([timed], repeats=3, warmup=1, run=run)
    assert curve.name == "tiny" and curve.kind == "SSOG"
    assert curve.tokens == [8, 35, 80, 140, 315]  # 4×2, 7×5, 10×8, 14×10, 21×15 grids
    assert all(len(s) == 3 and min(s) > 0 for s in curve.samples)
    assert len(seen) == 5 * (1 + 3) and seen[0] == (1, 3, 16, 8)
    assert latency.cpu_model() in latency.machine("cpu") and "torch thread" in latency.machine("cpu")
