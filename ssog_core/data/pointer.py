"""``pointer``: a cue points at one of three coloured targets; the class is the colour of the one it points at.

Why this task needs content to decide where to look (docs/DATA.md has the full argument): the cue and the
targets are placed at random, far apart, so the offset from the cue to the answer changes from image to image
and is written only in the cue's orientation. A fixed field must gather every target into the cue (or every
direction into every target) and keep which came from where; a steered field can move the cue's atoms the way
it points; dot attention can look the target up by content and position. Ignoring the cue and naming any
target's colour gives 1/3, against a chance level of 1/6.

The scene, in cells of a ``grid × grid`` board (``--data pointer:grid=24``):

* three discs of radius 1 cell in three different colours of :data:`~ssog_core.data.scene.PALETTE`, each at
  least ``max(3.5, 0.3 · grid)`` cells from the cue (7.2 cells on a 24-cell board, beyond the ±4-cell reach of
  a steering offset), 3.5 cells from each other, and seen from the cue at least 60° apart;
* the cue: a black tail (1.5 cells) and a white arrowhead (1.75 cells), pointing exactly at the target whose
  colour is the label.

Labels survive the training augmentations: a horizontal flip mirrors the cue and the targets alike, a pad-crop
only shifts. The mask that comes with each image covers what decides the class: the cue and the target it points
at (the other targets are distractors). Every image is a pure function of ``(seed, split, index)``.
"""

from __future__ import annotations

import math
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
from ssog_core.data.shapes import BACKGROUNDS, SPLITS

CLASS_NAMES: tuple[str, ...] = tuple(PALETTE)
TARGETS = 3
RADIUS = 1.0  # target disc, cells
MIN_ANGLE = math.radians(60)  # between two targets as seen from the cue
TAIL, HEAD, HEAD_WIDTH = 1.5, 1.75, 1.6  # cue, cells
CUE_RGB, TAIL_RGB = (245, 245, 245), (20, 20, 20)


def min_reach(grid: int) -> float:
    """The shortest cue-to-target distance on a board of ``grid`` cells."""
    return max(3.5, 0.3 * grid)


def _angle_between(a: float, b: float) -> float:
    d = abs(a - b) % (2 * math.pi)
    return min(d, 2 * math.pi - d)


def layout(rng: np.random.Generator, grid: int) -> tuple[Point, list[Point]]:
    """The cue's centre and the targets' centres (the first is the one pointed at), by rejection sampling."""
    reach = min_reach(grid)
    while True:
        cue = place(rng, 2.5, grid - 2.5)
        targets: list[Point] = []
        for _ in range(60 * TARGETS):
            t = place(rng, 2.0, grid - 2.0)
            angle = math.atan2(t[1] - cue[1], t[0] - cue[0])
            if distance(t, cue) >= reach and all(
                distance(t, u) >= 3.5 and _angle_between(angle, math.atan2(u[1] - cue[1], u[0] - cue[0])) >= MIN_ANGLE
                for u in targets
            ):
                targets.append(t)
                if len(targets) == TARGETS:
                    return cue, targets


def cue_polygons(cue: Point, target: Point) -> tuple[Polygon, Polygon]:
    """The cue's tail (black quad behind the centre) and head (white triangle ahead of it), aimed at ``target``."""
    d = distance(cue, target)
    ux, uy = (target[0] - cue[0]) / d, (target[1] - cue[1]) / d
    nx, ny = -uy, ux
    x, y = cue
    h = 0.5  # the tail's half-width
    tail = [(x + nx * h, y + ny * h), (x - ux * TAIL + nx * h, y - uy * TAIL + ny * h),
            (x - ux * TAIL - nx * h, y - uy * TAIL - ny * h), (x - nx * h, y - ny * h)]  # fmt: skip
    w = HEAD_WIDTH / 2
    head = [(x + nx * w, y + ny * w), (x + ux * HEAD, y + uy * HEAD), (x - nx * w, y - ny * w)]
    return tail, head


@dataclass(frozen=True)
class Scene:
    """One rendered image and where its parts lie: each disc's coverage ``(3, H, W)``, the pointed one first (the
    target-share readout measures attention on them), and the cue's."""

    image: np.ndarray
    label: int
    discs: np.ndarray
    cue: np.ndarray


def render_scene(
    seed: int,
    split: str,
    index: int,
    num_classes: int,
    size: tuple[int, int],
    photos_dir: str | Path = BACKGROUNDS,
    grid: int = 14,
) -> Scene:
    """Image ``index`` of a split as ``(H, W, 3)`` uint8 with its label and the coverage of each of its parts."""
    label = index % num_classes
    rng = np.random.default_rng([seed, SPLITS[split], index, 2])  # the trailing 2 keeps it apart from other sets
    bg = background(rng, size, str(photos_dir))
    cue, targets = layout(rng, grid)
    others = [c for c in CLASS_NAMES if c != CLASS_NAMES[label]]
    colours = [CLASS_NAMES[label], *(others[i] for i in rng.choice(len(others), TARGETS - 1, replace=False))]
    shade = rng.uniform(0.85, 1.0, TARGETS)
    discs = np.stack([coverage([disc(t, RADIUS)], size, grid) for t in targets])
    layers = [(d, np.array(PALETTE[c]) * s) for d, c, s in zip(discs, colours, shade, strict=True)]
    tail, head = cue_polygons(cue, targets[0])
    tail_cover, head_cover = coverage([tail], size, grid), coverage([head], size, grid)
    img = paint(bg, [*layers, (tail_cover, TAIL_RGB), (head_cover, CUE_RGB)])
    return Scene(img, label, discs, np.maximum(tail_cover, head_cover))


def render_with_mask(
    seed: int,
    split: str,
    index: int,
    num_classes: int,
    size: tuple[int, int],
    photos_dir: str | Path = BACKGROUNDS,
    grid: int = 14,
) -> tuple[np.ndarray, int, np.ndarray]:
    """Image ``index`` of a split as ``(H, W, 3)`` uint8, its label, and the coverage ``(H, W)`` of the cue and the
    target it points at."""
    scene = render_scene(seed, split, index, num_classes, size, photos_dir, grid)
    return scene.image, scene.label, np.maximum(scene.discs[0], scene.cue)


@dataclass(frozen=True)
class PointerSpec(SceneSpec):
    """What ``--data pointer:SPEC`` selects (``grid``, ``train``, ``val``, ``seed``; 14 cells a side by default)."""

    KIND = "pointer"
    CLASS_NAMES = CLASS_NAMES


class PointerDataset(SceneDataset):
    """One split of ``pointer`` at a given resolution; ``ds[i]`` is ``(H×W×3 uint8 array, label)``."""

    CLASS_NAMES = CLASS_NAMES
    render_with_mask = staticmethod(render_with_mask)

    def scene(self, index: int) -> Scene:
        """Image ``index`` with the coverage of each disc (the pointed one first) and of the cue."""
        if not 0 <= index < len(self):
            raise IndexError(f"index {index} out of range for {len(self)} images")
        return render_scene(
            self.spec.seed, self.split, index, self.spec.classes, self.size, self.photos_dir, **self.render_options()
        )
