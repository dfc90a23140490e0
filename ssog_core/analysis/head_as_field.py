"""A head as a field: how much of any attention head is a content-blind field over displacement, and which few
Gaussian atoms (an SSOG head's own kind of field) come closest to it.

The functions take post-softmax attention patterns ``(B, H, T, T)`` (prefix tokens first, then the ``Gh × Gw`` patch
tokens in raster order) with ``grid`` and ``num_prefix``, so they work for any model: a dot ViT, a converted timm
model or an SSOG model. Displacements are **query − key** (docs/DESIGN.md §1.1). Every quantity is over patch
queries, with rows restricted to patch keys and renormalised (``measures._patch_block``), except ``prefix_share``:

* :func:`positional_field` — the head's attention as a function of displacement, ``(H, 2Gh−1, 2Gw−1)``: each
  displacement averaged over the query–key pairs that have it and over images; :func:`field_rows` applies a field
  to every query (its values at the query's in-grid displacements, renormalised over those keys);
* :func:`mean_distance` — ``Σ_k A(q,k)·‖p_q − p_k‖`` in pixels between patch centres, averaged over queries and
  images (the ViT paper's mean attention distance);
* :func:`share_explained` — ``1 − mean TV`` between the head's rows and a content-blind field's rows (1: the head is
  that field); the same share of the *uniform* field (every in-grid key alike) is its baseline, and
  :func:`normalised` the part of the head's departure from uniform a field explains (0: no more than the uniform
  field, 1: the head itself; undefined, and marked *diffuse*, for a head within :data:`DIFFUSE_TV` of uniform);
  :func:`prefix_share` — the mass patch queries put on prefix tokens;
* :func:`fit_atoms` — K Gaussian atoms whose factorized SSOG field best matches the head's mean attention;
* :func:`mean_attention` — each layer's patch attention averaged over images (:class:`MeanAttention`, the one
  reduction every head field and ``replace_with_field`` are made from), with the prefix queries' mean rows and the
  patch queries' mean mass on each prefix token;
* :func:`measure_head_fields` — all of it for every layer of a model with ``blocks.{l}.attn.pattern`` hook points,
  on a batch of images or a batch iterator (grid, patch size and prefix read from the model and the images);
  :func:`fit_spec` opens a fitted head in the playground.

The positional field is the head's mean over the query–key pairs of each displacement: a description of the head,
not the content-blind field closest to it, which is why a fit can explain more of the head than it does.
"""

from __future__ import annotations

import dataclasses
import math
import re
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

from ssog_core.analysis.head_spec import GRID_RANGE, SIGMA_RANGE, HeadSpec, _head_spec
from ssog_core.analysis.measures import _eval, _grid_positions, _patch_block
from ssog_core.field import MAX_ATOMS, Field, axis_kernels
from ssog_core.nn.hook_points import HookPoint, hooked

FIT_ATOMS = 4  # Gaussian atoms fitted per head unless asked otherwise: the fields command, the app, replace_with_field
MAX_FIT_ATOMS = MAX_ATOMS  # a fit is an SSOG layer's field: the model's own cap
FIELD_BATCH = 16  # images per forward pass of every fit: the fields command, the app's fields, a distillation's
# (the same batches make the same mean attention bit for bit, hence the same atoms; other batches differ by rounding)
PATTERN_POINT = "blocks.{layer}.attn.pattern"  # the hook point holding a layer's post-softmax attention (B, H, T, T)
_PATTERN_NAME = re.compile(r"blocks\.(\d+)\.attn\.pattern")
FIT_STEPS = (20, 200)  # L-BFGS steps with every start, then with each head's best start only
LBFGS_HISTORY = 8  # curvature pairs kept per head
LBFGS_BACKTRACKS = 12  # trial steps, each a quarter of the last, before a head stays put
_LOG_SIGMA = (math.log(SIGMA_RANGE[0]), math.log(SIGMA_RANGE[1]))
DIFFUSE_TV = 0.1  # a head whose rows lie within this mean total variation of uniform is diffuse: no share normalises
LBFGS_TOLERANCE = 1e-13  # a head whose descent along its direction is below this (relative to the loss) has converged
FIT_CHUNK = 2**25  # float64 values a fit holds per (query, key) table across its starts: 256 MiB


# ------------------------------------------------------------------------------------------- on patterns


def patch_attention(pattern: Tensor, grid: tuple[int, int], num_prefix: int) -> tuple[Tensor, Tensor]:
    """``(B, H, N, N)`` patch-to-patch attention, rows renormalised over patch keys, and ``(B, H, N)`` the mass each
    patch query put on prefix tokens; float64. Refuses a pattern whose shape does not fit ``grid`` and the prefix."""
    gh, gw = grid
    if pattern.dim() != 4 or pattern.shape[-1] != pattern.shape[-2]:
        raise ValueError(f"an attention pattern is (B, H, T, T); got shape {tuple(pattern.shape)}")
    if num_prefix < 0 or gh < 1 or gw < 1 or pattern.shape[-1] != num_prefix + gh * gw:
        raise ValueError(
            f"the pattern has {pattern.shape[-1]} tokens, but {num_prefix} prefix tokens and a {gh}×{gw} grid make "
            f"{num_prefix + gh * gw}: pass the grid the patches were laid out on and the number of prefix tokens"
        )
    return _patch_block(pattern.double(), num_prefix)


def displacement_index(grid: tuple[int, int]) -> Tensor:
    """``(N, N)`` index of each (query, key) pair's displacement ``p_q − p_k`` in a flattened ``(2Gh−1) × (2Gw−1)``
    field (row ``Gh−1+dy``, column ``Gw−1+dx``)."""
    gh, gw = grid
    pos = _grid_positions(grid, torch.device("cpu"), torch.long)
    d = pos[:, None] - pos[None]  # (N, N, 2): query − key
    return (d[..., 0] + gh - 1) * (2 * gw - 1) + d[..., 1] + gw - 1


def field_of(mean_attn: Tensor, grid: tuple[int, int]) -> Tensor:
    """The positional field ``(H, 2Gh−1, 2Gw−1)`` of mean patch attention ``(H, N, N)``: each displacement's mean
    over the pairs that have it (the mean over images is linear, so it can come first)."""
    gh, gw = grid
    idx = displacement_index(grid).reshape(-1).to(mean_attn.device)
    size = (2 * gh - 1) * (2 * gw - 1)
    total = mean_attn.new_zeros(mean_attn.shape[0], size).index_add_(1, idx, mean_attn.reshape(mean_attn.shape[0], -1))
    count = torch.bincount(idx, minlength=size).to(mean_attn.dtype)
    return (total / count).reshape(-1, 2 * gh - 1, 2 * gw - 1)


def positional_field(pattern: Tensor, grid: tuple[int, int], num_prefix: int) -> Tensor:
    """The head's attention averaged over patch queries and images as a function of displacement (module doc)."""
    return field_of(patch_attention(pattern, grid, num_prefix)[0].mean(0), grid)


def field_rows(field: Tensor, grid: tuple[int, int]) -> Tensor:
    """A positional field ``(H, 2Gh−1, 2Gw−1)`` applied to every query: ``(H, N, N)``, each row the field at that
    query's in-grid displacements, renormalised over those keys."""
    rows = field.reshape(field.shape[0], -1)[:, displacement_index(grid).to(field.device)]
    return rows / rows.sum(-1, keepdim=True).clamp_min(1e-300)


def distance_px(mean_attn: Tensor, grid: tuple[int, int], patch: tuple[float, float]) -> Tensor:
    """``(H,)`` mean over queries of ``Σ_k A(q,k)·‖p_q − p_k‖``, in pixels for patches of ``patch = (h, w)`` pixels."""
    pos = _grid_positions(grid, mean_attn.device, mean_attn.dtype)
    pos = pos * torch.tensor(patch, device=mean_attn.device, dtype=mean_attn.dtype)
    return (mean_attn * torch.cdist(pos, pos)).sum(-1).mean(-1)


def mean_distance(pattern: Tensor, grid: tuple[int, int], num_prefix: int, patch: tuple[float, float]) -> Tensor:
    """``(H,)`` mean attention distance in pixels (module doc), over the patterns' images."""
    return distance_px(patch_attention(pattern, grid, num_prefix)[0].mean(0), grid, patch)


def prefix_share(pattern: Tensor, grid: tuple[int, int], num_prefix: int) -> Tensor:
    """``(H,)`` attention mass patch queries put on prefix tokens, averaged over queries and images."""
    return patch_attention(pattern, grid, num_prefix)[1].mean(dim=(0, 2))


def share_of(attn: Tensor, rows: Tensor) -> Tensor:
    """``(H,)`` ``1 − mean TV`` between patch rows ``attn`` ``(B, H, N, N)`` and a field's rows ``(H, N, N)``."""
    return 1.0 - 0.5 * (attn - rows.to(attn.dtype)).abs().sum(-1).mean(dim=(0, 2))


def uniform_rows(grid: tuple[int, int], heads: int = 1) -> Tensor:
    """``(heads, N, N)`` the uniform field's rows: every in-grid patch key alike, float64."""
    n = grid[0] * grid[1]
    return torch.full((heads, n, n), 1.0 / n, dtype=torch.float64)


def row_entropy(attn: Tensor) -> Tensor:
    """``(H,)`` mean entropy (nats) of patch rows ``(B, H, N, N)`` over queries and images; at most ``log N``."""
    return -(attn * attn.clamp_min(1e-300).log()).sum(-1).mean(dim=(0, 2))


def normalised(share: Tensor, uniform: Tensor) -> Tensor:
    """``(share − uniform) / (1 − uniform)``: the part of the head's distance from the uniform field that a field
    with this ``share`` closes (1 − TV to the field ÷ TV to uniform); NaN where the head is diffuse
    (``1 − uniform`` below :data:`DIFFUSE_TV`)."""
    gap = 1.0 - uniform
    return torch.where(gap >= DIFFUSE_TV, (share - uniform) / gap.clamp_min(1e-300), torch.full_like(share, math.nan))


def share_explained(pattern: Tensor, rows: Tensor, grid: tuple[int, int], num_prefix: int) -> Tensor:
    """``(H,)`` share of the head a content-blind field explains: 1 − the mean total-variation distance between the
    head's renormalised patch rows and the field's ``rows`` (``(H, N, N)``, e.g. :func:`field_rows` or
    :meth:`AtomFit.rows`), over patch queries and images."""
    return share_of(patch_attention(pattern, grid, num_prefix)[0], rows)


# ------------------------------------------------------------------------------------------- fitting atoms


@dataclass(frozen=True)
class AtomFit:
    """K Gaussian atoms per head, in grid cells, τ = 1 (the widths absorb a temperature: ``softmax(ℓ/τ)`` is the
    kernel of width ``σ·√τ``).

    Attributes:
        mu: ``(H, K, 2)`` centres (y, x) as query − key displacements; an atom looks at ``query − μ``.
        sigma: ``(H, K, 2)`` widths (y, x).
        lam: ``(H, K)`` weights λ (sum to 1).
        loss: ``(H,)`` the objective at the fit: mean over queries of ``−Σ_k Ā log Φ`` (nats).
    """

    mu: Tensor
    sigma: Tensor
    lam: Tensor
    loss: Tensor

    def field(self) -> Field:
        """The atoms as an SSOG layer's fixed field (one head per fitted head)."""
        one = torch.ones((), dtype=self.mu.dtype)
        return Field(self.mu, self.sigma, self.lam.clamp_min(1e-300).log(), one)

    def rows(self, grid: tuple[int, int]) -> Tensor:
        """``(H, N, N)`` the fitted field's attention of every query on ``grid``."""
        return _atom_rows(self.mu, self.sigma.log(), self.lam.clamp_min(1e-300).log(), grid)


def _atom_rows(mu: Tensor, log_sigma: Tensor, log_lam: Tensor, grid: tuple[int, int]) -> Tensor:
    """``(H, N, N)`` attention of a fixed factorized field, query by query: ``Σ_r λ_r·ay_r[i, j]·ax_r[w, k]`` for query
    ``(i, w)`` and key ``(j, k)``, the rows ``field.attention_matrix`` computes through the operator. One matrix
    product of :func:`_pair_factors` gives them in ``[(i, j), (w, k)]`` order (the fit reorders its target instead)."""
    gh, gw = grid
    rows = torch.bmm(*_pair_factors(mu, log_sigma, log_lam, grid)).view(-1, gh, gh, gw, gw)
    return rows.transpose(2, 3).reshape(mu.shape[0], gh * gw, gh * gw)


def _pair_factors(mu: Tensor, log_sigma: Tensor, log_lam: Tensor, grid: tuple[int, int]) -> tuple[Tensor, Tensor]:
    """``λ_r·ay_r[i, j]`` as ``(H, Gh·Gh, K)`` and ``ax_r[w, k]`` as ``(H, K, Gw·Gw)``, from
    :func:`ssog_core.field.axis_kernels` (each atom's row and column kernels normalised over the in-grid keys)."""
    gh, gw = grid
    k = axis_kernels(Field(mu, log_sigma.exp(), log_lam, torch.ones((), dtype=mu.dtype)), grid)
    ay = (k.ay[0, :, 0] * k.lam[0, 0, 0, ..., None]).permute(1, 0, 3, 2).reshape(-1, gh * gh, mu.shape[1])
    return ay, k.ax[0, 0].permute(1, 2, 0, 3).reshape(-1, mu.shape[1], gw * gw)


class _CrossEntropy(torch.autograd.Function):
    """``−Σ weights·log(a @ b)`` per head over the ``(M, Gh·Gh, Gw·Gw)`` table of pairs, the backward pass in one
    division and two products: autograd's chain of log, product and sum passes over that table (what the fit's time
    goes on) three more times."""

    @staticmethod
    def forward(ctx, a: Tensor, b: Tensor, weights: Tensor) -> Tensor:
        rows = torch.bmm(a, b)
        m = rows.shape[0]
        ctx.save_for_backward(a, b, weights, rows)
        return -torch.bmm(weights.view(m, 1, -1), rows.log().view(m, -1, 1)).view(m)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor) -> tuple[Tensor, Tensor, None]:
        a, b, weights, rows = ctx.saved_tensors
        g = weights.div(rows).mul_(-grad[:, None, None])
        return torch.bmm(g, b.transpose(1, 2)), torch.bmm(a.transpose(1, 2), g), None


def _starts(field: Tensor, weight: Tensor, atoms: int) -> list[tuple[Tensor, Tensor, Tensor]]:
    """Three deterministic starts ``(μ, log σ, log λ)`` per head from its positional field ``(H, 2Gh−1, 2Gw−1)`` and
    the mass at each displacement ``weight`` (field × pairs): the field's peaks (greedy, each peak's 3×3
    neighbourhood then left out) as tight atoms; every atom at the field's centre of mass with widths from a quarter
    to twice its spread; the highest peak tight with the rest broad around the centre of mass."""
    h, ny, nx = field.shape
    dy = torch.arange(ny, dtype=field.dtype) - (ny - 1) // 2
    dx = torch.arange(nx, dtype=field.dtype) - (nx - 1) // 2
    disp = torch.stack(torch.meshgrid(dy, dx, indexing="ij"), -1).reshape(-1, 2)  # (D, 2) query − key
    p = weight.reshape(h, -1) / weight.reshape(h, -1).sum(-1, keepdim=True)
    mean = p @ disp  # (H, 2)
    spread = (p @ disp.square() - mean.square()).clamp_min(0.25).sqrt()  # (H, 2)
    left = field.clone().reshape(h, ny, nx)
    peaks, heights = [], []
    for _ in range(atoms):
        flat = left.reshape(h, -1).argmax(-1)
        peaks.append(disp[flat])
        heights.append(left.reshape(h, -1).gather(1, flat[:, None])[:, 0].clamp_min(1e-12))
        y, x = flat // nx, flat % nx
        for oy in (-1, 0, 1):
            for ox in (-1, 0, 1):
                yy, xx = (y + oy).clamp(0, ny - 1), (x + ox).clamp(0, nx - 1)
                left[torch.arange(h), yy, xx] = -1.0
    peak_mu = torch.stack(peaks, 1)  # (H, K, 2)
    tight = torch.full((h, atoms, 2), -0.35, dtype=field.dtype)  # σ ≈ 0.7 cells
    scales = torch.logspace(-2, 1, atoms, base=2.0, dtype=field.dtype) if atoms > 1 else torch.ones(1)
    broad = (spread[:, None] * scales.to(field.dtype)[None, :, None]).log()
    centre = mean[:, None].expand(h, atoms, 2)
    flat_lam = torch.zeros(h, atoms, dtype=field.dtype)
    mixed_mu = torch.cat([peak_mu[:, :1], centre[:, 1:]], 1)
    mixed_sigma = torch.cat([tight[:, :1], broad[:, 1:]], 1)
    return [
        (peak_mu, tight, torch.stack(heights, 1).log()),
        (centre.clone(), broad, flat_lam),
        (mixed_mu, mixed_sigma, flat_lam.clone()),
    ]


def _lbfgs(
    weights: Tensor, grid: tuple[int, int], start: tuple[Tensor, Tensor, Tensor], steps: int
) -> tuple[tuple[Tensor, Tensor, Tensor], Tensor]:
    """``steps`` of L-BFGS on every head at once against the target's pair ``weights`` (:func:`fit_atoms`): the heads'
    losses are independent, so each head keeps its own curvature pairs (the last :data:`LBFGS_HISTORY`) and its own
    backtracking (Armijo) step, and a batch of heads costs one forward and backward per trial step."""
    shapes = [t.shape[1:] for t in start]
    x = torch.cat([t.reshape(t.shape[0], -1) for t in start], 1).detach().clone()  # (M, P)
    reach = torch.tensor([2.0 * grid[0], 2.0 * grid[1]], dtype=x.dtype)

    def unpack(flat: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """μ, log σ, log λ, each kept in range (flat, so the search stays in range too): μ within twice the grid,
        σ within the playground's [0.05, 64] cells."""
        parts, at = [], 0
        for shape in shapes:
            parts.append(flat[:, at : at + shape.numel()].reshape(-1, *shape))
            at += shape.numel()
        mu, log_sigma, log_lam = parts
        return mu.clamp(-reach, reach), log_sigma.clamp(*_LOG_SIGMA), log_lam

    def value_and_grad(flat: Tensor, heads: Tensor) -> tuple[Tensor, Tensor]:
        """Losses and gradients of the rows ``heads`` of ``flat``."""
        flat = flat.detach().requires_grad_(True)
        w = weights if len(heads) == len(weights) else weights[heads]
        loss = _cross_entropy(w, _pair_factors(*unpack(flat), grid))
        (grad,) = torch.autograd.grad(loss.sum(), flat)
        return loss.detach(), grad

    f, g = value_and_grad(x, torch.arange(len(x)))
    pairs_s, pairs_y = [], []
    for _ in range(steps):
        d = _two_loop(g, pairs_s, pairs_y)
        slope = (g * d).sum(-1)
        uphill = slope >= 0
        d = torch.where(uphill[:, None], -g, d)
        slope = torch.where(uphill, -(g * g).sum(-1), slope)
        trying = -slope > LBFGS_TOLERANCE * f.abs().clamp_min(1.0)  # the rest has no descent left above rounding
        if not bool(trying.any()):
            break
        t = torch.ones_like(f) if pairs_s else (1.0 / g.abs().sum(-1).clamp_min(1.0))
        f_new, g_new = f.clone(), g.clone()
        for _ in range(LBFGS_BACKTRACKS):  # only the heads still without a better point are evaluated again
            heads = trying.nonzero()[:, 0]
            if len(heads) == 0:
                break
            f_new[heads], g_new[heads] = value_and_grad(x[heads] + t[heads, None] * d[heads], heads)
            worse = f_new[heads] > f[heads] + 1e-4 * t[heads] * slope[heads]
            trying[heads] = worse
            t[heads[worse]] /= 4
        stay = trying | (f_new == f)  # no better point found: the head stays where it is
        t[stay], f_new[stay], g_new[stay] = 0.0, f[stay], g[stay]
        step = t[:, None] * d
        pairs_s.append(step)
        pairs_y.append(g_new - g)
        del pairs_s[:-LBFGS_HISTORY], pairs_y[:-LBFGS_HISTORY]
        x, f, g = x + step, f_new, g_new
    return unpack(x), f


def _two_loop(g: Tensor, pairs_s: list[Tensor], pairs_y: list[Tensor]) -> Tensor:
    """The L-BFGS direction ``−H·g`` per head (row) from its curvature pairs; pairs with ``s·y ≤ 0`` are skipped."""
    q, alphas = g.clone(), []
    rhos = []
    for s, y in zip(pairs_s, pairs_y, strict=True):
        sy = (s * y).sum(-1)
        rhos.append(torch.where(sy > 1e-12, 1.0 / sy.clamp_min(1e-12), torch.zeros_like(sy)))
    for s, y, rho in reversed(list(zip(pairs_s, pairs_y, rhos, strict=True))):
        a = rho * (s * q).sum(-1)
        q -= a[:, None] * y
        alphas.append(a)
    if pairs_s:
        s, y = pairs_s[-1], pairs_y[-1]
        yy = (y * y).sum(-1)
        gamma = torch.where((rhos[-1] > 0) & (yy > 0), (s * y).sum(-1) / yy.clamp_min(1e-300), torch.ones_like(yy))
        q *= gamma[:, None]
    for (s, y, rho), a in zip(zip(pairs_s, pairs_y, rhos, strict=True), reversed(alphas), strict=True):
        b = rho * (y * q).sum(-1)
        q += (a - b)[:, None] * s
    return -q


def _cross_entropy(weights: Tensor, factors: tuple[Tensor, Tensor]) -> Tensor:
    """``(M,)`` ``−Σ weights·log rows`` over every (query, key) pair of the field whose :func:`_pair_factors` are
    given; each factor is raised by 1e-150, so no row underflows to a zero the logarithm cannot take."""
    a, b = factors
    return _CrossEntropy.apply(a + 1e-150, b + 1e-150, weights)


def check_atoms(atoms: int) -> int:
    """``atoms`` as a whole number from 1 to :data:`MAX_FIT_ATOMS`; a clear error otherwise."""
    if isinstance(atoms, bool) or int(atoms) != atoms or not 1 <= atoms <= MAX_FIT_ATOMS:
        raise ValueError(f"fit 1 to {MAX_FIT_ATOMS} atoms per head, got {atoms}")
    return int(atoms)


def fit_atoms(mean_attn: Tensor, grid: tuple[int, int], atoms: int) -> AtomFit:
    """K Gaussian atoms per head whose factorized field (τ = 1) best matches the heads' patch attention.

    ``mean_attn`` is ``(H, N, N)``: each head's renormalised patch-to-patch rows averaged over images. The objective
    is the mean over patch queries and images of ``KL(A_q ‖ Φ_q)`` between the head's rows and the field's;
    ``−Σ_k Ā log Φ`` differs from it by the rows' entropy alone, so the image mean ``Ā`` is a sufficient statistic
    and the fit never touches an image. Parameters are unconstrained (μ, log σ, logits of λ), float64. Each head
    starts from three deterministic starts (:func:`_starts`), all run for :data:`FIT_STEPS` ``[0]`` steps of L-BFGS
    (per head: its own curvature and step), and the best of them for up to ``[1]`` more; a head stops once it has
    no descent left. μ is kept within twice the grid and σ within the playground's [0.05, 64] cells.
    """
    check_atoms(atoms)
    gh, gw = grid
    if mean_attn.dim() != 3 or mean_attn.shape[-2:] != (gh * gw, gh * gw):
        raise ValueError(f"mean attention is (H, N, N) with N = {gh}·{gw}; got shape {tuple(mean_attn.shape)}")
    target = mean_attn.detach().double().cpu()
    size = max(1, FIT_CHUNK // (3 * target[0].numel()))
    if target.shape[0] > size:  # heads are independent: a chunk at a time bounds the memory
        fits = [fit_atoms(part, grid, atoms) for part in target.split(size)]
        return AtomFit(*(torch.cat([getattr(f, n) for f in fits]) for n in ("mu", "sigma", "lam", "loss")))
    field = field_of(target, grid)
    count = torch.bincount(displacement_index(grid).reshape(-1), minlength=field[0].numel()).to(field.dtype)
    starts = _starts(field, field * count.reshape(field.shape[1:]), atoms)
    h = target.shape[0]
    weights = target.view(h, gh, gw, gh, gw).transpose(2, 3).reshape(h, gh * gh, gw * gw) / (gh * gw)
    with torch.enable_grad():
        stacked = tuple(torch.cat(parts) for parts in zip(*starts, strict=True))
        tried, loss = _lbfgs(weights.repeat(len(starts), 1, 1), grid, stacked, FIT_STEPS[0])
        best = loss.view(len(starts), h).argmin(0) * h + torch.arange(h)
        params, loss = _lbfgs(weights, grid, tuple(t[best] for t in tried), FIT_STEPS[1])
    mu, log_sigma, log_lam = params
    return AtomFit(mu, log_sigma.exp(), torch.softmax(log_lam, -1), loss)


def fit_spec(fit: AtomFit, head: int, grid: tuple[int, int]) -> HeadSpec:
    """Fitted head ``head`` of a model on a ``Gh × Gw`` ``grid`` as the playground's :class:`HeadSpec`: τ = 1, on the
    displacement grid ``(2Gh−1) × (2Gw−1)`` (kept within the playground's sizes) with the ★ at its centre and the
    atoms at ``★ − μ``, as :func:`~ssog_core.analysis.head_spec.spec_from_head` opens an SSOG head."""
    lo, hi = GRID_RANGE
    spec_grid = (min(max(2 * grid[0] - 1, lo), hi), min(max(2 * grid[1] - 1, lo), hi))
    star = ((spec_grid[0] - 1) // 2, (spec_grid[1] - 1) // 2)
    return _head_spec(spec_grid, star, fit.mu[head], fit.sigma[head], fit.lam[head], 1.0, "factorized")


# ------------------------------------------------------------------------------------------- a model's heads


@dataclass
class HeadFieldStats:
    """Every head of a model as a field, measured over ``images`` images (all ``(L, H)`` unless noted, float64).

    Attributes:
        mean_distance_px: mean attention distance in pixels (:func:`mean_distance`).
        share_fit, share_field: share explained by the fitted atoms and by the positional field.
        share_uniform: the same share of the uniform field, the baseline every share is read against
            (:meth:`normalised_fit`, :meth:`normalised_field`, :attr:`diffuse`).
        entropy: mean entropy (nats) of the head's patch rows; its maximum is ``log N`` (:attr:`max_entropy`).
        prefix_share: mass patch queries put on prefix tokens.
        field: ``(L, H, 2Gh−1, 2Gw−1)`` positional fields.
        fits: one :class:`AtomFit` per layer.
        pictures: what the images were, as their chooser describes them (e.g. ``{"data": "layouts", "split":
            "validation", "first": 64}``; empty when the caller did not say).
        measured_on: the same in words, for every figure and note made from these numbers.
    """

    grid: tuple[int, int]
    patch: tuple[float, float]
    num_prefix: int
    images: int
    mean_distance_px: Tensor
    share_fit: Tensor
    share_field: Tensor
    share_uniform: Tensor
    entropy: Tensor
    prefix_share: Tensor
    field: Tensor
    fits: list[AtomFit]
    pictures: dict[str, Any] = dataclasses.field(default_factory=dict)
    measured_on: str = ""

    @property
    def normalised_fit(self) -> Tensor:
        """``(L, H)`` share_fit against the uniform baseline (:func:`normalised`; NaN for a diffuse head)."""
        return normalised(self.share_fit, self.share_uniform)

    @property
    def normalised_field(self) -> Tensor:
        """``(L, H)`` share_field against the uniform baseline (:func:`normalised`; NaN for a diffuse head)."""
        return normalised(self.share_field, self.share_uniform)

    @property
    def diffuse(self) -> Tensor:
        """``(L, H)`` whether a head lies within :data:`DIFFUSE_TV` of the uniform field (no share normalises)."""
        return (1.0 - self.share_uniform) < DIFFUSE_TV

    @property
    def max_entropy(self) -> float:
        """``log N``: the entropy of the uniform field's rows."""
        return math.log(self.grid[0] * self.grid[1])

    @property
    def atoms(self) -> int:
        """Atoms fitted per head."""
        return int(self.fits[0].mu.shape[1])

    @property
    def size(self) -> tuple[int, int]:
        """The images' size in pixels ``(H, W)``."""
        return round(self.grid[0] * self.patch[0]), round(self.grid[1] * self.patch[1])


def pattern_points(model: nn.Module) -> list[HookPoint]:
    """The model's ``blocks.{l}.attn.pattern`` hook points, by layer; a clear error when it has none."""
    found = {}
    for name, m in model.named_modules():
        match = _PATTERN_NAME.fullmatch(name)
        if match and isinstance(m, HookPoint):
            found[int(match.group(1))] = m
    if not found or sorted(found) != list(range(len(found))):
        raise ValueError(
            f"this model has no attention pattern hook points {PATTERN_POINT.format(layer='{l}')} for every layer "
            f"(found layers {sorted(found)}): head fields need the post-softmax attention of each layer"
        )
    return [found[layer] for layer in range(len(found))]


def reduce_patterns(model: nn.Module, batches: Iterable[Tensor], reduce: Callable[[int, Tensor], None]) -> int:
    """Run ``model`` on every batch with ``reduce(layer, pattern)`` at each pattern point (so no layer's pattern
    outlives its own block); returns the number of images."""
    points = pattern_points(model)

    def keep(layer: int) -> Callable[[Tensor], Tensor]:
        def fn(pattern: Tensor) -> Tensor:
            reduce(layer, pattern)
            return pattern

        return fn

    images = 0
    with _eval(), hooked({id(p): keep(layer) for layer, p in enumerate(points)}):
        for x in batches:
            model(x)
            images += x.shape[0]
    return images


class MeanAttention:
    """One layer's patch attention (rows renormalised over patch keys) averaged over images, ``(H, N, N)`` float64,
    and the mass patch queries put on prefix tokens ``(H,)``: the sufficient statistics of each head's positional
    field, its atom fit and its mean distance, made by :func:`mean_attention`. :meth:`fit` and :meth:`rows` make
    the fits and rows from it, once each, and keep them. ``prefix_rows`` ``(H, P, P + N)`` are the prefix queries'
    mean rows and ``prefix_mass`` ``(H, N, P)`` each patch query's mean mass on each prefix token: what a
    content-blind replacement puts where no displacement applies."""

    def __init__(
        self,
        mean: Tensor,
        grid: tuple[int, int],
        num_prefix: int,
        images: int,
        prefix_share: Tensor | None = None,
        patch: tuple[float, float] = (1.0, 1.0),
        prefix_rows: Tensor | None = None,
        prefix_mass: Tensor | None = None,
    ):
        self.mean, self.grid, self.num_prefix, self.images = mean, grid, num_prefix, images
        heads, n = mean.shape[0], mean.shape[-1]
        self.prefix_share = mean.new_zeros(heads) if prefix_share is None else prefix_share
        self.prefix_rows = mean.new_zeros(heads, num_prefix, num_prefix + n) if prefix_rows is None else prefix_rows
        self.prefix_mass = mean.new_zeros(heads, n, num_prefix) if prefix_mass is None else prefix_mass
        self.patch = patch
        self._fits: dict[int, AtomFit] = {}
        self._rows: dict[tuple[str, int], Tensor] = {}
        self._lock = threading.RLock()  # threads sharing the model share its values: one fit each

    def fit(self, atoms: int) -> AtomFit:
        """Each head's ``atoms``-atom fit (:func:`fit_atoms`), made once."""
        with self._lock:
            if atoms not in self._fits:
                with torch.inference_mode(False):  # the fit needs gradients, whatever mode its first caller is in
                    self._fits[atoms] = fit_atoms(self.mean.clone(), self.grid, atoms)
            return self._fits[atoms]

    def rows(self, replacement: str, atoms: int) -> Tensor:
        """``(H, N, N)`` float64: every patch query's row of each head's positional field (``"field"``) or of its
        ``atoms``-atom fit (``"fit"``), over the in-grid patch keys."""
        key = (replacement, atoms if replacement == "fit" else 0)
        with self._lock:
            if key not in self._rows:
                with torch.inference_mode(False):
                    if replacement == "field":
                        rows = field_rows(field_of(self.mean.clone(), self.grid), self.grid)
                    else:
                        rows = self.fit(atoms).rows(self.grid)
                self._rows[key] = rows.detach()
            return self._rows[key]


def mean_attention(model: nn.Module, batches: Iterable[Tensor]) -> list[MeanAttention]:
    """Per layer, the model's patch attention averaged over the images ``batches`` yields (all of one size: the grid
    is the model's for that size, the prefix the model's own), read at the ``blocks.{l}.attn.pattern`` points with
    each layer's patterns reduced as its block runs: one forward per batch for every layer."""
    sums: dict[int, list[Tensor]] = {}
    sizes: list[tuple[int, int]] = []
    prefix = int(model.num_prefix_tokens)

    def sized() -> Iterator[Tensor]:
        for x in batches:
            size = (int(x.shape[-2]), int(x.shape[-1]))
            if sizes and size != sizes[0]:
                grids = [model.grid_for(*s) for s in (sizes[0], size)]
                raise ValueError(f"the mean attention needs images of one size, got grids {grids[0]} and {grids[1]}")
            sizes[:] = [size]
            yield x

    def add(layer: int, pattern: Tensor) -> None:
        attn, share = patch_attention(pattern, model.grid_for(*sizes[0]), prefix)
        full = pattern.double()
        more = [attn.sum(0), share.mean(-1).sum(0), full[:, :, :prefix].sum(0), full[:, :, prefix:, :prefix].sum(0)]
        sums[layer] = more if layer not in sums else [a + b for a, b in zip(sums[layer], more, strict=True)]

    images = reduce_patterns(model, sized(), add)
    if images == 0:
        raise ValueError("the mean attention needs at least one image")
    grid = model.grid_for(*sizes[0])
    patch = (sizes[0][0] / grid[0], sizes[0][1] / grid[1])
    means = [[t.cpu() / images for t in sums[i]] for i in range(len(sums))]
    return [MeanAttention(m[0], grid, prefix, images, m[1], patch, m[2], m[3]) for m in means]


def fit_layers(attention: list[MeanAttention], atoms: int) -> list[AtomFit]:
    """Every layer's ``atoms``-atom fit, the missing ones made together (all heads of all layers in one batch for
    the optimiser) and kept with each layer's :class:`MeanAttention`."""
    missing = [a for a in attention if atoms not in a._fits]
    if missing:
        every = fit_atoms(torch.cat([a.mean for a in missing]), attention[0].grid, atoms)
        per_layer = (t.split(missing[0].mean.shape[0]) for t in (every.mu, every.sigma, every.lam, every.loss))
        for a, parts in zip(missing, zip(*per_layer, strict=True), strict=True):
            with a._lock:
                a._fits.setdefault(atoms, AtomFit(*parts))
    return [a.fit(atoms) for a in attention]


Images = Tensor | Callable[[], Iterable[Tensor]]  # a batch (B, C, H, W), or batches made afresh for each pass


def _passes(model: nn.Module, images: Images) -> Callable[[], Iterable[Tensor]]:
    """``images`` as batches made afresh for each pass (a tensor: :data:`FIELD_BATCH` at a time, on the model's
    device and in its dtype)."""
    if not isinstance(images, Tensor):
        return images
    p = next(model.parameters())
    return lambda: iter(images.to(p.device, p.dtype).split(FIELD_BATCH))


def measure_head_fields(
    model: nn.Module, images: Images, atoms: int = FIT_ATOMS, *, attention: list[MeanAttention] | None = None
) -> HeadFieldStats:
    """Every head of ``model`` as a field with ``atoms`` fitted atoms, over ``images`` (a batch ``(B, C, H, W)``, or
    a callable returning batches, called once per pass). The grid, patch size and prefix come from the model and
    the images' size.

    The first pass is :func:`mean_attention` (skipped when ``attention``, its result on the same images, is given):
    each layer's mean patch attention and prefix share, the sufficient statistics of the positional field, the
    distance and the fit; the atoms are fitted to them (:func:`fit_layers`); the second pass measures both fields'
    shares image by image. Each pattern is reduced as its block runs, so no layer's patterns are ever kept.
    """
    atoms = check_atoms(atoms)
    pattern_points(model)  # a model without them is refused before any image is made
    passes = _passes(model, images)
    attention = mean_attention(model, passes()) if attention is None else attention
    grid, num_prefix, count = attention[0].grid, attention[0].num_prefix, attention[0].images
    fields = [field_of(a.mean, grid) for a in attention]
    fits = fit_layers(attention, atoms)
    rows = [(fit.rows(grid), field_rows(f, grid)) for fit, f in zip(fits, fields, strict=True)]
    flat = uniform_rows(grid)
    shares: dict[int, Tensor] = {}

    def second(layer: int, pattern: Tensor) -> None:
        attn = patch_attention(pattern, grid, num_prefix)[0]
        fit_rows, pos_rows = (r.to(attn.device) for r in rows[layer])
        each = [share_of(attn, fit_rows), share_of(attn, pos_rows), share_of(attn, flat.to(attn.device))]
        add = torch.stack([*each, row_entropy(attn)]).cpu() * attn.shape[0]
        shares[layer] = add if layer not in shares else shares[layer] + add

    if reduce_patterns(model, passes(), second) != count:
        raise ValueError("the second pass over the images saw other images than the first")
    share = torch.stack([shares[layer] for layer in range(len(attention))]) / count  # (L, 4, H)
    return HeadFieldStats(
        grid=grid,
        patch=attention[0].patch,
        num_prefix=num_prefix,
        images=count,
        mean_distance_px=torch.stack([distance_px(a.mean, grid, attention[0].patch) for a in attention]),
        share_fit=share[:, 0],
        share_field=share[:, 1],
        share_uniform=share[:, 2],
        entropy=share[:, 3],
        prefix_share=torch.stack([a.prefix_share for a in attention]),
        field=torch.stack(fields),
        fits=fits,
    )
