"""The one vision transformer: the lab's models and every standard ViT (timm, transformers' ViT / DeiT / DINOv2), its
attention a part chosen by the config (SSOG, dot-product or RBF; docs/DESIGN.md §2).

timm's ``VisionTransformer`` is the shape: patches → linear embedding (+ learned position embedding) → prefix tokens
(class, distillation, registers, or none; the position embedding covers the first ``pos_prefix`` of them) →
pre-norm blocks with optional LayerScale → LayerNorm → pooling (patch mean, class token, or both) → head(s). What
differs between families by convention, not by design, is a named config field
(:class:`~ssog_core.nn.config.ViTConfig`: ``patch_order``, ``pos_resize``, ``qk_norm_kind``, ``eps``, ...), and a
family's weights are renamed to this model's by its reader in :mod:`ssog_core.checkpoint` (parameter names are the
lab's and the upstream implementation's: ``patch_embed``, ``registers``, ``attn.out``, ``mlp.0`` / ``mlp.2``).

The model runs on any image whose sides are multiples of the patch size: only the position embedding's patch part
is resized (by the family's rule); SSOG's Gaussian fields are re-evaluated on the new grid, whose units stay grid
cells. Tokens are ``[class, distillation, registers..., patches...]``, prefix first. Images are NCHW in [0, 1]; a
model whose config has a ``mean`` / ``std`` normalises them itself.

Hook points (:mod:`ssog_core.nn.hook_points`): ``blocks.{l}.attn.hook_in``, ``…attn.pattern``, ``…attn.head_out``,
``blocks.{l}.resid_post`` in every model, and ``…attn.field`` / ``…attn.probes.{tap}`` with SSOG attention.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ssog_core.nn.attention import build_attention
from ssog_core.nn.config import LAB_EPS, ViTConfig
from ssog_core.nn.hook_points import Dropout, HookPoint


def init_registers(count: int, dim: int, attn: str) -> nn.Parameter:
    """``count`` register tokens ``(1, count, dim)`` for the ViT and the language model: zero for RBF, so a query
    "looks away" at distance ‖q‖ from them; N(0, 0.02²) for dot, whose registers need a random start."""
    std = 0.0 if attn == "rbf" else 0.02
    return nn.Parameter(torch.randn(1, count, dim) * std)


class LayerScale(nn.Module):
    """A learned per-channel gain on a residual branch (timm's ``ls1`` / ``ls2``, DINOv2's ``layer_scale``)."""

    def __init__(self, dim: int):
        super().__init__()
        self.gamma = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        return x * self.gamma


class Block(nn.Module):
    """Pre-norm block: ``x + drop(ls(attn(LN(x))))``, then ``x + drop(ls(MLP(LN(x))))``.

    Shared by the ViT and the causal language model: the attention module (any kind, causal or not) is
    built by the caller, so the block is the same code for images and text. Dropout is
    :class:`~ssog_core.nn.hook_points.Dropout`, which a call may switch off for itself; LayerScale is the identity
    unless ``layer_scale``.
    """

    def __init__(
        self,
        dim: int,
        attn: nn.Module,
        mlp_hidden: int,
        dropout: float = 0.0,
        eps: float = LAB_EPS,
        mlp_bias: bool = True,
        layer_scale: bool = False,
    ):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=eps)
        self.attn = attn
        self.ls1 = LayerScale(dim) if layer_scale else nn.Identity()
        self.drop1 = Dropout(dropout)
        self.norm2 = nn.LayerNorm(dim, eps=eps)
        self.mlp = nn.Sequential(
            nn.Linear(dim, mlp_hidden, bias=mlp_bias), nn.GELU(), nn.Linear(mlp_hidden, dim, bias=mlp_bias)
        )
        self.ls2 = LayerScale(dim) if layer_scale else nn.Identity()
        self.drop2 = Dropout(dropout)
        self.resid_post = HookPoint()  # the block's output (B, P + N, dim): a hook point (ssog_core.nn.hook_points)

    def forward(self, x: Tensor, grid: tuple[int, int]) -> Tensor:
        x = x + self.drop1(self.ls1(self.attn(self.norm1(x), grid)))
        return self.resid_post(x + self.drop2(self.ls2(self.mlp(self.norm2(x)))))


def patch_grid(height: int, width: int, patch: int) -> tuple[int, int]:
    """The token grid of an image cut into ``patch``-pixel squares; its sides must be positive multiples of the
    patch."""
    if height % patch or width % patch or height < patch or width < patch:
        raise ValueError(f"image size {height}×{width} is not a positive multiple of the patch size {patch}")
    return height // patch, width // patch


def resize_pos_embed(
    pe: Tensor,
    grid: tuple[int, int],
    to: tuple[int, int],
    mode: str = "bilinear",
    antialias: bool = False,
    in_float32: bool = False,
) -> Tensor:
    """A ``(1, gh·gw, dim)`` position embedding learned on ``grid``, resized to the grid ``to``: the one rule for
    resolution transfer and for a run started from weights trained at another size. The lab's is bilinear;
    timm's and transformers' are bicubic, some antialiased, some in float32 whatever the model's dtype
    (:class:`~ssog_core.nn.config.ViTConfig`'s ``pos_resize``, ``resize_antialias``, ``resize_in_float32``)."""
    (gh0, gw0), to = tuple(grid), tuple(to)
    if to == (gh0, gw0):
        return pe
    dtype = pe.dtype
    pe = pe.reshape(1, gh0, gw0, -1).permute(0, 3, 1, 2)
    if in_float32:
        pe = pe.float()
    pe = F.interpolate(pe, size=to, mode=mode, align_corners=False, antialias=antialias)
    return pe.to(dtype).permute(0, 2, 3, 1).reshape(1, to[0] * to[1], -1)


class ViT(nn.Module):
    """Image classifier; ``ViT(config)`` or ``ViT(num_classes=..., img_size=..., attn="ssog", ...)``.

    Keyword arguments are the fields of :class:`~ssog_core.nn.config.ViTConfig`; images are NCHW in [0, 1]. The
    model offers what :class:`~ssog_core.nn.protocol.LabModel` declares: the staged run ``embed`` → ``block(x,
    grid)`` → ``readout`` that head importance and the analysis use, and its hook points.
    """

    def __init__(self, config: ViTConfig | None = None, **kwargs: Any):
        super().__init__()
        if config is not None and kwargs:
            raise TypeError("give either a ViTConfig or keyword arguments, not both")
        cfg = config if config is not None else ViTConfig(**kwargs)
        self.config = cfg
        p, dim = cfg.patch_size, cfg.dim
        self.patch_embed = nn.Linear(p * p * cfg.in_chans, dim)
        gh, gw = cfg.grid
        self.pos_embed = nn.Parameter(torch.randn(1, cfg.pos_prefix + gh * gw, dim) * 0.02)
        if cfg.class_token:
            self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        if cfg.dist_token:
            self.dist_token = nn.Parameter(torch.zeros(1, 1, dim))
        if cfg.num_registers:
            self.registers = init_registers(cfg.num_registers, dim, cfg.attn)
        self.drop = Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(
            Block(dim, build_attention(cfg), cfg.mlp_width, cfg.dropout, cfg.eps, cfg.mlp_bias, cfg.layer_scale)
            for _ in range(cfg.depth)
        )
        width = 2 * dim if cfg.pool == "token+avg" else dim
        if cfg.fc_norm:
            self.fc_norm = nn.LayerNorm(width, eps=cfg.eps)
        else:
            self.norm = nn.LayerNorm(dim, eps=cfg.eps)
        if cfg.num_classes:
            self.head = nn.Linear(width, cfg.num_classes)
            if cfg.distilled:
                self.head_dist = nn.Linear(dim, cfg.num_classes)

    @property
    def num_prefix_tokens(self) -> int:
        return self.config.num_prefix_tokens

    @property
    def patch_size(self) -> int:
        return self.config.patch_size

    @property
    def normalization(self) -> dict[str, list[float]] | None:
        """The mean and std the model applies to its [0, 1] input itself, or None (its input is used as given)."""
        cfg = self.config
        return {"mean": list(cfg.mean), "std": list(cfg.std)} if cfg.mean else None

    def grid_for(self, height: int, width: int) -> tuple[int, int]:
        """Token grid for an image of the given size (sides must be multiples of the patch)."""
        return patch_grid(height, width, self.config.patch_size)

    def pos_embed_for(self, grid: tuple[int, int]) -> Tensor:
        """The patches' position embedding ``(1, Gh·Gw, dim)`` on ``grid``: as learned, else resized by the
        family's rule (resolution transfer)."""
        cfg = self.config
        pe = self.pos_embed[:, cfg.pos_prefix :] if cfg.pos_prefix else self.pos_embed
        return resize_pos_embed(pe, cfg.grid, grid, cfg.pos_resize, cfg.resize_antialias, cfg.resize_in_float32)

    def patchify(self, img: Tensor) -> Tensor:
        """``(B, C, H, W)`` → ``(B, N, p·p·C)``, patches in raster order, each flattened in the config's
        ``patch_order``: (row, col, channel) or, as a patch convolution reads it, (channel, row, col)."""
        b, c, h, w = img.shape
        if c != self.config.in_chans:
            raise ValueError(f"expected {self.config.in_chans} image channels, got {c}")
        p = self.config.patch_size
        gh, gw = self.grid_for(h, w)
        order = (0, 2, 4, 3, 5, 1) if self.config.patch_order == "hwc" else (0, 2, 4, 1, 3, 5)
        return img.reshape(b, c, gh, p, gw, p).permute(*order).reshape(b, gh * gw, p * p * c)

    def embed(self, img: Tensor) -> tuple[Tensor, tuple[int, int]]:
        """Tokens entering the first block ``(B, P + N, dim)``, prefix first, and the patch grid."""
        cfg = self.config
        grid = self.grid_for(img.shape[-2], img.shape[-1])
        if cfg.mean:
            img = (img - img.new_tensor(cfg.mean).view(1, -1, 1, 1)) / img.new_tensor(cfg.std).view(1, -1, 1, 1)
        x = self.drop(self.patch_embed(self.patchify(img)) + self.pos_embed_for(grid))
        prefix = [getattr(self, name) for name, on in self._prefix_parts() if on]
        if not prefix:
            return x, grid
        pre = torch.cat(prefix, dim=1).expand(x.shape[0], -1, -1)
        if cfg.pos_prefix:
            k = cfg.pos_prefix
            pre = torch.cat([pre[:, :k] + self.pos_embed[:, :k], pre[:, k:]], dim=1)
        return torch.cat([pre, x], dim=1), grid

    def _prefix_parts(self) -> tuple[tuple[str, bool], ...]:
        cfg = self.config
        return ("cls_token", cfg.class_token), ("dist_token", cfg.dist_token), ("registers", cfg.num_registers > 0)

    def forward_features(self, img: Tensor) -> Tensor:
        """The patch tokens ``(B, N, dim)`` after the last block (prefix stripped), through the final norm unless
        it follows the pooling (``fc_norm``)."""
        return self._final_norm(self._stream(img))[:, self.num_prefix_tokens :]

    def readout(self, x: Tensor) -> Tensor:
        """Logits ``(B, classes)`` from the residual stream ``(B, P + N, dim)`` after the last block (what a caller
        that runs the blocks itself ends with): final norm, pooling, head; the pooled features when the model has
        no head."""
        cfg = self.config
        x = self._final_norm(x)
        if cfg.pool == "token":
            pooled = x[:, 0]
        else:
            pooled = x[:, self.num_prefix_tokens :].mean(dim=1)
            pooled = torch.cat([x[:, 0], pooled], dim=-1) if cfg.pool == "token+avg" else pooled
        if cfg.fc_norm:
            pooled = self.fc_norm(pooled)
        if not cfg.num_classes:
            return pooled
        logits = self.head(pooled)
        return (logits + self.head_dist(x[:, 1])) / 2 if cfg.distilled else logits

    def forward(self, img: Tensor) -> Tensor:
        return self.readout(self._stream(img))

    def _stream(self, img: Tensor) -> Tensor:
        x, grid = self.embed(img)
        for block in self.blocks:
            x = block(x, grid)
        return x

    def _final_norm(self, x: Tensor) -> Tensor:
        return x if self.config.fc_norm else self.norm(x)
