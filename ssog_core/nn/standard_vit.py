"""The standard vision transformer of timm, Hugging Face transformers (ViT, DeiT, DINOv2) and the papers, as lab
code with the lab's hook points: weights are converted in (:mod:`ssog_core.checkpoint.standard`), not wrapped.

One implementation covers the families: patch embedding (the patch convolution applied as a linear map), a class
token or none, a distillation token, register tokens, a position embedding that covers the first ``pos_prefix``
prefix tokens and the patches (timm's ``no_embed_class``: none of the prefix), qkv bias, QK-norm, LayerScale, pre-norm
blocks, the final norm before pooling or after it (timm's ``fc_norm``), and the heads: class token, patch mean,
DINOv2's class token beside the patch mean, distilled DeiT's two heads averaged.

Tokens are ``[class, distillation, registers..., patches...]`` (prefix first). Attention is computed from the
module's own q and k with an explicit softmax, so the hook point ``blocks.{l}.attn.pattern`` sees, and may replace,
the weights the output is made from. Hook points (names shared with :class:`ssog_core.nn.vit.ViT`):

| point | activation |
|---|---|
| ``blocks.{l}.attn.hook_in`` | the LayerNormed attention input ``(B, T, dim)`` |
| ``blocks.{l}.attn.pattern`` | post-softmax attention ``(B, H, T, T)``, prefix tokens first |
| ``blocks.{l}.attn.head_out`` | per-head output before the output projection ``(B, T, H, head_dim)`` |
| ``blocks.{l}.resid_post`` | the block's output ``(B, T, dim)`` |

T counts every token, prefix first (the lab's ViT has no class token, and its ``head_out`` is over patches).
Images are NCHW in [0, 1]; the model applies its own mean / std. Any image whose sides the patch divides runs: the
patch part of the position embedding is resized bicubically, with or without antialiasing and in float32 or the
model's dtype, as the source family does it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ssog_core.nn.config import PatchShape
from ssog_core.nn.hook_points import HookPoint
from ssog_core.nn.vit import patch_grid

FAMILIES = ("timm", "vit", "deit", "dinov2", "dinov2_with_registers")  # whose conventions the weights follow
TIMM_EPS = 1e-6  # timm's LayerNorm epsilon
POOLS = ("token", "avg", "token+avg")  # class token, patch mean, DINOv2's class token beside the patch mean


@dataclass(frozen=True)
class StandardViTConfig(PatchShape):
    """Architecture of a :class:`StandardViT`; the readers fill it from a timm or transformers config."""

    family: str
    img_size: tuple[int, int]  # the source's input size (H, W); other multiples of the patch still run
    patch_size: int
    dim: int
    depth: int
    num_heads: int
    num_classes: int  # 0: no head, the model returns the pooled features (timm's num_classes=0)
    mlp_hidden: int
    in_chans: int = 3
    eps: float = TIMM_EPS  # every LayerNorm's epsilon (transformers' ViT / DeiT: 1e-12)
    qkv_bias: bool = True
    proj_bias: bool = True  # biases of the attention output and both MLP layers (timm's proj_bias)
    qk_norm: bool = False  # LayerNorm (with gain and bias) on each head's q and k
    layer_scale: bool = False
    class_token: bool = True
    dist_token: bool = False
    num_registers: int = 0
    pos_prefix: int = 1  # how many leading prefix tokens have a position embedding (0: timm no_embed_class)
    pool: str = "token"
    fc_norm: bool = False  # the final norm after pooling instead of before
    distilled: bool = False  # DeiT: a second head on the distillation token, the two logits averaged
    resize_antialias: bool = True  # position-embedding resizing antialiases (timm, DINOv2 with registers)
    resize_in_float32: bool = True  # and runs in float32 whatever the model's dtype (timm, DINOv2)
    mean: tuple[float, ...] = (0.0, 0.0, 0.0)
    std: tuple[float, ...] = (1.0, 1.0, 1.0)
    attn: str = field(default="dot", init=False)  # what the lab's code asks of a model: dot-product attention

    def __post_init__(self) -> None:
        size = (self.img_size, self.img_size) if isinstance(self.img_size, int) else self.img_size
        object.__setattr__(self, "img_size", tuple(int(s) for s in size))
        object.__setattr__(self, "mean", tuple(float(m) for m in self.mean))
        object.__setattr__(self, "std", tuple(float(s) for s in self.std))
        problems = self.problems()
        if problems:
            raise ValueError("invalid standard ViT config: " + "; ".join(problems))

    def problems(self) -> list[str]:
        p = []
        whole = ("patch_size", "dim", "depth", "num_heads", "mlp_hidden", "in_chans")
        for name in (*whole, "num_classes", "num_registers", "pos_prefix"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < (1 if name in whole else 0):
                p.append(f"{name}={value!r} must be a whole number >= {1 if name in whole else 0}")
        if p:
            return p
        if self.family not in FAMILIES:
            p.append(f"family={self.family!r} is not one of {FAMILIES}")
        if self.pool not in POOLS:
            p.append(f"pool={self.pool!r} is not one of {POOLS}")
        if len(self.img_size) != 2 or min(self.img_size) < 1 or any(s % self.patch_size for s in self.img_size):
            p.append(f"img_size={self.img_size} must be positive multiples of patch_size={self.patch_size}")
        if self.dim % self.num_heads:
            p.append(f"dim={self.dim} must be divisible by num_heads={self.num_heads}")
        if not self.eps > 0:
            p.append(f"eps={self.eps} must be positive")
        if self.pos_prefix > self.num_prefix_tokens:
            p.append(f"pos_prefix={self.pos_prefix} is more than the {self.num_prefix_tokens} prefix token(s)")
        if "token" in self.pool and not self.class_token:
            p.append(f"pool={self.pool!r} reads the class token, which this model does not have")
        if self.distilled and not (self.dist_token and self.pool == "token" and not self.fc_norm):
            p.append("a distilled head needs the distillation token and class-token pooling")
        if len(self.mean) != self.in_chans or len(self.std) != self.in_chans or min(self.std, default=1) <= 0:
            p.append(f"mean / std need {self.in_chans} values each, std positive")
        return p

    @property
    def num_prefix_tokens(self) -> int:
        return int(self.class_token) + int(self.dist_token) + self.num_registers

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d.pop("attn")
        return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}


class Attention(nn.Module):
    """Multi-head self-attention with an explicit softmax: what the ``pattern`` point passes on is what mixes v."""

    def __init__(self, cfg: StandardViTConfig):
        super().__init__()
        self.num_heads, self.head_dim, self.dim = cfg.num_heads, cfg.head_dim, cfg.dim
        self.scale = cfg.head_dim**-0.5
        self.qkv = nn.Linear(cfg.dim, 3 * cfg.dim, bias=cfg.qkv_bias)
        if cfg.qk_norm:
            self.q_norm = nn.LayerNorm(cfg.head_dim, eps=cfg.eps)
            self.k_norm = nn.LayerNorm(cfg.head_dim, eps=cfg.eps)
        self.qk_norm = cfg.qk_norm
        self.proj = nn.Linear(cfg.dim, cfg.dim, bias=cfg.proj_bias)
        self.hook_in = HookPoint()  # the LayerNormed input (B, T, dim)
        self.pattern = HookPoint()  # post-softmax attention (B, H, T, T)
        self.head_out = HookPoint()  # per-head output (B, T, H, head_dim) before the output projection

    def queries_keys_values(self, x: Tensor, grid: tuple[int, int] | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """The q, k, v ``(B, H, T, head_dim)`` the logits see (after QK-norm); ``grid`` is unused (no position code)."""
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        return q, k, v

    def _pattern(self, q: Tensor, k: Tensor) -> Tensor:
        return self.pattern(torch.softmax((q * self.scale) @ k.transpose(-2, -1), dim=-1))

    def forward(self, x: Tensor) -> Tensor:
        x = self.hook_in(x)
        b, t, _ = x.shape
        q, k, v = self.queries_keys_values(x)
        y = self.head_out((self._pattern(q, k) @ v).transpose(1, 2))
        return self.proj(y.reshape(b, t, self.dim))

    def attention_matrix(self, x: Tensor, grid: tuple[int, int] | None = None) -> Tensor:
        """The ``(B, H, T, T)`` weights for the LayerNormed input ``x``, through the ``pattern`` point (``grid``: the
        lab's attention interface; unused)."""
        q, k, _ = self.queries_keys_values(x)
        return self._pattern(q, k)


class LayerScale(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.gamma = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        return x * self.gamma


class Mlp(nn.Module):
    def __init__(self, cfg: StandardViTConfig):
        super().__init__()
        self.fc1 = nn.Linear(cfg.dim, cfg.mlp_hidden, bias=cfg.proj_bias)
        self.fc2 = nn.Linear(cfg.mlp_hidden, cfg.dim, bias=cfg.proj_bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class Block(nn.Module):
    """Pre-norm block ``x + ls1(attn(LN(x)))``, then ``x + ls2(mlp(LN(x)))``."""

    def __init__(self, cfg: StandardViTConfig):
        super().__init__()
        self.norm1 = nn.LayerNorm(cfg.dim, eps=cfg.eps)
        self.attn = Attention(cfg)
        self.ls1 = LayerScale(cfg.dim) if cfg.layer_scale else nn.Identity()
        self.norm2 = nn.LayerNorm(cfg.dim, eps=cfg.eps)
        self.mlp = Mlp(cfg)
        self.ls2 = LayerScale(cfg.dim) if cfg.layer_scale else nn.Identity()
        self.resid_post = HookPoint()  # the block's output (B, T, dim)

    def forward(self, x: Tensor, grid: tuple[int, int] | None = None) -> Tensor:
        """``grid``: the patch grid, which the lab's blocks take (``block(x, grid)``) and this one does not need."""
        x = x + self.ls1(self.attn(self.norm1(x)))
        return self.resid_post(x + self.ls2(self.mlp(self.norm2(x))))


class StandardViT(nn.Module):
    """The standard ViT; parameter names are timm's (the patch convolution's weight flattened to a linear map's)."""

    def __init__(self, config: StandardViTConfig):
        super().__init__()
        cfg = self.config = config
        p = cfg.patch_size
        self.patch_embed = nn.Module()
        self.patch_embed.proj = nn.Linear(cfg.in_chans * p * p, cfg.dim)
        if cfg.class_token:
            self.cls_token = nn.Parameter(torch.zeros(1, 1, cfg.dim))
        if cfg.dist_token:
            self.dist_token = nn.Parameter(torch.zeros(1, 1, cfg.dim))
        if cfg.num_registers:
            self.reg_token = nn.Parameter(torch.zeros(1, cfg.num_registers, cfg.dim))
        gh, gw = cfg.grid
        self.pos_embed = nn.Parameter(torch.zeros(1, cfg.pos_prefix + gh * gw, cfg.dim))
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.depth))
        width = 2 * cfg.dim if cfg.pool == "token+avg" else cfg.dim
        if cfg.fc_norm:
            self.fc_norm = nn.LayerNorm(width, eps=cfg.eps)
        else:
            self.norm = nn.LayerNorm(cfg.dim, eps=cfg.eps)
        if cfg.num_classes:
            self.head = nn.Linear(width, cfg.num_classes)
        if cfg.distilled and cfg.num_classes:
            self.head_dist = nn.Linear(cfg.dim, cfg.num_classes)

    @property
    def num_prefix_tokens(self) -> int:
        return self.config.num_prefix_tokens

    def grid_for(self, height: int, width: int) -> tuple[int, int]:
        """Token grid for an image of the given size (sides must be multiples of the patch)."""
        return patch_grid(height, width, self.config.patch_size)

    def pos_embed_for(self, grid: tuple[int, int]) -> Tensor:
        """The patches' position embedding ``(1, Gh·Gw, dim)`` on ``grid``: as learned, else resized bicubically
        the way the source family resizes it."""
        cfg = self.config
        pe = self.pos_embed[:, cfg.pos_prefix :]
        if tuple(grid) == cfg.grid:
            return pe
        dtype = pe.dtype
        pe = pe.reshape(1, *cfg.grid, -1).permute(0, 3, 1, 2)
        if cfg.resize_in_float32:
            pe = pe.float()
        pe = F.interpolate(pe, size=tuple(grid), mode="bicubic", align_corners=False, antialias=cfg.resize_antialias)
        return pe.to(dtype).permute(0, 2, 3, 1).reshape(1, grid[0] * grid[1], -1)

    def embed(self, img: Tensor) -> tuple[Tensor, tuple[int, int]]:
        """Tokens entering the first block ``(B, T, dim)``, prefix first, from an image in [0, 1], and the patch
        grid: the staged run every lab model offers (``embed``, ``block(x, grid)``, ``readout``), which head
        importance uses to start each edited run at its own layer."""
        cfg = self.config
        b, c, h, w = img.shape
        if c != cfg.in_chans:
            raise ValueError(f"expected {cfg.in_chans} image channels, got {c}")
        (gh, gw), p = self.grid_for(h, w), cfg.patch_size
        x = (img - img.new_tensor(cfg.mean).view(1, -1, 1, 1)) / img.new_tensor(cfg.std).view(1, -1, 1, 1)
        patches = x.reshape(b, c, gh, p, gw, p).permute(0, 2, 4, 1, 3, 5).reshape(b, gh * gw, c * p * p)
        x = self.patch_embed.proj(patches) + self.pos_embed_for((gh, gw))
        prefix = [getattr(self, n) for n, on in self._prefix_parts() if on]
        if not prefix:
            return x, (gh, gw)
        pre = torch.cat(prefix, dim=1).expand(b, -1, -1)
        if cfg.pos_prefix:
            pre = torch.cat(
                [pre[:, : cfg.pos_prefix] + self.pos_embed[:, : cfg.pos_prefix], pre[:, cfg.pos_prefix :]], 1
            )
        return torch.cat([pre, x], dim=1), (gh, gw)

    def _prefix_parts(self) -> tuple[tuple[str, bool], ...]:
        cfg = self.config
        return ("cls_token", cfg.class_token), ("dist_token", cfg.dist_token), ("reg_token", cfg.num_registers > 0)

    def forward_features(self, img: Tensor) -> Tensor:
        """Every token after the last block ``(B, T, dim)``, prefix first, normalised unless the norm follows the
        pooling (``fc_norm``)."""
        x, grid = self.embed(img)
        for block in self.blocks:
            x = block(x, grid)
        return x if self.config.fc_norm else self.norm(x)

    def readout(self, x: Tensor) -> Tensor:
        """Logits from the residual stream after the last block (what a caller that runs the blocks itself ends
        with)."""
        return self.forward_head(x if self.config.fc_norm else self.norm(x))

    def forward_head(self, x: Tensor) -> Tensor:
        """Logits from :meth:`forward_features` (the pooled features when the model has no head)."""
        cfg = self.config
        if cfg.pool == "token":
            pooled = x[:, 0]
        else:
            pooled = x[:, cfg.num_prefix_tokens :].mean(dim=1)
            pooled = torch.cat([x[:, 0], pooled], dim=-1) if cfg.pool == "token+avg" else pooled
        if cfg.fc_norm:
            pooled = self.fc_norm(pooled)
        if not cfg.num_classes:
            return pooled
        logits = self.head(pooled)
        return (logits + self.head_dist(x[:, 1])) / 2 if cfg.distilled else logits

    def forward(self, img: Tensor) -> Tensor:
        return self.forward_head(self.forward_features(img))
