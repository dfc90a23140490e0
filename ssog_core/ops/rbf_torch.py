"""RBF (distance) attention: ``softmax_j(−γ‖q_i − k_j‖²)`` with ``γ = 1/√D`` (docs/DESIGN.md §2).

Expanding the square, ``−γ‖q − k‖² = 2γ q·k − γ‖k‖² − γ‖q‖²``, and the last term is the same for every key
of a query, so the softmax drops it: RBF attention is dot-product attention with scale ``2γ`` and a
penalty ``γ‖k‖²`` on each key. Neither backend ever builds the N × N distance matrix:

* ``"torch"`` (exact, used on CPU): PyTorch's fused SDPA on augmented vectors
  ``q' = [q, 1]``, ``k' = [k, −‖k‖²/2]``, ``v' = [v, 0]``, so that ``2γ q'·k' = 2γ q·k − γ‖k‖²`` (in a 16-bit
  dtype ``−‖k‖²/2`` is split into two 16-bit parts so that it keeps fp32 precision). Passing the
  penalty as an additive mask instead would force SDPA's math backend (N × N) as soon as the mask
  needs a gradient, i.e. in training;
* ``"triton"`` (:mod:`ssog_core.ops.rbf_triton`, used on CUDA): fused flash-style kernels that compute the
  key norms on chip.

:func:`ssog_core.ops.dispatch.rbf_attention` chooses between them (the same vocabulary as SSOG's backends).
Importing this module never imports Triton.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor


def rbf_gamma(head_dim: int) -> float:
    """The distance scale γ = 1/√head_dim."""
    return 1.0 / math.sqrt(head_dim)


def check_rbf_inputs(q: Tensor, k: Tensor, v: Tensor) -> None:
    if q.dim() != 4 or k.shape != q.shape or v.dim() != 4 or v.shape[:3] != q.shape[:3]:
        raise ValueError(
            f"RBF attention expects q and k of shape (B, H, N, D) and v of shape (B, H, N, Dv); "
            f"got q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
        )
    if not (q.dtype == k.dtype == v.dtype) or not q.is_floating_point():
        raise ValueError(f"q, k, v must share one floating dtype; got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on one device; got {q.device}, {k.device}, {v.device}")


def rbf_attention_torch(q: Tensor, k: Tensor, v: Tensor, causal: bool = False) -> Tensor:
    """Reference RBF attention through SDPA on augmented vectors (see the module docstring).

    Args:
        q, k: ``(B, H, N, D)``; v: ``(B, H, N, Dv)``.
        causal: query i sees keys j ≤ i.
    Returns:
        ``(B, H, N, Dv)``.
    """
    check_rbf_inputs(q, k, v)
    d, dv = q.shape[-1], v.shape[-1]
    # −‖k‖²/2 summed and kept in at least fp32: in a 16-bit dtype it travels as two 16-bit parts (hi + lo, ~16
    # mantissa bits; SDPA accumulates q'·k' in fp32), since rounding it to bf16 alone shifts a logit by up to
    # γ·2⁻⁸·‖k‖², a large error for long keys
    wide = torch.promote_types(k.dtype, torch.float32)
    half_norm = k.to(wide).square().sum(-1, keepdim=True) * -0.5
    parts = [half_norm.to(k.dtype)]
    if k.dtype != wide:
        parts.append((half_norm - parts[0].to(wide)).to(k.dtype))
    extra = len(parts)
    pad = (-(d + extra)) % 8 if q.is_cuda else 0  # CUDA's fused SDPA kernels want head dims in multiples of 8
    q2 = torch.cat([q, torch.ones_like(q[..., :1]).expand(*q.shape[:-1], extra), q.new_zeros(*q.shape[:-1], pad)], -1)
    k2 = torch.cat([k, *parts, k.new_zeros(*k.shape[:-1], pad)], dim=-1)
    # equal head dims for v let the fused (flash) kernels run; an identity basis (analysis) keeps its own width
    v2 = F.pad(v, (0, extra + pad)) if dv == d else v
    out = F.scaled_dot_product_attention(q2, k2, v2, is_causal=causal, scale=2.0 * rbf_gamma(d))
    return out[..., :dv]
