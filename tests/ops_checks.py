"""Test helpers for the SSOG operator backends: tolerances, the check of a backend against the definition and the
compile check; the float64 oracle and the random fields live in :mod:`ssog_core.testing.oracles` (shared with
``benchmarks/gpu_check.py``)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from ssog_core.field import Field
from ssog_core.testing.oracles import TAP_SUBSETS, FieldLeaves, grads, oracle_apply, oracle_matrix

__all__ = [
    "TAP_SUBSETS",
    "FieldLeaves",
    "assert_backward_repeats",
    "assert_close",
    "assert_compiles_like_eager",
    "check_against_definition",
    "far_narrow_field",
    "grads",
    "oracle_apply",
    "oracle_matrix",
]


def assert_close(actual: Tensor, expected: Tensor, rtol: float, what: str) -> None:
    """Max-abs error relative to the expected tensor's max-abs magnitude (scale-aware, robust to zeros)."""
    actual, expected = actual.double(), expected.double()
    scale = expected.abs().max().clamp_min(1e-12)
    err = (actual - expected).abs().max() / scale
    assert torch.isfinite(actual).all(), f"{what}: non-finite values"
    assert err <= rtol, f"{what}: relative error {err:.2e} > {rtol:.0e}"


def assert_backward_repeats(out: Tensor, inputs: list[Tensor]) -> None:
    """The backward pass overwrites only its own buffers, never a saved tensor: a second pass over the same graph
    (``retain_graph``) gives the same gradients, bit for bit."""
    dy = torch.randn_like(out)
    first = torch.autograd.grad(out, inputs, dy, retain_graph=True)
    second = torch.autograd.grad(out, inputs, dy)
    for a, b in zip(first, second, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def check_against_definition(
    apply: Callable[..., Tensor],
    leaves: FieldLeaves,
    mode: str,
    batch: int,
    head_dim: int,
    dtype: torch.dtype,
    rtol: float,
    scalar_grad_rtol: float = 0.0,
) -> None:
    """A backend's ``apply(v, field, grid, mode)`` against the float64 definition on the same rounded input: the
    output within ``rtol``, the gradient of ``v`` and of every field leaf within ``10·rtol``, and at least
    ``scalar_grad_rtol`` for a scalar leaf (a gate or temperature sums signed contributions of every token, so
    fp32 cancellation, not the kernel, sets its error). The field is float64 for float64 values, else float32."""
    gh, gw = leaves.grid
    heads = leaves.leaves["mu"].shape[0]
    v = torch.randn(batch, gh * gw, heads, head_dim, dtype=torch.float64, requires_grad=True)
    dy = torch.randn(batch, gh * gw, heads, head_dim, dtype=torch.float64)
    inputs = [v, *leaves.tensors()]
    expected = oracle_apply(v.to(dtype).double(), leaves.field(), leaves.grid, mode)  # same rounded input
    field_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    out = apply(v.to(dtype), leaves.field(field_dtype), leaves.grid, mode)
    assert out.dtype == dtype and out.shape == v.shape
    assert_close(out, expected, rtol, "output")
    expected_grads = grads(expected, inputs, dy)
    for name, got, want in zip(["v", *leaves.names()], grads(out, inputs, dy), expected_grads, strict=True):
        assert_close(got, want, 10 * rtol if want.dim() else max(10 * rtol, scalar_grad_rtol), f"d/d{name}")


def far_narrow_field(batch: int, grid: tuple[int, int], heads: int) -> Field:
    """A steered float64 field of 3 atoms per head far off the grid (μ ≈ 30, −25 and 3 cells) with tiny widths
    (σ = 0.06): every weight underflows but the peak, so only an analytic max keeps the output finite."""
    gh, gw = grid
    mu = torch.tensor([30.0, -25.0, 3.3], dtype=torch.float64)[None, :, None].expand(heads, 3, 2)
    return Field(
        (mu + torch.randn(batch, gh, gw, heads, 3, 2, dtype=torch.float64)).requires_grad_(),
        torch.full((batch, gh, gw, heads, 3, 2), 0.06, dtype=torch.float64).requires_grad_(),
        torch.randn(batch, gh, gw, heads, 3, dtype=torch.float64).requires_grad_(),
        torch.tensor(0.5, dtype=torch.float64),
    )


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
