"""Named heads of a trained model: the playground's presets are geometries a model actually converged to.

Each head's field over relative position (:attr:`LayerField.density`) is summarised by its spread along
each axis (the standard deviation of key offsets under the density, in grid cells) and how far its mass
sits from the query. Four shapes the SSOG post's figures show are then picked, each from a different head:

* **tight local blob** — the smallest spread with its mass near the query (layer 0 is "a convolution in disguise");
* **vertical strip** / **horizontal strip** — the largest ratio of the spreads along the two axes, if that ratio
  is at least :data:`STRIP_RATIO` (a model whose heads are all round has no strip to offer);
* **broad global field** — the largest area ``spread_y · spread_x``, if its mean spread is at least
  :data:`BROAD_FACTOR` times the blob's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ssog_core.analysis.measures import LayerField

KINDS = ("tight local blob", "vertical strip", "horizontal strip", "broad global field")
STRIP_RATIO = 1.5  # spread along one axis over the other: below this a field reads as a blob, not a strip
BROAD_FACTOR = 1.5  # geometric-mean spread relative to the tight blob's


@dataclass(frozen=True)
class HeadShape:
    """Second-moment summary of one head's field (grid cells; offsets are key − query)."""

    layer: int
    head: int
    spread_y: float
    spread_x: float
    centre_y: float
    centre_x: float

    @property
    def distance(self) -> float:
        """How far the field's centre of mass sits from the query."""
        return math.hypot(self.centre_y, self.centre_x)


@dataclass(frozen=True)
class Preset:
    kind: str
    shape: HeadShape

    @property
    def label(self) -> str:
        s = self.shape
        return (
            f"{self.kind}: layer {s.layer} · head {s.head} "
            f"(spread {s.spread_y:.1f} × {s.spread_x:.1f} cells, centre {s.distance:.1f} from ★)"
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
            shapes.append(HeadShape(layer, h, float(vy[h].sqrt()), float(vx[h].sqrt()), float(cy[h]), float(cx[h])))
    return shapes


def find_presets(fields: list[LayerField]) -> list[Preset]:
    """Up to four presets (in the order of :data:`KINDS`), each from a different head; a kind no head fits
    (e.g. no strip in a model whose fields are all round) is left out rather than mislabelled."""
    shapes = head_shapes(fields)
    if not shapes:
        return []
    blob = min(shapes, key=lambda s: math.hypot(s.spread_y, s.spread_x) + s.distance)
    blob_size = math.sqrt(blob.spread_y * blob.spread_x)
    kinds = {
        "vertical strip": (lambda s: s.spread_y / max(s.spread_x, 1e-3), lambda v: v >= STRIP_RATIO),
        "horizontal strip": (lambda s: s.spread_x / max(s.spread_y, 1e-3), lambda v: v >= STRIP_RATIO),
        "broad global field": (lambda s: math.sqrt(s.spread_y * s.spread_x), lambda v: v >= BROAD_FACTOR * blob_size),
    }
    presets, used = [Preset("tight local blob", blob)], {(blob.layer, blob.head)}
    for kind, (score, fits) in kinds.items():
        free = [s for s in shapes if (s.layer, s.head) not in used]
        if not free:
            break
        best = max(free, key=score)
        if fits(score(best)):
            used.add((best.layer, best.head))
            presets.append(Preset(kind, best))
    return presets
