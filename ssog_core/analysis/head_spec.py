"""One attention head built by hand: the head playground's model, evaluated by the field code itself.

A :class:`HeadSpec` is what a person edits: a grid, a ★ query, the temperature and 1–8 atoms placed where
they look (key coordinates, grid cells), each with its widths and weight. :func:`evaluate` turns it into a
:class:`~ssog_core.field.Field` (``μ = query − key``, docs/DESIGN.md §1) and returns what the playground draws:
the query's 2D field, the row and column kernels, and the query's entropy and effective radius. Specs are
plain JSON (:meth:`HeadSpec.to_dict`), so a browser canvas, a session file and the CLI share them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import Tensor

from ssog_core.analysis.measures import LayerField, query_stats
from ssog_core.field import FIELD_MODES, MAX_ATOMS, TAU_MIN, Field, axis_kernels, centre_query, query_field

GRID_RANGE = (3, 96)  # smallest grid with a neighbourhood; largest a browser canvas still draws cell by cell
SIGMA_RANGE = (0.05, 64.0)  # grid cells
WEIGHT_RANGE = (1e-4, 1e4)  # relative atom weights; λ = w / Σw
TAU_RANGE = (TAU_MIN, 10.0)


@dataclass(frozen=True)
class Atom:
    """One Gaussian: where it looks (key cell ``(y, x)``), its widths σ and its relative weight."""

    y: float
    x: float
    sy: float
    sx: float
    w: float


@dataclass(frozen=True)
class HeadSpec:
    """A hand-made head on a ``Gh × Gw`` grid, seen from one query."""

    grid: tuple[int, int]
    query: tuple[int, int]
    tau: float
    atoms: tuple[Atom, ...]
    mode: str = "factorized"

    def __post_init__(self) -> None:
        problems = []
        gh, gw = self.grid
        lo, hi = GRID_RANGE
        if not (lo <= gh <= hi and lo <= gw <= hi):
            problems.append(f"grid {gh}×{gw} must be between {lo} and {hi} cells per side")
        qy, qx = self.query
        if not (0 <= qy < gh and 0 <= qx < gw):
            problems.append(f"query {self.query} lies outside the {gh}×{gw} grid")
        if not TAU_RANGE[0] <= self.tau <= TAU_RANGE[1]:
            problems.append(f"τ={self.tau} must be in [{TAU_RANGE[0]}, {TAU_RANGE[1]}]")
        if not 1 <= len(self.atoms) <= MAX_ATOMS:
            problems.append(f"a head has 1 to {MAX_ATOMS} atoms, got {len(self.atoms)}")
        for i, a in enumerate(self.atoms):
            if not all(math.isfinite(v) for v in (a.y, a.x, a.sy, a.sx, a.w)):
                problems.append(f"atom {i + 1} has a non-finite number")
            elif not (SIGMA_RANGE[0] <= a.sy <= SIGMA_RANGE[1] and SIGMA_RANGE[0] <= a.sx <= SIGMA_RANGE[1]):
                problems.append(f"atom {i + 1}: σ must be in [{SIGMA_RANGE[0]}, {SIGMA_RANGE[1]}] cells")
            elif not WEIGHT_RANGE[0] <= a.w <= WEIGHT_RANGE[1]:
                problems.append(f"atom {i + 1}: weight must be in [{WEIGHT_RANGE[0]}, {WEIGHT_RANGE[1]}]")
        if self.mode not in FIELD_MODES:
            problems.append(f"mode {self.mode!r} is not one of {FIELD_MODES}")
        if problems:
            raise ValueError("invalid head: " + "; ".join(problems))

    @classmethod
    def from_dict(cls, d: Any) -> HeadSpec:
        """Parse the JSON form (as the canvas and session files hold it); raises ``ValueError`` with reasons."""
        if not isinstance(d, dict):
            raise ValueError(f"a head must be a JSON object, got {type(d).__name__}")
        try:
            atoms = tuple(
                Atom(float(a["y"]), float(a["x"]), float(a["sy"]), float(a["sx"]), float(a["w"])) for a in d["atoms"]
            )
            grid = (int(d["grid"][0]), int(d["grid"][1]))
            query = (int(round(float(d["query"][0]))), int(round(float(d["query"][1]))))
            return cls(grid, query, float(d["tau"]), atoms, str(d.get("mode", "factorized")))
        except (KeyError, TypeError, IndexError) as e:
            raise ValueError(f"a head needs grid, query, tau and atoms with y, x, sy, sx, w: {e!r}") from None

    def to_dict(self) -> dict[str, Any]:
        return {
            "grid": list(self.grid),
            "query": list(self.query),
            "tau": self.tau,
            "mode": self.mode,
            "atoms": [{"y": a.y, "x": a.x, "sy": a.sy, "sx": a.sx, "w": a.w} for a in self.atoms],
        }

    # ---- edits: each returns a new, validated spec (a spec is never changed in place)

    def with_grid(self, grid: tuple[int, int]) -> HeadSpec:
        """The head on a ``grid`` of another size: the ★ goes to the same relative place on it (cell centres
        scale) and every atom keeps its offset μ from the ★, so the field's shape is unchanged."""
        gh, gw = (int(n) for n in grid)
        query = (rescale_cell(self.query[0], self.grid[0], gh), rescale_cell(self.query[1], self.grid[1], gw))
        return self._moved(query, (gh, gw))

    def move_query(self, query: tuple[int, int]) -> HeadSpec:
        """The ★ moved to cell ``query``; the atoms move with it (their offsets μ = ★ − key stay the same)."""
        return self._moved((int(query[0]), int(query[1])), self.grid)

    def _moved(self, query: tuple[int, int], grid: tuple[int, int]) -> HeadSpec:
        dy, dx = query[0] - self.query[0], query[1] - self.query[1]
        atoms = tuple(replace(a, y=a.y + dy, x=a.x + dx) for a in self.atoms)
        return replace(self, grid=grid, query=query, atoms=atoms)

    def add_atom(self, atom: Atom) -> HeadSpec:
        """One more atom (last in the list); a head has at most :data:`MAX_ATOMS`."""
        if len(self.atoms) >= MAX_ATOMS:
            raise ValueError(f"a head has at most {MAX_ATOMS} atoms")
        return replace(self, atoms=(*self.atoms, atom))

    def remove_atom(self, index: int) -> HeadSpec:
        """The head without atom ``index`` (0-based); a head keeps at least one atom."""
        self._check_index(index)
        if len(self.atoms) <= 1:
            raise ValueError("a head needs at least one atom")
        return replace(self, atoms=self.atoms[:index] + self.atoms[index + 1 :])

    def with_atom(self, index: int, **changes: float) -> HeadSpec:
        """Atom ``index`` with some of its numbers (``y``, ``x``, ``sy``, ``sx``, ``w``) changed."""
        self._check_index(index)
        unknown = set(changes) - {"y", "x", "sy", "sx", "w"}
        if unknown:
            raise ValueError(f"an atom has y, x, sy, sx and w, not {', '.join(sorted(unknown))}")
        atom = replace(self.atoms[index], **{k: float(v) for k, v in changes.items()})
        return replace(self, atoms=self.atoms[:index] + (atom,) + self.atoms[index + 1 :])

    def _check_index(self, index: int) -> None:
        if not (isinstance(index, int) and 0 <= index < len(self.atoms)):
            raise ValueError(f"atom index {index!r} does not exist: the head has {len(self.atoms)} atoms (0-based)")

    def field(self) -> Field:
        """The spec as a one-head fixed field: ``μ = query − key``, ``log λ = log w``."""
        qy, qx = self.query
        mu = torch.tensor([[[qy - a.y, qx - a.x] for a in self.atoms]], dtype=torch.float64)
        sigma = torch.tensor([[[a.sy, a.sx] for a in self.atoms]], dtype=torch.float64)
        log_lam = torch.log(torch.tensor([[a.w for a in self.atoms]], dtype=torch.float64))
        return Field(mu, sigma, log_lam, torch.tensor(self.tau, dtype=torch.float64))


@dataclass
class HeadView:
    """Everything the playground shows for a spec (numpy-free tensors, float64, CPU).

    Attributes:
        density: ``(Gh, Gw)`` the ★ query's attention over keys (sums to 1).
        row: ``(R', Gh)`` per-atom row-pass kernels of the query (R' = 1 in axial mode).
        col: ``(R', Gw)`` per-atom column-pass kernels of the query.
        row_marginal, col_marginal: ``(Gh,)``, ``(Gw,)`` the density summed over columns / rows.
        mu: ``(R, 2)`` atom centres as query − key displacements.
        lam: ``(R,)`` normalised weights λ.
        width: ``(R, 2)`` effective per-axis width of each atom's softmax kernel, ``σ·√τ``.
        entropy, radius: the query's attention entropy (nats) and effective radius (cells).
    """

    density: Tensor
    row: Tensor
    col: Tensor
    row_marginal: Tensor
    col_marginal: Tensor
    mu: Tensor
    lam: Tensor
    width: Tensor
    entropy: float
    radius: float


def evaluate(spec: HeadSpec) -> HeadView:
    """Evaluate the spec with :mod:`ssog_core.field` (the code the models run)."""
    field = spec.field()
    qy, qx = spec.query
    density = query_field(field, spec.grid, spec.query, spec.mode)[0]
    k = axis_kernels(field, spec.grid, spec.mode)
    stats = query_stats(density, spec.query)
    return HeadView(
        density=density,
        row=k.ay[0, qy, 0, 0],
        col=k.ax[0, 0, qx, 0],
        row_marginal=density.sum(1),
        col_marginal=density.sum(0),
        mu=field.mu[0],
        lam=field.lam()[0],
        width=field.sigma[0] * field.tau.sqrt(),
        entropy=float(stats["entropy"]),
        radius=float(stats["radius"]),
    )


def rescale_cell(c: int, n_old: int, n_new: int) -> int:
    """Cell ``c`` of an ``n_old``-cell axis at the same relative place on an ``n_new``-cell axis (cell centres
    scale; unchanged when the size is)."""
    return min(max(round((c + 0.5) * n_new / n_old - 0.5), 0), n_new - 1)


def _clip(v: float, bounds: tuple[float, float]) -> float:
    return min(max(float(v), bounds[0]), bounds[1])


def _head_spec(
    grid: tuple[int, int], query: tuple[int, int], mu: Tensor, sigma: Tensor, lam: Tensor, tau: float, mode: str
) -> HeadSpec:
    """Atoms at ``query − μ``; widths and weights raised into the playground's ranges where needed."""
    qy, qx = query
    atoms = tuple(
        Atom(
            qy - float(m[0]),
            qx - float(m[1]),
            _clip(s[0], SIGMA_RANGE),
            _clip(s[1], SIGMA_RANGE),
            _clip(w, WEIGHT_RANGE),
        )
        for m, s, w in zip(mu.double(), sigma.double(), lam.double(), strict=True)
    )
    return HeadSpec(grid, query, _clip(tau, TAU_RANGE), atoms, mode)


def spec_from_head(
    lf: LayerField, head: int, grid: tuple[int, int] | None = None, mode: str = "factorized"
) -> HeadSpec:
    """A trained head as a playground spec, ★ at the centre and atoms at ``query − μ``.

    ``grid`` defaults to the layer's displacement grid ``(2E_y+1) × (2E_x+1)``, on which the spec's field is
    exactly the head's :attr:`LayerField.density`. Atoms off the canvas are kept (the model keeps them too);
    weights below the playground's floor are raised to it.
    """
    if grid is None:
        grid = (2 * lf.extent[0] + 1, 2 * lf.extent[1] + 1)
    lo, hi = GRID_RANGE
    grid = (min(max(grid[0], lo), hi), min(max(grid[1], lo), hi))
    return _head_spec(grid, centre_query(grid), lf.mu[head], lf.sigma[head], lf.lam[head], lf.tau, mode)


def steered_spec(
    lf: LayerField,
    head: int,
    grid: tuple[int, int],
    query: tuple[int, int],
    dmu: Tensor,
    sigma_ratio: Tensor,
    dlam: Tensor,
    gate: float = 1.0,
    mode: str = "factorized",
) -> HeadSpec:
    """The head as one query of an image sees it, with content's steering turned up from 0 (the fixed field) to
    ``gate`` = 1 (the learned gate), from :func:`~ssog_core.analysis.steering_offsets`' ``dmu``, ``sigma_ratio``
    (``(R, 2)``) and ``dlam`` (``(R,)``) of that token and head.

    Exact for every gate: :func:`~ssog_core.field.steer` scales each tap by its gate ``s`` outside the tanh, so
    the query's atoms at gate ``g·s`` are ``μ + g·Δμ``, ``σ·ratio^g`` and ``λ ∝ λ·(λ'/λ)^g``. The spec draws the
    query's own atoms; the model's exact steered attention row (``attention_maps``) can differ slightly from
    this single-query field, since its separable passes use per-token fields.
    """
    if not 0.0 <= gate <= 1.0:
        raise ValueError(f"gate must be in [0, 1] (0 = fixed field, 1 = learned gate), got {gate}")
    lam0 = lf.lam[head].double()
    lam1 = (lam0 + dlam.double()).clamp_min(1e-30)
    lam = lam0.clamp_min(1e-30) * (lam1 / lam0.clamp_min(1e-30)) ** gate
    mu = lf.mu[head].double() + gate * dmu.double()
    sigma = lf.sigma[head].double() * sigma_ratio.double() ** gate
    return _head_spec(grid, query, mu, sigma, lam / lam.sum(), lf.tau, mode)


DEFAULT_SPEC = HeadSpec(  # the playground's first head, its ★ at the grid's centre query like every other view's
    grid=(24, 24),
    query=centre_query((24, 24)),
    tau=1.0,
    atoms=(
        Atom(7.5, 10.0, 1.2, 1.2, 0.45),  # a tight blob up and to the left (the "head" of the SSOG post's bird)
        Atom(16.0, 11.0, 3.5, 0.8, 0.35),  # a vertical strip below (the "post")
        Atom(14.0, 5.0, 2.5, 2.5, 0.20),  # a broad, weak blob to the lower left
    ),
)
