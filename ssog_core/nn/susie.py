"""SuSiE (subspace sinusoidal embeddings): a position code for distance-based attention.

RoPE rotates q and k, which preserves dot products between equally rotated vectors but not the Euclidean
distances RBF attention measures. SuSiE instead *adds* fixed, unrotated sinusoids of the token position to
q and k on a subspace of each head (its first ``dim`` channels), each frequency scaled by a learnable
per-head weight. Because the same code is added to a query and a key at the same place, position enters
the logit ``−γ‖q − k‖²`` through ``‖(q − k) + w ∘ (c(p_q) − c(p_k))‖²``: a distance penalty that grows
with the positions' separation (for each frequency, ``|c(p) − c(p')|² = 4 sin²(ω(p − p')/2)``).

* 1D (sequences): token t at position t; ``dim/2`` frequencies ω_i = θ^(−2i/dim), code ``[sin(tω), cos(tω)]``.
* 2D (image grids): a token at grid cell (row, col) codes its row on half of the frequency pairs and its
  column on the other half (``dim`` must be a multiple of 4). Units are grid cells, so a ViT run on a
  larger grid (resolution transfer) needs no resizing: positions beyond the training grid are just new
  phases of the same sinusoids.

Prefix (register) tokens get **no** code: a zero-initialised register's key stays exactly at the origin,
the one place that is equally close to every query direction (so a query that finds nothing useful can
put its mass there, at distance ‖q‖). Tokens are laid out as ``[prefix..., grid raster...]``; the prefix
length is whatever precedes the ``Gh·Gw`` grid tokens.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

THETA = 10000.0  # the usual transformer base: periods from 2π up to ~θ·2π positions
INIT_WEIGHT = 0.5  # a modest start, so that content similarity dominates the distances early in training
SUSIE_MODES = ("1d", "2d")


def frequencies(n: int, device: torch.device | None = None) -> Tensor:
    """``n`` geometric angular frequencies from 1 down to about 1/θ (float64)."""
    return THETA ** (-torch.arange(n, device=device, dtype=torch.float64) / n)


def phases(grid: tuple[int, int], pairs: int, mode: str, device: torch.device | None = None) -> Tensor:
    """Angles ``(Gh·Gw, pairs)`` of every grid token (raster order) for each sin/cos pair (float64)."""
    gh, gw = grid
    if mode == "1d":
        pos = torch.arange(gh * gw, device=device, dtype=torch.float64)
        return pos[:, None] * frequencies(pairs, device)[None, :]
    if mode != "2d":
        raise ValueError(f"SuSiE mode {mode!r} is not one of {SUSIE_MODES}")
    if pairs % 2:
        raise ValueError(f"2D SuSiE needs an even number of frequency pairs, got {pairs}")
    w = frequencies(pairs // 2, device)
    rows = torch.arange(gh, device=device, dtype=torch.float64).repeat_interleave(gw)
    cols = torch.arange(gw, device=device, dtype=torch.float64).repeat(gh)
    return torch.cat([rows[:, None] * w, cols[:, None] * w], dim=-1)


def sinusoids(grid: tuple[int, int], dim: int, mode: str, device: torch.device | None = None) -> Tensor:
    """The code ``(Gh·Gw, dim)``: ``[sin(φ), cos(φ)]`` of :func:`phases` (float64)."""
    if dim < 2 or dim % 2:
        raise ValueError(f"SuSiE needs an even, positive subspace width, got {dim}")
    phi = phases(grid, dim // 2, mode, device)
    return torch.cat([phi.sin(), phi.cos()], dim=-1)


class SuSiE(nn.Module):
    """Adds the weighted code to q and k (``(B, H, P + Gh·Gw, head_dim)``) on their first ``dim`` channels.

    Args:
        num_heads: heads, each with its own weights.
        head_dim: channels per head.
        dim: width of the coded subspace (even; a multiple of 4 for 2D); ``0`` means the whole head.
        mode: ``"1d"`` (sequence position = raster index) or ``"2d"`` (row and column).
    """

    def __init__(self, num_heads: int, head_dim: int, dim: int = 0, mode: str = "1d"):
        super().__init__()
        dim = dim or head_dim
        if mode not in SUSIE_MODES:
            raise ValueError(f"SuSiE mode {mode!r} is not one of {SUSIE_MODES}")
        if dim % (4 if mode == "2d" else 2) or not 0 < dim <= head_dim:
            raise ValueError(
                f"SuSiE subspace width {dim} must be in (0, head_dim={head_dim}] and a multiple of "
                f"{4 if mode == '2d' else 2} for {mode}"
            )
        self.num_heads, self.head_dim, self.dim, self.mode = num_heads, head_dim, dim, mode
        self.weight = nn.Parameter(torch.full((num_heads, dim // 2), INIT_WEIGHT))  # one per head and sin/cos pair

    def code(self, n_tokens: int, grid: tuple[int, int], device: torch.device, dtype: torch.dtype) -> Tensor:
        """The weighted code ``(1, H, n_tokens, dim)``, zero on the prefix tokens."""
        gh, gw = grid
        prefix = n_tokens - gh * gw
        if prefix < 0 or gh < 1 or gw < 1:
            raise ValueError(f"{n_tokens} tokens cannot hold a {gh}×{gw} grid (prefix tokens come first)")
        c = sinusoids(grid, self.dim, self.mode, device).to(dtype)  # (Gh·Gw, dim)
        w = torch.cat([self.weight, self.weight], dim=-1).to(dtype)  # (H, dim): sin and cos share a weight
        pe = w[:, None, :] * c[None]  # (H, Gh·Gw, dim)
        return nn.functional.pad(pe, (0, 0, prefix, 0))[None]

    def forward(self, q: Tensor, k: Tensor, grid: tuple[int, int]) -> tuple[Tensor, Tensor]:
        pe = self.code(q.shape[-2], grid, q.device, q.dtype)
        pe = nn.functional.pad(pe, (0, self.head_dim - self.dim))
        return q + pe, k + pe

    def extra_repr(self) -> str:
        return f"heads={self.num_heads}, dim={self.dim}/{self.head_dim}, mode={self.mode}"
