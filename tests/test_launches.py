"""Kernel launches of one attention layer in eager mode (issue 46 item 3; docs/KERNELS.md §5): an SSOG layer on the
Triton backend launches at most 12 kernels forward and 24 backward, counted on the CPU as the non-view ATen
operations dispatched plus the Triton launches (stubbed: counted, not run)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from ssog_core.nn.attention import DotAttention, SSOGAttention
from ssog_core.ops import dispatch
from tests.launch_count import count_launches

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")

MAX_FORWARD, MAX_BACKWARD = 12, 24


def _layer_launches(layer: torch.nn.Module, run_kernels: bool = False) -> tuple[int, int, dict, dict]:
    x = torch.randn(2, 35, 32, requires_grad=True)
    with count_launches(run_kernels) as forward:
        y = layer(x, (7, 5))
    dy = torch.randn_like(y)
    with count_launches(run_kernels) as backward:
        y.backward(dy)
    return sum(forward.values()), sum(backward.values()), dict(forward), dict(backward)


@pytest.mark.parametrize("taps", [("mu", "sigma", "lambda"), ("sigma",), ()], ids=["steered", "sigma", "fixed"])
def test_ssog_layer_launches(monkeypatch: pytest.MonkeyPatch, taps) -> None:
    monkeypatch.delenv("SSOG_BACKEND", raising=False)
    monkeypatch.setattr(dispatch, "interpreting", lambda: True)  # the Triton backend on CPU tensors, launches stubbed
    ssog = _layer_launches(SSOGAttention(32, 2, 4, steer=taps, cold_init=False))
    dot = _layer_launches(DotAttention(32, 2))
    print(f"\nSSOG ({'+'.join(taps) or 'fixed'}): forward {ssog[0]}, backward {ssog[1]}: {ssog[2]} / {ssog[3]}")
    print(f"dot: forward {dot[0]}, backward {dot[1]}: {dot[2]} / {dot[3]}")
    assert any(k.startswith("triton:fwd") for k in ssog[2]) and "triton:bwd-cols" in ssog[3], ssog
    assert ssog[0] <= MAX_FORWARD and ssog[1] <= MAX_BACKWARD, ssog


def test_counter_counts_aten_operations_and_not_views() -> None:
    x = torch.randn(4, 6)
    with count_launches() as counts:
        y = (x.view(6, 4).t() * 2).sum()
    assert dict(counts) == {"mul": 1, "sum": 1} and y.shape == ()
