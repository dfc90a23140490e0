"""An independent dense float64 oracle for RBF / dot attention, SuSiE, registers, the ViT and the causal LM.

Written from docs/DESIGN.md §2 and the RBF-attention post for the tests only: it builds every distance and attention
matrix explicitly (N × N, pairwise differences, no norm expansion) from a state dict and never calls
ssog_core, so agreement with ssog_core is evidence, not tautology.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from tests.dense_oracle import gelu, layer_norm, softmax

THETA = 10000.0


def rbf_weights(q: Tensor, k: Tensor, causal: bool = False) -> Tensor:
    """softmax_j(−‖q_i − k_j‖² / √D) from explicit pairwise differences: ``(..., N, N)``."""
    q, k = q.double(), k.double()
    diff = q[..., :, None, :] - k[..., None, :, :]
    logits = -diff.square().sum(-1) / math.sqrt(q.shape[-1])
    if causal:
        n = q.shape[-2]
        logits = logits.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    return softmax(logits)


def dot_weights(q: Tensor, k: Tensor, causal: bool = False) -> Tensor:
    q, k = q.double(), k.double()
    logits = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        n = q.shape[-2]
        logits = logits.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    return softmax(logits)


def susie_code(positions: list[tuple[float, ...]], width: int) -> Tensor:
    """Unweighted code ``(len(positions), width)`` written term by term.

    1D (positions are 1-tuples): pair i has frequency θ^(−i/(width/2)); channels [sin of all pairs, cos of all].
    2D (row, col): the first half of the pairs code the row, the second half the column, each half with
    frequencies θ^(−i/(width/4)).
    """
    pairs = width // 2
    rows = []
    for pos in positions:
        angles = []
        if len(pos) == 1:
            angles = [pos[0] * THETA ** (-i / pairs) for i in range(pairs)]
        else:
            half = pairs // 2
            angles = [pos[0] * THETA ** (-i / half) for i in range(half)]
            angles += [pos[1] * THETA ** (-i / half) for i in range(half)]
        rows.append([math.sin(a) for a in angles] + [math.cos(a) for a in angles])
    return torch.tensor(rows, dtype=torch.float64)


def add_susie(q: Tensor, k: Tensor, weight: Tensor, positions: list[tuple[float, ...]], prefix: int):
    """q, k ``(B, H, P + N, hd)`` plus the weighted code on the first ``2·pairs`` channels of grid tokens."""
    width = 2 * weight.shape[-1]
    code = susie_code(positions, width)  # (N, width)
    w = torch.cat([weight, weight], dim=-1).double()  # (H, width)
    pe = torch.zeros(q.shape[1], q.shape[2], q.shape[3], dtype=torch.float64)
    pe[:, prefix:, :width] = w[:, None, :] * code[None]
    return q + pe, k + pe


def attention_layer(x: Tensor, p: dict[str, Tensor], kind: str, heads: int, positions, prefix: int, causal: bool):
    """One dot / RBF attention layer on ``(B, P + N, dim)``: output, dense weights ``(B, H, T, T)`` and keys."""
    b, t, dim = x.shape
    hd = dim // heads
    qkv = x @ p["qkv.weight"].T.double()
    q, k, v = (z.reshape(b, t, heads, hd).transpose(1, 2) for z in qkv.split(dim, dim=-1))
    if p.get("qk_norm"):
        q = q / torch.sqrt(q.square().mean(-1, keepdim=True) + torch.finfo(torch.float64).eps)
        k = k / torch.sqrt(k.square().mean(-1, keepdim=True) + torch.finfo(torch.float64).eps)
    if "susie.weight" in p:
        q, k = add_susie(q, k, p["susie.weight"], positions, prefix)
    a = (rbf_weights if kind == "rbf" else dot_weights)(q, k, causal)
    y = (a @ v).transpose(1, 2).reshape(b, t, dim)
    return y @ p["out.weight"].T.double(), a, k


def _blocks(x: Tensor, sd: dict, depth: int, kind: str, heads: int, positions, prefix: int, causal: bool, qk_norm):
    maps, keys = [], []
    for layer in range(depth):
        pre = f"blocks.{layer}."
        lp = {k[len(pre) + 5 :]: v.double() for k, v in sd.items() if k.startswith(pre + "attn.")}
        lp["qk_norm"] = qk_norm
        h = layer_norm(x, sd[pre + "norm1.weight"], sd[pre + "norm1.bias"])
        y, a, k = attention_layer(h, lp, kind, heads, positions, prefix, causal)
        maps.append(a)
        keys.append(k)
        x = x + y
        h = layer_norm(x, sd[pre + "norm2.weight"], sd[pre + "norm2.bias"])
        x = x + gelu(h @ sd[pre + "mlp.0.weight"].T + sd[pre + "mlp.0.bias"]) @ sd[pre + "mlp.2.weight"].T
        x = x + sd[pre + "mlp.2.bias"]
    return x, maps, keys


def vit_forward(img: Tensor, sd: dict[str, Tensor], cfg: dict, keys: list | None = None) -> tuple[Tensor, list]:
    """Logits and per-layer full (prefix included) attention of a dot / RBF ViT with registers and 2D SuSiE.

    The image must be at the training size (no position-embedding resize here). If ``keys`` is a list, each
    layer's keys ``(B, H, P + N, hd)`` are appended to it.
    """
    sd = {k: v.double() for k, v in sd.items()}
    img = img.double()
    p = cfg["patch_size"]
    b, c, hh, ww = img.shape
    gh, gw = hh // p, ww // p
    patches = []
    for i in range(gh):
        for j in range(gw):
            patches.append(img[:, :, i * p : (i + 1) * p, j * p : (j + 1) * p].permute(0, 2, 3, 1).reshape(b, -1))
    x = torch.stack(patches, dim=1) @ sd["patch_embed.weight"].T + sd["patch_embed.bias"] + sd["pos_embed"]
    prefix = cfg.get("num_registers", 0)
    if prefix:
        x = torch.cat([sd["registers"].expand(b, -1, -1), x], dim=1)
    positions = [(float(i), float(j)) for i in range(gh) for j in range(gw)]
    x, maps, ks = _blocks(
        x, sd, cfg["depth"], cfg["attn"], cfg["num_heads"], positions, prefix, False, cfg.get("qk_norm")
    )
    if keys is not None:
        keys.extend(ks)
    x = layer_norm(x[:, prefix:], sd["norm.weight"], sd["norm.bias"]).mean(dim=1)
    return x @ sd["head.weight"].T + sd["head.bias"], maps


def lm_forward(idx: Tensor, sd: dict[str, Tensor], cfg: dict, keys: list | None = None) -> tuple[Tensor, list]:
    """Logits ``(B, T, vocab)`` and per-layer causal attention of the causal LM (1D SuSiE or learned positions)."""
    sd = {k: v.double() for k, v in sd.items()}
    b, t = idx.shape
    x = sd["tok_embed.weight"][idx]
    if cfg.get("position") == "learned":
        x = x + sd["pos_embed"][:, :t]
    prefix = cfg.get("num_registers", 0)
    if prefix:
        x = torch.cat([sd["registers"].expand(b, -1, -1), x], dim=1)
    positions = [(float(i),) for i in range(t)]
    x, maps, ks = _blocks(
        x, sd, cfg["depth"], cfg["attn"], cfg["num_heads"], positions, prefix, True, cfg.get("qk_norm")
    )
    if keys is not None:
        keys.extend(ks)
    x = layer_norm(x[:, prefix:], sd["norm.weight"], sd["norm.bias"])
    return x @ sd["head.weight"].T, maps
