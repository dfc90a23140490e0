"""A small vision transformer whose attention is SSOG, its dot twin, or RBF (docs/DESIGN.md §2).

Patches → linear embedding + learned position embedding → pre-norm blocks → LayerNorm → mean pool →
linear head; no class token. The model runs on any image whose sides are multiples of the patch size:
only the position embedding is resized (bilinear); the Gaussian fields are re-evaluated on the new grid,
whose units stay grid cells.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ssog_core.nn.attention import build_attention
from ssog_core.nn.config import ViTConfig
from ssog_core.nn.hook_points import Dropout, HookPoint

LAB_EPS = 1e-5  # every LayerNorm's epsilon in the lab's ViT (torch's default)


def init_registers(count: int, dim: int, attn: str) -> nn.Parameter:
    """``count`` register tokens ``(1, count, dim)`` for the ViT and the language model: zero for RBF, so a query
    "looks away" at distance ‖q‖ from them; N(0, 0.02²) for dot, whose registers need a random start."""
    std = 0.0 if attn == "rbf" else 0.02
    return nn.Parameter(torch.randn(1, count, dim) * std)


class Block(nn.Module):
    """Pre-norm block: ``x + drop(attn(LN(x)))``, then ``x + drop(MLP(LN(x)))``.

    Shared by the ViT and the causal language model: the attention module (any kind, causal or not) is
    built by the caller, so the block is the same code for images and text. Dropout is
    :class:`~ssog_core.nn.hook_points.Dropout`, which a call may switch off for itself.
    """

    def __init__(self, dim: int, attn: nn.Module, mlp_ratio: float, dropout: float):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=LAB_EPS)
        self.attn = attn
        self.drop1 = Dropout(dropout)
        self.norm2 = nn.LayerNorm(dim, eps=LAB_EPS)
        hidden = int(dim * mlp_ratio)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))
        self.drop2 = Dropout(dropout)
        self.resid_post = HookPoint()  # the block's output (B, P + N, dim): a hook point (ssog_core.nn.hook_points)

    def forward(self, x: Tensor, grid: tuple[int, int]) -> Tensor:
        x = x + self.drop1(self.attn(self.norm1(x), grid))
        return self.resid_post(x + self.drop2(self.mlp(self.norm2(x))))


def patch_grid(height: int, width: int, patch: int) -> tuple[int, int]:
    """The token grid of an image cut into ``patch``-pixel squares; its sides must be positive multiples of the
    patch (every ViT the lab opens, its own and the standard ones)."""
    if height % patch or width % patch or height < patch or width < patch:
        raise ValueError(f"image size {height}×{width} is not a positive multiple of the patch size {patch}")
    return height // patch, width // patch


def resize_pos_embed(pe: Tensor, grid: tuple[int, int], to: tuple[int, int]) -> Tensor:
    """A ``(1, gh·gw, dim)`` position embedding learned on ``grid``, resized bilinearly to the grid ``to``: the one
    rule for resolution transfer and for a run started from weights trained at another size."""
    (gh0, gw0), to = tuple(grid), tuple(to)
    if to == (gh0, gw0):
        return pe
    pe = pe.reshape(1, gh0, gw0, -1).permute(0, 3, 1, 2)
    pe = F.interpolate(pe, size=to, mode="bilinear", align_corners=False)
    return pe.permute(0, 2, 3, 1).reshape(1, to[0] * to[1], -1)


class ViT(nn.Module):
    """Image classifier; ``ViT(config)`` or ``ViT(num_classes=..., img_size=..., attn="ssog", ...)``.

    Keyword arguments are the fields of :class:`~ssog_core.nn.config.ViTConfig`; images are NCHW in [0, 1].
    """

    def __init__(self, config: ViTConfig | None = None, **kwargs: Any):
        super().__init__()
        if config is not None and kwargs:
            raise TypeError("give either a ViTConfig or keyword arguments, not both")
        cfg = config if config is not None else ViTConfig(**kwargs)
        self.config = cfg
        p = cfg.patch_size
        self.patch_embed = nn.Linear(p * p * cfg.in_chans, cfg.dim)
        gh, gw = cfg.grid
        self.pos_embed = nn.Parameter(torch.randn(1, gh * gw, cfg.dim) * 0.02)
        if cfg.num_registers:
            self.registers = init_registers(cfg.num_registers, cfg.dim, cfg.attn)
        self.drop = Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(
            Block(cfg.dim, build_attention(cfg), cfg.mlp_ratio, cfg.dropout) for _ in range(cfg.depth)
        )
        self.norm = nn.LayerNorm(cfg.dim, eps=LAB_EPS)
        self.head = nn.Linear(cfg.dim, cfg.num_classes)

    @property
    def num_prefix_tokens(self) -> int:
        return self.config.num_registers

    def grid_for(self, height: int, width: int) -> tuple[int, int]:
        """Token grid for an image of the given size (sides must be multiples of the patch)."""
        return patch_grid(height, width, self.config.patch_size)

    def pos_embed_for(self, grid: tuple[int, int]) -> Tensor:
        """The position embedding on ``grid``: learned as is, else resized bilinearly (resolution transfer)."""
        return resize_pos_embed(self.pos_embed, self.config.grid, grid)

    def patchify(self, img: Tensor) -> Tensor:
        """``(B, C, H, W)`` → ``(B, N, p·p·C)``, patches in raster order, each flattened (row, col, channel)."""
        b, c, h, w = img.shape
        if c != self.config.in_chans:
            raise ValueError(f"expected {self.config.in_chans} image channels, got {c}")
        p = self.config.patch_size
        gh, gw = self.grid_for(h, w)
        x = img.reshape(b, c, gh, p, gw, p).permute(0, 2, 4, 3, 5, 1)
        return x.reshape(b, gh * gw, p * p * c)

    def embed(self, img: Tensor) -> tuple[Tensor, tuple[int, int]]:
        """Tokens entering the first block (registers first) and the patch grid."""
        grid = self.grid_for(img.shape[-2], img.shape[-1])
        x = self.drop(self.patch_embed(self.patchify(img)) + self.pos_embed_for(grid))
        if self.config.num_registers:
            x = torch.cat([self.registers.expand(x.shape[0], -1, -1), x], dim=1)
        return x, grid

    def forward_features(self, img: Tensor) -> Tensor:
        """Normalised patch tokens ``(B, N, dim)`` after the last block (registers stripped)."""
        return self._patch_tokens(self._stream(img))

    def readout(self, x: Tensor) -> Tensor:
        """Logits ``(B, classes)`` from the residual stream ``(B, P + N, dim)`` after the last block: registers
        stripped, LayerNorm, mean pool, head (what a caller that runs the blocks itself ends with)."""
        return self.head(self._patch_tokens(x).mean(dim=1))

    def forward(self, img: Tensor) -> Tensor:
        return self.readout(self._stream(img))

    def _stream(self, img: Tensor) -> Tensor:
        x, grid = self.embed(img)
        for block in self.blocks:
            x = block(x, grid)
        return x

    def _patch_tokens(self, x: Tensor) -> Tensor:
        return self.norm(x[:, self.num_prefix_tokens :])
