"""What the two *scene* tasks (``pointer`` and ``relation``) share: a spec counted in grid cells, a calm photo
background, and painting objects given in cell units at any pixel size.

A scene is laid out on a ``grid × grid`` board of cells (one cell = one 4-pixel patch at the native size), so
the ``grid`` knob sets how much room there is to move while objects keep their size in cells. Rendered at another
resolution (zero-shot transfer) the same scene is drawn with more or fewer pixels per cell, as a photo would be.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
from PIL import Image, ImageDraw

from ssog_core.data.shapes import SUPERSAMPLE, ShapesDataset, _background, _photos, parse_options

Point = tuple[float, float]  # (x, y) in cells, y down
Polygon = list[Point]
CELL = 4  # pixels per cell at the native size: the patch size the recipes use for procedural sets
CALM = 0.35  # background contrast kept, as in ``layouts``
GREY = 110.0  # the background's mean is pulled half-way to this: white and black objects stand out on any photo
PALETTE: dict[str, tuple[int, int, int]] = {  # saturated colours, told apart by hue at a glance
    "red": (230, 40, 40),
    "yellow": (235, 215, 35),
    "green": (40, 185, 60),
    "cyan": (40, 205, 225),
    "blue": (50, 80, 235),
    "magenta": (215, 55, 215),
}


@dataclass(frozen=True)
class SceneSpec:
    """What ``--data KIND:SPEC`` selects for a scene task; SPEC is ``key=value`` pairs, e.g. ``grid=24,train=20000``."""

    grid: int = 14  # cells a side: the native image is grid × CELL pixels a side
    train: int = 20_000
    val: int = 2_000
    seed: int = 0  # the data set's identity

    KIND: ClassVar[str] = "scene"
    CLASS_NAMES: ClassVar[tuple[str, ...]] = ()
    MIN_GRID = 12  # below this the objects no longer fit far enough apart
    MAX_GRID = 64

    @property
    def size(self) -> int:
        return self.grid * CELL

    @property
    def classes(self) -> int:
        return len(self.CLASS_NAMES)

    @classmethod
    def parse(cls, text: str) -> SceneSpec:
        spec = cls(**parse_options(cls, text))
        if not cls.MIN_GRID <= spec.grid <= cls.MAX_GRID:
            raise ValueError(f"{cls.KIND} grid={spec.grid} must be between {cls.MIN_GRID} and {cls.MAX_GRID} cells")
        if spec.train < 1 or spec.val < 1 or spec.seed < 0:
            raise ValueError(f"{cls.KIND} needs train >= 1, val >= 1 and seed >= 0")
        return spec


class SceneDataset(ShapesDataset):
    """One split of a scene task at a given resolution; a task sets ``CLASS_NAMES`` and ``render_with_mask``."""

    def render_options(self) -> dict[str, int]:
        return {"grid": self.spec.grid}


def background(rng: np.random.Generator, size: tuple[int, int], photos_dir: str) -> np.ndarray:
    """A crop of a photo at a third of its contrast, its mean pulled half-way to grey, ``(H, W, 3)`` float."""
    bg = _background(rng, size, _photos(photos_dir))
    mean = bg.mean(axis=(0, 1), keepdims=True)
    return CALM * (bg - mean) + 0.5 * (mean + GREY)


def coverage(polygons: Sequence[Polygon], size: tuple[int, int], grid: int) -> np.ndarray:
    """Anti-aliased coverage ``(H, W)`` in [0, 1] of polygons given in cells, on an image of ``size`` pixels."""
    h, w = size
    sx, sy = w * SUPERSAMPLE / grid, h * SUPERSAMPLE / grid
    canvas = Image.new("L", (w * SUPERSAMPLE, h * SUPERSAMPLE), 0)
    draw = ImageDraw.Draw(canvas)
    for poly in polygons:
        draw.polygon([(x * sx, y * sy) for x, y in poly], fill=255)
    return np.asarray(canvas.reduce(SUPERSAMPLE), dtype=np.float32) / 255.0


def paint(bg: np.ndarray, layers: Sequence[tuple[np.ndarray, Sequence[float]]]) -> np.ndarray:
    """Composite ``(coverage, rgb)`` layers over the background in order; uint8 ``(H, W, 3)``."""
    img = bg
    for alpha, rgb in layers:
        img = img * (1 - alpha[..., None]) + np.asarray(rgb, dtype=np.float32) * alpha[..., None]
    return np.clip(img + 0.5, 0, 255).astype(np.uint8)


def disc(c: Point, r: float, n: int = 24) -> Polygon:
    angles = 2 * np.pi * np.arange(n) / n
    return [(c[0] + r * float(np.cos(a)), c[1] + r * float(np.sin(a))) for a in angles]


def ring(c: Point, r: float, inner: float, n: int = 24) -> list[Polygon]:
    """A ring as ``n`` quads (PIL fills no holes)."""
    outer, hole = disc(c, r, n), disc(c, inner, n)
    return [[outer[k], outer[(k + 1) % n], hole[(k + 1) % n], hole[k]] for k in range(n)]


def plus(c: Point, r: float, width: float) -> list[Polygon]:
    x, y, h = c[0], c[1], width / 2
    return [[(x - r, y - h), (x + r, y - h), (x + r, y + h), (x - r, y + h)],
            [(x - h, y - r), (x + h, y - r), (x + h, y + r), (x - h, y + r)]]  # fmt: skip


def place(rng: np.random.Generator, lo: float, hi: float) -> Point:
    """A uniform point of the square ``[lo, hi]²`` (cells)."""
    return float(rng.uniform(lo, hi)), float(rng.uniform(lo, hi))


def distance(a: Point, b: Point) -> float:
    return float(np.hypot(a[0] - b[0], a[1] - b[1]))
