"""Fused Triton kernels for the axial SSOG field (``_ssog_*``), forward and backward; the design, its roofline
argument and the compile report are in docs/KERNELS.md. The factorized field's kernels
(:mod:`ssog_core.ops.ssog_triton_factorized`) share the tiling, the two passes and the backward scheme.

Imported only by :mod:`ssog_core.ops.ssog_triton`, never by ``import ssog_core``. Set ``TRITON_INTERPRET=1``
before importing this module to run the kernels on the CPU (the tests do).

One program owns (a tile of T query rows × WT query columns) of one image and head; batch·heads is grid
axis 1. It streams over chunks of KC key columns k:

1. column pass (keys j, all rows): ``y1[(i, k), r] = Σ_j A_r((i, k), j) · v[j, k]`` as batched dots
   ``[KC, T·RP, JC] @ [KC, JC, D]`` (factorized: all key rows at once, the weights normalised before the dot;
   axial: normalised afterwards — the normaliser is a row sum of the same unnormalised weights, so no weight is
   computed twice); v is read with its strides, no transposed copy;
2. row pass: ``acc[(i, w)] += Σ_{(k, r)} λ_r(i, w) · P_r((i, w), k) · y1[(i, k), r]`` as one batched dot
   ``[T, WT, KC·RP] @ [T, KC·RP, D]``.

Kernel weights are computed on chip in fp32 from the per-token parameters (``prm``) in log2 units,
with the analytic argmax ``j* = clamp(round(q − μ))`` of each Gaussian so that no max pass is needed and
every weight lies in [0, 1] (factorized) — the row-pass normaliser Z_x comes from a prologue over all keys
and its reciprocal is stored for the backward pass. Nothing per query × key or per atom goes to memory.

Parameter layout (last axis of ``prm``, fp32, indexed (b, i, w, h, r, f) through strides so that a shared
field can be passed with zero strides):

* axial: ``(μy, μx, by, bx, βy, βx, ιy, ιx)`` with ``b = log2(e) / (2σ²)``, ``β = log2(e)·(log λ − log σ)``
  and ``ι = 1/τ``; the mixed log2-density is ``ℓ(j) = log2 Σ_r 2^(β_r − b_r (q − j − μ_r)²)`` and the weight
  ``2^((ℓ(j) − m)·ι)``, where ``m = max_r (β_r − b_r δ_r²)`` ≤ max_j ℓ(j) is the analytic peak bound.

Backward (recompute, no atomics): the row kernel (one writer per query) recomputes y1 chunk by chunk,
forms ``G = dY · y1ᵀ`` and running sums that give the gradients of λ and of the column-axis (x) parameters;
the column kernel (one writer per key column) forms ``dy1 = Σ_w λ P dY`` with the saved ``1/Z_x``, recomputes
the row-axis kernels, and produces dV and the gradients of the y parameters.

With a fixed field (``FIXED``) the forward kernel loads the normalised per-head kernels ``Ay[h, r, i, j]``
and ``λ·Ax[h, r, w, k]`` instead of computing them.
"""

from __future__ import annotations

import triton
import triton.language as tl

LN2 = tl.constexpr(0.6931471805599453)
NEG_INF = tl.constexpr(float("-inf"))

# fmt: off


@triton.jit
def _axial_terms(q, key, pa, pmask, spr, F_MU: tl.constexpr, F_B: tl.constexpr, F_BETA: tl.constexpr, gmax,
                 R: tl.constexpr):
    """Axial mixed log2-density ``ℓ(key)`` (full tile) and the analytic peak bound ``m`` (parameter tile).

    ``pa`` points at atom 0 of each query's parameters; atom ``r`` is ``pa + r·spr``.
    """
    mu = tl.load(pa + F_MU, mask=pmask, other=0.0)
    bb = tl.load(pa + F_B, mask=pmask, other=1.0)
    beta = tl.load(pa + F_BETA, mask=pmask, other=0.0)
    x = q - mu
    ds = x - tl.minimum(tl.maximum(tl.floor(x + 0.5), 0.0), gmax)
    m = beta - bb * ds * ds
    d = x - key
    mx = beta - bb * d * d
    for a in tl.static_range(1, R):
        mu = tl.load(pa + a * spr + F_MU, mask=pmask, other=0.0)
        bb = tl.load(pa + a * spr + F_B, mask=pmask, other=1.0)
        beta = tl.load(pa + a * spr + F_BETA, mask=pmask, other=0.0)
        x = q - mu
        ds = x - tl.minimum(tl.maximum(tl.floor(x + 0.5), 0.0), gmax)
        m = tl.maximum(m, beta - bb * ds * ds)
        d = x - key
        mx = tl.maximum(mx, beta - bb * d * d)
    s = tl.zeros_like(mx)
    for a in tl.static_range(R):
        mu = tl.load(pa + a * spr + F_MU, mask=pmask, other=0.0)
        bb = tl.load(pa + a * spr + F_B, mask=pmask, other=1.0)
        beta = tl.load(pa + a * spr + F_BETA, mask=pmask, other=0.0)
        d = q - key - mu
        s += tl.exp2(beta - bb * d * d - mx)
    return mx + tl.log2(s), m


@triton.jit
def _log_weights(qf, kf, base, pmask, valid, spr, gmax, AXIAL: tl.constexpr, F: tl.constexpr, R: tl.constexpr):
    """Unnormalised log2 kernel weights along one axis (F = 0: rows/y, F = 1: columns/x), −inf where not
    ``valid``; ``base``/``pmask`` address the parameters (one per query and atom, broadcast over keys)."""
    if AXIAL:
        lse, mpk = _axial_terms(qf, kf, base, pmask, spr, F, 2 + F, 4 + F, gmax, R)
        lg = (lse - mpk) * tl.load(base + 6 + F, mask=pmask, other=1.0)
    else:  # the host-side terms j*, ca, cb of this axis
        e = tl.load(base + 3 * F, mask=pmask, other=0.0) - kf
        lg = e * (tl.load(base + 3 * F + 1, mask=pmask, other=0.0) * e + tl.load(base + 3 * F + 2, mask=pmask,
                                                                                    other=0.0))
    return tl.where(valid, lg, NEG_INF)


@triton.jit
def _column_pass(v_ptr, prm_ptr, taby_ptr, b, h, i0, k0, GH, GW, D, svb, svn, svh, spb, spi, spw, sph, spr,
                 sty_h, sty_r, sty_i, R: tl.constexpr, RO: tl.constexpr, RP: tl.constexpr, AXIAL: tl.constexpr,
                 FIXED: tl.constexpr, T: tl.constexpr, KC: tl.constexpr, JC: tl.constexpr, DHP: tl.constexpr,
                 DOT: tl.constexpr, PREC: tl.constexpr):
    """``y1`` for tokens (i0 + t, k0 + kc), all atoms, as ``[T, KC·RP, DHP]`` (index kc·RP + r), fp32."""
    kc = tl.arange(0, KC)[:, None, None]
    m = tl.arange(0, T * RP)[None, :, None]
    t = m // RP
    r = m % RP
    i = i0 + t
    k = k0 + kc
    qf = i.to(tl.float32)
    tok = (i < GH) & (k < GW) & (r < RO)
    base = prm_ptr + b * spb + i * spi + k * spw + h * sph + r * spr
    vj = tl.arange(0, JC)[None, :, None]
    vd = tl.arange(0, DHP)[None, None, :]
    y1 = tl.zeros((KC, T * RP, DHP), dtype=tl.float32)
    z = tl.zeros((KC, T * RP), dtype=tl.float32)
    for j0 in range(0, GH, JC):
        j = j0 + tl.arange(0, JC)[None, None, :]
        if FIXED:
            p = tl.load(taby_ptr + h * sty_h + r * sty_r + i * sty_i + j, mask=(i < GH) & (r < RO) & (j < GH),
                        other=0.0)
            p = tl.broadcast_to(p, (KC, T * RP, JC))
        else:
            p = tl.exp2(_log_weights(qf, j.to(tl.float32), base, tok, tok & (j < GH), spr, GH - 1.0, AXIAL, 0, R))
            z += tl.sum(p, axis=2)
        vals = tl.load(v_ptr + b * svb + ((j0 + vj) * GW + k) * svn + h * svh + vd,
                       mask=(j0 + vj < GH) & (k < GW) & (vd < D), other=0.0)
        y1 = tl.dot(p.to(DOT), vals.to(DOT), y1, input_precision=PREC)  # [KC, T·RP, DHP]
    if not FIXED:
        y1 = y1 / tl.where(z > 0.0, z, 1.0)[:, :, None]
    return tl.reshape(tl.permute(tl.reshape(y1, (KC, T, RP, DHP)), (1, 0, 2, 3)), (T, KC * RP, DHP))


@triton.jit
def _query_atoms(prm_ptr, b, h, i0, w0, GH, GW, spb, spi, spw, sph, spr, RO: tl.constexpr, RP: tl.constexpr,
                 T: tl.constexpr, WT: tl.constexpr, KC: tl.constexpr):
    """Over ``[T, WT, KC·RP]`` from the query tile at ``(i0, w0)``: query rows ``i`` and columns ``w`` (``qf``: as
    floats), key offsets ``kc`` and atoms ``r`` (index kc·RP + r), the mask of real (query, atom) pairs and the
    pointers to their parameters."""
    t = tl.arange(0, T)[:, None, None]
    w = w0 + tl.arange(0, WT)[None, :, None]
    m = tl.arange(0, KC * RP)[None, None, :]
    kc = m // RP
    r = m % RP
    i = i0 + t
    qmask = (i < GH) & (w < GW) & (r < RO)
    qf = w.to(tl.float32)
    base = prm_ptr + b * spb + i * spi + w * spw + h * sph + r * spr
    return i, w, kc, r, qmask, qf, base


@triton.jit
def _row_prologue(prm_ptr, b, h, i0, w0, GH, GW, spb, spi, spw, sph, spr, R: tl.constexpr, RO: tl.constexpr,
                  RP: tl.constexpr, AXIAL: tl.constexpr, T: tl.constexpr, WT: tl.constexpr, KC: tl.constexpr):
    """``1/Z_x`` for queries (i0 + t, w0 + w) and atoms r, as ``[T, WT, RP]`` (1 where the query is padding)."""
    i, w, kc, r, qmask, qf, base = _query_atoms(prm_ptr, b, h, i0, w0, GH, GW, spb, spi, spw, sph, spr, RO, RP, T, WT,
                                                KC)
    z = tl.zeros((T, WT, KC * RP), dtype=tl.float32)
    for k0 in range(0, GW, KC):
        key = k0 + kc
        z += tl.exp2(_log_weights(qf, key.to(tl.float32), base, qmask, qmask & (key < GW), spr, GW - 1.0, AXIAL, 1,
                                  R))
    z = tl.sum(tl.reshape(z, (T, WT, KC, RP)), axis=2)
    return 1.0 / tl.where(z > 0.0, z, 1.0)


@triton.jit
def _expand_atoms(x, T: tl.constexpr, WT: tl.constexpr, KC: tl.constexpr, RP: tl.constexpr):
    """``[T, WT, RP]`` → ``[T, WT, KC·RP]`` (index kc·RP + r)."""
    return tl.reshape(tl.broadcast_to(tl.reshape(x, (T, WT, 1, RP)), (T, WT, KC, RP)), (T, WT, KC * RP))


@triton.jit
def _axial_tile(prm_ptr, H, GH, GW, spb, spi, spw, sph, spr, RO: tl.constexpr, RP: tl.constexpr, T: tl.constexpr,
                WT: tl.constexpr, KC: tl.constexpr):
    """The program's query tile, shared by the forward and the row-gradient kernels: its image ``b`` and head ``h``
    (batch·heads on grid axis 1: programs sharing v run together), its origin ``(i0, w0)`` and
    :func:`_query_atoms` of it."""
    pid = tl.program_id(0)  # (row tile, column tile)
    bh = tl.program_id(1)
    b = (bh // H).to(tl.int64)  # batch offsets may exceed 2**31 elements
    h = bh % H
    n_wt = tl.cdiv(GW, WT)
    i0 = (pid // n_wt) * T
    w0 = (pid % n_wt) * WT
    i, w, kc, r, qmask, qf, base = _query_atoms(prm_ptr, b, h, i0, w0, GH, GW, spb, spi, spw, sph, spr, RO, RP, T, WT,
                                                KC)
    return b, h, i0, w0, i, w, kc, r, qmask, qf, base


@triton.jit
def _ssog_izx_kernel(prm_ptr, out_ptr, H, GW, spw, sph, spr, sow, soh, R: tl.constexpr, RO: tl.constexpr,
                     RP: tl.constexpr, AXIAL: tl.constexpr, WT: tl.constexpr, KC: tl.constexpr):
    """``1/Z_x`` of a shared field, ``(Gw, H, RO)``: the forward prologue on its own (same code)."""
    h = tl.program_id(0)
    w0 = tl.program_id(2) * WT
    izx = _row_prologue(prm_ptr, 0, h, 0, w0, 1, GW, 0, 0, spw, sph, spr, R, RO, RP, AXIAL, 1, WT, KC)
    w = w0 + tl.arange(0, WT)[None, :, None]
    r = tl.arange(0, RP)[None, None, :]
    tl.store(out_ptr + w * sow + h * soh + r, izx, mask=(w < GW) & (r < RO))


@triton.jit
def _ssog_fwd_kernel(v_ptr, prm_ptr, taby_ptr, tabx_ptr, y_ptr, izx_ptr, H, GH, GW, D,
                     svb, svn, svh, spb, spi, spw, sph, spr, syb, syn, syh, szb, szi, szw, szh,
                     sty_h, sty_r, sty_i, stx_h, stx_r, stx_w,
                     R: tl.constexpr, RO: tl.constexpr, RP: tl.constexpr,
                     FIXED: tl.constexpr, T: tl.constexpr, WT: tl.constexpr, KC: tl.constexpr, JC: tl.constexpr,
                     DHP: tl.constexpr, DOT: tl.constexpr, PREC: tl.constexpr):
    """Axial ``y`` for one (row tile, column tile) × (b, h); stores ``1/Z_x`` unless the field is fixed."""
    b, h, i0, w0, i, w, kc, r, qmask, qf, base = _axial_tile(prm_ptr, H, GH, GW, spb, spi, spw, sph, spr, RO, RP, T, WT,
                                                             KC)

    if not FIXED:
        izx3 = _row_prologue(prm_ptr, b, h, i0, w0, GH, GW, spb, spi, spw, sph, spr, R, RO, RP, True, T, WT, KC)
        r3 = tl.arange(0, RP)[None, None, :]
        tl.store(izx_ptr + b * szb + i * szi + w * szw + h * szh + r3, izx3, mask=(i < GH) & (w < GW) & (r3 < RO))
        scale = _expand_atoms(izx3, T, WT, KC, RP)

    acc = tl.zeros((T, WT, DHP), dtype=tl.float32)
    for k0 in range(0, GW, KC):
        y1 = _column_pass(v_ptr, prm_ptr, taby_ptr, b, h, i0, k0, GH, GW, D, svb, svn, svh, spb, spi, spw, sph,
                          spr, sty_h, sty_r, sty_i, R, RO, RP, True, FIXED, T, KC, JC, DHP, DOT, PREC)
        key = k0 + kc
        if FIXED:
            p = tl.load(tabx_ptr + h * stx_h + r * stx_r + w * stx_w + key,
                        mask=(w < GW) & (r < RO) & (key < GW), other=0.0)
            p = tl.broadcast_to(p, (T, WT, KC * RP))
        else:
            p = tl.exp2(_log_weights(qf, key.to(tl.float32), base, qmask, qmask & (key < GW), spr, GW - 1.0,
                                     True, 1, R)) * scale
        acc = tl.dot(p.to(DOT), y1.to(DOT), acc, input_precision=PREC)

    yd = tl.arange(0, DHP)[None, None, :]
    tl.store(y_ptr + b * syb + (i * GW + w) * syn + h * syh + yd, acc.to(y_ptr.dtype.element_ty),
             mask=(i < GH) & (w < GW) & (yd < D))


@triton.jit
def _ssog_bwd_rows_kernel(v_ptr, prm_ptr, izx_ptr, dy_ptr, dprm_ptr, H, GH, GW, D,
                          svb, svn, svh, spb, spi, spw, sph, spr, szb, szi, szw, szh, sdyb, sdyn, sdyh,
                          sgb, sgi, sgw, sgh, sgr,
                          R: tl.constexpr, RO: tl.constexpr, RP: tl.constexpr, RA: tl.constexpr,
                          T: tl.constexpr, WT: tl.constexpr, KC: tl.constexpr,
                          JC: tl.constexpr, DHP: tl.constexpr, DOT: tl.constexpr, PREC: tl.constexpr):
    """Axial gradients of the column-axis (x) parameters and 1/τ; one program per (row tile, column tile) × (b, h).

    ``G = dY · y1ᵀ`` per key chunk; with ``g = λ·G`` and the softmax backward ``dL/dl_k = ln2·P_k (g_k − Σ P g)``,
    the gradients need only running sums over keys of ``P·G``, ``P·G·e``, ``P·e``, ``P·G·e²``, ``P·e²``.
    """
    b, h, i0, w0, i, w, kc, r, qmask, qf, base = _axial_tile(prm_ptr, H, GH, GW, spb, spi, spw, sph, spr, RO, RP, T, WT,
                                                             KC)
    izx = tl.load(izx_ptr + b * szb + i * szi + w * szw + h * szh + r, mask=qmask, other=0.0)
    yd = tl.arange(0, DHP)[None, None, :]
    dy = tl.load(dy_ptr + b * sdyb + (i * GW + w) * sdyn + h * sdyh + yd, mask=(i < GH) & (w < GW) & (yd < D),
                 other=0.0).to(DOT)

    s_pg = tl.zeros((T, WT), dtype=tl.float32)
    s_pgl = tl.zeros((T, WT), dtype=tl.float32)
    s_pl = tl.zeros((T, WT), dtype=tl.float32)
    a_idx = tl.arange(0, RA)[None, None, :]
    pg_e = tl.zeros((T, WT, RA), dtype=tl.float32)
    p_e = tl.zeros((T, WT, RA), dtype=tl.float32)
    pg_e2 = tl.zeros((T, WT, RA), dtype=tl.float32)
    p_e2 = tl.zeros((T, WT, RA), dtype=tl.float32)
    pg_1 = tl.zeros((T, WT, RA), dtype=tl.float32)
    p_1 = tl.zeros((T, WT, RA), dtype=tl.float32)
    itau = tl.load(base + 7, mask=qmask, other=1.0)
    for k0 in range(0, GW, KC):
        y1 = _column_pass(v_ptr, prm_ptr, prm_ptr, b, h, i0, k0, GH, GW, D, svb, svn, svh, spb, spi, spw, sph, spr,
                          0, 0, 0, R, RO, RP, True, False, T, KC, JC, DHP, DOT, PREC)
        g = tl.dot(dy, tl.permute(y1.to(DOT), (0, 2, 1)), input_precision=PREC)  # [T, WT, KC·RP]
        key = k0 + kc
        kf = key.to(tl.float32)
        valid = qmask & (key < GW)
        lse, mpk = _axial_terms(qf, kf, base, qmask, spr, 1, 3, 5, GW - 1.0, R)
        p = tl.exp2(tl.where(valid, (lse - mpk) * itau, NEG_INF)) * izx
        pg = p * g
        s_pg += tl.sum(pg, axis=2)
        s_pgl += tl.sum(pg * (lse - mpk), axis=2)
        s_pl += tl.sum(p * (lse - mpk), axis=2)
        for a in tl.static_range(R):
            mu_a = tl.load(base + a * spr + 1, mask=qmask, other=0.0)
            b_a = tl.load(base + a * spr + 3, mask=qmask, other=1.0)
            beta_a = tl.load(base + a * spr + 5, mask=qmask, other=0.0)
            d = qf - kf - mu_a
            om = tl.exp2(tl.where(valid, beta_a - b_a * d * d - lse, NEG_INF))
            sel = a_idx == a
            pom = p * om
            pgom = pg * om
            pg_1 += tl.where(sel, tl.sum(pgom, axis=2)[:, :, None], 0.0)
            p_1 += tl.where(sel, tl.sum(pom, axis=2)[:, :, None], 0.0)
            pg_e += tl.where(sel, tl.sum(pgom * d, axis=2)[:, :, None], 0.0)
            p_e += tl.where(sel, tl.sum(pom * d, axis=2)[:, :, None], 0.0)
            pg_e2 += tl.where(sel, tl.sum(pgom * d * d, axis=2)[:, :, None], 0.0)
            p_e2 += tl.where(sel, tl.sum(pom * d * d, axis=2)[:, :, None], 0.0)
    gbase = dprm_ptr + b * sgb + i * sgi + w * sgw + h * sgh
    amask = (i < GH) & (w < GW) & (a_idx < R)
    pbase = prm_ptr + b * spb + i * spi + w * spw + h * sph + a_idx * spr
    b_a = tl.load(pbase + 3, mask=amask, other=1.0)
    itau3 = tl.load(pbase + 7, mask=amask, other=1.0)
    s = s_pg[:, :, None]
    d_om_e = LN2 * (pg_e - s * p_e)
    d_om_e2 = LN2 * (pg_e2 - s * p_e2)
    d_om = LN2 * (pg_1 - s * p_1)
    d_itau = LN2 * (s_pgl - s_pg * s_pl)
    tl.store(gbase + a_idx * sgr + 1, itau3 * 2.0 * b_a * d_om_e, mask=amask)
    tl.store(gbase + a_idx * sgr + 3, -itau3 * d_om_e2, mask=amask)
    tl.store(gbase + a_idx * sgr + 5, itau3 * d_om, mask=amask)
    tl.store(gbase + a_idx * sgr + 7, tl.where(a_idx == 0, d_itau[:, :, None], 0.0), mask=amask)


@triton.jit
def _ssog_bwd_cols_kernel(v_ptr, prm_ptr, izx_ptr, dy_ptr, dv_ptr, dprm_ptr, H, GH, GW, D,
                          svb, svn, svh, spb, spi, spw, sph, spr, szb, szi, szw, szh, sdyb, sdyn, sdyh,
                          sdvb, sdvn, sdvh, sgb, sgi, sgw, sgh, sgr,
                          R: tl.constexpr, RO: tl.constexpr, RP: tl.constexpr,
                          KT: tl.constexpr, IC: tl.constexpr, WC: tl.constexpr, GHP: tl.constexpr,
                          DHP: tl.constexpr, DOT: tl.constexpr, PREC: tl.constexpr):
    """Axial dV and the gradients of the row-axis (y) parameters; one program per (b, h, tile of KT key columns).

    For each chunk of IC query rows: ``dy1 = Σ_w λ·P_x·dY`` (chunked over w, with the saved ``1/Z_x``), then the
    column-pass kernels of tokens (i, k) over all key rows j give ``dV += Aᵀ·dy1`` and, from
    ``G = dy1 · vᵀ``, the softmax backward over j.
    """
    bh = tl.program_id(1)  # batch·heads on axis 1: programs sharing v run together
    b = (bh // H).to(tl.int64)  # batch offsets may exceed 2**31 elements
    h = bh % H
    k0 = tl.program_id(0) * KT

    # values of this column tile, [KT, GHP, DHP]
    vk = k0 + tl.arange(0, KT)[:, None, None]
    vj = tl.arange(0, GHP)[None, :, None]
    vd = tl.arange(0, DHP)[None, None, :]
    vmask = (vk < GW) & (vj < GH) & (vd < D)
    vals = tl.load(v_ptr + b * svb + (vj * GW + vk) * svn + h * svh + vd, mask=vmask, other=0.0).to(DOT)
    dv = tl.zeros((KT, GHP, DHP), dtype=tl.float32)

    # row-pass weight tile [IC, KT·RP, WC]: query (i0 + ic, w), atom r, key k0 + kt
    ic = tl.arange(0, IC)[:, None, None]
    mq = tl.arange(0, KT * RP)[None, :, None]
    r_q = mq % RP
    key_q = k0 + mq // RP
    # column-pass weight tile [KT, IC·RP, GHP]: token (i0 + ic, k0 + kt), atom r, key row j
    k_c = k0 + tl.arange(0, KT)[:, None, None]
    mc = tl.arange(0, IC * RP)[None, :, None]
    r_c = mc % RP
    j = tl.arange(0, GHP)[None, None, :]
    jf = j.to(tl.float32)
    dyw = tl.arange(0, WC)[None, :, None]

    for i0 in range(0, GH, IC):
        iq = i0 + ic
        dy1 = tl.zeros((IC, KT * RP, DHP), dtype=tl.float32)
        for w0 in range(0, GW, WC):
            wq = w0 + tl.arange(0, WC)[None, None, :]
            qmask = (iq < GH) & (wq < GW) & (r_q < RO)
            qbase = prm_ptr + b * spb + iq * spi + wq * spw + h * sph + r_q * spr
            scale = tl.load(izx_ptr + b * szb + iq * szi + wq * szw + h * szh + r_q, mask=qmask, other=0.0)
            px = tl.exp2(_log_weights(wq.to(tl.float32), key_q.to(tl.float32), qbase, qmask, qmask & (key_q < GW),
                                      spr, GW - 1.0, True, 1, R)) * scale
            dyv = tl.load(dy_ptr + b * sdyb + (iq * GW + w0 + dyw) * sdyn + h * sdyh + vd,
                          mask=(iq < GH) & (w0 + dyw < GW) & (vd < D), other=0.0)
            dy1 = tl.dot(px.to(DOT), dyv.to(DOT), dy1, input_precision=PREC)  # [IC, KT·RP, DHP]
        dy1 = tl.reshape(tl.permute(tl.reshape(dy1, (IC, KT, RP, DHP)), (1, 0, 2, 3)), (KT, IC * RP, DHP)).to(DOT)

        i_c = i0 + mc // RP
        tok = (i_c < GH) & (k_c < GW) & (r_c < RO)
        cbase = prm_ptr + b * spb + i_c * spi + k_c * spw + h * sph + r_c * spr
        qy = i_c.to(tl.float32)
        lse_y, m_y = _axial_terms(qy, jf, cbase, tok, spr, 0, 2, 4, GH - 1.0, R)
        itau_y = tl.load(cbase + 6, mask=tok, other=1.0)
        py = tl.exp2(tl.where(tok & (j < GH), (lse_y - m_y) * itau_y, NEG_INF))
        zy = tl.sum(py, axis=2)[:, :, None]
        py = py / tl.where(zy > 0.0, zy, 1.0)  # [KT, IC·RP, GHP]

        g = tl.dot(dy1, tl.permute(vals, (0, 2, 1)), input_precision=PREC)  # [KT, IC·RP, GHP]
        dv = tl.dot(tl.permute(py.to(DOT), (0, 2, 1)), dy1, dv, input_precision=PREC)

        pg = py * g
        s = tl.sum(pg, axis=2)[:, :, None]
        gbase = dprm_ptr + b * sgb + i_c * sgi + k_c * sgw + h * sgh
        dl = LN2 * (pg - py * s)
        for a in tl.static_range(R):
            mu_a = tl.load(cbase + a * spr + 0, mask=tok, other=0.0)
            b_a = tl.load(cbase + a * spr + 2, mask=tok, other=1.0)
            beta_a = tl.load(cbase + a * spr + 4, mask=tok, other=0.0)
            d = qy - jf - mu_a
            dlom = dl * tl.exp2(tl.where(tok & (j < GH), beta_a - b_a * d * d - lse_y, NEG_INF))
            d_e = tl.sum(dlom * d, axis=2)[:, :, None]
            d_e2 = tl.sum(dlom * d * d, axis=2)[:, :, None]
            d_1 = tl.sum(dlom, axis=2)[:, :, None]
            tl.store(gbase + a * sgr + 0, itau_y * 2.0 * b_a * d_e, mask=tok)
            tl.store(gbase + a * sgr + 2, -itau_y * d_e2, mask=tok)
            tl.store(gbase + a * sgr + 4, itau_y * d_1, mask=tok)
            if a == 0:
                tl.store(gbase + 6, tl.sum(dl * (lse_y - m_y), axis=2)[:, :, None], mask=tok)
            else:
                tl.store(gbase + a * sgr + 6, tl.zeros_like(d_1), mask=tok)

    tl.store(dv_ptr + b * sdvb + (vj * GW + vk) * sdvn + h * sdvh + vd, dv.to(dv_ptr.dtype.element_ty), mask=vmask)


# fmt: on
