"""Fused flash-style Triton kernels for RBF attention, wrapped as ``torch.library`` custom ops.

Logits are ``s_ij = 2γ q_i·k_j − γ‖k_j‖²`` (γ = 1/√D), i.e. ``−γ‖q_i − k_j‖²`` up to the per-query constant
``γ‖q_i‖²`` that the softmax ignores. Each key tile's squared norms are computed on chip from the tile
already loaded for the product, so the only extra work over dot-product flash attention is one row
reduction per key tile; nothing of size N × N is ever written.

* forward: one program per (query tile, batch·head); online softmax in base 2; writes ``o`` and the
  per-row log-sum-exp (base 2) for the backward pass;
* backward (recompute, no atomics, deterministic): ``dk, dv`` with one program per key tile looping over
  queries, ``dq`` with one program per query tile looping over keys. With ``dS = P ∘ (dP − δ)`` and
  ``δ_i = o_i·do_i``: ``dq_i = 2γ Σ_j dS_ij k_j`` and ``dk_j = 2γ (Σ_i dS_ij q_i − k_j Σ_i dS_ij)``.

Importing this module imports Triton; :mod:`ssog_core.ops.dispatch` imports it only when the Triton backend
is chosen. Under ``TRITON_INTERPRET=1`` (set before this import) the kernels run on CPU tensors through
Triton's interpreter, which multiplies bf16 tiles wrongly (triton-lang/triton#11584): bf16 dots are then
done in fp32 (the ``DOT_F32`` switch; fp16 and fp32 dots are exact there).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from torch import Tensor

from ssog_core.field import LOG2E
from ssog_core.ops.env import interpreting

INTERPRET = interpreting()  # fixed at import, as it is for Triton itself


@triton.jit
def _key_tile(K, V, kv_off, mask, DOT_F32: tl.constexpr):
    """A tile of keys and values, and the keys' squared norms ``‖k_j‖²`` computed on chip from the same tile
    (``k`` and ``v`` in fp32 when ``DOT_F32``; ``kf`` always fp32)."""
    k = tl.load(K + kv_off, mask=mask, other=0.0)
    v = tl.load(V + kv_off, mask=mask, other=0.0)
    kf = k.to(tl.float32)
    knorm = tl.sum(kf * kf, axis=1)
    if DOT_F32:
        k = kf
        v = v.to(tl.float32)
    return k, v, kf, knorm


@triton.jit
def _query_tile(Q, DO, LSE, DELTA, q_off, mask, row_off, m_ok, DOT_F32: tl.constexpr):
    """What the backward needs of a tile of queries: ``q``, ``do``, the forward's log-sum-exp and ``δ = o·do``."""
    q = tl.load(Q + q_off, mask=mask, other=0.0)
    do = tl.load(DO + q_off, mask=mask, other=0.0)
    lse = tl.load(LSE + row_off, mask=m_ok, other=0.0)
    delta = tl.load(DELTA + row_off, mask=m_ok, other=0.0)
    if DOT_F32:
        q = q.to(tl.float32)
        do = do.to(tl.float32)
    return q, do, lse, delta


@triton.jit
def _rbf_fwd_kernel(
    Q,
    K,
    V,
    O,
    LSE,
    N,
    qk_scale,  # 2γ·log2(e): the dot product's weight in base-2 logits
    kn_scale,  # γ·log2(e): the key norm's weight
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    DOT_F32: tl.constexpr,
    PRECISION: tl.constexpr,
):
    pid_m = tl.program_id(0)
    base = tl.program_id(1).to(tl.int64) * N * HEAD_DIM  # (B·H, N, D) contiguous
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n0 = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d[None, :] < HEAD_DIM
    m_ok = offs_m < N

    q = tl.load(Q + base + offs_m[:, None] * HEAD_DIM + offs_d[None, :], mask=m_ok[:, None] & d_ok, other=0.0)
    if DOT_F32:
        q = q.to(tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    hi = tl.minimum((pid_m + 1) * BLOCK_M, N) if CAUSAL else N
    for start_n in range(0, hi, BLOCK_N):
        offs_n = start_n + offs_n0
        n_ok = offs_n < N
        kv_off = base + offs_n[:, None] * HEAD_DIM + offs_d[None, :]
        k, v, _, knorm = _key_tile(K, V, kv_off, n_ok[:, None] & d_ok, DOT_F32)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale - knorm[None, :] * kn_scale
        valid = n_ok[None, :]
        if CAUSAL:
            valid = valid & (offs_m[:, None] >= offs_n[None, :])
        s = tl.where(valid, s, float("-inf"))
        # every row sees key 0 in the first tile, so m_new is finite from the first iteration on
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        p = tl.math.exp2(s - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new

    acc = acc / l_i[:, None]
    tl.store(
        O + base + offs_m[:, None] * HEAD_DIM + offs_d[None, :], acc.to(O.dtype.element_ty), mask=m_ok[:, None] & d_ok
    )
    tl.store(LSE + tl.program_id(1).to(tl.int64) * N + offs_m, m_i + tl.math.log2(l_i), mask=m_ok)


@triton.jit
def _rbf_bwd_dkdv_kernel(
    Q,
    K,
    V,
    DO,
    LSE,
    DELTA,
    DK,
    DV,
    N,
    qk_scale,
    kn_scale,
    two_gamma,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    DOT_F32: tl.constexpr,
    PRECISION: tl.constexpr,
):
    start_n = tl.program_id(0) * BLOCK_N
    bh = tl.program_id(1).to(tl.int64)
    base = bh * N * HEAD_DIM
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_m0 = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d[None, :] < HEAD_DIM
    n_ok = offs_n < N

    kv_off = base + offs_n[:, None] * HEAD_DIM + offs_d[None, :]
    k, v, kf, knorm = _key_tile(K, V, kv_off, n_ok[:, None] & d_ok, DOT_F32)
    dk_acc = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)  # Σ_i dS_ij q_i
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    ds_sum = tl.zeros([BLOCK_N], dtype=tl.float32)  # Σ_i dS_ij

    lo = (start_n // BLOCK_M) * BLOCK_M if CAUSAL else 0  # queries before this key tile never see it
    for start_m in range(lo, N, BLOCK_M):
        offs_m = start_m + offs_m0
        m_ok = offs_m < N
        q_off = base + offs_m[:, None] * HEAD_DIM + offs_d[None, :]
        q, do, lse, delta = _query_tile(Q, DO, LSE, DELTA, q_off, m_ok[:, None] & d_ok, bh * N + offs_m, m_ok, DOT_F32)
        s_t = tl.dot(k, tl.trans(q), input_precision=PRECISION) * qk_scale - knorm[:, None] * kn_scale  # (BN, BM)
        valid = n_ok[:, None] & m_ok[None, :]
        if CAUSAL:
            valid = valid & (offs_m[None, :] >= offs_n[:, None])
        p_t = tl.where(valid, tl.math.exp2(s_t - lse[None, :]), 0.0)
        dv += tl.dot(p_t.to(do.dtype), do, input_precision=PRECISION)
        dp_t = tl.dot(v, tl.trans(do), input_precision=PRECISION)
        ds_t = p_t * (dp_t - delta[None, :])
        dk_acc += tl.dot(ds_t.to(q.dtype), q, input_precision=PRECISION)
        ds_sum += tl.sum(ds_t, axis=1)

    dk = two_gamma * (dk_acc - kf * ds_sum[:, None])
    tl.store(DK + kv_off, dk.to(DK.dtype.element_ty), mask=n_ok[:, None] & d_ok)
    tl.store(DV + kv_off, dv.to(DV.dtype.element_ty), mask=n_ok[:, None] & d_ok)


@triton.jit
def _rbf_bwd_dq_kernel(
    Q,
    K,
    V,
    DO,
    LSE,
    DELTA,
    DQ,
    N,
    qk_scale,
    kn_scale,
    two_gamma,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    DOT_F32: tl.constexpr,
    PRECISION: tl.constexpr,
):
    pid_m = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    base = bh * N * HEAD_DIM
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n0 = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d[None, :] < HEAD_DIM
    m_ok = offs_m < N

    q_off = base + offs_m[:, None] * HEAD_DIM + offs_d[None, :]
    q, do, lse, delta = _query_tile(Q, DO, LSE, DELTA, q_off, m_ok[:, None] & d_ok, bh * N + offs_m, m_ok, DOT_F32)
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    hi = tl.minimum((pid_m + 1) * BLOCK_M, N) if CAUSAL else N
    for start_n in range(0, hi, BLOCK_N):
        offs_n = start_n + offs_n0
        n_ok = offs_n < N
        kv_off = base + offs_n[:, None] * HEAD_DIM + offs_d[None, :]
        k, v, _, knorm = _key_tile(K, V, kv_off, n_ok[:, None] & d_ok, DOT_F32)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale - knorm[None, :] * kn_scale
        valid = m_ok[:, None] & n_ok[None, :]
        if CAUSAL:
            valid = valid & (offs_m[:, None] >= offs_n[None, :])
        p = tl.where(valid, tl.math.exp2(s - lse[:, None]), 0.0)
        dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)
        ds = p * (dp - delta[:, None])
        dq += tl.dot(ds.to(k.dtype), k, input_precision=PRECISION)

    tl.store(DQ + q_off, (two_gamma * dq).to(DQ.dtype.element_ty), mask=m_ok[:, None] & d_ok)


# Per (pass, precision): (largest head dim, (BLOCK_M, BLOCK_N, num_warps)). Chosen from sm_90 compiles
# (cuobjdump --dump-resource-usage; tests/rbf_triton_checks.py repeats the bf16 one): the largest tiles whose
# bf16/fp16 kernels use tensor cores without register spills. fp32 inputs take exact IEEE products (as torch
# does by default), which run on FMA units and spill beyond 32 × 32 tiles; train in bf16 for speed.
# Not yet tuned on a GPU: benchmarks/rbf.py measures them when one is lent.
GPU_TILES = {
    ("fwd", "half"): ((64, (128, 64, 8)), (128, (64, 64, 8))),
    ("bwd", "half"): ((64, (64, 64, 8)), (128, (64, 32, 8))),
    ("fwd", "fp32"): ((128, (32, 32, 4)),),
    ("bwd", "fp32"): ((128, (32, 32, 4)),),
}


def launch_params(q: Tensor, kind: str) -> dict:
    """Tile sizes and precision switches for ``q`` (``(B, H, N, D)``) in pass ``kind`` (``"fwd"``/``"bwd"``)."""
    d = q.shape[-1]
    block_d = max(16, triton.next_power_of_2(d))
    tiles = GPU_TILES[kind, "fp32" if q.dtype == torch.float32 else "half"]
    if block_d > tiles[-1][0]:
        raise ValueError(f"head dim {d} is too large for the fused RBF kernels (at most {tiles[-1][0]})")
    if INTERPRET:  # small tiles keep the interpreter fast and make short test sequences cross tile edges
        block_m = block_n = 16
        extra = {}
    else:
        block_m, block_n, warps = next(t for bound, t in tiles if block_d <= bound)
        extra = {"num_warps": warps, "num_stages": 2}
    return dict(
        HEAD_DIM=d,
        BLOCK_D=block_d,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        DOT_F32=INTERPRET and q.dtype == torch.bfloat16,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32",  # fp32 inputs: exact products, not TF32
        **extra,
    )


def _scales(head_dim: int) -> tuple[float, float, float]:
    gamma = 1.0 / math.sqrt(head_dim)
    return 2.0 * gamma * LOG2E, gamma * LOG2E, 2.0 * gamma


@torch.library.custom_op("ssog_rbf::fwd", mutates_args=())
def rbf_fwd(q: Tensor, k: Tensor, v: Tensor, causal: bool) -> tuple[Tensor, Tensor]:
    """Output ``(B, H, N, D)`` and the per-row log-sum-exp in base 2 ``(B, H, N)`` (fp32)."""
    if q.dim() != 4 or k.shape != q.shape or v.shape != q.shape or not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k, v must share one (B, H, N, D) shape and dtype; got {q.shape}, {k.shape}, {v.shape}")
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    b, h, n, d = q.shape
    o = torch.empty_like(q)
    lse = torch.empty((b, h, n), device=q.device, dtype=torch.float32)
    params = launch_params(q, "fwd")
    qk_scale, kn_scale, _ = _scales(d)
    grid = (triton.cdiv(n, params["BLOCK_M"]), b * h)
    _rbf_fwd_kernel[grid](q, k, v, o, lse, n, qk_scale, kn_scale, CAUSAL=causal, **params)
    return o, lse


@rbf_fwd.register_fake
def _(q: Tensor, k: Tensor, v: Tensor, causal: bool) -> tuple[Tensor, Tensor]:
    b, h, n, _ = q.shape
    return torch.empty_like(q, memory_format=torch.contiguous_format), q.new_empty((b, h, n), dtype=torch.float32)


@torch.library.custom_op("ssog_rbf::bwd", mutates_args=())
def rbf_bwd(
    q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor, do: Tensor, causal: bool
) -> tuple[Tensor, Tensor, Tensor]:
    """Gradients ``(dq, dk, dv)`` by recomputation from ``lse``."""
    q, k, v, do = q.contiguous(), k.contiguous(), v.contiguous(), do.contiguous()
    b, h, n, d = q.shape
    delta = (o.float() * do.float()).sum(-1).contiguous()  # δ_i = Σ_j P_ij dP_ij = o_i · do_i
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    params = launch_params(q, "bwd")
    scales = _scales(d)
    lse = lse.contiguous()
    _rbf_bwd_dkdv_kernel[(triton.cdiv(n, params["BLOCK_N"]), b * h)](
        q, k, v, do, lse, delta, dk, dv, n, *scales, CAUSAL=causal, **params
    )
    _rbf_bwd_dq_kernel[(triton.cdiv(n, params["BLOCK_M"]), b * h)](
        q, k, v, do, lse, delta, dq, n, *scales, CAUSAL=causal, **params
    )
    return dq, dk, dv


@rbf_bwd.register_fake
def _(
    q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor, do: Tensor, causal: bool
) -> tuple[Tensor, Tensor, Tensor]:
    return tuple(torch.empty_like(t, memory_format=torch.contiguous_format) for t in (q, k, v))


def _setup_context(ctx, inputs, output) -> None:
    q, k, v, causal = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse)
    ctx.causal = causal


def _backward(ctx, do: Tensor, _dlse: Tensor):  # the log-sum-exp is an auxiliary output: its grad is ignored
    q, k, v, o, lse = ctx.saved_tensors
    dq, dk, dv = rbf_bwd(q, k, v, o, lse, do, ctx.causal)
    return dq, dk, dv, None


rbf_fwd.register_autograd(_backward, setup_context=_setup_context)


def rbf_attention_triton(q: Tensor, k: Tensor, v: Tensor, causal: bool = False) -> Tensor:
    """Fused RBF attention of ``(B, H, N, D)`` inputs; differentiable and ``torch.compile``-safe."""
    return rbf_fwd(q, k, v, causal)[0]
