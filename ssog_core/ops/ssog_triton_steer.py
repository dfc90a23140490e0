"""Triton kernels that steer a layer's fixed field by content (``ssog::steer``, docs/KERNELS.md §2), both ways.

:class:`~ssog_core.nn.attention.SSOGAttention` on the Triton backend hands over the probes' raw outputs (one GEMM of
all taps, without their biases), the fixed field's raw parameters (μ, raw σ, log λ, raw τ) and the gates' raw
parameters; one program per block of tokens computes, for every head and atom, the maths of
:mod:`ssog_core.field` (:func:`~ssog_core.field.positive`, :func:`~ssog_core.field.temperature`,
:func:`~ssog_core.field.bound` and :func:`~ssog_core.field.steer`) and writes the per-token field μ, σ, log λ (and τ)
that the field kernels read. The backward kernel recomputes the same terms and writes the probes' gradient and, per
program, its part of the gradients of every parameter (the fixed field, the probe biases, the gates, τ); one sum
over the programs finishes them, so no output has two writers.

Layout of the raw probe outputs ``(T, P)`` (``T`` tokens): each enabled tap's block starts at its offset, its
entries ordered (h, r[, axis]) as the probe ``Linear`` lays them out. Partial sums ``(programs, 10·H·R + 4)``: dμ0
``(H, R, 2)``, d raw σ0 ``(H, R, 2)``, dlog λ0 ``(H, R)``, the biases of the μ, σ and λ taps (``2·H·R``, ``2·H·R``,
``H·R``), then the raw gates of μ, σ, λ and raw τ.
"""

from __future__ import annotations

import triton
import triton.language as tl

EPS = tl.constexpr(1e-4)  # ssog_core.field.EPS
TAU_MIN = tl.constexpr(0.5)  # ssog_core.field.TAU_MIN


@triton.jit
def _softplus(x):
    """``log(1 + e^x)`` as PyTorch's ``softplus`` (x above 20 passes through), with an accurate ``log1p``."""
    u = tl.exp(-tl.abs(x))
    w = 1.0 + u
    log1p = tl.where(w == 1.0, u, tl.log(w) * u / (w - 1.0))
    return tl.where(x > 20.0, x, tl.maximum(x, 0.0) + log1p)


@triton.jit
def _sigmoid(x):
    return 1.0 / (1.0 + tl.exp(-x))


@triton.jit
def _bound(raw_ptr, bias_ptr, t, col, off, P, mask):
    """``tanh(raw + bias)`` of the tap entries ``col`` (as ``2·sigmoid(2p) − 1``, :func:`ssog_core.field.bound`)."""
    p = tl.load(raw_ptr + t * P + off + col, mask=mask, other=0.0).to(tl.float32)
    p += tl.load(bias_ptr + col, mask=mask, other=0.0)
    return _sigmoid(p * 2.0) * 2.0 - 1.0


@triton.jit
def _steer_fwd_kernel(raw_ptr, mu0_ptr, rsig0_ptr, ll0_ptr, rtau_ptr, gmu_ptr, gsig_ptr, glam_ptr, bmu_ptr,
                      bsig_ptr, blam_ptr, mu_ptr, sig_ptr, ll_ptr, tau_ptr, NT, P, OFF_MU, OFF_SIG, OFF_LAM, MAX_OFFSET,
                      SIGMA_FLOOR, HR: tl.constexpr, HR2P: tl.constexpr, HRP: tl.constexpr, BLOCK: tl.constexpr,
                      HAS_MU: tl.constexpr, HAS_SIG: tl.constexpr, HAS_LAM: tl.constexpr):  # fmt: skip
    """The per-token field of ``BLOCK`` tokens: μ, σ ``(T, H, R, 2)`` and log λ ``(T, H, R)``, contiguous."""
    t = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)[:, None]
    e = tl.arange(0, HR2P)[None, :]  # (h, r, axis) entries of μ and σ
    ok = e < 2 * HR
    mask = (t < NT) & ok
    mu = tl.load(mu0_ptr + e, mask=ok, other=0.0)
    if HAS_MU:
        a = (_softplus(tl.load(gmu_ptr)) + EPS) * MAX_OFFSET
        mu = mu + a * _bound(raw_ptr, bmu_ptr, t, e, OFF_MU, P, mask)
    tl.store(mu_ptr + t * (2 * HR) + e, mu + tl.zeros((BLOCK, HR2P), tl.float32), mask=mask)
    sig = _softplus(tl.load(rsig0_ptr + e, mask=ok, other=0.0)) + EPS + SIGMA_FLOOR
    if HAS_SIG:
        s = _softplus(tl.load(gsig_ptr)) + EPS
        sig = tl.exp(tl.log(sig) + s * _bound(raw_ptr, bsig_ptr, t, e, OFF_SIG, P, mask))
    tl.store(sig_ptr + t * (2 * HR) + e, sig + tl.zeros((BLOCK, HR2P), tl.float32), mask=mask)
    q = tl.arange(0, HRP)[None, :]  # (h, r) entries of log λ
    qok = q < HR
    qmask = (t < NT) & qok
    ll = tl.load(ll0_ptr + q, mask=qok, other=0.0)
    if HAS_LAM:
        ll = ll + (_softplus(tl.load(glam_ptr)) + EPS) * _bound(raw_ptr, blam_ptr, t, q, OFF_LAM, P, qmask)
    tl.store(ll_ptr + t * HR + q, ll + tl.zeros((BLOCK, HRP), tl.float32), mask=qmask)
    if tl.program_id(0) == 0:
        tl.store(tau_ptr, _softplus(tl.load(rtau_ptr)) + TAU_MIN)


@triton.jit
def _steer_bwd_kernel(raw_ptr, rsig0_ptr, rtau_ptr, gmu_ptr, gsig_ptr, glam_ptr, bmu_ptr, bsig_ptr, blam_ptr,
                      dmu_ptr, dsig_ptr, dll_ptr, dtau_ptr, draw_ptr, part_ptr, NT, P, OFF_MU, OFF_SIG, OFF_LAM,
                      MAX_OFFSET, SIGMA_FLOOR, sdt, sdh, sdr, slt, slh, slr, HR: tl.constexpr, R: tl.constexpr,
                      HR2P: tl.constexpr, HRP: tl.constexpr, BLOCK: tl.constexpr, HAS_MU: tl.constexpr,
                      HAS_SIG: tl.constexpr, HAS_LAM: tl.constexpr):  # fmt: skip
    """The probes' gradient for ``BLOCK`` tokens and the program's row of partial sums (module docstring). The
    field's gradients ``dmu``/``dsig`` ``(T, H, R, 2)`` (axis contiguous) and ``dll`` ``(T, H, R)`` come through
    strides."""
    pid = tl.program_id(0)
    t = pid * BLOCK + tl.arange(0, BLOCK)[:, None]
    row = part_ptr + pid * (10 * HR + 4)
    e = tl.arange(0, HR2P)[None, :]
    ok = e < 2 * HR
    mask = (t < NT) & ok
    goff = t * sdt + (e // 2 // R) * sdh + (e // 2 % R) * sdr + e % 2
    dmu = tl.load(dmu_ptr + goff, mask=mask, other=0.0)
    tl.store(row + tl.arange(0, HR2P), tl.sum(dmu, axis=0), mask=tl.arange(0, HR2P) < 2 * HR)
    if HAS_MU:
        gm = tl.load(gmu_ptr)
        a = (_softplus(gm) + EPS) * MAX_OFFSET
        b = _bound(raw_ptr, bmu_ptr, t, e, OFF_MU, P, mask)
        d = dmu * a * (1.0 - b * b)
        tl.store(draw_ptr + t * P + OFF_MU + e, d.to(draw_ptr.dtype.element_ty), mask=mask)
        tl.store(row + 5 * HR + tl.arange(0, HR2P), tl.sum(d, axis=0), mask=tl.arange(0, HR2P) < 2 * HR)
        tl.store(row + 10 * HR, tl.sum(tl.sum(dmu * b, axis=1), axis=0) * MAX_OFFSET * _sigmoid(gm))
    else:
        tl.store(row + 5 * HR + tl.arange(0, HR2P), tl.zeros((HR2P,), tl.float32), mask=tl.arange(0, HR2P) < 2 * HR)
        tl.store(row + 10 * HR, 0.0)
    dsig = tl.load(dsig_ptr + goff, mask=mask, other=0.0)
    rs0 = tl.load(rsig0_ptr + e, mask=ok, other=0.0)
    sig0 = _softplus(rs0) + EPS + SIGMA_FLOOR
    if HAS_SIG:
        gs = tl.load(gsig_ptr)
        s = _softplus(gs) + EPS
        b = _bound(raw_ptr, bsig_ptr, t, e, OFF_SIG, P, mask)
        dlog = dsig * tl.exp(tl.log(sig0) + s * b)  # dL/dlog σ(t)
        d = dlog * s * (1.0 - b * b)
        tl.store(draw_ptr + t * P + OFF_SIG + e, d.to(draw_ptr.dtype.element_ty), mask=mask)
        tl.store(row + 7 * HR + tl.arange(0, HR2P), tl.sum(d, axis=0), mask=tl.arange(0, HR2P) < 2 * HR)
        tl.store(row + 10 * HR + 1, tl.sum(tl.sum(dlog * b, axis=1), axis=0) * _sigmoid(gs))
        dsig0 = tl.sum(dlog, axis=0) / tl.reshape(sig0, (HR2P,))
    else:
        tl.store(row + 7 * HR + tl.arange(0, HR2P), tl.zeros((HR2P,), tl.float32), mask=tl.arange(0, HR2P) < 2 * HR)
        tl.store(row + 10 * HR + 1, 0.0)
        dsig0 = tl.sum(dsig, axis=0)
    tl.store(row + 2 * HR + tl.arange(0, HR2P), dsig0 * tl.reshape(_sigmoid(rs0), (HR2P,)),
             mask=tl.arange(0, HR2P) < 2 * HR)  # fmt: skip
    q = tl.arange(0, HRP)[None, :]
    qok = q < HR
    qmask = (t < NT) & qok
    dll = tl.load(dll_ptr + t * slt + (q // R) * slh + (q % R) * slr, mask=qmask, other=0.0)
    tl.store(row + 4 * HR + tl.arange(0, HRP), tl.sum(dll, axis=0), mask=tl.arange(0, HRP) < HR)
    if HAS_LAM:
        gl = tl.load(glam_ptr)
        s = _softplus(gl) + EPS
        b = _bound(raw_ptr, blam_ptr, t, q, OFF_LAM, P, qmask)
        d = dll * s * (1.0 - b * b)
        tl.store(draw_ptr + t * P + OFF_LAM + q, d.to(draw_ptr.dtype.element_ty), mask=qmask)
        tl.store(row + 9 * HR + tl.arange(0, HRP), tl.sum(d, axis=0), mask=tl.arange(0, HRP) < HR)
        tl.store(row + 10 * HR + 2, tl.sum(tl.sum(dll * b, axis=1), axis=0) * _sigmoid(gl))
    else:
        tl.store(row + 9 * HR + tl.arange(0, HRP), tl.zeros((HRP,), tl.float32), mask=tl.arange(0, HRP) < HR)
        tl.store(row + 10 * HR + 2, 0.0)
    dtau = tl.where(pid == 0, tl.load(dtau_ptr) * _sigmoid(tl.load(rtau_ptr)), 0.0)
    tl.store(row + 10 * HR + 3, dtau)
