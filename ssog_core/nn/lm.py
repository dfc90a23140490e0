"""A small causal language model with dot-product or RBF attention, on the ViT's blocks.

The model: token embedding (+ a learned absolute position embedding if ``position="learned"``), optional
register tokens prepended (zero for RBF so a query can "look away" at distance ‖q‖, N(0, 0.02²) for dot),
the ViT's pre-norm :class:`~ssog_core.nn.vit.Block` with a causal attention module (a sequence is a ``1 × T`` grid)
and a GELU MLP, final LayerNorm, linear head. With ``position="susie"`` (default) the 1D SuSiE code is added to
queries and keys in every layer instead. Tokens are bytes (vocabulary 256, any text) or the text's characters.
Its checkpoints are :mod:`ssog_core.checkpoint.lm`; training and loss curves :mod:`ssog_core.train.lm`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ssog_core.nn.attention import DotAttention, RBFAttention
from ssog_core.nn.hook_points import Dropout
from ssog_core.nn.vit import Block, init_registers

POSITIONS = ("susie", "learned", "none")
LM_ATTENTION = ("dot", "rbf")


@dataclass(frozen=True)
class LMConfig:
    """Architecture of a :class:`CausalLM`; each default says why it is what it is."""

    vocab_size: int = 256  # bytes; a char tokenizer sets its own
    context: int = 256  # tokens per window (registers not counted): TinyStories' stories fit
    dim: int = 256
    depth: int = 4
    num_heads: int = 4
    mlp_ratio: float = 4.0  # the usual language-model MLP
    dropout: float = 0.0  # small models on a few million tokens barely overfit
    attn: str = "rbf"  # "dot" (SDPA) or "rbf" (distance attention)
    position: str = "susie"  # SuSiE in q and k (works for both kinds), "learned" absolute embedding, or "none"
    susie_dim: int = 0  # channels per head carrying SuSiE (even); 0 = the whole head, as in the RBF post
    qk_norm: bool = False  # dot only: RMS-normalised q and k
    num_registers: int = 1  # prefix tokens every position can attend to (an attention sink by design)

    def __post_init__(self) -> None:
        problems = []
        if self.attn not in LM_ATTENTION:
            problems.append(f"attn={self.attn!r} is not one of {LM_ATTENTION}")
        if self.position not in POSITIONS:
            problems.append(f"position={self.position!r} is not one of {POSITIONS}")
        for name in ("vocab_size", "context", "dim", "depth", "num_heads"):
            if getattr(self, name) < 1:
                problems.append(f"{name} must be >= 1")
        if self.num_heads >= 1 and self.dim % self.num_heads:
            problems.append(f"dim={self.dim} must be divisible by num_heads={self.num_heads}")
        head_dim = self.dim // max(self.num_heads, 1)
        if self.susie_dim and (self.position != "susie" or self.susie_dim % 2 or self.susie_dim > head_dim):
            problems.append(f"susie_dim={self.susie_dim} needs position='susie' and an even width <= {head_dim}")
        if self.position == "susie" and not self.susie_dim and head_dim % 2:
            problems.append(f"SuSiE over the whole head needs an even head dim, got {head_dim}")
        if self.qk_norm and self.attn != "dot":
            problems.append("qk_norm is for attn='dot' only (RBF with unit-RMS keys is dot-product attention)")
        if self.num_registers < 0 or self.mlp_ratio <= 0 or not 0 <= self.dropout < 1:
            problems.append("num_registers >= 0, mlp_ratio > 0 and 0 <= dropout < 1 are required")
        if problems:
            raise ValueError("invalid language-model config: " + "; ".join(problems))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LMConfig:
        """Build from a dict, refusing unknown keys."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ValueError(f"unknown language-model config field(s): {', '.join(unknown)}")
        return cls(**d)


def _codepoints(text: str) -> np.ndarray:
    return np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)


class Tokenizer:
    """Bytes (UTF-8, vocabulary 256) or the characters of a training text (vocabulary = its alphabet).

    :meth:`encode` returns a compact integer stream (uint8 for bytes, int32 for characters) so that a text
    of a few GB stays a few GB; batches are widened to int64 when they are cut from it.
    """

    def __init__(self, kind: str = "byte", chars: str = ""):
        if kind not in ("byte", "char"):
            raise ValueError(f"tokenizer must be 'byte' or 'char', got {kind!r}")
        if kind == "char" and not chars:
            raise ValueError("a character tokenizer needs its alphabet")
        self._sorted = np.unique(_codepoints(chars))  # alphabet code points; a character's id is its rank
        self.kind, self.chars = kind, "".join(chr(c) for c in self._sorted)

    @classmethod
    def for_text(cls, text: str, kind: str) -> Tokenizer:
        return cls(kind, text if kind == "char" else "")

    @property
    def vocab_size(self) -> int:
        return 256 if self.kind == "byte" else len(self.chars)

    def encode(self, text: str) -> Tensor:
        if self.kind == "byte":
            return torch.frombuffer(bytearray(text.encode("utf-8")), dtype=torch.uint8)
        cps = _codepoints(text)
        ids = np.searchsorted(self._sorted, cps).clip(0, len(self._sorted) - 1)
        unknown = self._sorted[ids] != cps
        if unknown.any():
            missing = "".join(sorted({chr(c) for c in cps[unknown][:1000]}))
            raise ValueError(f"characters not in the tokenizer's alphabet: {missing!r}")
        return torch.from_numpy(ids.astype(np.int32))

    def decode(self, ids: Sequence[int]) -> str:
        if self.kind == "byte":
            return bytes(int(i) for i in ids).decode("utf-8", errors="replace")
        return "".join(self.chars[int(i)] for i in ids)

    def to_dict(self) -> dict[str, str]:
        return {"kind": self.kind, "chars": self.chars}


def _attention(cfg: LMConfig) -> nn.Module:
    """The causal attention module of one block."""
    susie = "1d" if cfg.position == "susie" else None
    if cfg.attn == "rbf":
        return RBFAttention(cfg.dim, cfg.num_heads, susie=susie, susie_dim=cfg.susie_dim, causal=True)
    qk_norm = "rms" if cfg.qk_norm else None
    return DotAttention(cfg.dim, cfg.num_heads, qk_norm=qk_norm, susie=susie, susie_dim=cfg.susie_dim, causal=True)


class CausalLM(nn.Module):
    """Next-token model over ``(B, T)`` token ids; a sequence is a ``1 × T`` grid for the attention modules."""

    def __init__(self, config: LMConfig):
        super().__init__()
        self.config = cfg = config
        self.tok_embed = nn.Embedding(cfg.vocab_size, cfg.dim)
        nn.init.normal_(self.tok_embed.weight, std=0.02)
        if cfg.position == "learned":
            self.pos_embed = nn.Parameter(torch.randn(1, cfg.context, cfg.dim) * 0.02)
        if cfg.num_registers:
            self.registers = init_registers(cfg.num_registers, cfg.dim, cfg.attn)
        self.drop = Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(
            Block(cfg.dim, _attention(cfg), int(cfg.dim * cfg.mlp_ratio), cfg.dropout) for _ in range(cfg.depth)
        )
        self.norm = nn.LayerNorm(cfg.dim)
        self.head = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        nn.init.normal_(self.head.weight, std=0.02)  # near-uniform first predictions: initial loss ≈ log(vocab)

    @property
    def num_prefix_tokens(self) -> int:
        return self.config.num_registers

    def forward(self, idx: Tensor) -> Tensor:
        """Logits ``(B, T, vocab)``."""
        b, t = idx.shape
        if self.config.position == "learned" and t > self.config.context:
            raise ValueError(f"{t} tokens exceed the learned position embedding's {self.config.context}")
        x = self.tok_embed(idx)
        if self.config.position == "learned":
            x = x + self.pos_embed[:, :t]
        x = self.drop(x)
        if self.config.num_registers:
            x = torch.cat([self.registers.expand(b, -1, -1).to(x.dtype), x], dim=1)
        for block in self.blocks:
            x = block(x, (1, t))
        return self.head(self.norm(x[:, self.num_prefix_tokens :]))

    def loss(self, idx: Tensor, targets: Tensor) -> Tensor:
        logits = self(idx)
        return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))

    @torch.no_grad()
    def generate(
        self,
        idx: Tensor,
        new_tokens: int,
        temperature: float = 0.8,
        top_k: int | None = None,
        generator: torch.Generator | None = None,
    ) -> Tensor:
        """Append ``new_tokens`` sampled tokens to ``idx`` (``(B, T)``), seeing at most ``context`` tokens."""
        if temperature <= 0:
            raise ValueError("temperature must be > 0")
        for _ in range(new_tokens):
            logits = self(idx[:, -self.config.context :])[:, -1].float() / temperature
            if top_k:
                kth = torch.topk(logits, min(top_k, logits.shape[-1])).values[:, -1:]
                logits = logits.masked_fill(logits < kth, float("-inf"))
            nxt = torch.multinomial(torch.softmax(logits, -1).cpu(), 1, generator=generator).to(idx.device)
            idx = torch.cat([idx, nxt], dim=1)
        return idx
