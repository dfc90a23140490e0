"""``layouts``: a procedural data set whose classes are told apart by orientation and long-range arrangement.

``shapes`` asks *what* an object is; ``layouts`` asks *how its parts lie*: a long bar, two discs far apart,
a striped patch, a plus or a corner, each vertical, horizontal or diagonal. A class is often decided by two
parts 5–10 patches apart (a vertical pair vs a horizontal pair) or by a thin structure that runs across the
grid, so attention has reason to reach far and along one axis -- the geometry SSOG heads can express with an
elongated or displaced Gaussian. Objects are painted in one random saturated colour over a crop of a photo from
``assets/backgrounds/`` (as in ``shapes``), the photo at a third of its contrast. Every image is a pure function
of ``(seed, split, index)``.

Labels survive the training augmentations (a horizontal flip keeps vertical/horizontal, and "diagonal" covers
both diagonals; a pad-crop only shifts). The object's coverage mask comes with each image, for export maps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from ssog_core.data.shapes import (
    BACKGROUNDS,
    SPLITS,
    SUPERSAMPLE,
    ShapesDataset,
    ShapesSpec,
    _background,
    _colour,
    _photos,
    _stroke,
)

Polygon = list[tuple[float, float]]

CLASS_NAMES: tuple[str, ...] = (
    "vertical bar",
    "horizontal bar",
    "diagonal bar",
    "vertical pair",
    "horizontal pair",
    "diagonal pair",
    "vertical stripes",
    "horizontal stripes",
    "plus",
    "corner",
)
CALM = 0.35  # background contrast kept (a ViT on full-contrast photos sat at chance for 750 steps, here ~150)
JITTER = math.radians(10)  # orientation noise, well inside the 45° that separates two classes


def _angle(rng: np.random.Generator, kind: str) -> float:
    """Direction of the long axis (radians, y down): vertical, horizontal, or either diagonal."""
    base = {"vertical": math.pi / 2, "horizontal": 0.0}.get(kind)
    if base is None:
        base = math.pi / 4 if rng.random() < 0.5 else 3 * math.pi / 4
    return base + rng.uniform(-JITTER, JITTER)


def _place(rng: np.random.Generator, lo: float, hi: float) -> float:
    """A uniform position in [lo, hi], or the middle when the object only just fits."""
    return rng.uniform(lo, hi) if hi > lo else (lo + hi) / 2


def _disc(cx: float, cy: float, r: float) -> Polygon:
    return [(cx + r * math.cos(2 * math.pi * k / 32), cy + r * math.sin(2 * math.pi * k / 32)) for k in range(32)]


def _bar(cx: float, cy: float, angle: float, length: float, width: float) -> list[Polygon]:
    dx, dy = math.cos(angle) * length / 2, math.sin(angle) * length / 2
    return _stroke([(cx - dx, cy - dy), (cx + dx, cy + dy)], width)


def _stripes(cx: float, cy: float, angle: float, side: float, period: float, width: float) -> list[Polygon]:
    """Parallel bars along ``angle`` filling a square patch of the given side."""
    nx, ny = -math.sin(angle), math.cos(angle)  # across the stripes
    count = max(2, int(side / period))
    offsets = (np.arange(count) - (count - 1) / 2) * period
    return [p for o in offsets for p in _bar(cx + o * nx, cy + o * ny, angle, side - width, width)]


def _polygons(label: int, rng: np.random.Generator, h: int, w: int) -> list[Polygon]:
    """The object of class ``label`` in pixel coordinates, kept inside the image."""
    side = min(h, w)
    name = CLASS_NAMES[label]
    kind, _, what = name.partition(" ")
    if name == "plus":
        length, width = rng.uniform(0.5, 0.75) * side, rng.uniform(0.08, 0.11) * side
        a = _angle(rng, "horizontal")
        cx, cy = (_place(rng, length / 2 + width, d - length / 2 - width) for d in (w, h))
        return _bar(cx, cy, a, length, width) + _bar(cx, cy, a + math.pi / 2, length, width)
    if name == "corner":
        arm, width = rng.uniform(0.4, 0.6) * side, rng.uniform(0.08, 0.11) * side
        a = rng.integers(4) * math.pi / 2 + rng.uniform(-JITTER, JITTER)
        # the corner sits where both arms fit: arms run along a and a + 90°
        ux, uy, vx, vy = math.cos(a), math.sin(a), -math.sin(a), math.cos(a)
        xs, ys = [0, ux * arm, vx * arm], [0, uy * arm, vy * arm]
        m = width
        cx, cy = _place(rng, m - min(xs), w - m - max(xs)), _place(rng, m - min(ys), h - m - max(ys))
        return _stroke([(cx + ux * arm, cy + uy * arm), (cx, cy), (cx + vx * arm, cy + vy * arm)], width)
    a = _angle(rng, kind)
    if what == "bar":
        length, width = rng.uniform(0.55, 0.8) * side, rng.uniform(0.08, 0.11) * side
        ex, ey = abs(math.cos(a)) * length / 2 + width, abs(math.sin(a)) * length / 2 + width
        cx, cy = _place(rng, ex, w - ex), _place(rng, ey, h - ey)
        return _bar(cx, cy, a, length, width)
    if what == "pair":
        r, gap = rng.uniform(0.08, 0.11) * side, rng.uniform(0.4, 0.65) * side
        ex, ey = abs(math.cos(a)) * gap / 2 + r, abs(math.sin(a)) * gap / 2 + r
        cx, cy = _place(rng, ex, w - ex), _place(rng, ey, h - ey)
        dx, dy = math.cos(a) * gap / 2, math.sin(a) * gap / 2
        return [_disc(cx - dx, cy - dy, r), _disc(cx + dx, cy + dy, r)]
    # stripes: a square patch; its half-diagonal bounds the rotated extent
    patch = rng.uniform(0.35, 0.5) * side
    period = rng.uniform(0.11, 0.15) * side
    half = patch / math.sqrt(2)
    cx, cy = _place(rng, half, w - half), _place(rng, half, h - half)
    return _stripes(cx, cy, a, patch, period, period * 0.5)


def _mask(label: int, rng: np.random.Generator, size: tuple[int, int]) -> np.ndarray:
    h, w = size
    k = SUPERSAMPLE
    canvas = Image.new("L", (w * k, h * k), 0)
    draw = ImageDraw.Draw(canvas)
    for poly in _polygons(label, rng, h, w):
        draw.polygon([(x * k, y * k) for x, y in poly], fill=255)
    return np.asarray(canvas.reduce(k), dtype=np.float32) / 255.0


def render_with_mask(
    seed: int, split: str, index: int, num_classes: int, size: tuple[int, int], photos_dir: str | Path = BACKGROUNDS
) -> tuple[np.ndarray, int, np.ndarray]:
    """Image ``index`` of a split as ``(H, W, 3)`` uint8, its label, and the object's coverage ``(H, W)`` in [0, 1]."""
    label = index % num_classes
    rng = np.random.default_rng([seed, SPLITS[split], index, 1])  # the trailing 1 keeps it apart from shapes
    bg = _background(rng, size, _photos(str(photos_dir)))
    bg = CALM * bg + (1 - CALM) * bg.mean()  # the photo at reduced contrast: thin parts must stay visible
    alpha = _mask(label, rng, size)
    behind = (bg * alpha[..., None]).sum(axis=(0, 1)) / max(float(alpha.sum()), 1e-6)
    img = bg * (1 - alpha[..., None]) + _colour(rng, behind) * alpha[..., None]
    return np.clip(img + 0.5, 0, 255).astype(np.uint8), label, alpha


@dataclass(frozen=True)
class LayoutsSpec(ShapesSpec):
    """What ``--data layouts:SPEC`` selects (same keys as ``shapes``; 56×56 by default: a 14×14 grid at patch 4)."""

    size: int = 56
    KIND = "layouts"
    CLASSES = len(CLASS_NAMES)


class LayoutsDataset(ShapesDataset):
    """One split of ``layouts`` at a given resolution; ``ds[i]`` is ``(H×W×3 uint8 array, label)``."""

    CLASS_NAMES = CLASS_NAMES
    render_with_mask = staticmethod(render_with_mask)
