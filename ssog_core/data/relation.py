"""``relation``: two white marks far apart on one row, one column or one diagonal; the class is the axis they share
and whether the two marks are the same shape.

Why this task rewards long, thin and content-placed fields (docs/DATA.md has the full argument): the two marks
that matter lie at least ``max(4, 0.4 · grid)`` cells apart (9.6 cells on a 24-cell board), at random places,
among three coloured distractors of the same shapes. A head whose field is a strip along its row or column reads
both marks of a row or column pair from either one; a separable Gaussian cannot lie along a diagonal, so a
diagonal pair has to be reached by a displaced atom (which content can place) or by a broad field that also takes
in the distractors. Shapes are told apart only at the marks, so "same or different" needs both marks in one place.

The scene, in cells of a ``grid × grid`` board (``--data relation:grid=24``): the two marks (radius 1.1 cells,
white, each a disc, a ring or a plus), their centres on exactly one row, one column or one diagonal (either
diagonal); the three distractors (the same shapes in colours of :data:`~ssog_core.data.scene.PALETTE`) at least 3
cells from every other mark. Classes cycle with the index: axis × (same, different).

Labels survive the training augmentations: a horizontal flip keeps rows and columns and swaps the two diagonals
(one class), a pad-crop only shifts. The mask that comes with each image covers the two white marks. Every image is
a pure function of ``(seed, split, index)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ssog_core.data.scene import (
    PALETTE,
    Point,
    Polygon,
    SceneDataset,
    SceneSpec,
    background,
    coverage,
    disc,
    distance,
    paint,
    place,
)
from ssog_core.data.scene import plus as plus_sign
from ssog_core.data.scene import ring as ring_shape
from ssog_core.data.shapes import BACKGROUNDS, SPLITS

AXES = ("row", "column", "diagonal")
CLASS_NAMES: tuple[str, ...] = tuple(f"{axis} {kind}" for axis in AXES for kind in ("same", "different"))
MARKS = ("disc", "ring", "plus")
RADIUS = 1.1  # cells
DISTRACTORS = 3
MARK_RGB = (245, 245, 245)


def min_gap(grid: int) -> float:
    """The shortest offset, along the shared axis, between the two marks on a board of ``grid`` cells."""
    return max(4.0, 0.4 * grid)


def mark(shape: str, c: Point) -> list[Polygon]:
    if shape == "disc":
        return [disc(c, RADIUS)]
    if shape == "ring":
        return ring_shape(c, RADIUS, 0.5 * RADIUS)
    return plus_sign(c, RADIUS, 0.8)


def pair(rng: np.random.Generator, axis: str, grid: int) -> tuple[Point, Point]:
    """Two centres on one row, column or diagonal, at least :func:`min_gap` apart along it, inside the margin."""
    lo, hi = 2.0, grid - 2.0
    gap = rng.uniform(min_gap(grid), hi - lo)
    start, across = rng.uniform(lo, hi - gap), rng.uniform(lo, hi)
    if axis == "row":
        return (start, across), (start + gap, across)
    if axis == "column":
        return (across, start), (across, start + gap)
    y = rng.uniform(lo, hi - gap)
    if rng.random() < 0.5:  # down-right
        return (start, y), (start + gap, y + gap)
    return (start + gap, y), (start, y + gap)  # down-left


def render_with_mask(
    seed: int,
    split: str,
    index: int,
    num_classes: int,
    size: tuple[int, int],
    photos_dir: str | Path = BACKGROUNDS,
    grid: int = 14,
) -> tuple[np.ndarray, int, np.ndarray]:
    """Image ``index`` of a split as ``(H, W, 3)`` uint8, its label, and the coverage ``(H, W)`` of the two marks."""
    label = index % num_classes
    axis, kind = CLASS_NAMES[label].split(" ")
    rng = np.random.default_rng([seed, SPLITS[split], index, 3])  # the trailing 3 keeps it apart from other sets
    bg = background(rng, size, str(photos_dir))
    a, b = pair(rng, axis, grid)
    first = MARKS[int(rng.integers(len(MARKS)))]
    second = first if kind == "same" else MARKS[(MARKS.index(first) + 1 + int(rng.integers(2))) % len(MARKS)]
    marks = coverage(mark(first, a) + mark(second, b), size, grid)
    placed, layers = [a, b], []
    colours = list(PALETTE.values())
    while len(layers) < DISTRACTORS:
        c = place(rng, 2.0, grid - 2.0)
        if all(distance(c, p) >= 3.0 for p in placed):
            placed.append(c)
            shape, rgb = MARKS[int(rng.integers(len(MARKS)))], colours[int(rng.integers(len(colours)))]
            layers.append((coverage(mark(shape, c), size, grid), rgb))
    return paint(bg, [*layers, (marks, MARK_RGB)]), label, marks


@dataclass(frozen=True)
class RelationSpec(SceneSpec):
    """What ``--data relation:SPEC`` selects (``grid``, ``train``, ``val``, ``seed``; 14 cells a side by default)."""

    KIND = "relation"
    CLASS_NAMES = CLASS_NAMES


class RelationDataset(SceneDataset):
    """One split of ``relation`` at a given resolution; ``ds[i]`` is ``(H×W×3 uint8 array, label)``."""

    CLASS_NAMES = CLASS_NAMES
    render_with_mask = staticmethod(render_with_mask)
