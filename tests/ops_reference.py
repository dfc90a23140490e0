"""Test helpers for the SSOG operator backends: tolerances and the compile check; the float64 reference and the
random fields live in :mod:`ssog_core.ops.reference` (shared with ``benchmarks/gpu_check.py``)."""

from __future__ import annotations

import torch
from torch import Tensor

from ssog_core.ops.reference import TAP_SUBSETS, FieldLeaves, grads, reference_apply, reference_matrix

__all__ = [
    "TAP_SUBSETS",
    "FieldLeaves",
    "assert_close",
    "assert_compiles_like_eager",
    "grads",
    "reference_apply",
    "reference_matrix",
]


def assert_close(actual: Tensor, expected: Tensor, rtol: float, what: str) -> None:
    """Max-abs error relative to the expected tensor's max-abs magnitude (scale-aware, robust to zeros)."""
    actual, expected = actual.double(), expected.double()
    scale = expected.abs().max().clamp_min(1e-12)
    err = (actual - expected).abs().max() / scale
    assert torch.isfinite(actual).all(), f"{what}: non-finite values"
    assert err <= rtol, f"{what}: relative error {err:.2e} > {rtol:.0e}"


def assert_compiles_like_eager(attn: torch.nn.Module, x: Tensor, grid: tuple[int, int]) -> None:
    """``torch.compile(fullgraph=True)`` of a loss through ``attn`` (one graph: no breaks) gives the eager loss
    and parameter gradients."""
    torch._dynamo.reset()

    def loss(module: torch.nn.Module, inp: Tensor) -> Tensor:
        return module(inp, grid).square().sum()

    eager = loss(attn, x)
    g_eager = torch.autograd.grad(eager, list(attn.parameters()))
    out = torch.compile(loss, fullgraph=True, backend="aot_eager")(attn, x)
    torch.testing.assert_close(out, eager, rtol=1e-5, atol=1e-5)
    for a, b in zip(torch.autograd.grad(out, list(attn.parameters())), g_eager, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
