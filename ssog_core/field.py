"""The SSOG field: the one place where the Gaussian-atom math lives.

Every other part of the project (attention modules, Triton kernels, analysis, the app) calls these
functions, so the picture a user sees is the computation the model runs.

Conventions (docs/DESIGN.md §1):
    * tokens are the row-major raster of a ``Gh × Gw`` grid; positions are in grid cells;
    * displacements are **query minus key** (``dy = i − j``), so an atom with ``μy = +2`` reads the
      keys two rows *above* its query: where a head looks is ``query − μ``;
    * ``ℓ(d; μ, σ) = −½ log 2π − log σ − (d − μ)² / (2σ²)``; axis kernels are ``softmax_key(ℓ / τ)``.

Layouts: a :class:`Field` holds atoms either shared by every query (``mu`` is ``(H, R, 2)``) or one set
per query token (``mu`` is ``(B, Gh, Gw, H, R, 2)``). Axis kernels come back in one broadcastable layout,
``ay[b, i, w, h, r, j]`` (row pass) and ``ax[b, i, w, h, r, k]`` (column pass), with size-1 dimensions
where the field does not depend on them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable

EPS = 1e-4  # keeps softplus-parametrised widths and gate scales strictly positive
TAU_MIN = 0.5  # τ = softplus(raw) + 0.5: the field can sharpen, but never collapse to argmax
TAPS = ("mu", "sigma", "lambda")  # the three steering taps, in the order the ablation table lists them
FieldMode = Literal["factorized", "axial"]
FIELD_MODES = ("factorized", "axial")
MAX_ATOMS = 8  # atoms per head: the model's cap, and what the fused kernels are built for
LOG2E = 1.0 / math.log(2.0)  # the fast paths work in base 2: e^t = 2^(t·log2 e)

_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)


def positive(raw: Tensor, floor: float = 0.0) -> Tensor:
    """Unconstrained parameter → positive width or gate scale: ``softplus(raw) + ε + floor``."""
    return F.softplus(raw) + EPS + floor


def softplus_inverse(y: Tensor) -> Tensor:
    """``raw`` with ``softplus(raw) = y`` (``y > 0``), stable for small and large ``y``: the raw parameter of a
    :func:`positive` value ``y + ε + floor``."""
    return y + torch.log(-torch.expm1(-y))


def temperature(raw: Tensor) -> Tensor:
    """The layer's softmax temperature ``τ = softplus(raw) + 0.5`` (≥ 0.5)."""
    return F.softplus(raw) + TAU_MIN


def log_gauss(d: Tensor, mu: Tensor, sigma: Tensor) -> Tensor:
    """``log N(d; μ, σ²)`` with broadcasting."""
    return -_LOG_SQRT_2PI - torch.log(sigma) - (d - mu).square() / (2.0 * sigma.square())


@dataclass(frozen=True)
class Field:
    """The atoms of one attention layer.

    Attributes:
        mu: ``(..., H, R, 2)`` atom centres (y, x) in grid cells, as query − key displacements.
        sigma: ``(..., H, R, 2)`` atom widths in grid cells.
        log_lam: ``(..., H, R)`` unnormalised log mixture weights (λ = softmax over R).
        tau: ``()`` the layer temperature.

    The leading ``...`` is empty for a fixed field, or ``(B, Gh, Gw)`` once content has steered it.
    """

    mu: Tensor
    sigma: Tensor
    log_lam: Tensor
    tau: Tensor

    @property
    def per_token(self) -> bool:
        return self.mu.dim() == 6

    @property
    def num_heads(self) -> int:
        return self.mu.shape[-3]

    @property
    def num_atoms(self) -> int:
        return self.mu.shape[-2]

    def lam(self) -> Tensor:
        """Normalised mixture weights λ, ``(..., H, R)``."""
        return torch.softmax(self.log_lam, dim=-1)

    def to(self, dtype: torch.dtype) -> Field:
        return Field(self.mu.to(dtype), self.sigma.to(dtype), self.log_lam.to(dtype), self.tau.to(dtype))


def base_field(mu: Tensor, raw_sigma: Tensor, log_lambda: Tensor, raw_temperature: Tensor, sigma_floor: float) -> Field:
    """The learned, content-free field from its raw parameters."""
    return Field(mu, positive(raw_sigma, sigma_floor), log_lambda, temperature(raw_temperature))


class _Bound(torch.autograd.Function):
    """``tanh`` as ``2·sigmoid(2p) − 1``, with the backward pass ``g·(1 − y²)`` from the output: one saved tensor
    instead of the seven full-size operations autograd records for the composite (a d64 layer's probes hold 80
    values per token, and their bound was the largest single part of the steering's training cost). Out of place:
    under ``torch.compile`` an in-place operation in a ``forward`` can route the gradient to the wrong output
    (pytorch/pytorch#180642; tests/test_compile.py checks every autograd.Function of the package)."""

    @staticmethod
    def forward(ctx, probe: Tensor) -> Tensor:
        y = torch.sigmoid(probe * 2) * 2 - 1
        ctx.save_for_backward(y)
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor) -> Tensor:
        (y,) = ctx.saved_tensors
        return torch.addcmul(grad, grad * y, y, value=-1)


def bound(probe: Tensor, out: Tensor | None = None) -> Tensor:
    """The steering bound ``tanh``: raw probe outputs → (−1, 1), elementwise, what :func:`steer` takes.

    Computed as ``2·sigmoid(2p) − 1`` (the same function): on the CPU PyTorch's ``sigmoid`` is much cheaper than
    its ``tanh``, and so is the whole form (absolute error ≤ 2e-7 in fp32,
    below the rounding of the μ, σ and log λ it is added to). ``out`` (e.g. ``probe`` itself, when no gradient is
    needed) receives the result without a fresh buffer per step. Separate from :func:`steer` so that a caller
    holding every tap's probe outputs in one tensor bounds them in one pass (twice as fast as each tap's strided
    view).
    """
    if out is None and torch.is_grad_enabled() and probe.requires_grad:
        return _Bound.apply(probe)
    return torch.mul(probe, 2, out=out).sigmoid_().mul_(2).sub_(1)


def steer(field: Field, probes: dict[str, Tensor], scales: dict[str, Tensor], max_offset: float) -> Field:
    """Per-token field: bounded, gated residuals on μ, σ and λ ("lookat").

    Args:
        field: the fixed field, ``mu`` of shape ``(H, R, 2)``.
        probes: the linear-probe outputs per enabled tap, already bounded by :func:`bound` (``b = tanh(p)``):
            ``"mu"`` and ``"sigma"`` of shape ``(B, Gh, Gw, H, R, 2)``, ``"lambda"`` of shape
            ``(B, Gh, Gw, H, R)``. A missing tap leaves that part of the field fixed.
        scales: the positive gate scale ``s`` of each enabled tap.
        max_offset: bound ``M`` on how far content may move an atom, in grid cells.

    ``μ(t) = μ + s_μ·M·tanh(p_μ)``, ``σ(t) = σ·exp(s_σ·tanh(p_σ))``, ``log λ(t) = log λ + s_λ·tanh(p_λ)``; each
    one fused multiply-add per token (``σ(t)`` as ``exp(log σ + s_σ·b)``), which allocates one per-token tensor
    per tap instead of two or three.
    """
    if not probes:
        raise ValueError("steer() needs at least one probe; a field without taps is the fixed field")
    lead = next(iter(probes.values())).shape[:3]
    mu, sigma, log_lam = field.mu, field.sigma, field.log_lam
    if "mu" in probes:
        mu = torch.addcmul(mu, probes["mu"], scales["mu"] * max_offset)
    if "sigma" in probes:
        sigma = torch.addcmul(sigma.log(), probes["sigma"], scales["sigma"]).exp()
    if "lambda" in probes:
        log_lam = torch.addcmul(log_lam, probes["lambda"], scales["lambda"])
    h, r = field.num_heads, field.num_atoms
    return Field(
        mu.expand(*lead, h, r, 2),
        sigma.expand(*lead, h, r, 2),
        log_lam.expand(*lead, h, r),
        field.tau,
    )


def exp2_rate(sigma: Tensor, tau: Tensor | float = 1.0) -> Tensor:
    """``log2(e) / (2σ²τ)``: an atom's log-density (over τ) is ``−rate·(d − μ)²`` plus a constant, in base 2.

    With ``τ = 1`` it is the ``b`` of the axial kernels; with the field's τ the ``c`` of the factorized ones
    (docs/DESIGN.md §1.6). Every backend takes its kernel terms from here and :func:`exp2_log_weight`.
    """
    return (0.5 * LOG2E) / (sigma.square() * tau)


def exp2_log_weight(sigma: Tensor, log_lam: Tensor) -> Tensor:
    """``β = log2(e)·(log λ − log σ)`` per atom and axis (λ normalised over the atoms): the base-2 constant of
    an atom's term in an axial mixture, ``(..., R)`` → ``(..., R, 2)``."""
    return LOG2E * (torch.log_softmax(log_lam, dim=-1)[..., None] - torch.log(sigma))


@dataclass(frozen=True)
class AxisKernels:
    """Normalised 1D kernels of a field on a grid (module docstring for the layout).

    ``ay[b, i, w, h, r, j]``: weight of key row ``j`` for the row pass of token ``(i, w)``;
    ``ax[b, i, w, h, r, k]``: weight of key column ``k`` for the column pass of token ``(i, w)``;
    ``lam[b, i, w, h, r]``: atom weights (all ones with R = 1 in axial mode, where the atoms are
    already mixed inside each axis).
    """

    ay: Tensor
    ax: Tensor
    lam: Tensor


def _per_token(field: Field) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """μy, μx, σy, σx, log λ, each as ``(B', Gh', Gw', H, R)`` (size 1 where the field is shared)."""
    if field.per_token:
        mu, sigma, log_lam = field.mu, field.sigma, field.log_lam
    else:
        mu, sigma, log_lam = field.mu[None, None, None], field.sigma[None, None, None], field.log_lam[None, None, None]
    return mu[..., 0], mu[..., 1], sigma[..., 0], sigma[..., 1], log_lam


def _axis_log_density(n: int, axis: int, mu: Tensor, sigma: Tensor) -> Tensor:
    """``ℓ(q − k; μ, σ)`` for query coordinate q along grid ``axis`` (1 = rows, 2 = columns), keys 0..n-1.

    ``mu``/``sigma`` are ``(B', Gh', Gw', H, R)``; the result has the query axis expanded to ``n`` and a
    trailing key axis of length ``n``.
    """
    coords = torch.arange(n, device=mu.device, dtype=mu.dtype)
    shape = [1, 1, 1, 1, 1]
    shape[axis] = n
    d = coords.view(*shape, 1) - coords  # query − key, (1, n|1, 1|n, 1, 1, n)
    return log_gauss(d, mu[..., None], sigma[..., None])


def axis_kernels(field: Field, grid: tuple[int, int], mode: FieldMode = "factorized") -> AxisKernels:
    """The row and column kernels of ``field`` on a ``Gh × Gw`` grid (softmax over keys per query)."""
    gh, gw = grid
    mu_y, mu_x, s_y, s_x, log_lam = _per_token(field)
    log_ay = _axis_log_density(gh, 1, mu_y, s_y)
    log_ax = _axis_log_density(gw, 2, mu_x, s_x)
    if mode == "factorized":
        lam = torch.softmax(log_lam, dim=-1)
    elif mode == "axial":
        log_w = torch.log_softmax(log_lam, dim=-1)[..., None]
        log_ay = torch.logsumexp(log_w + log_ay, dim=-2, keepdim=True)
        log_ax = torch.logsumexp(log_w + log_ax, dim=-2, keepdim=True)
        lam = torch.ones_like(log_lam[..., :1])
    else:
        raise ValueError(f"unknown field mode {mode!r}; expected one of {FIELD_MODES}")
    tau = field.tau
    return AxisKernels(torch.softmax(log_ay / tau, dim=-1), torch.softmax(log_ax / tau, dim=-1), lam)


def check_grid(n_tokens: int, grid: tuple[int, int]) -> None:
    """Raise a clear error unless the tokens tile the grid exactly."""
    gh, gw = grid
    if gh < 1 or gw < 1 or n_tokens != gh * gw:
        raise ValueError(
            f"SSOG attention needs the tokens to tile the grid: got {n_tokens} tokens for a "
            f"{gh}×{gw} grid ({gh * gw} positions). Pass the grid the tokens were laid out on."
        )


def centre_query(grid: tuple[int, int]) -> tuple[int, int]:
    """The query cell every view calls "the centre" of a ``Gh × Gw`` grid: the middle cell of an odd side, the
    upper (left) one of the two middle cells of an even side, so each tab, figure and head marks the same patch."""
    return ((grid[0] - 1) // 2, (grid[1] - 1) // 2)


def apply_field(v: Tensor, field: Field, grid: tuple[int, int], mode: FieldMode = "factorized") -> Tensor:
    """Reference SSOG operator: two 1D filter passes per atom, then the λ mix.

    ``y[(i,w)] = Σ_r λ_r(i,w) Σ_k ax_r((i,w),k) Σ_j ay_r((i,k),j) v[(j,k)]``; the row kernel used for
    key column ``k`` is the one of token ``(i, k)``, exactly as the SSOG post's einsums compute it.

    Args:
        v: values ``(B, N, H, D)`` with ``N = Gh·Gw`` in row-major order.
    Returns:
        ``(B, N, H, D)``.
    """
    b, n, h, d = v.shape
    check_grid(n, grid)
    gh, gw = grid
    k = axis_kernels(field, grid, mode)
    ay, ax_lam = k.ay.to(v.dtype), (k.ax * k.lam[..., None]).to(v.dtype)
    y1 = torch.einsum("biwhrj,bjwhd->biwhrd", ay, v.view(b, gh, gw, h, d))
    y = torch.einsum("biwhrk,bikhrd->biwhd", ax_lam, y1)
    return y.reshape(b, n, h, d)


def attention_matrix(field: Field, grid: tuple[int, int], mode: FieldMode = "factorized", batch: int = 1) -> Tensor:
    """The exact ``(B, H, N, N)`` attention matrix, obtained by applying the operator to an identity basis."""
    gh, gw = grid
    n, h = gh * gw, field.num_heads
    b = field.mu.shape[0] if field.per_token else batch
    eye = torch.eye(n, device=field.mu.device, dtype=field.mu.dtype)
    basis = eye[None, :, None, :].expand(b, n, h, n)
    return apply_field(basis, field, grid, mode).permute(0, 2, 1, 3)


def query_field(field: Field, grid: tuple[int, int], query: tuple[int, int], mode: FieldMode = "factorized") -> Tensor:
    """One query's attention over the grid for a fixed field, ``(H, Gh, Gw)``: ``Σ_r λ_r ay_r[i] ⊗ ax_r[w]``.

    Cheap (no N×N work), used for live pictures; it equals row ``query`` of :func:`attention_matrix`.
    """
    if field.per_token:
        raise ValueError("query_field() takes a fixed field; use attention_matrix() for a steered one")
    i, w = query
    k = axis_kernels(field, grid, mode)
    ay = k.ay[0, i, 0]  # (H, R, Gh)
    ax = k.ax[0, 0, w]  # (H, R, Gw)
    lam = k.lam[0, 0, 0]  # (H, R)
    return torch.einsum("hr,hrj,hrk->hjk", lam, ay, ax)


def displacement_density(field: Field, extent: int | tuple[int, int], mode: FieldMode = "factorized") -> Tensor:
    """A head's field over relative position: the attention of the centre query of a
    ``(2E_y+1) × (2E_x+1)`` grid, ``(H, 2E_y+1, 2E_x+1)``.

    Index ``[h, E_y + oy, E_x + ox]`` is the weight of the key at offset ``(oy, ox) = key − query``, so
    an atom with centre μ shows up at offset ``−μ``.
    """
    ey, ex = (extent, extent) if isinstance(extent, int) else extent
    return query_field(field, (2 * ey + 1, 2 * ex + 1), (ey, ex), mode)
