"""Named heads of a trained model: the playground's presets are geometries a model actually converged to.

Each head's fixed field over relative position (:attr:`LayerField.density`) is measured by its spread along each
axis (the standard deviation of key offsets under the density, in grid cells) and where its mass sits. A head is
named by what those numbers show, against thresholds relative to the grid's side (:data:`RULES`):

* **vertical / horizontal strip** — the long-axis spread ≥ :data:`STRIP_RATIO` × the short one and ≥
  :data:`STRIP_LENGTH` of the grid side along it;
* **vertically / horizontally elongated field** — the long-axis spread ≥ :data:`ELONGATED_RATIO` × the short one
  (offered only where no head makes a strip of that direction);
* **tight local blob** — the long-axis spread ≤ :data:`BLOB_SPREAD` of the grid side, less than
  :data:`ELONGATED_RATIO` × the short one, and the mass centred within :data:`BLOB_CENTRE` cell of the query;
* **broad field** — both spreads ≥ :data:`BROAD_SPREAD` of the grid side.

Each kind is offered once, from a different head (the narrowest blob, the most elongated strip, the broadest
field); a kind no head fits is left out rather than given to a head that does not look like it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ssog_core.analysis.measures import LayerField

KINDS = ("tight local blob", "vertical strip", "horizontal strip", "vertically elongated field",
         "horizontally elongated field", "broad field")  # fmt: skip
STRIP_RATIO = 3.0  # long/short spread of a strip: the one threshold every count, table and label of strips uses
STRIP_LENGTH = 0.25  # of the grid side along the strip
ELONGATED_RATIO = 2.0  # long/short spread of an elongated field (below STRIP_RATIO it is never called a strip)
BLOB_SPREAD = 0.125  # of the grid side
BLOB_CENTRE = 1.0  # grid cells from the query
BROAD_SPREAD = 0.2  # of the grid side, along each axis
RULES = (
    "spread = the standard deviation of the head's fixed field over key offsets, per axis; a strip: long-axis "
    f"spread ≥ {STRIP_RATIO:g}× the short one and ≥ ¼ of the grid side; elongated: ≥ {ELONGATED_RATIO:g}×; a tight "
    f"local blob: ≤ ⅛ of the grid side, under {ELONGATED_RATIO:g}×, centred within {BLOB_CENTRE:g} cell of ★; "
    "broad: both spreads ≥ ⅕ of the grid side"
)


@dataclass(frozen=True)
class HeadShape:
    """Second-moment summary of one head's field (grid cells; offsets are key − query) on a ``grid``."""

    layer: int
    head: int
    spread_y: float
    spread_x: float
    centre_y: float
    centre_x: float
    grid: tuple[int, int] = (1, 1)

    @property
    def distance(self) -> float:
        """How far the field's centre of mass sits from the query."""
        return math.hypot(self.centre_y, self.centre_x)

    @property
    def ratio(self) -> float:
        """Long-axis spread over the short one (≥ 1)."""
        return max(self.spread_y, self.spread_x) / max(min(self.spread_y, self.spread_x), 1e-6)

    @property
    def vertical(self) -> bool:
        return self.spread_y >= self.spread_x

    def kinds(self) -> list[str]:
        """Every name of :data:`KINDS` this head's measured shape fits (see :data:`RULES`)."""
        long_side = self.grid[0] if self.vertical else self.grid[1]
        long = max(self.spread_y, self.spread_x)
        way = "vertical" if self.vertical else "horizontal"
        out = []
        if self.ratio >= STRIP_RATIO and long >= STRIP_LENGTH * long_side:
            out.append(f"{way} strip")
        if self.ratio >= ELONGATED_RATIO:
            out.append(f"{way}ly elongated field")
        if long <= BLOB_SPREAD * max(self.grid) and self.ratio < ELONGATED_RATIO and self.distance <= BLOB_CENTRE:
            out.append("tight local blob")
        if self.spread_y >= BROAD_SPREAD * self.grid[0] and self.spread_x >= BROAD_SPREAD * self.grid[1]:
            out.append("broad field")
        return out


@dataclass(frozen=True)
class Preset:
    kind: str
    shape: HeadShape

    @property
    def label(self) -> str:
        """The name, the head and the measured spread the name was given for."""
        s = self.shape
        return (
            f"{self.kind}: layer {s.layer} · head {s.head} (spread {s.spread_y:.1f} × {s.spread_x:.1f} cells, "
            f"y × x, {s.ratio:.1f}×)"
        )


def head_shapes(fields: list[LayerField]) -> list[HeadShape]:
    """Spread and centre of mass of every head's density, layer by layer."""
    shapes = []
    for layer, lf in enumerate(fields):
        ey, ex = lf.extent
        d = lf.density.double()  # (H, 2Ey+1, 2Ex+1), each sums to 1
        oy = torch.arange(-ey, ey + 1, dtype=torch.float64)[:, None]
        ox = torch.arange(-ex, ex + 1, dtype=torch.float64)[None, :]
        mass = d.sum((-2, -1)).clamp_min(1e-30)
        cy = (d * oy).sum((-2, -1)) / mass
        cx = (d * ox).sum((-2, -1)) / mass
        vy = (d * (oy - cy[:, None, None]).square()).sum((-2, -1)) / mass
        vx = (d * (ox - cx[:, None, None]).square()).sum((-2, -1)) / mass
        for h in range(d.shape[0]):
            shapes.append(HeadShape(layer, h, float(vy[h].sqrt()), float(vx[h].sqrt()), float(cy[h]), float(cx[h]),
                                    (ey + 1, ex + 1)))  # fmt: skip
    return shapes


_BEST = {  # which head a kind is shown with, when several fit: the clearest example
    "tight local blob": lambda s: -math.sqrt(s.spread_y * s.spread_x),
    "vertical strip": lambda s: s.ratio,
    "horizontal strip": lambda s: s.ratio,
    "vertically elongated field": lambda s: s.ratio,
    "horizontally elongated field": lambda s: s.ratio,
    "broad field": lambda s: math.sqrt(s.spread_y * s.spread_x),
}


def find_presets(fields: list[LayerField]) -> list[Preset]:
    """At most one preset per kind (in the order of :data:`KINDS`), each from a different head, each a head whose
    measured shape fits its name; an elongated field only where no head makes a strip of that direction."""
    shapes = head_shapes(fields)
    fits = {kind: [s for s in shapes if kind in s.kinds()] for kind in KINDS}
    presets: list[Preset] = []
    used: set[tuple[int, int]] = set()
    for kind in KINDS:
        way = kind.split("ly ")[0] if "elongated" in kind else None
        if way and any(p.kind == f"{way} strip" for p in presets):
            continue
        free = [s for s in fits[kind] if (s.layer, s.head) not in used]
        if free:
            best = max(free, key=_BEST[kind])
            used.add((best.layer, best.head))
            presets.append(Preset(kind, best))
    return presets
