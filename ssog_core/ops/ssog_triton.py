"""The fused Triton SSOG operator as ``torch.library`` custom ops (``torch.compile``-safe).

Factorized fields (the kernels of :mod:`ssog_core.ops.ssog_triton_factorized` read the field as it is):

* ``ssog::field_fwd(v, mu, sigma, log_lam, tau, gh, gw) -> (y, inv_zx)`` — the field per token
  (``(B, Gh, Gw, H, R, …)``, any strides, broadcast dimensions included) or shared (``(H, R, …)``);
  ``inv_zx`` (1/Z of the column-axis kernels, fp32) is saved for the backward pass and has no gradient;
* ``ssog::field_bwd(dy, v, mu, sigma, log_lam, tau, inv_zx, gh, gw) -> (dv, dmu, dsigma, dlog_lam, dtau)`` — both
  backward kernels; the gradients of a shared field are summed over the tokens;
* ``ssog::table_fwd(v, taby, tabx) -> y`` — a shared field's forward pass from its per-head kernels (no
  exponential), where nothing needs a gradient;
* ``ssog::steer(raw, …) -> (mu, sigma, log_lam, tau)`` — a layer's per-token field from its raw probe outputs,
  fixed field and gates (:func:`ssog_core.field.bound`, :func:`~ssog_core.field.steer`, one kernel each way;
  :mod:`ssog_core.ops.ssog_triton_steer`).

Axial fields (:mod:`ssog_core.ops.ssog_triton_axial`) are first turned into per-token kernel parameters
(:func:`kernel_params`): ``ssog::axial_fwd(v, prm) -> (y, inv_zx)``, ``ssog::axial_fixed_fwd(v, prm, taby, tabx)
-> y``, ``ssog::axial_inv_zx(prm)`` and ``ssog::axial_bwd(dy, v, prm, inv_zx) -> (dv, dprm)``; PyTorch autograd
carries ``dprm`` on to the field.

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
from ssog_core.ops.triton_tiles import FACTORIZED_STAGES, NUM_WARPS, col_tiles, kernel_warps, p2, row_split, tiles

triton = KA.triton

AXIAL_FIELDS = 8  # μy, μx, by, bx, βy, βx, 1/τ (rows), 1/τ (columns)


def kernel_params(field: Field, grid: tuple[int, int]) -> Tensor:
    """The per-token kernel parameters the axial kernels read, fp32, ``(B or 1, 1, 1, H, R, F)`` — broadcast to
    ``(B, Gh, Gw, H, R, F)`` by the launcher (module docstring of :mod:`ssog_core.ops.ssog_triton_axial` for the
    fields); differentiable w.r.t. the field. The factorized kernels read the field itself."""
    mu, sigma = field.mu.float(), field.sigma.float()
    b, beta = exp2_rate(sigma), exp2_log_weight(sigma, field.log_lam.float())
    itau = (1.0 / field.tau.float()).expand_as(mu[..., 0])
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


def fwd_launch(v: Tensor, prm: Tensor, taby: Tensor | None, tabx: Tensor | None, y: Tensor,
               izx: Tensor | None) -> Launch:  # fmt: skip
    """The axial forward kernel writing ``y`` (and ``1/Z_x`` into ``izx`` for a steered field)."""
    b, n, h, d = v.shape
    gh, gw, r = prm.shape[1], prm.shape[2], prm.shape[4]
    cfg = _config(gh, gw, d, r, True, v.dtype)
    fixed = taby is not None
    sty = (taby.stride(0), taby.stride(1), taby.stride(2)) if fixed else (0, 0, 0)
    stx = (tabx.stride(0), tabx.stride(1), tabx.stride(2)) if fixed else (0, 0, 0)
    sz = tuple(izx.stride())[:4] if izx is not None else (0, 0, 0, 0)
    name = "fwd-fixed" if fixed else "fwd-steered"
    ptrs = (v, prm, taby if fixed else prm, tabx if fixed else prm, y, izx if izx is not None else prm)
    strides = (v.stride(0), v.stride(1), v.stride(2), *_strides6(prm), y.stride(0), y.stride(1), y.stride(2), *sz,
               *sty, *stx)  # fmt: skip
    grid = (triton.cdiv(gh, cfg["T"]) * triton.cdiv(gw, cfg["WT"]), b * h)
    consts = _pick(cfg, "R", "RO", "RP", "T", "WT", "KC", "JC", "DHP", "DOT", "PREC") | dict(FIXED=fixed)
    return Launch(name, KA._ssog_fwd_kernel, grid, (*ptrs, h, gh, gw, d, *strides), consts)


def izx_launch(prm: Tensor, out: Tensor) -> Launch:
    """``1/Z_x`` of a shared axial field (``prm`` is ``(Gw, H, R, F)``) into ``out`` ``(Gw, H, 1)``."""
    gw, h, r, _ = prm.shape
    cfg = _config(1, gw, 16, r, True, torch.float32)
    grid = (h, 1, triton.cdiv(gw, cfg["WT"]))
    args = (prm, out, h, gw, prm.stride(0), prm.stride(1), prm.stride(2), out.stride(0), out.stride(1))
    return Launch("inv_zx", KA._ssog_izx_kernel, grid, args, _pick(cfg, "R", "RO", "RP", "WT", "KC") | dict(AXIAL=True))


def bwd_launches(dy: Tensor, v: Tensor, prm: Tensor, izx: Tensor, dv: Tensor, dprm: Tensor) -> list:
    """The two axial backward kernels: rows (x-parameter gradients), then columns (dV and y-parameter gradients)."""
    b, n, h, d = v.shape
    gh, gw, r = prm.shape[1], prm.shape[2], prm.shape[4]
    cfg = _config(gh, gw, d, r, True, v.dtype)
    sz = tuple(izx.stride())[:4]
    sg = tuple(dprm.stride())[:5]
    common = (v.stride(0), v.stride(1), v.stride(2), *_strides6(prm), *sz, dy.stride(0), dy.stride(1), dy.stride(2))
    rows = Launch(
        "bwd-rows", KA._ssog_bwd_rows_kernel, (triton.cdiv(gh, cfg["T"]) * triton.cdiv(gw, cfg["WT"]), b * h),
        (v, prm, izx, dy, dprm, h, gh, gw, d, *common, *sg),
        _pick(cfg, "R", "RO", "RP", "T", "WT", "KC", "JC", "DHP", "DOT", "PREC") | dict(RA=p2(r)),
    )  # fmt: skip
    kt, ic, wc = col_tiles(cfg, True)
    cols = Launch(
        "bwd-cols", KA._ssog_bwd_cols_kernel, (triton.cdiv(gw, kt), b * h),
        (v, prm, izx, dy, dv, dprm, h, gh, gw, d, *common, dv.stride(0), dv.stride(1), dv.stride(2), *sg),
        _pick(cfg, "R", "RO", "RP", "GHP", "DHP", "DOT", "PREC") | dict(KT=kt, IC=ic, WC=wc),
    )  # fmt: skip
    return [rows, cols]


@dataclass
class FieldArgs:
    """A factorized field as its kernels read it: μ, σ ``(B, Gh, Gw, H, R, 2)`` or ``(H, R, 2)`` (the last axis
    contiguous), log λ, τ, and each tensor's strides over (b, i, w, h, r), zero where the field is shared."""

    mu: Tensor
    sigma: Tensor
    log_lam: Tensor
    tau: Tensor
    grid: tuple[int, int]

    @property
    def shared(self) -> bool:
        return self.mu.dim() == 3

    @property
    def atoms(self) -> int:
        return self.log_lam.shape[-1]

    @property
    def strides(self) -> tuple[int, ...]:
        """The 15 strides the kernels take: μ, σ, log λ over (b, i, w, h, r)."""
        out: tuple[int, ...] = ()
        for t, lead in ((self.mu, 2), (self.sigma, 2), (self.log_lam, 1)):
            st = tuple(t.stride())
            st = st[:-1] if lead == 2 else st
            out += st if len(st) == 5 else (0, 0, 0, *st)
        return out


def field_fwd_launch(v: Tensor, fld: FieldArgs, y: Tensor, izx: Tensor | None, taby: Tensor | None = None,
                     tabx: Tensor | None = None) -> Launch:  # fmt: skip
    """The factorized forward kernel writing ``y`` (and ``1/Z_x`` into ``izx``); from the per-head kernels
    ``taby``/``tabx`` of a shared field where they are given (``fwd-fixed``), else from the field itself."""
    b, n, h, d = v.shape
    gh, gw = fld.grid
    cfg = _config(gh, gw, d, fld.atoms, False, v.dtype)
    fixed = taby is not None
    cfg["T"] = cfg["T"] if fixed else cfg["TS"]
    sty = (taby.stride(0), taby.stride(1), taby.stride(2)) if fixed else (0, 0, 0)
    stx = (tabx.stride(0), tabx.stride(1), tabx.stride(2)) if fixed else (0, 0, 0)
    sz = tuple(izx.stride())[:4] if izx is not None else (0, 0, 0, 0)
    ptrs = (v, fld.mu, fld.sigma, fld.log_lam, fld.tau, taby if fixed else v, tabx if fixed else v, y,
            izx if izx is not None else y)  # fmt: skip
    strides = (v.stride(0), v.stride(1), v.stride(2), *fld.strides, y.stride(0), y.stride(1), y.stride(2), *sz, *sty,
               *stx)  # fmt: skip
    grid = (triton.cdiv(gh, cfg["T"]) * triton.cdiv(gw, cfg["WT"]), h, b)
    name = "fwd-fixed" if fixed else "fwd-steered"
    warps = kernel_warps(cfg, name, v.element_size())
    consts = _pick(cfg, "D", "R", "RP", "T", "WT", "KC", "GHP", "DHP", "EVEN_K", "DOT", "PREC") | dict(
        FIXED=fixed, JS=row_split(cfg["KC"] * cfg["T"] * cfg["RP"], cfg["GHP"], warps)
    )
    return Launch(name, KF._fact_fwd_kernel, grid, (*ptrs, gh, gw, *strides), consts, warps, FACTORIZED_STAGES)


def field_bwd_programs(v: Tensor, grid: tuple[int, int], atoms: int) -> tuple[int, int]:
    """Programs per (image, head) of the row and of the column backward kernel: each writes its part of dτ."""
    gh, gw = grid
    cfg = _config(gh, gw, v.shape[-1], atoms, False, v.dtype)
    kt = col_tiles(cfg, False)[0]
    return triton.cdiv(gh, cfg["TR"]) * triton.cdiv(gw, cfg["WT"]), triton.cdiv(gw, kt)


def field_bwd_launches(dy: Tensor, v: Tensor, fld: FieldArgs, izx: Tensor, dv: Tensor, grads: Tensor,
                       dtau: Tensor) -> list:  # fmt: skip
    """The two factorized backward kernels: rows (log λ, μx, σx), then columns (dV, μy, σy), into ``grads``
    ``(B, Gh, Gw, H, R, 5)`` (dμ (y, x), dσ (y, x), dlog λ) and ``dtau`` ``(B, H, rows + columns programs)``, each
    program's part of dτ."""
    b, n, h, d = v.shape
    gh, gw = fld.grid
    cfg = _config(gh, gw, d, fld.atoms, False, v.dtype)
    n_rows, _ = field_bwd_programs(v, fld.grid, fld.atoms)
    sz = tuple(izx.stride())[:4]
    sg = tuple(grads.stride())[:5]
    st = (dtau.stride(0), dtau.stride(1))
    common = (v.stride(0), v.stride(1), v.stride(2), *fld.strides, *sz, dy.stride(0), dy.stride(1), dy.stride(2))
    field = (fld.mu, fld.sigma, fld.log_lam, fld.tau, izx, dy)
    dmu, dsigma, dlog_lam = grads[..., 0], grads[..., 2], grads[..., 4]
    rw, cw = kernel_warps(cfg, "bwd-rows", v.element_size()), kernel_warps(cfg, "bwd-cols", v.element_size())
    rows = Launch(
        "bwd-rows", KF._fact_bwd_rows_kernel, (n_rows, h, b),
        (v, *field, dmu, dsigma, dlog_lam, dtau, gh, gw, *common, *sg, *st),
        _pick(cfg, "D", "R", "RP", "WT", "KC", "GHP", "DHP", "EVEN_K", "DOT", "PREC")
        | dict(T=cfg["TR"], JS=row_split(cfg["KC"] * cfg["TR"] * cfg["RP"], cfg["GHP"], rw)),
        rw,
        FACTORIZED_STAGES,
    )  # fmt: skip
    kt, ic, wc = col_tiles(cfg, False, cw)
    cols = Launch(
        "bwd-cols", KF._fact_bwd_cols_kernel, (triton.cdiv(gw, kt), h, b),
        (v, *field, dv, dmu, dsigma, dtau[:, :, n_rows:], gh, gw, *common, dv.stride(0), dv.stride(1), dv.stride(2),
         *sg, *st),
        _pick(cfg, "D", "R", "RP", "GHP", "DHP", "DOT", "PREC")
        | dict(KT=kt, IC=ic, WC=wc, W_CHUNKS=wc < gw, JS=row_split(kt * ic * cfg["RP"], cfg["GHP"], cw)),
        cw,
        FACTORIZED_STAGES,
    )  # fmt: skip
    return [rows, cols]


def problem_jobs(grid: tuple[int, int], head_dim: int, atoms: int, mode: str, dtype: torch.dtype, heads: int = 6,
                 batch: int = 2) -> dict[str, list]:  # fmt: skip
    """The kernel launches of each timed job of one problem — ``steered forward`` / ``backward`` and ``fixed
    forward`` / ``backward`` (the field kernels, as the benchmark's ``kernel`` rows time them), and for a factorized
    field the steering both ways (``steer forward`` / ``backward``) — built on ``meta`` tensors laid out as the
    custom ops lay them out, so that a compile sees the launch's constexprs and Triton's specialisation of its
    arguments (16-byte divisibility, ones) exactly as the JIT would (:mod:`ssog_core.ops.triton_compile`)."""
    gh, gw = grid
    ro = 1 if mode == "axial" else atoms

    def empty(*shape: int, dt: torch.dtype = torch.float32) -> Tensor:
        return torch.empty(shape, device="meta", dtype=dt)

    v = empty(batch, gh * gw, heads, head_dim, dt=dtype)
    izx = empty(batch, gh, gw, heads, ro)
    taby, tabx = empty(heads, ro, gh, gh), empty(heads, ro, gw, gw)
    if mode == "axial":
        prm = empty(batch, gh, gw, heads, atoms, AXIAL_FIELDS)
        shared = empty(heads, atoms, AXIAL_FIELDS)[None, None, None].expand(batch, gh, gw, heads, atoms, AXIAL_FIELDS)
        shared_izx = empty(gw, heads, ro)[None, None].expand(batch, gh, gw, heads, ro)  # as the fixed backward has it
        return {
            "steered forward": [fwd_launch(v, prm, None, None, empty(*v.shape, dt=dtype), izx)],
            "steered backward": bwd_launches(
                empty(*v.shape, dt=dtype), v, prm, izx, empty(*v.shape, dt=dtype), empty(*prm.shape)
            ),  # fmt: skip
            "fixed forward": [fwd_launch(v, shared, taby, tabx, empty(*v.shape, dt=dtype), None)],
            "fixed backward": [
                izx_launch(empty(gw, heads, atoms, AXIAL_FIELDS), empty(gw, heads, ro)),
                *bwd_launches(
                    empty(*v.shape, dt=dtype), v, shared, shared_izx, empty(*v.shape, dt=dtype), empty(*prm.shape)
                ),  # fmt: skip
            ],
        }
    lead = (batch, gh, gw, heads, atoms)
    steered = FieldArgs(empty(*lead, 2), empty(*lead, 2), empty(*lead), empty(), grid)
    shared = FieldArgs(empty(heads, atoms, 2), empty(heads, atoms, 2), empty(heads, atoms), empty(), grid)
    n_rows, n_cols = field_bwd_programs(v, grid, atoms)
    grads = (empty(*lead, 5), empty(batch, heads, n_rows + n_cols))
    nt, p = batch * gh * gw, 5 * heads * atoms  # every tap
    raw = empty(nt, p, dt=dtype)
    fixed = (empty(heads, atoms, 2), empty(heads, atoms, 2), empty(heads, atoms), empty())
    gates, biases = [empty()] * 3, [empty(2 * heads * atoms), empty(2 * heads * atoms), empty(heads * atoms)]
    offsets, out = [0, 2 * heads * atoms, 4 * heads * atoms], (empty(*lead, 2), empty(*lead, 2), empty(*lead), empty())
    dfield = (
        empty(nt, heads, atoms, 5)[..., 0:2],
        empty(nt, heads, atoms, 5)[..., 2:4],
        empty(nt, heads, atoms),
        empty(),
    )
    partials = empty(triton.cdiv(nt, _steer_config(heads, atoms)["BLOCK"]), 10 * heads * atoms + 4)
    return {
        "steered forward": [field_fwd_launch(v, steered, empty(*v.shape, dt=dtype), izx)],
        "steered backward": field_bwd_launches(
            empty(*v.shape, dt=dtype), v, steered, izx, empty(*v.shape, dt=dtype), *grads
        ),  # fmt: skip
        "fixed forward": [field_fwd_launch(v, shared, empty(*v.shape, dt=dtype), None, taby, tabx)],
        "fixed backward": field_bwd_launches(
            empty(*v.shape, dt=dtype), v, shared, izx, empty(*v.shape, dt=dtype), *grads
        ),  # fmt: skip
        "steer forward": [steer_launch(raw, fixed, gates, biases, offsets, 4.0, 0.25, out)],
        "steer backward": [
            steer_bwd_launch(
                raw, fixed[1::2], gates, biases, dfield, offsets, 4.0, 0.25, empty(nt, p, dt=dtype), partials
            )
        ],  # fmt: skip
    }


def problem_launches(grid: tuple[int, int], head_dim: int, atoms: int, mode: str, dtype: torch.dtype, heads: int = 6,
                     batch: int = 2) -> list:  # fmt: skip
    """Every distinct kernel launch of one problem once (:func:`problem_jobs`): forward steered and fixed, the
    shared field's ``inv_zx`` (axial), both backward kernels, the steering both ways (factorized)."""
    jobs = problem_jobs(grid, head_dim, atoms, mode, dtype, heads, batch)
    fixed_only = jobs["fixed backward"][:1] if mode == "axial" else []  # axial: inv_zx; the rest as steered
    steer = [*jobs.get("steer forward", []), *jobs.get("steer backward", [])]
    return [*jobs["steered forward"], *jobs["fixed forward"], *fixed_only, *jobs["steered backward"], *steer]


def _device_guard(t: Tensor):
    return torch.cuda.device(t.device) if t.is_cuda else contextlib.nullcontext()


def _launch_fwd(v: Tensor, prm: Tensor, taby: Tensor | None, tabx: Tensor | None, izx: Tensor | None):
    y = torch.empty_like(v, memory_format=torch.contiguous_format)
    with _device_guard(v):
        fwd_launch(v, prm, taby, tabx, y, izx)()
    return y


def _check(v: Tensor, prm: Tensor) -> None:
    if v.dim() != 4 or prm.dim() != 6:
        raise ValueError(
            f"expected v (B, N, H, D) and prm (B, Gh, Gw, H, R, F), got {tuple(v.shape)} and {tuple(prm.shape)}"
        )
    b, n, h, d = v.shape
    check_grid(n, (prm.shape[1], prm.shape[2]))
    if prm.shape[0] != b or prm.shape[3] != h or prm.shape[5] != AXIAL_FIELDS or prm.dtype != torch.float32:
        raise ValueError(f"kernel parameters {tuple(prm.shape)} {prm.dtype} do not match values {tuple(v.shape)}")
    if v.stride(-1) != 1:
        raise ValueError("values must be contiguous in the head dimension")


def _check_field(v: Tensor, mu: Tensor, sigma: Tensor, log_lam: Tensor, tau: Tensor, grid: tuple[int, int]) -> None:
    """Shapes, dtypes and layouts the factorized kernels need, with a clear error otherwise."""
    if v.dim() != 4:
        raise ValueError(f"expected values (B, N, H, D), got {tuple(v.shape)}")
    b, n, h, d = v.shape
    check_grid(n, grid)
    r = log_lam.shape[-1]
    lead = (b, *grid, h, r) if mu.dim() == 6 else (h, r)
    if (tuple(mu.shape), tuple(sigma.shape), tuple(log_lam.shape)) != ((*lead, 2), (*lead, 2), lead):
        raise ValueError(
            f"field μ {tuple(mu.shape)}, σ {tuple(sigma.shape)}, log λ {tuple(log_lam.shape)} do not match values "
            f"{tuple(v.shape)} on a {grid[0]}×{grid[1]} grid"
        )
    if any(t.dtype != torch.float32 for t in (mu, sigma, log_lam, tau)) or tau.numel() != 1:
        raise ValueError("the field must be float32, with a scalar τ")
    if v.stride(-1) != 1 or mu.stride(-1) != 1 or sigma.stride(-1) != 1:
        raise ValueError("values must be contiguous in the head dimension, μ and σ in their last axis")


# ----------------------------------------------------------------------------------------------------------------
# custom ops: factorized fields


@torch.library.custom_op("ssog::fwd", mutates_args=())
def field_fwd(v: Tensor, mu: Tensor, sigma: Tensor, log_lam: Tensor, tau: Tensor, gh: int, gw: int) -> tuple[
        Tensor, Tensor]:  # fmt: skip
    _check_field(v, mu, sigma, log_lam, tau, (gh, gw))
    b, n, h, _ = v.shape
    y = torch.empty_like(v, memory_format=torch.contiguous_format)
    izx = torch.empty(b, gh, gw, h, log_lam.shape[-1], device=v.device, dtype=torch.float32)
    with _device_guard(v):
        field_fwd_launch(v, FieldArgs(mu, sigma, log_lam, tau, (gh, gw)), y, izx)()
    return y, izx


@field_fwd.register_fake
def _(v: Tensor, mu: Tensor, sigma: Tensor, log_lam: Tensor, tau: Tensor, gh: int, gw: int) -> tuple[Tensor, Tensor]:
    b, n, h, _ = v.shape
    return torch.empty_like(v, memory_format=torch.contiguous_format), v.new_empty(
        (b, gh, gw, h, log_lam.shape[-1]), dtype=torch.float32
    )


@torch.library.custom_op("ssog::bwd", mutates_args=())
def field_bwd(dy: Tensor, v: Tensor, mu: Tensor, sigma: Tensor, log_lam: Tensor, tau: Tensor, izx: Tensor, gh: int,
              gw: int) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    """``(dv, grads, dtau)``: ``grads`` ``(B, Gh, Gw, H, R, 5)`` holds dμ (y, x), dσ (y, x) and dlog λ per token,
    ``dtau`` each backward program's part of dτ (the autograd formula sums them)."""
    _check_field(v, mu, sigma, log_lam, tau, (gh, gw))
    b, n, h, _ = v.shape
    r = log_lam.shape[-1]
    dy = dy.contiguous()
    dv = torch.empty_like(v, memory_format=torch.contiguous_format)
    grads = torch.empty(b, gh, gw, h, r, 5, device=v.device, dtype=torch.float32)
    dtau = torch.empty(b, h, sum(field_bwd_programs(v, (gh, gw), r)), device=v.device, dtype=torch.float32)
    with _device_guard(v):
        for launch in field_bwd_launches(dy, v, FieldArgs(mu, sigma, log_lam, tau, (gh, gw)), izx, dv, grads, dtau):
            launch()
    return dv, grads, dtau


@field_bwd.register_fake
def _(dy: Tensor, v: Tensor, mu: Tensor, sigma: Tensor, log_lam: Tensor, tau: Tensor, izx: Tensor, gh: int,
      gw: int) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    b, n, h, _ = v.shape
    r = log_lam.shape[-1]
    programs = sum(field_bwd_programs(v, (gh, gw), r))
    return (
        torch.empty_like(v, memory_format=torch.contiguous_format),
        v.new_empty((b, gh, gw, h, r, 5), dtype=torch.float32),
        v.new_empty((b, h, programs), dtype=torch.float32),
    )


def _field_setup(ctx, inputs, output) -> None:
    v, mu, sigma, log_lam, tau, gh, gw = inputs
    ctx.save_for_backward(v, mu, sigma, log_lam, tau, output[1])
    ctx.grid = (gh, gw)
    ctx.set_materialize_grads(False)  # 1/Z_x has no gradient: no zeros made for it


def _field_backward(ctx, dy: Tensor | None, _dizx: Tensor | None):
    v, mu, sigma, log_lam, tau, izx = ctx.saved_tensors
    if dy is None:
        return (None,) * 7
    dv, grads, dtau = field_bwd(dy, v, mu, sigma, log_lam, tau, izx, *ctx.grid)
    if mu.dim() == 3:  # a shared field: its gradient sums those of every token
        grads = grads.sum((0, 1, 2))
    return dv, grads[..., 0:2], grads[..., 2:4], grads[..., 4], dtau.sum().reshape(tau.shape), None, None


field_fwd.register_autograd(_field_backward, setup_context=_field_setup)


@torch.library.custom_op("ssog::table_fwd", mutates_args=())
def table_fwd(v: Tensor, taby: Tensor, tabx: Tensor) -> Tensor:
    """A shared factorized field's ``y`` from its per-head kernels ``taby`` ``(H, R, Gh(i), Gh(j))`` and ``tabx``
    ``(H, R, Gw(w), Gw(k))`` (λ folded in): no exponential in the kernel. Forward only."""
    h, r, gh, gw = taby.shape[0], taby.shape[1], taby.shape[2], tabx.shape[2]
    if v.dim() != 4 or v.shape[2] != h or tabx.shape[:2] != taby.shape[:2] or v.stride(-1) != 1:
        raise ValueError(f"values {tuple(v.shape)} and tables {tuple(taby.shape)}, {tuple(tabx.shape)} do not match")
    taby, tabx = taby.contiguous(), tabx.contiguous()
    dummy = v.new_empty((h, r, 2), dtype=torch.float32)  # the field is not read: its kernels are in the tables
    fld = FieldArgs(dummy, dummy, dummy[..., 0], dummy[0, 0, 0], (gh, gw))
    y = torch.empty_like(v, memory_format=torch.contiguous_format)
    with _device_guard(v):
        field_fwd_launch(v, fld, y, None, taby, tabx)()
    return y


@table_fwd.register_fake
def _(v: Tensor, taby: Tensor, tabx: Tensor) -> Tensor:
    return torch.empty_like(v, memory_format=torch.contiguous_format)


# ----------------------------------------------------------------------------------------------------------------
# custom ops: axial fields


@torch.library.custom_op("ssog::axial_fwd", mutates_args=())
def axial_fwd(v: Tensor, prm: Tensor) -> tuple[Tensor, Tensor]:
    _check(v, prm)
    b, gh, gw, h = prm.shape[:4]
    izx = torch.empty(b, gh, gw, h, 1, device=v.device, dtype=torch.float32)
    return _launch_fwd(v, prm, None, None, izx), izx


@axial_fwd.register_fake
def _(v: Tensor, prm: Tensor) -> tuple[Tensor, Tensor]:
    b, gh, gw, h = prm.shape[:4]
    return torch.empty_like(v, memory_format=torch.contiguous_format), v.new_empty(
        (b, gh, gw, h, 1), dtype=torch.float32
    )


@torch.library.custom_op("ssog::axial_fixed_fwd", mutates_args=())
def axial_fixed_fwd(v: Tensor, prm: Tensor, taby: Tensor, tabx: Tensor) -> Tensor:
    _check(v, prm)
    return _launch_fwd(v, prm, taby.contiguous(), tabx.contiguous(), None)


@axial_fixed_fwd.register_fake
def _(v: Tensor, prm: Tensor, taby: Tensor, tabx: Tensor) -> Tensor:
    return torch.empty_like(v, memory_format=torch.contiguous_format)


@torch.library.custom_op("ssog::axial_inv_zx", mutates_args=())
def axial_inv_zx(prm: Tensor) -> Tensor:
    """``1/Z`` of the column-axis kernels of a shared axial field, ``(Gw, H, 1)`` — exactly as the forward kernel
    computes it (same code), for the backward pass of :func:`axial_fixed_fwd`. ``prm`` is ``(Gw, H, R, F)``."""
    gw, h, r, _ = prm.shape
    prm = prm.contiguous()
    out = torch.empty(gw, h, 1, device=prm.device, dtype=torch.float32)
    with _device_guard(prm):
        izx_launch(prm, out)()
    return out


@axial_inv_zx.register_fake
def _(prm: Tensor) -> Tensor:
    gw, h, r, _ = prm.shape
    return prm.new_empty((gw, h, 1))


@torch.library.custom_op("ssog::axial_bwd", mutates_args=())
def axial_bwd(dy: Tensor, v: Tensor, prm: Tensor, izx: Tensor) -> tuple[Tensor, Tensor]:
    _check(v, prm)
    dy = dy.contiguous()
    dv = torch.empty_like(v, memory_format=torch.contiguous_format)
    dprm = torch.zeros(prm.shape, device=prm.device, dtype=torch.float32)
    with _device_guard(v):
        for launch in bwd_launches(dy, v, prm, izx, dv, dprm):
            launch()
    return dv, dprm


@axial_bwd.register_fake
def _(dy: Tensor, v: Tensor, prm: Tensor, izx: Tensor) -> tuple[Tensor, Tensor]:
    return torch.empty_like(v, memory_format=torch.contiguous_format), prm.new_empty(prm.shape)


def _axial_setup(ctx, inputs, output) -> None:
    v, prm = inputs
    ctx.save_for_backward(v, prm, output[1])


def _axial_backward(ctx, dy: Tensor, _dizx: Tensor | None):
    v, prm, izx = ctx.saved_tensors
    return axial_bwd(dy, v, prm, izx)


axial_fwd.register_autograd(_axial_backward, setup_context=_axial_setup)


def _axial_fixed_setup(ctx, inputs, output) -> None:
    v, prm, _taby, _tabx = inputs
    ctx.save_for_backward(v, prm)


def _axial_fixed_backward(ctx, dy: Tensor):
    v, prm = ctx.saved_tensors
    b, gh, gw, h, r, f = prm.shape
    izx = axial_inv_zx(prm[0, 0])  # the shared field's column normalisers, (Gw, H, 1)
    izx = izx[None, None].expand(b, gh, gw, h, 1)
    dv, dprm = axial_bwd(dy, v, prm, izx)
    return dv, dprm, None, None


axial_fixed_fwd.register_autograd(_axial_fixed_backward, setup_context=_axial_fixed_setup)


# ----------------------------------------------------------------------------------------------------------------
# flop formulas: the honest attention cost, so FLOP counts do not depend on the backend


def _attn_flops(b: int, n: int, h: int, d: int, gh: int, gw: int, ro: int) -> int:
    return 2 * ro * b * n * (gh + gw) * h * d


@register_flop_formula(torch.ops.ssog.fwd)
def _field_flops(v_shape, mu_shape, sigma_shape, ll_shape, tau_shape, gh, gw, *args, **kwargs) -> int:
    return _attn_flops(*v_shape, gh, gw, ll_shape[-1])


@register_flop_formula(torch.ops.ssog.table_fwd)
def _table_flops(v_shape, taby_shape, tabx_shape, *args, **kwargs) -> int:
    return _attn_flops(*v_shape, taby_shape[2], tabx_shape[2], taby_shape[1])


@register_flop_formula(torch.ops.ssog.bwd)
def _field_bwd_flops(dy_shape, v_shape, mu_shape, sigma_shape, ll_shape, tau_shape, izx_shape, gh, gw, *args,
                     **kwargs) -> int:  # fmt: skip
    # recomputed column pass, G = dY·y1ᵀ (rows kernel); dy1, G_y and dV (columns kernel)
    b, n, h, d = v_shape
    return 2 * ll_shape[-1] * b * n * (3 * gh + 2 * gw) * h * d


@register_flop_formula(torch.ops.ssog.axial_fwd)
def _axial_flops(v_shape, prm_shape, *args, **kwargs) -> int:
    return _attn_flops(*v_shape, prm_shape[1], prm_shape[2], 1)


@register_flop_formula(torch.ops.ssog.axial_fixed_fwd)
def _axial_fixed_flops(v_shape, prm_shape, taby_shape, tabx_shape, *args, **kwargs) -> int:
    return _attn_flops(*v_shape, prm_shape[1], prm_shape[2], 1)


@register_flop_formula(torch.ops.ssog.axial_bwd)
def _axial_bwd_flops(dy_shape, v_shape, prm_shape, izx_shape, *args, **kwargs) -> int:
    b, n, h, d = v_shape
    return 2 * b * n * (3 * prm_shape[1] + 2 * prm_shape[2]) * h * d


# ----------------------------------------------------------------------------------------------------------------


def _needs_grad(*tensors: Tensor) -> bool:
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def fixed_tables(field: Field, grid: tuple[int, int], mode: FieldMode, device: torch.device) -> tuple[Tensor, Tensor]:
    """A shared field's per-head kernels as the fixed-field forward kernel reads them: ``taby`` ``(H, R', Gh, Gh)``
    and ``tabx`` ``(H, R', Gw, Gw)`` with λ folded in (:func:`ssog_core.field.axis_kernels`)."""
    k = axis_kernels(field.to(torch.float32), grid, mode)
    taby = k.ay[0, :, 0].permute(1, 2, 0, 3).to(device)  # (H, R', Gh(i), Gh(j))
    tabx = (k.ax[0, 0] * k.lam[0, 0, 0, :, :, None]).permute(1, 2, 0, 3).to(device)  # (H, R', Gw(w), Gw(k))
    return taby, tabx


def apply_triton(v: Tensor, field: Field, grid: tuple[int, int], mode: FieldMode = "factorized") -> Tensor:
    """``apply_field`` semantics on the fused kernels: values ``(B, N, H, D)`` → ``(B, N, H, D)``."""
    b, n, h, d = v.shape
    check_grid(n, grid)
    gh, gw = grid
    if v.stride(-1) != 1:
        v = v.contiguous()
    if mode == "factorized":
        terms = (field.mu, field.sigma, field.log_lam, field.tau)
        mu, sigma, log_lam, tau = (t.to(device=v.device, dtype=torch.float32) for t in terms)
        if not field.per_token and not _needs_grad(v, mu, sigma, log_lam, tau):
            return table_fwd(v, *fixed_tables(field, grid, mode, v.device))
        mu, sigma = (t if t.stride(-1) == 1 else t.contiguous() for t in (mu, sigma))
        return field_fwd(v, mu, sigma, log_lam, tau, gh, gw)[0]
    prm = kernel_params(field, grid).to(v.device)
    prm = prm.expand(b, gh, gw, *prm.shape[-3:])
    if field.per_token:
        if prm.stride(-1) != 1:
            prm = prm.contiguous()
        return axial_fwd(v, prm)[0]
    return axial_fixed_fwd(v, prm, *fixed_tables(field, grid, mode, v.device))


# ----------------------------------------------------------------------------------------------------------------
# custom ops: a layer's steering (ssog_core.ops.ssog_triton_steer)

STEER_TAPS = ("mu", "sigma", "lambda")  # ssog_core.field.TAPS: the order of the gates and biases below


def _steer_config(h: int, r: int) -> dict:
    hr2p, hrp = p2(2 * h * r), p2(h * r)
    return dict(HR=h * r, HR2P=hr2p, HRP=hrp, BLOCK=max(1, 1024 // hr2p))  # no spills in the backward (sm_90)


def _steer_common(raw: Tensor, gates: list[Tensor | None], biases: list[Tensor | None], offsets: list[int]) -> tuple:
    """The gate and bias pointers (``raw`` itself for an absent tap, never read) and the taps' constexprs."""
    ptrs = tuple(t if t is not None else raw for t in (*gates, *biases))
    flags = {f"HAS_{k}": g is not None for k, g in zip(("MU", "SIG", "LAM"), gates, strict=True)}
    return ptrs, tuple(max(o, 0) for o in offsets), flags


def steer_launch(raw: Tensor, fixed: tuple[Tensor, ...], gates: list, biases: list, offsets: list[int],
                 max_offset: float, sigma_floor: float, out: tuple[Tensor, ...]) -> Launch:  # fmt: skip
    """The steering kernel: ``raw`` ``(T, P)``, the fixed field's ``(μ0, raw σ0, log λ0, raw τ)``, the taps' raw
    gates and probe biases (``None``: tap off) into ``out`` = ``(μ, σ, log λ, τ)``."""
    nt, p = raw.shape
    h, r = fixed[2].shape
    cfg = _steer_config(h, r)
    ptrs, offs, flags = _steer_common(raw, gates, biases, offsets)
    from ssog_core.ops import ssog_triton_steer as KS

    grid = (triton.cdiv(nt, cfg["BLOCK"]),)
    args = (raw, *fixed, *ptrs, *out, nt, p, *offs, float(max_offset), float(sigma_floor))
    return Launch("steer", KS._steer_fwd_kernel, grid, args, cfg | flags)


def steer_bwd_launch(raw: Tensor, fixed: tuple[Tensor, Tensor], gates: list, biases: list, grads: tuple,
                     offsets: list[int], max_offset: float, sigma_floor: float, draw: Tensor,
                     partials: Tensor) -> Launch:  # fmt: skip
    """The steering's backward kernel: ``raw`` ``(T, P)``, ``(raw σ0, raw τ)``, gates and biases as for
    :func:`steer_launch`, the field's gradients ``(dμ, dσ, dlog λ, dτ)`` (tokens on one axis) into ``draw`` and
    ``partials``."""
    from ssog_core.ops import ssog_triton_steer as KS

    nt, p = raw.shape
    h, r = fixed[0].shape[:2]
    cfg = _steer_config(h, r)
    ptrs, offs, flags = _steer_common(raw, gates, biases, offsets)
    dmu, dsigma, dlog_lam, dtau = grads
    args = (raw, *fixed, *ptrs, dmu, dsigma, dlog_lam, dtau, draw, partials, nt, p, *offs, float(max_offset),
            float(sigma_floor), *dmu.stride()[:3], *dlog_lam.stride())  # fmt: skip
    return Launch("steer-bwd", KS._steer_bwd_kernel, (partials.shape[0],), args, cfg | flags | dict(R=r))


def _tokens(t: Tensor, dims: int) -> Tensor:
    """``t`` with its leading (B, Gh, Gw) dimensions as one token axis (a view where the strides allow)."""
    return t.flatten(0, t.dim() - dims - 1)


@torch.library.custom_op("ssog::steer", mutates_args=())
def steer(raw: Tensor, mu0: Tensor, raw_sigma0: Tensor, log_lam0: Tensor, raw_tau: Tensor, gate_mu: Tensor | None,
          gate_sigma: Tensor | None, gate_lam: Tensor | None, bias_mu: Tensor | None, bias_sigma: Tensor | None,
          bias_lam: Tensor | None, offsets: list[int], max_offset: float, sigma_floor: float, gh: int,
          gw: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:  # fmt: skip
    """A layer's per-token field ``(μ, σ, log λ, τ)`` (``(B, Gh, Gw, H, R[, 2])``, fp32) from its raw probe outputs
    ``raw`` ``(B, N, P)`` (the taps at ``offsets`` in ``P``, −1: off; no biases), its fixed field's raw parameters and
    its gates' raw parameters: ``steer(base_field(…), bound(raw + bias), positive(gates), max_offset)``."""
    b, n, _ = raw.shape
    h, r = log_lam0.shape
    check_grid(n, (gh, gw))
    raw = raw.contiguous()
    mu = torch.empty(b, gh, gw, h, r, 2, device=raw.device, dtype=torch.float32)
    sigma = torch.empty_like(mu)
    log_lam = torch.empty(b, gh, gw, h, r, device=raw.device, dtype=torch.float32)
    tau = torch.empty((), device=raw.device, dtype=torch.float32)
    fixed = (mu0.contiguous(), raw_sigma0.contiguous(), log_lam0.contiguous(), raw_tau)
    with _device_guard(raw):
        steer_launch(raw.view(b * n, -1), fixed, [gate_mu, gate_sigma, gate_lam], [bias_mu, bias_sigma, bias_lam],
                     offsets, max_offset, sigma_floor, (mu, sigma, log_lam, tau))()  # fmt: skip
    return mu, sigma, log_lam, tau


@steer.register_fake
def _(raw, mu0, raw_sigma0, log_lam0, raw_tau, gate_mu, gate_sigma, gate_lam, bias_mu, bias_sigma, bias_lam, offsets,
      max_offset, sigma_floor, gh, gw):  # fmt: skip
    b = raw.shape[0]
    h, r = log_lam0.shape
    mu = raw.new_empty((b, gh, gw, h, r, 2), dtype=torch.float32)
    return (
        mu,
        torch.empty_like(mu),
        raw.new_empty((b, gh, gw, h, r), dtype=torch.float32),
        raw.new_empty((), dtype=torch.float32),
    )


@torch.library.custom_op("ssog::steer_bwd", mutates_args=())
def steer_bwd(raw: Tensor, raw_sigma0: Tensor, raw_tau: Tensor, gate_mu: Tensor | None, gate_sigma: Tensor | None,
              gate_lam: Tensor | None, bias_mu: Tensor | None, bias_sigma: Tensor | None, bias_lam: Tensor | None,
              dmu: Tensor, dsigma: Tensor, dlog_lam: Tensor, dtau: Tensor, offsets: list[int], max_offset: float,
              sigma_floor: float) -> tuple[Tensor, Tensor]:  # fmt: skip
    """``(draw, partials)``: the raw probes' gradient and each program's partial sums of the parameters' gradients
    (layout in :mod:`ssog_core.ops.ssog_triton_steer`; the autograd formula sums them)."""

    b, n, p = raw.shape
    h, r = raw_sigma0.shape[:2]
    raw = raw.contiguous()
    dmu, dsigma, dlog_lam = _tokens(dmu, 3), _tokens(dsigma, 3), _tokens(dlog_lam, 2)
    if dmu.stride(-1) != 1 or dsigma.stride() != dmu.stride():
        dmu, dsigma = dmu.contiguous(), dsigma.contiguous()
    draw = torch.empty_like(raw)
    programs = triton.cdiv(b * n, _steer_config(h, r)["BLOCK"])
    partials = torch.empty(programs, 10 * h * r + 4, device=raw.device, dtype=torch.float32)
    with _device_guard(raw):
        steer_bwd_launch(raw.view(b * n, p), (raw_sigma0.contiguous(), raw_tau), [gate_mu, gate_sigma, gate_lam],
                         [bias_mu, bias_sigma, bias_lam], (dmu, dsigma, dlog_lam, dtau), offsets, max_offset,
                         sigma_floor, draw.view(b * n, p), partials)()  # fmt: skip
    return draw, partials


@steer_bwd.register_fake
def _(raw, raw_sigma0, raw_tau, gate_mu, gate_sigma, gate_lam, bias_mu, bias_sigma, bias_lam, dmu, dsigma, dlog_lam,
      dtau, offsets, max_offset, sigma_floor):  # fmt: skip
    b, n, _ = raw.shape
    h, r = raw_sigma0.shape[:2]
    programs = -(-(b * n) // _steer_config(h, r)["BLOCK"])
    return torch.empty_like(raw), raw.new_empty((programs, 10 * h * r + 4), dtype=torch.float32)


def _steer_setup(ctx, inputs, output) -> None:
    raw, mu0, raw_sigma0, log_lam0, raw_tau, *gates_biases, offsets, max_offset, sigma_floor, gh, gw = inputs
    ctx.save_for_backward(raw, raw_sigma0, raw_tau, *gates_biases)
    ctx.consts = (offsets, max_offset, sigma_floor)


def _steer_backward(ctx, dmu: Tensor, dsigma: Tensor, dlog_lam: Tensor, dtau: Tensor):
    raw, raw_sigma0, raw_tau, *gb = ctx.saved_tensors
    h, r = raw_sigma0.shape[:2]
    hr = h * r
    draw, partials = steer_bwd(raw, raw_sigma0, raw_tau, *gb, dmu, dsigma, dlog_lam, dtau, *ctx.consts)
    total = partials.sum(0)
    gates = [None if g is None else total[10 * hr + k] for k, g in enumerate(gb[:3])]
    starts = (5 * hr, 7 * hr, 9 * hr)
    biases = [None if t is None else total[s : s + t.numel()] for s, t in zip(starts, gb[3:], strict=True)]
    fixed = (total[: 2 * hr].view(h, r, 2), total[2 * hr : 4 * hr].view(h, r, 2), total[4 * hr : 5 * hr].view(h, r))
    return (draw, *fixed, total[10 * hr + 3], *gates, *biases, None, None, None, None, None)


steer.register_autograd(_steer_backward, setup_context=_steer_setup)


def apply_triton_steering(
    v: Tensor,
    raw: Tensor,
    widths: dict[str, int],
    fixed: tuple[Tensor, Tensor, Tensor, Tensor],
    gates: dict[str, Tensor],
    biases: dict[str, Tensor],
    max_offset: float,
    sigma_floor: float,
    grid: tuple[int, int],
) -> Tensor:
    """A steered layer's ``apply_triton(v, steer(fixed, bound(raw + bias), positive(gates)))`` in two custom ops,
    factorized: ``raw`` ``(B, N, P)`` holds the enabled taps' raw probe outputs one after another in the order of
    ``widths`` (tap → its width in ``P``), without their ``biases``; ``fixed`` is the fixed field's raw parameters
    ``(μ, raw σ, log λ, raw τ)`` and ``gates`` the taps' raw gate parameters (docs/KERNELS.md §2)."""
    starts, at = {}, 0
    for tap, width in widths.items():
        starts[tap], at = at, at + width
    offsets = [starts.get(tap, -1) for tap in STEER_TAPS]
    mu, sigma, log_lam, tau = steer(
        raw, *fixed, *(gates.get(t) for t in STEER_TAPS), *(biases.get(t) for t in STEER_TAPS), offsets,
        float(max_offset), float(sigma_floor), *grid,
    )  # fmt: skip
    if v.stride(-1) != 1:
        v = v.contiguous()
    return field_fwd(v, mu, sigma, log_lam, tau, *grid)[0]
