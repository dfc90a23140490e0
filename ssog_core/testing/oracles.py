"""An independent float64 definition of the SSOG operator and random fields to check its backends against.

Shared by the tests and ``benchmarks/gpu_check.py`` (which must not import from ``tests/``). The oracle
builds the whole ``(B, H, N, N)`` attention matrix from docs/DESIGN.md §1 directly (per-query kernels for every atom,
no factorisation, nothing from ``ssog_core.field`` but the :class:`Field` container and the steering that the
attention module applies), so the fast paths are checked against the definition rather than against another
fast path. Everything is built on the device of its inputs.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ssog_core.field import TAPS, Field, base_field, bound, steer

TAP_SUBSETS = [(), ("mu",), ("sigma",), ("lambda",), ("mu", "sigma"), ("mu", "lambda"), ("sigma", "lambda"), TAPS]


def _log_density(d: Tensor, mu: Tensor, sigma: Tensor) -> Tensor:
    return -0.5 * math.log(2 * math.pi) - torch.log(sigma) - (d - mu) ** 2 / (2 * sigma**2)


def oracle_matrix(field: Field, grid: tuple[int, int], mode: str, batch: int = 1) -> Tensor:
    """``A[b, h, (i, w), (j, k)]`` in float64, straight from the definition."""
    gh, gw = grid
    f64 = torch.float64
    mu, sigma, log_lam, tau = (t.to(f64) for t in (field.mu, field.sigma, field.log_lam, field.tau))
    if mu.dim() == 3:  # shared field: every token gets the same atoms
        mu = mu.expand(batch, gh, gw, *mu.shape)
        sigma = sigma.expand(batch, gh, gw, *sigma.shape)
        log_lam = log_lam.expand(batch, gh, gw, *log_lam.shape)
    b, h = mu.shape[0], mu.shape[3]
    rows = torch.arange(gh, dtype=f64, device=mu.device)  # on the field's device: no CPU/GPU mix
    cols = torch.arange(gw, dtype=f64, device=mu.device)
    dy = rows[:, None, None, None, None] - rows  # (i, 1, 1, 1, 1, j): query row − key row
    dx = cols[None, :, None, None, None] - cols  # (1, w, 1, 1, 1, k)
    ly = _log_density(dy, mu[..., 0, None], sigma[..., 0, None])  # (B, i, w, H, R, j)
    lx = _log_density(dx, mu[..., 1, None], sigma[..., 1, None])  # (B, i, w, H, R, k)
    if mode == "factorized":
        ay = torch.softmax(ly / tau, dim=-1)
        ax = torch.softmax(lx / tau, dim=-1)
        lam = torch.softmax(log_lam, dim=-1)
        # A[(i,w),(j,k)] = Σ_r λ_r(i,w) · ax_r((i,w),k) · ay_r((i,k),j)
        a = torch.einsum("biwhr,biwhrk,bikhrj->bhiwjk", lam, ax, ay)
    else:
        log_w = torch.log_softmax(log_lam, dim=-1)[..., None]
        ay = torch.softmax(torch.logsumexp(log_w + ly, dim=-2) / tau, dim=-1)  # (B, i, w, H, j)
        ax = torch.softmax(torch.logsumexp(log_w + lx, dim=-2) / tau, dim=-1)  # (B, i, w, H, k)
        a = torch.einsum("biwhk,bikhj->bhiwjk", ax, ay)
    return a.reshape(b, h, gh * gw, gh * gw)


def oracle_apply(v: Tensor, field: Field, grid: tuple[int, int], mode: str) -> Tensor:
    """``y = A · v`` in float64 for values ``(B, N, H, D)``."""
    a = oracle_matrix(field, grid, mode, batch=v.shape[0])
    return torch.einsum("bhnm,bmhd->bnhd", a, v.to(torch.float64))


class FieldLeaves:
    """Leaf tensors of a (possibly steered) field, built the way :class:`SSOGAttention` builds it."""

    def __init__(self, batch: int, grid: tuple[int, int], heads: int, atoms: int, taps: tuple[str, ...],
                 dtype: torch.dtype = torch.float64, spread: float = 1.0,
                 device: torch.device | str = "cpu") -> None:  # fmt: skip
        gh, gw = grid
        g = torch.Generator().manual_seed(1234 + 17 * atoms + heads)

        def rnd(*shape: int, scale: float = 1.0, shift: float = 0.0) -> Tensor:
            return (torch.randn(shape, generator=g, dtype=torch.float64) * scale + shift).to(dtype)

        self.taps = taps
        self.grid = grid
        self.leaves: dict[str, Tensor] = {
            "mu": rnd(heads, atoms, 2, scale=1.5 * spread),
            "raw_sigma": rnd(heads, atoms, 2, scale=0.6, shift=0.2),
            "log_lambda": rnd(heads, atoms, scale=0.8),
            "raw_tau": rnd(scale=0.5),
        }
        shapes = {"mu": (batch, gh, gw, heads, atoms, 2), "sigma": (batch, gh, gw, heads, atoms, 2),
                  "lambda": (batch, gh, gw, heads, atoms)}  # fmt: skip
        for tap in taps:
            self.leaves[f"probe_{tap}"] = rnd(*shapes[tap], scale=1.5)
            self.leaves[f"gate_{tap}"] = rnd(scale=0.3, shift=-0.5)
        for name, t in self.leaves.items():  # drawn on the CPU (the same numbers everywhere), then moved
            self.leaves[name] = t.to(device).requires_grad_(True)

    def field(self, dtype: torch.dtype | None = None) -> Field:
        lv = {k: (t.to(dtype) if dtype is not None else t) for k, t in self.leaves.items()}
        fixed = base_field(lv["mu"], lv["raw_sigma"], lv["log_lambda"], lv["raw_tau"], sigma_floor=0.25)
        if not self.taps:
            return fixed
        probes = {tap: bound(lv[f"probe_{tap}"]) for tap in self.taps}
        scales = {tap: torch.nn.functional.softplus(lv[f"gate_{tap}"]) + 1e-4 for tap in self.taps}
        return steer(fixed, probes, scales, max_offset=4.0)

    def names(self) -> list[str]:
        return list(self.leaves)

    def tensors(self) -> list[Tensor]:
        return list(self.leaves.values())


def grads(out: Tensor, inputs: list[Tensor], dy: Tensor) -> list[Tensor]:
    """Gradients of ``out`` against ``dy`` for every input, zeros where an input does not reach ``out``."""
    g = torch.autograd.grad(out, inputs, dy.to(out.dtype), allow_unused=True)
    return [torch.zeros_like(x) if gi is None else gi for gi, x in zip(g, inputs, strict=True)]
