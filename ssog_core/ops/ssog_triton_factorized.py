"""Fused Triton kernels for the factorized SSOG field (``_fact_*``), forward and backward (docs/KERNELS.md §2).

They load every per-(token, atom) term once per thread and build the weights of all keys of that (token, atom)
in the same thread, so that a weight costs ``e = j* − key``, ``e·(ca·e + cb)``, one ``exp2`` and one multiply.
The tiling, the column and row passes, the recompute-only backward and the fixed-field tables are those of the
axial kernels (:mod:`ssog_core.ops.ssog_triton_axial`).

Imported only by :mod:`ssog_core.ops.ssog_triton`, never by ``import ssog_core``. Set ``TRITON_INTERPRET=1``
before importing this module to run the kernels on the CPU (the tests do).

The field is read as it is (no preparation tensor): ``μ`` and ``σ`` ``(B, Gh, Gw, H, R, 2)`` (axis (y, x)
contiguous), ``log λ`` ``(B, Gh, Gw, H, R)`` and the scalar ``τ``, each through its own strides, so that a shared
field (``(H, R, …)``) is read with zero strides over (b, i, w). Each program builds the per-(token, atom) terms of
the weights it needs from them (:func:`_axis_terms`, the maths of :func:`ssog_core.field.exp2_rate`): with
``c = log2(e) / (2σ²τ)``, ``x = q − μ``, ``j* = clamp(round(x), 0, G − 1)`` and ``δ = x − j*``, ``ca = −c`` and
``cb = −2c·δ``, the weight of key j for query q is ``2^(e·(ca·e + cb))`` with ``e = j* − j`` (an integer), i.e.
``exp(−(q − j − μ)² / (2σ²τ))`` divided by its peak; λ is the softmax of log λ over the atoms. The backward
kernels turn the gradients w.r.t. ``ca`` (``Σ dL/dl·e²``), ``cb`` (``Σ dL/dl·e``) and λ into those w.r.t. μ, σ
and log λ per token (:func:`_raw_grads`) and each program's part of the gradient w.r.t. τ.
"""

from __future__ import annotations

import triton
import triton.language as tl

LN2 = tl.constexpr(0.6931471805599453)
HALF_LOG2E = tl.constexpr(0.7213475204444817)  # log2(e) / 2, as in ssog_core.field.exp2_rate
NEG_INF = tl.constexpr(float("-inf"))

# fmt: off
# per-query terms hoisted out of the key loop, integer key offsets


@triton.jit
def _axis_terms(mu, sig, tau, q, G):
    """The weight terms of one axis of a (token, atom): ``(j*, ca, cb)`` and ``c`` from μ and σ of that axis, the
    field's τ and the query coordinate ``q`` on an axis of ``G`` keys (module docstring)."""
    c = HALF_LOG2E / (sig * sig * tau)
    x = q - mu
    js = tl.minimum(tl.maximum(tl.floor(x + 0.5), 0.0), G - 1.0)
    return js, -c, -2.0 * c * (x - js), c


@triton.jit
def _softmax_atoms(ll, valid, AXIS: tl.constexpr):
    """λ: the softmax of log λ over the atom axis ``AXIS`` (0 where ``valid`` is false)."""
    ll = tl.where(valid, ll, NEG_INF)
    m = tl.max(ll, axis=AXIS)
    m = tl.expand_dims(tl.where(m == NEG_INF, 0.0, m), AXIS)
    ex = tl.exp(ll - m)
    return ex / tl.maximum(tl.expand_dims(tl.sum(ex, axis=AXIS), AXIS), 1e-30)


@triton.jit
def _raw_grads(dca, dcb, ca, cb, js, sig, tau, q, mu):
    """Gradients w.r.t. μ and σ of one axis from those w.r.t. ``ca = −c`` and ``cb = −2c·(q − μ − j*)`` (j* has
    none), and each term's part of the gradient w.r.t. τ (``c = log2(e)/(2σ²τ)``)."""
    c = -ca
    dc = -dca - 2.0 * (q - mu - js) * dcb
    return 2.0 * c * dcb, dc * (-2.0 * c / sig), dc * (-c / tau)


@triton.jit
def _fact_tile(v_ptr, GW, svb, svh, T: tl.constexpr, WT: tl.constexpr):
    """The program's query tile, shared by the forward and the row-gradient kernels: its head ``h`` and image ``b``
    (grid axes 1 and 2: the programs sharing a value slab run together), its origin ``(i0, w0)`` and the base
    pointer of its values."""
    pid = tl.program_id(0)
    h = tl.program_id(1)  # heads and images on axes 1 and 2: the programs sharing a value slab run together
    b = tl.program_id(2).to(tl.int64)  # batch offsets may exceed 2**31 elements
    n_wt = tl.cdiv(GW, WT)
    i0 = (pid // n_wt) * T
    w0 = (pid % n_wt) * WT
    return h, b, i0, w0, v_ptr + b * svb + h * svh


@triton.jit
def _fact_column_weights(mb, sb, tau, k0, i0, GH, GW, smi, smw, smr, ssi, ssw, ssr, R: tl.constexpr,
                         RP: tl.constexpr, T: tl.constexpr, KC: tl.constexpr, GHP: tl.constexpr, JS: tl.constexpr):
    """Column-pass weights of tokens (i0 + t, k0 + kc), every atom, over all key rows j, normalised, as
    ``[GHP, KC, T·RP]`` (index t·RP + r); also ``e = j* − j``, the token mask ``[1, KC, T·RP]`` and the tokens' μy
    and σy as ``[KC, T·RP]`` (the column backward's gradients need them: taken from this load, not loaded again).

    The tile is built as ``[JS, GHP/JS, KC, T·RP]`` with μy and σy loaded as a ``[JS, 1, KC, T·RP]`` tile
    (JS = :func:`ssog_core.ops.triton_tiles.row_split`): a load of at least one element per thread fixes its
    layout, so each thread holds GHP/JS key rows of one (token, atom) — the terms are built once per thread, and
    the normaliser is summed in registers and over JS warps, not across lanes. Padded rows get −inf."""
    js4 = tl.arange(0, JS)[:, None, None, None]
    j = js4 * (GHP // JS) + tl.arange(0, GHP // JS)[None, :, None, None]
    kc = tl.arange(0, KC)[None, None, :, None]
    m = tl.arange(0, T * RP)[None, None, None, :]
    i = i0 + m // RP
    r = m % RP
    k = k0 + kc
    tok = (i < GH) & (k < GW) & (r < R)
    tm = tok & (js4 < JS)
    mu = tl.load(mb + i * smi + k * smw + r * smr + 0 * js4, mask=tm, other=0.0)
    sig = tl.load(sb + i * ssi + k * ssw + r * ssr + 0 * js4, mask=tm, other=1.0)
    js, ca, cb, _ = _axis_terms(mu, sig, tau, i.to(tl.float32), GH)
    e = js - j.to(tl.float32)
    p = tl.exp2(e * (ca * e + cb) + tl.where(j < GH, 0.0, NEG_INF))
    p = p * tl.fdiv(1.0, tl.sum(tl.sum(p, axis=1), axis=0))[None, None]  # Z ≥ 1; fdiv: non-IEEE division, within 2 ulp
    terms = (tl.reshape(tl.max(mu, axis=0), (KC, T * RP)), tl.reshape(tl.max(sig, axis=0), (KC, T * RP)))
    return tl.reshape(p, (GHP, KC, T * RP)), tl.reshape(e, (GHP, KC, T * RP)), tl.reshape(tok, (1, KC, T * RP)), terms


@triton.jit
def _fact_column_pass(vb, mb, sb, tau, k0, i0, GH, GW, svn, smi, smw, smr, ssi, ssw, ssr, D: tl.constexpr,
                      R: tl.constexpr, RP: tl.constexpr, T: tl.constexpr, KC: tl.constexpr, GHP: tl.constexpr,
                      JS: tl.constexpr, DHP: tl.constexpr, DOT: tl.constexpr, PREC: tl.constexpr):
    """Normalised ``y1`` of tokens (i0 + t, k0 + kc) for every atom as ``[KC, T·RP, DHP]`` (index t·RP + r); all key
    rows j in one dot."""
    p, _, _, _ = _fact_column_weights(mb, sb, tau, k0, i0, GH, GW, smi, smw, smr, ssi, ssw, ssr, R, RP, T, KC, GHP, JS)
    k = k0 + tl.arange(0, KC)[:, None, None]
    vj = tl.arange(0, GHP)[None, :, None]
    vd = tl.arange(0, DHP)[None, None, :]
    vmask = (vj < GH) & (k < GW)
    if D != DHP:
        vmask = vmask & (vd < D)
    vals = tl.load(vb + (vj * GW + k) * svn + vd, mask=vmask, other=0.0)
    return tl.dot(tl.permute(p, (1, 2, 0)).to(DOT), vals.to(DOT), input_precision=PREC)


@triton.jit
def _fact_fwd_kernel(
    v_ptr,
    mu_ptr,
    sig_ptr,
    ll_ptr,
    tau_ptr,
    taby_ptr,
    tabx_ptr,
    y_ptr,
    izx_ptr,
    GH,
    GW,
    svb,
    svn,
    svh,
    smb,
    smi,
    smw,
    smh,
    smr,
    ssb,
    ssi,
    ssw,
    ssh,
    ssr,
    slb,
    sli,
    slw,
    slh,
    slr,
    syb,
    syn,
    syh,
    szb,
    szi,
    szw,
    szh,
    sty_h,
    sty_r,
    sty_i,
    stx_h,
    stx_r,
    stx_w,
    D: tl.constexpr,
    R: tl.constexpr,
    RP: tl.constexpr,
    FIXED: tl.constexpr,
    T: tl.constexpr,
    WT: tl.constexpr,
    KC: tl.constexpr,
    GHP: tl.constexpr,
    DHP: tl.constexpr,
    EVEN_K: tl.constexpr,
    JS: tl.constexpr,
    DOT: tl.constexpr,
    PREC: tl.constexpr,
):
    """Factorized ``y`` for one (row tile, column tile) × (h, b). Unless the field is ``FIXED`` (its per-head kernels
    loaded from ``taby``/``tabx``), the weights are built from μ, σ, log λ and τ, and ``1/Z_x`` is stored."""
    h, b, i0, w0, vb = _fact_tile(v_ptr, GW, svb, svh, T, WT)
    mb = mu_ptr + b * smb + h * smh
    sb = sig_ptr + b * ssb + h * ssh

    # row-pass tile: query (i0 + t, w0 + w), atom r, key k0 + kc. Steered: [T, WT, RP, KC], the per-(query, atom)
    # terms [T, WT, RP, 1] tiles, so each thread builds the weights of all KC keys of its (query, atom), adjacent in
    # the dot's K (index r·KC + kc): staged for the dot as one vector store, not KC single ones. Fixed: [T, WT, KC,
    # RP] (index kc·RP + r), the tables' order that keeps the fixed forward at its registers (docs/KERNELS.md §3)
    i = i0 + tl.arange(0, T)[:, None, None, None]
    w = w0 + tl.arange(0, WT)[None, :, None, None]
    if FIXED:
        kc = tl.arange(0, KC)[None, None, :, None]
        r = tl.arange(0, RP)[None, None, None, :]
    else:
        r = tl.arange(0, RP)[None, None, :, None]
        kc = tl.arange(0, KC)[None, None, None, :]
    qmask = (i < GH) & (w < GW) & (r < R)

    if FIXED:
        tau = 1.0
        tx = tabx_ptr + h * stx_h + r * stx_r + w * stx_w + kc
        tmask = (w < GW) & (r < R)
    else:
        tau = tl.load(tau_ptr)
        mux = tl.load(mb + i * smi + w * smw + r * smr + 1, mask=qmask, other=0.0)
        sigx = tl.load(sb + i * ssi + w * ssw + r * ssr + 1, mask=qmask, other=1.0)
        js, ca, cb, _ = _axis_terms(mux, sigx, tau, w.to(tl.float32), GW)
        ll = tl.load(ll_ptr + b * slb + h * slh + i * sli + w * slw + r * slr, mask=qmask, other=0.0)
        lam = _softmax_atoms(ll, r < R, 2)
        kf = kc.to(tl.float32)
        z = tl.zeros((T, WT, RP, KC), dtype=tl.float32)
        for k0 in range(0, GW - KC + 1, KC):
            e = (js - k0) - kf
            z += tl.exp2(e * (ca * e + cb))
        if not EVEN_K:
            k0 = GW - GW % KC
            e = (js - k0) - kf
            z += tl.where(kc < GW - k0, tl.exp2(e * (ca * e + cb)), 0.0)
        izx = tl.fdiv(1.0, tl.sum(z, axis=3)[:, :, :, None])  # Z_x ≥ 1; fdiv: non-IEEE, within 2 ulp
        tl.store(izx_ptr + b * szb + i * szi + w * szw + h * szh + r, izx, mask=qmask)
        scale = izx * lam  # λ/Z_x

    acc = tl.zeros((T, WT, DHP), dtype=tl.float32)
    for k0 in range(0, GW, KC):
        if FIXED:
            y1 = _fixed_column_pass(
                vb, taby_ptr, h, k0, i0, GH, GW, svn, sty_h, sty_r, sty_i, D, R, RP, T, KC, GHP, DHP, DOT, PREC
            )
            p = tl.broadcast_to(tl.load(tx + k0, mask=tmask & (kc < GW - k0), other=0.0), (T, WT, KC, RP))
            y1 = tl.reshape(tl.permute(tl.reshape(y1, (KC, T, RP, DHP)), (1, 0, 2, 3)), (T, KC * RP, DHP))
        else:
            y1 = _fact_column_pass(vb, mb, sb, tau, k0, i0, GH, GW, svn, smi, smw, smr, ssi, ssw, ssr, D, R, RP, T, KC,
                                   GHP, JS, DHP, DOT, PREC)
            e = (js - k0) - kf
            lg = e * (ca * e + cb)
            if not EVEN_K:  # ≤ 0 on every real key; capped so that padded keys (y1 = 0 there) cannot overflow
                lg = tl.minimum(lg, 0.0)
            p = tl.exp2(lg) * scale
            y1 = tl.reshape(tl.permute(tl.reshape(y1, (KC, T, RP, DHP)), (1, 2, 0, 3)), (T, RP * KC, DHP))
        acc = tl.dot(tl.reshape(p, (T, WT, KC * RP)).to(DOT), y1.to(DOT), acc, input_precision=PREC)

    i = i0 + tl.arange(0, T)[:, None, None]
    w = w0 + tl.arange(0, WT)[None, :, None]
    yd = tl.arange(0, DHP)[None, None, :]
    ymask = (i < GH) & (w < GW)
    if D != DHP:
        ymask = ymask & (yd < D)
    tl.store(y_ptr + b * syb + h * syh + (i * GW + w) * syn + yd, acc.to(y_ptr.dtype.element_ty), mask=ymask)


@triton.jit
def _fixed_column_pass(
    vb,
    taby_ptr,
    h,
    k0,
    i0,
    GH,
    GW,
    svn,
    sty_h,
    sty_r,
    sty_i,
    D: tl.constexpr,
    R: tl.constexpr,
    RP: tl.constexpr,
    T: tl.constexpr,
    KC: tl.constexpr,
    GHP: tl.constexpr,
    DHP: tl.constexpr,
    DOT: tl.constexpr,
    PREC: tl.constexpr,
):
    """``y1`` of a fixed field: the per-head row kernels ``Ay[h, r, i, j]`` loaded, the same for every column."""
    kc = tl.arange(0, KC)[:, None, None]
    m = tl.arange(0, T * RP)[None, :, None]
    i = i0 + m // RP
    r = m % RP
    j = tl.arange(0, GHP)[None, None, :]
    p = tl.load(taby_ptr + h * sty_h + r * sty_r + i * sty_i + j, mask=(i < GH) & (r < R) & (j < GH), other=0.0)
    p = tl.broadcast_to(p, (KC, T * RP, GHP))
    vj = tl.arange(0, GHP)[None, :, None]
    vd = tl.arange(0, DHP)[None, None, :]
    k = k0 + kc
    vmask = (vj < GH) & (k < GW)
    if D != DHP:
        vmask = vmask & (vd < D)
    vals = tl.load(vb + (vj * GW + k) * svn + vd, mask=vmask, other=0.0)
    return tl.dot(p.to(DOT), vals.to(DOT), input_precision=PREC)


@triton.jit
def _fact_bwd_rows_kernel(v_ptr, mu_ptr, sig_ptr, ll_ptr, tau_ptr, izx_ptr, dy_ptr, dmu_ptr, dsig_ptr, dll_ptr,
                          dtau_ptr, GH, GW, svb, svn, svh, smb, smi, smw, smh, smr, ssb, ssi, ssw, ssh, ssr,
                          slb, sli, slw, slh, slr, szb, szi, szw, szh, sdyb, sdyn, sdyh, sgb, sgi, sgw, sgh, sgr, stb,
                          sth, D: tl.constexpr, R: tl.constexpr, RP: tl.constexpr, T: tl.constexpr, WT: tl.constexpr,
                          KC: tl.constexpr, GHP: tl.constexpr, DHP: tl.constexpr, EVEN_K: tl.constexpr,
                          JS: tl.constexpr, DOT: tl.constexpr, PREC: tl.constexpr):
    """Factorized gradients of log λ, μx and σx for one (row tile, column tile) × (h, b), and the program's part of
    the gradient of τ (``dtau[b, h, program]``).

    ``G = dY · y1ᵀ`` per key chunk; with ``g = λ·G`` and ``dL/dl_k = ln2·P_k (g_k − Σ P g)`` the gradients need
    only running sums over keys of ``P·G``, ``P·G·e``, ``P·e``, ``P·G·e²``, ``P·e²`` (e = j* − key). The three
    gradients share the strides ``sg*`` over (b, i, w, h, r) (views of one buffer), μ and σ with their axis at +0, +1.
    """
    h, b, i0, w0, vb = _fact_tile(v_ptr, GW, svb, svh, T, WT)
    mb = mu_ptr + b * smb + h * smh
    sb = sig_ptr + b * ssb + h * ssh
    tau = tl.load(tau_ptr)

    # row-pass tile [T, WT, KC, RP] as in the forward kernel: the terms of a (query, atom) in one thread
    i = i0 + tl.arange(0, T)[:, None, None, None]
    w = w0 + tl.arange(0, WT)[None, :, None, None]
    kf = tl.arange(0, KC)[None, None, :, None].to(tl.float32)
    r = tl.arange(0, RP)[None, None, None, :]
    qmask = (i < GH) & (w < GW) & (r < R)
    mux = tl.load(mb + i * smi + w * smw + r * smr + 1, mask=qmask, other=0.0)
    sigx = tl.load(sb + i * ssi + w * ssw + r * ssr + 1, mask=qmask, other=1.0)
    wq = w.to(tl.float32)
    js, ca, cb, _ = _axis_terms(mux, sigx, tau, wq, GW)
    i3 = i0 + tl.arange(0, T)[:, None, None]
    w3 = w0 + tl.arange(0, WT)[None, :, None]
    yd = tl.arange(0, DHP)[None, None, :]
    dmask = (i3 < GH) & (w3 < GW)
    if D != DHP:
        dmask = dmask & (yd < D)
    dy = tl.load(dy_ptr + b * sdyb + h * sdyh + (i3 * GW + w3) * sdyn + yd, mask=dmask, other=0.0).to(DOT)

    # running sums over keys of P·G, P·G·e, P·e, P·G·e², P·e² per (query, atom), P unnormalised (1/Z_x at the end)
    s1 = tl.zeros((T, WT, 1, RP), dtype=tl.float32)
    s2 = tl.zeros((T, WT, 1, RP), dtype=tl.float32)
    s3 = tl.zeros((T, WT, 1, RP), dtype=tl.float32)
    s4 = tl.zeros((T, WT, 1, RP), dtype=tl.float32)
    s5 = tl.zeros((T, WT, 1, RP), dtype=tl.float32)
    for k0 in range(0, GW, KC):
        y1 = _fact_column_pass(vb, mb, sb, tau, k0, i0, GH, GW, svn, smi, smw, smr, ssi, ssw, ssr, D, R, RP, T, KC,
                               GHP, JS, DHP, DOT, PREC)
        y1 = tl.reshape(tl.permute(tl.reshape(y1, (KC, T, RP, DHP)), (1, 0, 2, 3)), (T, KC * RP, DHP))
        g = tl.dot(dy, tl.permute(y1.to(DOT), (0, 2, 1)), input_precision=PREC)  # [T, WT, KC·RP]
        e = (js - k0) - kf
        p = tl.exp2(e * (ca * e + cb))
        if not EVEN_K:
            p = tl.where(kf < GW - k0, p, 0.0)
        pg = p * tl.reshape(g, (T, WT, KC, RP))
        pe = p * e
        pge = pg * e
        s1 += tl.sum(pg, axis=2)[:, :, None, :]
        s2 += tl.sum(pge, axis=2)[:, :, None, :]
        s3 += tl.sum(pe, axis=2)[:, :, None, :]
        s4 += tl.sum(pge * e, axis=2)[:, :, None, :]
        s5 += tl.sum(pe * e, axis=2)[:, :, None, :]

    izx = tl.load(izx_ptr + b * szb + i * szi + w * szw + h * szh + r, mask=qmask, other=0.0)
    a1 = s1 * izx  # d/dλ
    a3 = s3 * izx
    a5 = s5 * izx
    ll = tl.load(ll_ptr + b * slb + h * slh + i * sli + w * slw + r * slr, mask=qmask, other=0.0)
    lam = _softmax_atoms(ll, r < R, 3)
    dca = LN2 * lam * (s4 * izx - a1 * a5)  # Σ_k dL/dl_k · e_k²
    dcb = LN2 * lam * (s2 * izx - a1 * a3)  # Σ_k dL/dl_k · e_k
    dmu, dsig, dtau = _raw_grads(dca, dcb, ca, cb, js, sigx, tau, wq, mux)
    go = b * sgb + h * sgh + i * sgi + w * sgw + r * sgr
    tl.store(dll_ptr + go, lam * (a1 - tl.sum(lam * a1, axis=3)[:, :, :, None]), mask=qmask)  # softmax backward
    tl.store(dmu_ptr + go + 1, dmu, mask=qmask)
    tl.store(dsig_ptr + go + 1, dsig, mask=qmask)
    tl.store(dtau_ptr + b * stb + h * sth + tl.program_id(0), tl.sum(tl.where(qmask, dtau, 0.0)))


@triton.jit
def _fact_dy1(mb, sb, ll_ptr, izx_ptr, dy_ptr, tau, b, h, i0, w0, kf, GH, GW, smi, smw, smr, ssi, ssw, ssr, slb,
              sli, slw, slh, slr, szb, szi, szw, szh, sdyb, sdyn, sdyh, D: tl.constexpr, R: tl.constexpr,
              RP: tl.constexpr, KT: tl.constexpr, IC: tl.constexpr, WC: tl.constexpr, DHP: tl.constexpr,
              DOT: tl.constexpr, PREC: tl.constexpr):
    """``Σ_w λ·P_x·dY/Z_x`` over query columns w0 … w0 + WC of rows i0 … i0 + IC for the KT keys ``kf``, as
    ``[IC, KT·RP, DHP]``: the row-pass weight tile is ``[KT, IC, RP, WC]`` with the terms of a (query, atom)
    built once and its KT keys within a thread."""
    iq = i0 + tl.arange(0, IC)[None, :, None, None]
    rq = tl.arange(0, RP)[None, None, :, None]
    wq = w0 + tl.arange(0, WC)[None, None, None, :]
    qmask = (iq < GH) & (wq < GW) & (rq < R)
    mux = tl.load(mb + iq * smi + wq * smw + rq * smr + 1, mask=qmask, other=0.0)
    sigx = tl.load(sb + iq * ssi + wq * ssw + rq * ssr + 1, mask=qmask, other=1.0)
    js, ca, cb, _ = _axis_terms(mux, sigx, tau, wq.to(tl.float32), GW)
    ll = tl.load(ll_ptr + b * slb + h * slh + iq * sli + wq * slw + rq * slr, mask=qmask, other=0.0)
    scale = tl.load(izx_ptr + b * szb + iq * szi + wq * szw + h * szh + rq, mask=qmask, other=0.0) * _softmax_atoms(
        ll, rq < R, 2)  # λ/Z_x, 0 on padding
    e = js - kf
    px = tl.exp2(e * (ca * e + cb)) * scale
    px = tl.reshape(tl.permute(px, (1, 0, 2, 3)), (IC, KT * RP, WC))
    di = i0 + tl.arange(0, IC)[:, None, None]
    dw = w0 + tl.arange(0, WC)[None, :, None]
    dd = tl.arange(0, DHP)[None, None, :]
    dmask = (di < GH) & (dw < GW)
    if D != DHP:
        dmask = dmask & (dd < D)
    dyv = tl.load(dy_ptr + b * sdyb + h * sdyh + (di * GW + dw) * sdyn + dd, mask=dmask, other=0.0)
    return tl.dot(px.to(DOT), dyv.to(DOT), input_precision=PREC)


@triton.jit
def _fact_bwd_cols_kernel(v_ptr, mu_ptr, sig_ptr, ll_ptr, tau_ptr, izx_ptr, dy_ptr, dv_ptr, dmu_ptr, dsig_ptr,
                          dtau_ptr, GH, GW, svb, svn, svh, smb, smi, smw, smh, smr, ssb, ssi, ssw, ssh, ssr,
                          slb, sli, slw, slh, slr, szb, szi, szw, szh, sdyb, sdyn, sdyh, sdvb, sdvn, sdvh,
                          sgb, sgi, sgw, sgh, sgr, stb, sth,
                          D: tl.constexpr, R: tl.constexpr, RP: tl.constexpr, KT: tl.constexpr, IC: tl.constexpr,
                          WC: tl.constexpr, W_CHUNKS: tl.constexpr, GHP: tl.constexpr, JS: tl.constexpr,
                          DHP: tl.constexpr, DOT: tl.constexpr, PREC: tl.constexpr):
    """Factorized dV and gradients of μy and σy; one program per (tile of KT key columns) × (h, b), the only writer
    of both, and of its part of the gradient of τ (``dtau[b, h, program]``).

    For each chunk of IC query rows: ``dy1 = Σ_w λ·P_x·dY/Z_x`` (:func:`_fact_dy1`), then the column-pass weights
    of tokens (i, k) over all key rows j give ``dV += Aᵀ·dy1`` and, from ``G = dy1 · vᵀ``, the softmax backward
    over j.
    """
    h = tl.program_id(1)  # heads and images on axes 1 and 2: the programs sharing a value slab run together
    b = tl.program_id(2).to(tl.int64)  # batch offsets may exceed 2**31 elements
    k0 = tl.program_id(0) * KT
    vb = v_ptr + b * svb + h * svh
    mb = mu_ptr + b * smb + h * smh
    sb = sig_ptr + b * ssb + h * ssh
    tau = tl.load(tau_ptr)

    # values of this column tile, [KT, GHP, DHP]
    vk = k0 + tl.arange(0, KT)[:, None, None]
    vj = tl.arange(0, GHP)[None, :, None]
    vd = tl.arange(0, DHP)[None, None, :]
    vmask = (vk < GW) & (vj < GH)
    if D != DHP:
        vmask = vmask & (vd < D)
    vals = tl.load(vb + (vj * GW + vk) * svn + vd, mask=vmask, other=0.0).to(DOT)
    dv = tl.zeros((KT, GHP, DHP), dtype=tl.float32)

    kf = (k0 + tl.arange(0, KT)[:, None, None, None]).to(tl.float32)  # the keys of the row-pass weights
    # column-pass tokens [KT, IC·RP]: (i0 + m // RP, k0 + kt), atom m % RP
    mc = tl.arange(0, IC * RP)[None, :]
    kc = k0 + tl.arange(0, KT)[:, None]
    dtau = tl.zeros((KT, IC * RP), dtype=tl.float32)

    for i0 in range(0, GH, IC):
        if not W_CHUNKS:  # one chunk of query columns: no inner loop
            dy1 = _fact_dy1(mb, sb, ll_ptr, izx_ptr, dy_ptr, tau, b, h, i0, 0, kf, GH, GW, smi, smw, smr, ssi, ssw, ssr,
                            slb, sli, slw, slh, slr, szb, szi, szw, szh, sdyb, sdyn, sdyh, D, R, RP, KT, IC, WC, DHP,
                            DOT, PREC)
        else:
            dy1 = tl.zeros((IC, KT * RP, DHP), dtype=tl.float32)
            for w0 in range(0, GW, WC):
                dy1 += _fact_dy1(mb, sb, ll_ptr, izx_ptr, dy_ptr, tau, b, h, i0, w0, kf, GH, GW, smi, smw, smr, ssi,
                                 ssw, ssr, slb, sli, slw, slh, slr, szb, szi, szw, szh, sdyb, sdyn, sdyh, D, R, RP, KT,
                                 IC, WC, DHP, DOT, PREC)
        dy1 = tl.reshape(tl.permute(tl.reshape(dy1, (IC, KT, RP, DHP)), (1, 0, 2, 3)), (KT, IC * RP, DHP)).to(DOT)

        py, ey, _, (muy, sigy) = _fact_column_weights(mb, sb, tau, k0, i0, GH, GW, smi, smw, smr, ssi, ssw, ssr, R, RP,
                                                      IC, KT, GHP, JS)
        pe = py * ey
        m1 = tl.sum(pe, axis=0)  # Σ_j P·e and Σ_j P·e², in the weights' own layout
        m2 = tl.sum(pe * ey, axis=0)
        g = tl.dot(dy1, tl.permute(vals, (0, 2, 1)), input_precision=PREC)  # [KT, IC·RP, GHP]
        dv = tl.dot(tl.permute(py, (1, 0, 2)).to(DOT), dy1, dv, input_precision=PREC)

        pg = py * tl.permute(g, (2, 0, 1))
        pge = pg * ey
        s = tl.sum(pg, axis=0)
        dcb = LN2 * (tl.sum(pge, axis=0) - s * m1)  # Σ_j dL/dl_j · e_j
        dca = LN2 * (tl.sum(pge * ey, axis=0) - s * m2)  # Σ_j dL/dl_j · e_j²
        # the y terms of these tokens in the gradients' layout [KT, IC·RP], μy and σy from the weights' load
        ic = i0 + mc // RP
        rc = mc % RP
        tok = (ic < GH) & (kc < GW) & (rc < R)
        iq = ic.to(tl.float32)
        js, ca, cb, _ = _axis_terms(muy, sigy, tau, iq, GH)
        dmu, dsig, dt = _raw_grads(dca, dcb, ca, cb, js, sigy, tau, iq, muy)
        go = b * sgb + h * sgh + ic * sgi + kc * sgw + rc * sgr
        tl.store(dmu_ptr + go, dmu, mask=tok)
        tl.store(dsig_ptr + go, dsig, mask=tok)
        dtau += tl.where(tok, dt, 0.0)

    tl.store(dv_ptr + b * sdvb + (vj * GW + vk) * sdvn + h * sdvh + vd, dv.to(dv_ptr.dtype.element_ty), mask=vmask)
    tl.store(dtau_ptr + b * stb + h * sth + tl.program_id(0), tl.sum(dtau))


# fmt: on
