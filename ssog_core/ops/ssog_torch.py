"""Fast PyTorch SSOG operator: the CPU path, and the fallback wherever the Triton kernels cannot run.

Same operator as :func:`ssog_core.field.apply_field` (docs/DESIGN.md §1), rearranged for speed:

* every contraction is a batched matrix product with the atoms folded into an M or K dimension — the column
  pass multiplies ``[(r, i), j] @ [j, d]`` per key column, the row pass ``[w, (r, k)] @ [(r, k), d]`` per query
  row with λ folded into the row kernel — so there are no 6-D einsum permute copies; v is transposed once on
  the way in and the output once on the way out;
* factorized kernels use the reparametrisation of docs/DESIGN.md §1.6: ``softmax_j(ℓ/τ)`` is
  ``2^(−c((x − j)² − (x − j*)²)) / Z`` with ``c = log2(e)/(2σ²τ)``, ``x = query − μ`` and the analytic argmax
  ``j* = clamp(round(x))``, so every weight is ≤ 1, the peak is exactly 1 and no max pass is needed;
* a shared (fixed) field's kernels are computed once per head by :func:`ssog_core.field.axis_kernels`
  and reused across the batch;
* per-query kernels and the per-atom intermediate are built for one chunk of query rows at a time,
  bounded by :data:`CHUNK_ELEMENTS` (:data:`CUDA_CHUNK_ELEMENTS` on a GPU), never for the whole input at once.

Gradients: a steered factorized field trains through :class:`_SteeredFactorized`, one autograd node with an
analytic backward (the softmax-of-a-quadratic gradient needs two moments of ``kernel ⊙ grad`` per atom), instead
of a graph of ~30 broadcast ops per layer whose fresh full-size buffers dominated small models' training steps;
the other paths use PyTorch autograd through their ops. Without autograd the kernels are built in place, the steered
factorized ones with the keys outermost (:func:`_kernel`).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from ssog_core.field import Field, FieldMode, axis_kernels, check_grid, exp2_log_weight, exp2_rate

LN2 = math.log(2.0)
CHUNK_ELEMENTS = 1 << 21  # per-chunk bound on kernel and intermediate elements on the CPU (8 MiB in fp32)
CUDA_CHUNK_ELEMENTS = 1 << 27  # on a GPU, memory rather than cache bounds the chunk (512 MiB in fp32)
ONE_BMM_ROW_PASS = 32  # from this many (image, head) pairs per chunk the CPU row pass is one bmm (see _row_pass)


def apply_torch(v: Tensor, field: Field, grid: tuple[int, int], mode: FieldMode = "factorized") -> Tensor:
    """``apply_field`` semantics: values ``(B, N, H, D)`` → ``(B, N, H, D)``."""
    check_grid(v.shape[1], grid)
    if mode not in ("factorized", "axial"):
        raise ValueError(f"unknown field mode {mode!r}; expected 'factorized' or 'axial'")
    if field.per_token:
        return _apply_steered(v, field, grid, mode)
    return _apply_fixed(v, field, grid, mode)


def _needs_grad(v: Tensor, field: Field) -> bool:
    tensors = (v, field.mu, field.sigma, field.log_lam, field.tau)
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def _budget(t: Tensor) -> int:
    return CUDA_CHUNK_ELEMENTS if t.is_cuda else CHUNK_ELEMENTS


def _row_chunks(n_rows: int, per_row: int, budget: int) -> list[slice]:
    step = max(1, min(n_rows, budget // max(per_row, 1)))
    return [slice(i, min(i + step, n_rows)) for i in range(0, n_rows, step)]


def _apply_fixed(v: Tensor, field: Field, grid: tuple[int, int], mode: FieldMode) -> Tensor:
    """Shared field: ``y_h = Σ_r λ_r · Ay_r · V · Ax_rᵀ`` as two GEMMs per head, batch folded into N."""
    b, n, h, d = v.shape
    gh, gw = grid
    k = axis_kernels(field, grid, mode)
    r = k.ay.shape[-2]
    # column pass kernel, M = (i, r): (H, Gh·R, Gh)
    ay = k.ay[0, :, 0].permute(1, 0, 2, 3).reshape(h, gh * r, gh).to(v.dtype)
    # row pass kernel with λ folded in, K = (r, k): (H, 1, Gw, R·Gw)
    ax = (k.ax[0, 0] * k.lam[0, 0, 0, :, :, None]).permute(1, 0, 2, 3).reshape(h, 1, gw, r * gw).to(v.dtype)
    vt = v.reshape(b, gh, gw, h, d).permute(3, 1, 2, 0, 4).reshape(h, gh, gw * b * d)  # (H, j, (k, b, d))
    out = []
    for rows in _row_chunks(gh, h * r * gw * b * d, _budget(v)):
        y1 = torch.bmm(ay[:, rows.start * r : rows.stop * r], vt)  # (H, (i, r), (k, b, d))
        y1 = y1.view(h, rows.stop - rows.start, r * gw, b * d)  # K = (r, k) is contiguous per (h, i)
        out.append(torch.matmul(ax, y1))  # (H, i, w, b·d)
    y = out[0] if len(out) == 1 else torch.cat(out, dim=1)
    return y.view(h, gh, gw, b, d).permute(3, 1, 2, 0, 4).reshape(b, n, h, d)


class _Terms(NamedTuple):
    """Per-token kernel parameters in the two pass layouts: ``x = query − μ`` (where the atom looks) and
    ``c = log2(e)/(2σ²τ)`` as ``(B, H, k, R, i)`` for the column pass (row axis y) and ``(B, H, i, w, R)`` for the
    row pass (column axis x); ``lam`` (λ, normalised) in the row-pass layout."""

    x_col: Tensor
    c_col: Tensor
    x_row: Tensor
    c_row: Tensor
    lam: Tensor


_TERM_LAYOUTS = {  # column-pass x, c; row-pass x, c; λ: permutations of (B, Gh, Gw, H, R) and of λ's (B, H, R, i, w)
    "keys_last": ((0, 3, 2, 4, 1), (0, 3, 1, 2, 4), (0, 1, 3, 4, 2)),  # the _Terms layouts (_SteeredFactorized)
    "per_image": ((0, 3, 2, 4, 1), (4, 0, 3, 1, 2), (2, 0, 1, 3, 4)),  # (B, H, k, R, i), (R, B, H, i, w)
    "one_bmm": ((0, 3, 2, 1, 4), (4, 0, 3, 1, 2), (2, 0, 1, 3, 4)),  # (B, H, k, i, R), (R, B, H, i, w)
}


def _field_terms(field: Field, b: int, grid: tuple[int, int], layout: str = "keys_last") -> _Terms:
    """:class:`_Terms` of a per-token factorized field (no autograd: :class:`_SteeredFactorized` differentiates it),
    in the layout ``layout`` of :data:`_TERM_LAYOUTS`: ``"keys_last"`` as :class:`_Terms` says, the other two the
    layouts :func:`_apply_steered` builds its keys-outermost kernels from (atoms outermost for the row pass; for
    the one-bmm row pass, query rows before atoms in the column pass).

    λ's softmax runs with the atoms on an outer axis (tokens innermost): over a short last axis of atoms PyTorch's CPU
    softmax is much slower.
    """
    gh, gw = grid
    h, r = field.num_heads, field.num_atoms
    dev, dt = field.mu.device, field.mu.dtype
    rows, cols = torch.arange(gh, device=dev, dtype=dt), torch.arange(gw, device=dev, dtype=dt)
    pos = torch.stack(torch.meshgrid(rows, cols, indexing="ij"), dim=-1)[:, :, None, None]  # (Gh, Gw, 1, 1, 2)
    x = (pos - field.mu).expand(b, gh, gw, h, r, 2)
    c = exp2_rate(field.sigma, field.tau).expand(b, gh, gw, h, r, 2)
    lam = torch.softmax(field.log_lam.expand(b, gh, gw, h, r).permute(0, 3, 4, 1, 2), dim=2)  # (B, H, R, i, w)
    col, row, lam_perm = _TERM_LAYOUTS[layout]
    return _Terms(
        x[..., 0].permute(col).contiguous(),
        c[..., 0].permute(col).contiguous(),
        x[..., 1].permute(row).contiguous(),
        c[..., 1].permute(row).contiguous(),
        lam.permute(lam_perm).contiguous(),
    )


def _kernel(x: Tensor, c: Tensor, keys: Tensor, scale: Tensor | None, dim: int = -1, inplace: bool = True) -> Tensor:
    """Normalised factorized weights ``2^(c·(x − j*)² − c·(x − key)²) · scale / Z`` for per-token ``x``, ``c`` (and
    ``scale``), which have size 1 on the key axis ``dim``, and ``keys`` shaped to broadcast along it; never
    recorded by autograd. Built in place, except inside :class:`_SteeredFactorized` (``inplace=False``): an in-place
    operation in an ``autograd.Function.forward`` can misroute gradients under ``torch.compile``
    (pytorch/pytorch#180642).

    ``exp2`` rather than ``exp``: PyTorch's CPU ``exp`` takes a much slower path for arguments below −87,
    which far-away keys of narrow atoms always produce; the analytic max ``j* = clamp(round(x))`` makes every
    weight ≤ 1 with peak 1 without a max pass. The per-query operand comes first in every broadcast
    (TensorIterator picks a slow loop order when a broadcast operand leads).

    Keys last (``_SteeredFactorized``): ``Z`` is a matrix-vector product, on the CPU faster than ``sum(-1)``
    over a short key axis. Keys outermost (the evaluation path): every elementwise pass runs over long
    contiguous vectors with one scalar key per run (half the time of the keys-last layout, whose runs are only
    ``Gh`` or ``Gw`` long), ``Z`` is a sum over an outer axis, and the bmms read the kernels as column-major
    matrices without a copy.
    """
    n = keys.numel()
    shift = c * (x - torch.round(x).clamp(0, n - 1)).square()  # per token: small
    if inplace:
        w = torch.sub(x, keys).square_()
        w = torch.addcmul(shift, w, c, value=-1.0, out=w).exp2_()  # one pass for −c·d² + shift
    else:
        w = torch.addcmul(shift, torch.sub(x, keys).square(), c, value=-1.0).exp2()
    if dim % w.dim() == w.dim() - 1:
        z = torch.mv(w.view(-1, n), torch.ones_like(keys)).view(x.shape)
    else:
        z = w.sum(dim, keepdim=True)
    norm = z.reciprocal() if scale is None else scale / z
    return w.mul_(norm) if inplace else w * norm


def _kernel_grad(
    w: Tensor, g: Tensor, x: Tensor, c: Tensor, keys: Tensor, lam: Tensor | None
) -> tuple[Tensor, Tensor, Tensor]:
    """Gradients ``(∂L/∂x, ∂L/∂c)`` of a :func:`_kernel` ``w`` (normalised, times ``lam`` if given), and
    ``P = Σ_key w ⊙ g`` (``λ·∂L/∂λ`` for the λ-scaled kernel). ``g`` (∂L/∂w) is overwritten; ``w`` is a saved
    tensor and stays intact (``retain_graph`` and gradcheck run the backward more than once).

    With ``s = w ⊙ g − a·P`` (``a = w/λ`` the normalised kernel), the softmax-of-a-quadratic gradient is
    ``∂L/∂x = −2·ln2·c·Σ s·(x − key)`` and ``∂L/∂c = −ln2·Σ s·(x − key)²``: eight passes over the kernel instead of
    the ~12 full-size autograd buffers of the elementwise graph. The moments are taken about the query's own ``x``
    (not as key moments recombined afterwards), so nothing cancels: fp32 gradients stay as exact as autograd's.
    """
    n = keys.shape[0]
    ones = torch.ones_like(keys)
    s = g.mul_(w)
    p_sum = torch.mv(s.view(-1, n), ones).view(x.shape)
    coef = p_sum if lam is None else p_sum / lam.clamp_min(torch.finfo(lam.dtype).tiny)
    s.addcmul_(w, coef[..., None], value=-1.0)
    dist = torch.sub(x[..., None], keys)
    m1 = torch.mv(s.mul_(dist).view(-1, n), ones).view(x.shape)
    m2 = torch.mv(s.mul_(dist).view(-1, n), ones).view(x.shape)
    return m1.mul_(c).mul_(-2.0 * LN2), m2.mul_(-LN2), p_sum


def _factorized_passes(vt: Tensor, a: Tensor, u: Tensor) -> tuple[Tensor, Tensor]:
    """Both passes with one bmm each: values ``vt`` ``(B, H, k, j, D)``, column kernel ``a`` ``(B, H, k, R, i, j)``,
    row kernel ``u`` ``(B, H, i, w, R, k)`` → ``y1`` as ``(B, H, i, R, k, D)`` (kept for the backward pass) and
    ``y`` ``(B, H, i, w, D)``."""
    b, h, gw, gh, d = vt.shape
    r = a.shape[3]
    y1 = torch.bmm(a.reshape(b * h * gw, r * gh, gh), vt.view(b * h * gw, gh, d))
    y1t = y1.view(b, h, gw, r, gh, d).permute(0, 1, 4, 3, 2, 5).contiguous()
    y = torch.bmm(u.reshape(b * h * gh, gw, r * gw), y1t.view(b * h * gh, r * gw, d))
    return y1t, y.view(b, h, gh, gw, d)


class _SteeredFactorized(torch.autograd.Function):
    """The steered factorized operator as one autograd node: ``(v, μ, σ, log λ, τ)`` of a per-token field → ``y``.

    The kernel parameters (:func:`_field_terms`), both kernels and both passes run without autograd; the backward
    pass is analytic (:func:`_kernel_grad`, then the chain rule through ``x = query − μ``, ``c = log2(e)/(2σ²τ)``
    and λ's softmax). Saved: the values, both kernels, ``y1`` and the terms.
    """

    @staticmethod
    def forward(
        ctx, v: Tensor, mu: Tensor, sigma: Tensor, log_lam: Tensor, tau: Tensor, grid: tuple[int, int]
    ) -> Tensor:
        b, n, h, d = v.shape
        gh, gw = grid
        t = _field_terms(Field(mu, sigma, log_lam, tau), b, grid)
        ky = torch.arange(gh, device=v.device, dtype=mu.dtype)
        kx = torch.arange(gw, device=v.device, dtype=mu.dtype)
        a = _kernel(t.x_col[..., None], t.c_col[..., None], ky, None, inplace=False)
        u = _kernel(t.x_row[..., None], t.c_row[..., None], kx, t.lam[..., None], inplace=False)
        vt = v.reshape(b, gh, gw, h, d).permute(0, 3, 2, 1, 4).contiguous()  # (B, H, k, j, D)
        y1t, y = _factorized_passes(vt, a.to(v.dtype), u.to(v.dtype))
        ctx.save_for_backward(vt, a, u, y1t, sigma, tau, *t)
        return y.permute(0, 2, 3, 1, 4).reshape(b, n, h, d)

    @staticmethod
    @once_differentiable
    def backward(ctx, dout: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, None]:
        vt, a, u, y1t, sigma, tau, *terms = ctx.saved_tensors
        t = _Terms(*terms)
        b, h, gw, gh, d = vt.shape
        r = a.shape[3]
        vdt, pdt = vt.dtype, a.dtype
        bhi, bhk = b * h * gh, b * h * gw
        dy = dout.reshape(b, gh, gw, h, d).permute(0, 3, 1, 2, 4).to(vdt).contiguous().view(bhi, gw, d)
        du = torch.bmm(dy, y1t.view(bhi, r * gw, d).transpose(1, 2))  # (B·H·i, w, (r, k))
        dy1 = torch.bmm(u.to(vdt).view(bhi, gw, r * gw).transpose(1, 2), dy)  # (B·H·i, (r, k), D)
        dy1 = dy1.view(b, h, gh, r, gw, d).permute(0, 1, 4, 3, 2, 5).contiguous().view(bhk, r * gh, d)
        da = torch.bmm(dy1, vt.view(bhk, gh, d).transpose(1, 2))  # (B·H·k, (r, i), j)
        dvt = torch.bmm(a.to(vdt).view(bhk, r * gh, gh).transpose(1, 2), dy1)  # (B·H·k, j, D)
        dv = dvt.view(b, h, gw, gh, d).permute(0, 3, 2, 1, 4).reshape(b, gh * gw, h, d)
        ky = torch.arange(gh, device=vt.device, dtype=pdt)
        kx = torch.arange(gw, device=vt.device, dtype=pdt)
        dx_col, dc_col, _ = _kernel_grad(a, da.view(a.shape).to(pdt), t.x_col, t.c_col, ky, None)
        dx_row, dc_row, p_sum = _kernel_grad(u, du.view(u.shape).to(pdt), t.x_row, t.c_row, kx, t.lam)
        # back to the field's layout (B, Gh, Gw, H, R[, 2]): x = query − μ, c = log2(e)/(2σ²τ), λ = softmax(log λ)
        col, row = (0, 4, 2, 1, 3), (0, 2, 3, 1, 4)
        dmu = torch.stack([dx_col.permute(col), dx_row.permute(row)], dim=-1).neg_()
        q_col, q_row = dc_col.mul_(t.c_col), dc_row.mul_(t.c_row)  # c·∂L/∂c: ∂c/∂σ = −2c/σ, ∂c/∂τ = −c/τ
        dsigma = torch.stack([q_col.permute(col), q_row.permute(row)], dim=-1).mul_(-2.0).div_(sigma)
        dtau = (q_col.sum(dtype=torch.float64) + q_row.sum(dtype=torch.float64)).to(pdt).neg_()  # one sum of all
        dtau = dtau.div_(tau).reshape(tau.shape)  # tokens: accumulated in float64
        dlog_lam = (p_sum - t.lam * p_sum.sum(-1, keepdim=True)).permute(row)
        return dv, dmu, dsigma, dlog_lam, dtau, None


def _apply_steered(v: Tensor, field: Field, grid: tuple[int, int], mode: FieldMode) -> Tensor:
    """Per-token field. With autograd, a factorized field is one :class:`_SteeredFactorized` node over the whole
    input (autograd would keep every chunk's kernels anyway). Otherwise chunked over query rows (and over the
    batch when all rows of one image fit a chunk).

    Per chunk of query rows ``I``: the column pass builds ``A[b, h, k, r, i, j]`` for the tokens
    ``(i ∈ I, k)`` and runs one bmm ``[(r, i), j] @ [j, d]`` per key column (``y1`` comes out as
    ``(b, h, k, r, i, d)``); the row pass builds ``U[b, h, i, w, r, k]`` (λ folded in) and contracts ``(r, k)``
    per query row (:func:`_row_pass`). Factorized kernels are stored keys outermost and read as strided views.
    """
    b, n, h, d = v.shape
    gh, gw = grid
    r = field.num_atoms
    ro = r if mode == "factorized" else 1  # atoms left in the contractions (axial mixes them inside each axis)
    inplace = not _needs_grad(v, field)
    per_row = h * gw * r * (gh + gw + 2 * d)  # kernel + y1 elements per query row and image
    b_step = max(1, _budget(v) // (gh * per_row))
    # see _row_pass; decided once, as the factorized kernels' layout follows it
    one_bmm = v.is_cuda or torch.compiler.is_compiling() or min(b, b_step) * h >= ONE_BMM_ROW_PASS
    dev, pdt, vdt = v.device, field.mu.dtype, v.dtype
    if mode == "factorized":
        if not inplace:
            return _SteeredFactorized.apply(v, field.mu, field.sigma, field.log_lam, field.tau, grid)
        t = _field_terms(field, b, grid, "one_bmm" if one_bmm else "per_image")
    else:
        col_t, row_t, col_m, row_m = _axial_terms(field, b, grid)
        itau = 1.0 / field.tau
    ky = torch.arange(gh, device=dev, dtype=pdt)
    kx = torch.arange(gw, device=dev, dtype=pdt)
    vt = v.reshape(b, gh, gw, h, d).permute(0, 3, 2, 1, 4).contiguous()  # (B, H, k, j, D)
    out = []
    for b0 in range(0, b, b_step):
        bs = slice(b0, min(b0 + b_step, b))
        nb = bs.stop - bs.start
        for rows in _row_chunks(gh, nb * per_row, _budget(v)):
            ni = rows.stop - rows.start
            # column pass: A[b, h, k, (r, i), j] for tokens (i ∈ rows, k), keys j; (i, r) for the one-bmm row pass
            if mode == "factorized":  # stored as (j, b, h, k, r, i) or (j, b, h, k, i, r): keys outermost
                at = (bs, slice(None), slice(None)) + ((rows,) if one_bmm else (slice(None), rows))  # rows of i
                xc, cc = t.x_col[at][None], t.c_col[at][None]
                a = _kernel(xc, cc, ky.view(gh, 1, 1, 1, 1, 1), None, 0).permute(1, 2, 3, 4, 5, 0)
            else:
                tc = col_t[bs, :, :, rows]
                a = _axial_weights(tc[..., 0], tc[..., 1], tc[..., 2], col_m[bs, :, :, rows], itau, ky, inplace)
            y1 = torch.bmm(a.to(vdt).reshape(nb * h * gw, ro * ni, gh), vt[bs].reshape(nb * h * gw, gh, d))
            # row pass: U[b, h, i, w, r, k] for queries (i ∈ rows, w), keys k, λ folded in
            if mode == "factorized":  # stored as (k, r, b, h, i, w): _row_pass reads U as (w, (k, r))
                xr, cr, lam = (z[None, :, bs, :, rows] for z in (t.x_row, t.c_row, t.lam))
                u = _kernel(xr, cr, kx.view(gw, 1, 1, 1, 1, 1), lam, 0)
                u = u.to(vdt).permute(2, 3, 4, 5, 1, 0)
            else:
                tr = row_t[bs, :, rows]
                u = _axial_weights(tr[..., 0], tr[..., 1], tr[..., 2], row_m[bs, :, rows], itau, kx, inplace)
                u = u.to(vdt).view(nb, h, ni, gw, ro, gw)
            y1 = y1.view((nb, h, gw, ni, ro, d) if one_bmm else (nb, h, gw, ro, ni, d))
            out.append(_row_pass(u, y1, inplace, one_bmm))
    if len(out) > 1:  # chunks are ordered batch-major, rows within a batch chunk
        n_row_chunks = len(out) // len(range(0, b, b_step))
        out = [torch.cat(out[i : i + n_row_chunks], dim=2) for i in range(0, len(out), n_row_chunks)]
    y = out[0] if len(out) == 1 else torch.cat(out, dim=0)
    return y.permute(0, 2, 3, 1, 4).reshape(b, n, h, d)


def _row_pass(u: Tensor, y1: Tensor, inplace: bool, single: bool) -> Tensor:
    """``y[b, h, i, w] = Σ_{r, k} U[b, h, i, w, r, k] · y1[b, h, k, r, i]``, U ``(B, H, I, Gw, R, Gw)`` in any
    strides (read as ``(w, (k, r))``: the factorized kernels are built in that order, axial ones have one atom),
    y1 ``(B, H, Gw, I, R, D)`` if ``single``, else ``(B, H, Gw, R, I, D)`` → ``(B, H, I, Gw, D)``.

    ``single`` (a GPU, a compiled graph, or at least :data:`ONE_BMM_ROW_PASS` (image, head) pairs on the CPU):
    transpose y1 to ``(i, (k, r), d)`` — runs of ``R·D`` elements, twice as fast as the ``D``-element runs of an
    ``(r, i)`` layout — and run one bmm: few large operations instead of one small bmm per (image, head).
    Otherwise (the CPU, few images) y1 is read in place and one strided bmm
    runs per (image, head). Skipping the copy of y1 (R× the size of v, a fresh allocation per layer) pays on 1
    and 2 threads alike (benchmarks/RESULTS.md).
    """
    nb, h, ni, gw, r, _ = u.shape
    d = y1.shape[-1]
    uk = u.transpose(-1, -2)  # (B, H, I, w, k, r)
    if single:
        y1t = y1.permute(0, 1, 3, 2, 4, 5).reshape(nb * h * ni, gw * r, d)
        return torch.bmm(uk.reshape(nb * h * ni, gw, gw * r), y1t).view(nb, h, ni, gw, d)
    us = uk.reshape(nb * h, ni, gw, gw * r).unbind(0)
    ys = y1.view(nb * h, gw * r, ni, d).transpose(1, 2).unbind(0)  # each (I, (k, r), D), read in place
    if not inplace:
        return torch.stack([torch.bmm(a, b) for a, b in zip(us, ys, strict=True)]).view(nb, h, ni, gw, d)
    y = torch.empty(nb, h, ni, gw, d, dtype=u.dtype, device=u.device)
    for a, b, out in zip(us, ys, y.view(nb * h, ni, gw, d).unbind(0), strict=True):
        torch.bmm(a, b, out=out)
    return y


def _axial_terms(field: Field, b: int, grid: tuple[int, int]) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Per-token axial terms in log2 units: ``(x, b, β)`` per atom with ``x = query − μ``, ``b = log2(e)/(2σ²)``,
    ``β = log2(e)·(log λ − log σ)``, as ``(B, H, k, i, R, 3)`` (column pass, row axis y) and ``(B, H, i, w, R, 3)``
    (row pass, column axis x); and the analytic peak bound ``m = max_r(β_r − b_r δ_r²) ≤ max_key ℓ(key)``
    (``δ = x − clamp(round(x))``) as ``(B, H, k, i)`` and ``(B, H, i, w)``."""
    gh, gw = grid
    h, r = field.num_heads, field.num_atoms
    mu = field.mu.expand(b, gh, gw, h, r, 2)
    dev, dt = mu.device, mu.dtype
    rows, cols = torch.arange(gh, device=dev, dtype=dt), torch.arange(gw, device=dev, dtype=dt)
    pos = torch.stack(torch.meshgrid(rows, cols, indexing="ij"), dim=-1)[:, :, None, None]  # (Gh, Gw, 1, 1, 2)
    x = pos - mu
    bb, beta = exp2_rate(field.sigma), exp2_log_weight(field.sigma, field.log_lam)
    with torch.no_grad():  # the bound cancels in the normalisation: no gradient needed
        peak = torch.stack([x[..., 0].round().clamp_(0, gh - 1), x[..., 1].round().clamp_(0, gw - 1)], dim=-1)
        delta = x - peak  # no per-call host → device tensor (CUDA-graph capture)
        m = (beta - bb * delta.square()).amax(dim=-2)  # (B, Gh, Gw, H, 2)
    terms = torch.stack(torch.broadcast_tensors(x, bb, beta), dim=-1)  # (B, Gh, Gw, H, R, 2, 3)
    col = terms[..., 0, :].permute(0, 3, 2, 1, 4, 5).contiguous()
    row = terms[..., 1, :].permute(0, 3, 1, 2, 4, 5).contiguous()
    return col, row, m[..., 0].permute(0, 3, 2, 1).contiguous(), m[..., 1].permute(0, 3, 1, 2).contiguous()


def _axial_weights(x: Tensor, bb: Tensor, beta: Tensor, m: Tensor, itau: Tensor, keys: Tensor, inplace: bool) -> Tensor:
    """Axial per-query kernel ``softmax_key(ℓ(key)/τ)``, ``ℓ = log Σ_r λ_r N(q − key; μ_r, σ_r)``, atoms on the last
    axis of ``x``/``bb``/``beta`` and mixed away; keys on a new last axis.

    In log2 units with ``exp2`` (PyTorch's CPU ``exp`` is slow far below zero): the mixture is a logsumexp over
    atoms, then ``2^((ℓ − m)/τ)`` with the analytic bound ``m`` (so the peak weight is ≥ 1 and nothing overflows).
    """
    if inplace:
        t = torch.sub(x[..., None], keys, out=torch.empty(*x.shape, keys.shape[-1], dtype=x.dtype, device=x.device))
        t.square_().mul_(-bb[..., None]).add_(beta[..., None])  # log2 of each atom's term
        mx = t.amax(dim=-2, keepdim=True)
        lg = t.sub_(mx).exp2_().sum(-2).log2_().add_(mx.squeeze(-2))
        p = lg.sub_(m[..., None]).mul_(itau).exp2_()
        return p.mul_(p.sum(-1, keepdim=True).reciprocal_())
    t = beta[..., None] - bb[..., None] * (x[..., None] - keys).square()
    mx = t.amax(dim=-2, keepdim=True).detach()  # any shift gives logsumexp its exact value and gradient
    lg = (t - mx).exp2().sum(-2).log2() + mx.squeeze(-2)
    p = ((lg - m[..., None]) * itau).exp2()
    return p / p.sum(-1, keepdim=True)
