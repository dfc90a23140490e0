"""The fused Triton SSOG operator as ``torch.library`` custom ops (``torch.compile``-safe).

Ops (all take and return plain tensors; the field is first turned into per-token kernel parameters):

* ``ssog::steered_fwd(v, prm, axial) -> (y, inv_zx)`` — per-token field; ``inv_zx`` (1/Z of the column-axis
  kernels, fp32) is saved for the backward pass and has no gradient;
* ``ssog::fixed_fwd(v, prm, taby, tabx, axial) -> y`` — shared field: the forward kernel loads the per-head
  kernels ``taby``/``tabx`` (from :func:`ssog_core.field.axis_kernels`); the backward pass runs the steered
  backward kernels on ``prm`` broadcast with zero strides, so gradients reach the field through ``prm``;
* ``ssog::bwd(dy, v, prm, inv_zx, axial) -> (dv, dprm)`` — both backward kernels.

Gradients flow to ``v`` and ``prm``; PyTorch autograd carries them on to μ, σ, λ, τ and the steering heads.
The kernels need CUDA tensors, or CPU tensors with ``TRITON_INTERPRET=1`` set before this module is imported.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from torch.utils.flop_counter import register_flop_formula

from ssog_core.field import Field, FieldMode, axis_kernels, check_grid, exp2_log_weight, exp2_rate
from ssog_core.ops import ssog_triton_axial as KA
from ssog_core.ops import ssog_triton_factorized as KF
from ssog_core.ops.env import interpreting
from ssog_core.ops.triton_tiles import FACTORIZED_STAGES, NUM_WARPS, col_tiles, p2, row_split, tiles

triton = KA.triton

FACTORIZED_FIELDS = 7  # j*, ca, cb of the rows (y), the same of the columns (x), λ
AXIAL_FIELDS = 8  # μy, μx, by, bx, βy, βx, 1/τ (rows), 1/τ (columns)


def kernel_params(field: Field, mode: FieldMode, grid: tuple[int, int]) -> Tensor:
    """The per-token kernel parameters the Triton kernels read, fp32, ``(B or 1, Gh or 1, Gw or 1, H, R, F)`` —
    broadcast to ``(B, Gh, Gw, H, R, F)`` by the launcher (module docstring of
    :mod:`ssog_core.ops.ssog_triton_factorized` and :mod:`ssog_core.ops.ssog_triton_axial` for the fields);
    differentiable w.r.t. the field.

    Factorized: the kernels' per-(token, atom) terms ``(j*, ca, cb)`` of each axis are built here once, so that no
    kernel rebuilds them per weight or per program: ``j* = clamp(round(q − μ), 0, G − 1)`` (the analytic argmax,
    no gradient), ``ca = −c`` and ``cb = −2c·(q − μ − j*)``; a shared field gives them per grid cell (they depend
    on the query position), the same for every image."""
    mu, sigma = field.mu.float(), field.sigma.float()
    tau = field.tau.float()
    if mode == "factorized":
        c = exp2_rate(sigma, tau)
        lam = torch.softmax(field.log_lam.float(), dim=-1)
        if not field.per_token:
            mu, c, lam = mu[None, None, None], c[None, None, None], lam[None, None, None]
        terms = []
        for axis, n in enumerate(grid):
            q = torch.arange(n, device=mu.device, dtype=torch.float32).view((n, 1, 1, 1) if axis == 0 else (n, 1, 1))
            x = q - mu[..., axis]
            js = torch.clamp(torch.floor(x.detach() + 0.5), 0.0, n - 1.0)
            terms += [js, -c[..., axis], -2.0 * c[..., axis] * (x - js)]
        shape = torch.broadcast_shapes(*(t.shape for t in terms))
        return torch.stack([t.expand(shape) for t in (*terms, lam)], dim=-1)
    b, beta = exp2_rate(sigma), exp2_log_weight(sigma, field.log_lam.float())
    itau = (1.0 / tau).expand_as(mu[..., 0])
    prm = torch.stack([mu[..., 0], mu[..., 1], b[..., 0], b[..., 1], beta[..., 0], beta[..., 1], itau, itau], dim=-1)
    return prm if field.per_token else prm[None, None, None]


def _config(gh: int, gw: int, d: int, r: int, axial: bool, dtype: torch.dtype) -> dict:
    """Tile sizes (:func:`ssog_core.ops.triton_tiles.tiles`) and dot settings for one problem shape."""
    if interpreting():
        dot, prec = KA.tl.float32, "ieee"  # bf16 tl.dot is wrong in the interpreter (triton#11584)
    elif dtype in (torch.bfloat16, torch.float16):
        dot, prec = (KA.tl.bfloat16 if dtype == torch.bfloat16 else KA.tl.float16), "ieee"
    else:
        dot, prec = KA.tl.float32, ("ieee" if torch.get_float32_matmul_precision() == "highest" else "tf32")
    return tiles(gh, gw, d, r, axial) | dict(DOT=dot, PREC=prec)


def _pick(cfg: dict, *names: str) -> dict:
    return {k: cfg[k] for k in names}


@dataclass
class Launch:
    """One kernel launch, built without running it: the custom ops run it, the compile report compiles exactly
    what it would run (same constexprs, same argument values for Triton's specialisation)."""

    name: str
    kernel: Any
    grid: tuple[int, ...]
    args: tuple
    constexprs: dict
    num_warps: int = NUM_WARPS
    num_stages: int | None = None  # Triton's default unless set

    @property
    def options(self) -> dict:
        """Compile options of the launch (warps, pipeline stages)."""
        return {"num_warps": self.num_warps} | ({"num_stages": self.num_stages} if self.num_stages else {})

    def __call__(self) -> None:
        self.kernel[self.grid](*self.args, **self.options, **self.constexprs)


def _strides6(prm: Tensor) -> tuple[int, ...]:
    if prm.stride(-1) != 1:
        raise ValueError("kernel parameters must be contiguous in their last axis")
    return tuple(prm.stride())[:5]


def fwd_launch(v: Tensor, prm: Tensor, taby: Tensor | None, tabx: Tensor | None, axial: bool, y: Tensor,
               izx: Tensor | None) -> Launch:  # fmt: skip
    """The forward kernel writing ``y`` (and ``1/Z_x`` into ``izx`` for a steered field)."""
    b, n, h, d = v.shape
    gh, gw, r = prm.shape[1], prm.shape[2], prm.shape[4]
    cfg = _config(gh, gw, d, r, axial, v.dtype)
    fixed = taby is not None
    sty = (taby.stride(0), taby.stride(1), taby.stride(2)) if fixed else (0, 0, 0)
    stx = (tabx.stride(0), tabx.stride(1), tabx.stride(2)) if fixed else (0, 0, 0)
    sz = tuple(izx.stride())[:4] if izx is not None else (0, 0, 0, 0)
    name = "fwd-fixed" if fixed else "fwd-steered"
    ptrs = (v, prm, taby if fixed else prm, tabx if fixed else prm, y, izx if izx is not None else prm)
    strides = (v.stride(0), v.stride(1), v.stride(2), *_strides6(prm), y.stride(0), y.stride(1), y.stride(2), *sz,
               *sty, *stx)  # fmt: skip
    if axial:
        grid = (triton.cdiv(gh, cfg["T"]) * triton.cdiv(gw, cfg["WT"]), b * h)
        consts = _pick(cfg, "R", "RO", "RP", "T", "WT", "KC", "JC", "DHP", "DOT", "PREC") | dict(FIXED=fixed)
        return Launch(name, KA._ssog_fwd_kernel, grid, (*ptrs, h, gh, gw, d, *strides), consts)
    grid = (triton.cdiv(gh, cfg["T"]) * triton.cdiv(gw, cfg["WT"]), h, b)
    consts = _pick(cfg, "D", "R", "RP", "T", "WT", "KC", "GHP", "DHP", "EVEN_K", "DOT", "PREC") | dict(
        FIXED=fixed, JS=row_split(cfg["KC"] * cfg["T"] * cfg["RP"], cfg["GHP"], cfg["WARPS"])
    )
    return Launch(name, KF._fact_fwd_kernel, grid, (*ptrs, gh, gw, *strides), consts, cfg["WARPS"], FACTORIZED_STAGES)


def izx_launch(prm: Tensor, axial: bool, out: Tensor) -> Launch:
    """``1/Z_x`` of a shared field (``prm`` is ``(Gw, H, R, F)``) into ``out`` ``(Gw, H, R')``."""
    gw, h, r, _ = prm.shape
    cfg = _config(1, gw, 16, r, axial, torch.float32)
    grid = (h, 1, triton.cdiv(gw, cfg["WT"]))
    args = (prm, out, h, gw, prm.stride(0), prm.stride(1), prm.stride(2), out.stride(0), out.stride(1))
    return Launch(
        "inv_zx", KA._ssog_izx_kernel, grid, args, _pick(cfg, "R", "RO", "RP", "WT", "KC") | dict(AXIAL=axial)
    )


def bwd_launches(dy: Tensor, v: Tensor, prm: Tensor, izx: Tensor, axial: bool, dv: Tensor, dprm: Tensor) -> list:
    """The two backward kernels: rows (λ and x-parameter gradients), then columns (dV and y-parameter gradients)."""
    b, n, h, d = v.shape
    gh, gw, r = prm.shape[1], prm.shape[2], prm.shape[4]
    cfg = _config(gh, gw, d, r, axial, v.dtype)
    sz = tuple(izx.stride())[:4]
    sg = tuple(dprm.stride())[:5]
    common = (v.stride(0), v.stride(1), v.stride(2), *_strides6(prm), *sz, dy.stride(0), dy.stride(1), dy.stride(2))
    if axial:
        rows = Launch(
            "bwd-rows", KA._ssog_bwd_rows_kernel, (triton.cdiv(gh, cfg["T"]) * triton.cdiv(gw, cfg["WT"]), b * h),
            (v, prm, izx, dy, dprm, h, gh, gw, d, *common, *sg),
            _pick(cfg, "R", "RO", "RP", "T", "WT", "KC", "JC", "DHP", "DOT", "PREC") | dict(RA=p2(r)),
        )  # fmt: skip
    else:
        rows = Launch(
            "bwd-rows", KF._fact_bwd_rows_kernel, (triton.cdiv(gh, cfg["TR"]) * triton.cdiv(gw, cfg["WT"]), h, b),
            (v, prm, izx, dy, dprm, gh, gw, *common, *sg),
            _pick(cfg, "D", "R", "RP", "WT", "KC", "GHP", "DHP", "EVEN_K", "DOT", "PREC")
            | dict(T=cfg["TR"], JS=row_split(cfg["KC"] * cfg["TR"] * cfg["RP"], cfg["GHP"], cfg["WARPS"])),
            cfg["WARPS"],
            FACTORIZED_STAGES,
        )  # fmt: skip
    kt, ic, wc = col_tiles(cfg, axial)
    sdv = (dv.stride(0), dv.stride(1), dv.stride(2))
    if axial:
        cols = Launch(
            "bwd-cols", KA._ssog_bwd_cols_kernel, (triton.cdiv(gw, kt), b * h),
            (v, prm, izx, dy, dv, dprm, h, gh, gw, d, *common, *sdv, *sg),
            _pick(cfg, "R", "RO", "RP", "GHP", "DHP", "DOT", "PREC") | dict(KT=kt, IC=ic, WC=wc),
        )  # fmt: skip
    else:
        cols = Launch(
            "bwd-cols", KF._fact_bwd_cols_kernel, (triton.cdiv(gw, kt), h, b),
            (v, prm, izx, dy, dv, dprm, gh, gw, *common, *sdv, *sg),
            _pick(cfg, "D", "R", "RP", "GHP", "DHP", "DOT", "PREC")
            | dict(KT=kt, IC=ic, WC=wc, W_CHUNKS=wc < gw, JS=row_split(kt * ic * cfg["RP"], cfg["GHP"], cfg["WARPS"])),
            cfg["WARPS"],
            FACTORIZED_STAGES,
        )  # fmt: skip
    return [rows, cols]


def _device_guard(t: Tensor):
    return torch.cuda.device(t.device) if t.is_cuda else contextlib.nullcontext()


def _launch_fwd(v: Tensor, prm: Tensor, taby: Tensor | None, tabx: Tensor | None, axial: bool, izx: Tensor | None):
    y = torch.empty_like(v, memory_format=torch.contiguous_format)
    with _device_guard(v):
        fwd_launch(v, prm, taby, tabx, axial, y, izx)()
    return y


def _check(v: Tensor, prm: Tensor, axial: bool) -> None:
    if v.dim() != 4 or prm.dim() != 6:
        raise ValueError(
            f"expected v (B, N, H, D) and prm (B, Gh, Gw, H, R, F), got {tuple(v.shape)} and {tuple(prm.shape)}"
        )
    b, n, h, d = v.shape
    check_grid(n, (prm.shape[1], prm.shape[2]))
    f = AXIAL_FIELDS if axial else FACTORIZED_FIELDS
    if prm.shape[0] != b or prm.shape[3] != h or prm.shape[5] != f or prm.dtype != torch.float32:
        raise ValueError(f"kernel parameters {tuple(prm.shape)} {prm.dtype} do not match values {tuple(v.shape)}")
    if v.stride(-1) != 1:
        raise ValueError("values must be contiguous in the head dimension")


# ----------------------------------------------------------------------------------------------------------------
# custom ops


@torch.library.custom_op("ssog::steered_fwd", mutates_args=())
def steered_fwd(v: Tensor, prm: Tensor, axial: bool) -> tuple[Tensor, Tensor]:
    _check(v, prm, axial)
    b, gh, gw, h, r = prm.shape[:5]
    izx = torch.empty(b, gh, gw, h, 1 if axial else r, device=v.device, dtype=torch.float32)
    return _launch_fwd(v, prm, None, None, axial, izx), izx


@steered_fwd.register_fake
def _(v: Tensor, prm: Tensor, axial: bool) -> tuple[Tensor, Tensor]:
    b, gh, gw, h, r = prm.shape[:5]
    return torch.empty_like(v, memory_format=torch.contiguous_format), v.new_empty(
        (b, gh, gw, h, 1 if axial else r), dtype=torch.float32
    )


@torch.library.custom_op("ssog::fixed_fwd", mutates_args=())
def fixed_fwd(v: Tensor, prm: Tensor, taby: Tensor, tabx: Tensor, axial: bool) -> Tensor:
    _check(v, prm, axial)
    return _launch_fwd(v, prm, taby.contiguous(), tabx.contiguous(), axial, None)


@fixed_fwd.register_fake
def _(v: Tensor, prm: Tensor, taby: Tensor, tabx: Tensor, axial: bool) -> Tensor:
    return torch.empty_like(v, memory_format=torch.contiguous_format)


@torch.library.custom_op("ssog::inv_zx", mutates_args=())
def inv_zx(prm: Tensor, axial: bool) -> Tensor:
    """``1/Z`` of the column-axis kernels of a shared field, ``(Gw, H, R')`` — exactly as the forward kernel
    computes it (same code), for the backward pass of :func:`fixed_fwd`. ``prm`` is ``(Gw, H, R, F)``."""
    gw, h, r, _ = prm.shape
    prm = prm.contiguous()
    out = torch.empty(gw, h, 1 if axial else r, device=prm.device, dtype=torch.float32)
    with _device_guard(prm):
        izx_launch(prm, axial, out)()
    return out


@inv_zx.register_fake
def _(prm: Tensor, axial: bool) -> Tensor:
    gw, h, r, _ = prm.shape
    return prm.new_empty((gw, h, 1 if axial else r))


@torch.library.custom_op("ssog::bwd", mutates_args=())
def bwd(dy: Tensor, v: Tensor, prm: Tensor, izx: Tensor, axial: bool) -> tuple[Tensor, Tensor]:
    _check(v, prm, axial)
    dy = dy.contiguous()
    dv = torch.empty_like(v, memory_format=torch.contiguous_format)
    dprm = (torch.zeros if axial else torch.empty)(prm.shape, device=prm.device, dtype=torch.float32)
    with _device_guard(v):
        for launch in bwd_launches(dy, v, prm, izx, axial, dv, dprm):
            launch()
    return dv, dprm


@bwd.register_fake
def _(dy: Tensor, v: Tensor, prm: Tensor, izx: Tensor, axial: bool) -> tuple[Tensor, Tensor]:
    return torch.empty_like(v, memory_format=torch.contiguous_format), prm.new_empty(prm.shape)


def _steered_setup(ctx, inputs, output) -> None:
    v, prm, axial = inputs
    ctx.save_for_backward(v, prm, output[1])
    ctx.axial = axial


def _steered_backward(ctx, dy: Tensor, _dizx: Tensor | None):
    v, prm, izx = ctx.saved_tensors
    dv, dprm = bwd(dy, v, prm, izx, ctx.axial)
    return dv, dprm, None


steered_fwd.register_autograd(_steered_backward, setup_context=_steered_setup)


def _fixed_setup(ctx, inputs, output) -> None:
    v, prm, _taby, _tabx, axial = inputs
    ctx.save_for_backward(v, prm)
    ctx.axial = axial


def _fixed_backward(ctx, dy: Tensor):
    v, prm = ctx.saved_tensors
    b, gh, gw, h, r, f = prm.shape
    izx = inv_zx(prm[0, 0], ctx.axial)  # the shared field's column normalisers, (Gw, H, R')
    izx = izx[None, None].expand(b, gh, gw, h, izx.shape[-1])
    dv, dprm = bwd(dy, v, prm, izx, ctx.axial)
    return dv, dprm, None, None, None


fixed_fwd.register_autograd(_fixed_backward, setup_context=_fixed_setup)


# ----------------------------------------------------------------------------------------------------------------
# flop formulas: the honest attention cost, so FLOP counts do not depend on the backend


def _attn_flops(v_shape, prm_shape, axial: bool) -> int:
    b, n, h, d = v_shape
    gh, gw, r = prm_shape[1], prm_shape[2], prm_shape[4]
    ro = 1 if axial else r
    return 2 * ro * b * n * (gh + gw) * h * d


@register_flop_formula(torch.ops.ssog.steered_fwd)
def _steered_flops(v_shape, prm_shape, axial, *args, **kwargs) -> int:
    return _attn_flops(v_shape, prm_shape, axial)


@register_flop_formula(torch.ops.ssog.fixed_fwd)
def _fixed_flops(v_shape, prm_shape, taby_shape, tabx_shape, axial, *args, **kwargs) -> int:
    return _attn_flops(v_shape, prm_shape, axial)


@register_flop_formula(torch.ops.ssog.bwd)
def _bwd_flops(dy_shape, v_shape, prm_shape, izx_shape, axial, *args, **kwargs) -> int:
    # recomputed column pass, G = dY·y1ᵀ (rows kernel); dy1, G_y and dV (columns kernel)
    b, n, h, d = v_shape
    gh, gw, r = prm_shape[1], prm_shape[2], prm_shape[4]
    ro = 1 if axial else r
    return 2 * ro * b * n * (3 * gh + 2 * gw) * h * d


# ----------------------------------------------------------------------------------------------------------------


def apply_triton(v: Tensor, field: Field, grid: tuple[int, int], mode: FieldMode = "factorized") -> Tensor:
    """``apply_field`` semantics on the fused kernels: values ``(B, N, H, D)`` → ``(B, N, H, D)``."""
    b, n, h, d = v.shape
    check_grid(n, grid)
    gh, gw = grid
    axial = mode == "axial"
    prm = kernel_params(field, mode, grid).to(v.device)
    prm = prm.expand(b, gh, gw, *prm.shape[-3:])
    if v.stride(-1) != 1:
        v = v.contiguous()
    if field.per_token:
        if prm.stride(-1) != 1:
            prm = prm.contiguous()
        return steered_fwd(v, prm, axial)[0]
    k = axis_kernels(field.to(torch.float32), grid, mode)
    taby = k.ay[0, :, 0].permute(1, 2, 0, 3).to(v.device)  # (H, R', Gh(i), Gh(j))
    tabx = (k.ax[0, 0] * k.lam[0, 0, 0, :, :, None]).permute(1, 2, 0, 3).to(v.device)  # (H, R', Gw(w), Gw(k))
    return fixed_fwd(v, prm, taby, tabx, axial)
