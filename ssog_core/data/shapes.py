"""``shapes``: a procedural image-classification data set that makes steering and export maps visible.

Each image is one object of K classes (geometric shapes and letters) with a random colour, size,
rotation and position -- usually off-centre -- pasted on a random crop of a natural photo from
``assets/backgrounds/``. The label depends only on the object, so a model has to find it against a cluttered
background: the situation in which content-steered attention and "the object exports" show up.

Images are rendered at any resolution and are a pure function of ``(seed, split, index)``: the same
call gives the same pixels on every machine and in every worker process, with nothing stored on disk.
Shapes are drawn as polygons on a 4× supersampled mask (anti-aliased edges), independent of fonts.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from ssog_core.data.images import list_images, load_image

BACKGROUNDS = Path(__file__).resolve().parents[2] / "assets" / "backgrounds"  # the photos define the data set
SUPERSAMPLE = 4  # mask drawn at 4× resolution, then box-filtered: smooth edges at any output size
SPLITS = {"train": 0, "val": 1}
CACHE_BYTES = 512 * 1024**2  # rendered images kept per data set and process

Polygon = list[tuple[float, float]]
Layer = tuple[Polygon, bool]  # (polygon in unit coordinates, True = paint, False = cut out)


def _regular(n: int, radius: float = 1.0, phase: float = -math.pi / 2) -> Polygon:
    return [
        (radius * math.cos(phase + 2 * math.pi * k / n), radius * math.sin(phase + 2 * math.pi * k / n))
        for k in range(n)
    ]


def _star(points: int = 5, inner: float = 0.42) -> Polygon:
    outer = _regular(points)
    inner_pts = _regular(points, inner, -math.pi / 2 + math.pi / points)
    return [p for pair in zip(outer, inner_pts, strict=True) for p in pair]


def _heart(n: int = 48) -> Polygon:
    pts = []
    for k in range(n):
        t = 2 * math.pi * k / n
        x = 16 * math.sin(t) ** 3
        y = -(13 * math.cos(t) - 5 * math.cos(2 * t) - 2 * math.cos(3 * t) - math.cos(4 * t))
        pts.append((x / 17.0, (y + 2.5) / 17.0))
    return pts


def _stroke(points: Sequence[tuple[float, float]], width: float) -> list[Polygon]:
    """A polyline of the given width as quads plus square joints (letters without fonts)."""
    polys = []
    h = width / 2
    for (x0, y0), (x1, y1) in zip(points[:-1], points[1:], strict=True):
        dx, dy = x1 - x0, y1 - y0
        length = math.hypot(dx, dy)
        ux, uy = dx / length * h, dy / length * h  # along the segment, extended by h at both ends
        nx, ny = -uy, ux
        polys.append(
            [
                (x0 - ux + nx, y0 - uy + ny),
                (x1 + ux + nx, y1 + uy + ny),
                (x1 + ux - nx, y1 + uy - ny),
                (x0 - ux - nx, y0 - uy - ny),
            ]
        )
    return polys


def _glyph(*strokes: Sequence[tuple[float, float]], width: float = 0.34) -> list[Layer]:
    return [(p, True) for s in strokes for p in _stroke(s, width)]


# Every class is a list of layers in unit coordinates (y down, extent about [-1, 1]²). None of them turns
# into another under rotation or a horizontal flip (so no "N"/"Z" pair, no "+"/"x" pair, no diamond).
SHAPES: dict[str, list[Layer]] = {
    "circle": [(_regular(48), True)],
    "square": [(_regular(4, 1.15, -math.pi / 4), True)],
    "triangle": [(_regular(3, 1.1), True)],
    "star": [(_star(), True)],
    "cross": [
        (
            [
                (-0.33, -1),
                (0.33, -1),
                (0.33, -0.33),
                (1, -0.33),
                (1, 0.33),
                (0.33, 0.33),
                (0.33, 1),
                (-0.33, 1),
                (-0.33, 0.33),
                (-1, 0.33),
                (-1, -0.33),
                (-0.33, -0.33),
            ],
            True,
        )
    ],
    "ring": [(_regular(48), True), (_regular(48, 0.55), False)],
    "heart": [(_heart(), True)],
    "arrow": [([(-1, -0.28), (0.15, -0.28), (0.15, -0.7), (1, 0), (0.15, 0.7), (0.15, 0.28), (-1, 0.28)], True)],
    "crescent": [(_regular(48), True), ([(x + 0.5, y - 0.25) for x, y in _regular(48, 0.85)], False)],
    "letter E": _glyph([(0.7, -0.85), (-0.6, -0.85), (-0.6, 0.85), (0.7, 0.85)], [(-0.6, 0.0), (0.45, 0.0)]),
    "letter A": _glyph([(-0.8, 0.9), (0.0, -0.9), (0.8, 0.9)], [(-0.4, 0.25), (0.4, 0.25)]),
    "letter Z": _glyph([(-0.7, -0.85), (0.7, -0.85), (-0.7, 0.85), (0.7, 0.85)]),
}
CLASS_NAMES: tuple[str, ...] = tuple(SHAPES)


@dataclass(frozen=True)
class ShapesSpec:
    """What ``--data shapes:SPEC`` selects; SPEC is ``key=value`` pairs, e.g. ``classes=8,train=20000``."""

    classes: int = 10  # the first K of CLASS_NAMES
    train: int = 20_000  # images per epoch of the training split
    val: int = 2_000
    size: int = 64  # native resolution (square); any other size renders natively too
    seed: int = 0  # the data set's identity: a different seed is a different data set

    KIND = "shapes"  # the --data kind, named in error messages
    CLASSES = len(CLASS_NAMES)

    @classmethod
    def parse(cls, text: str) -> ShapesSpec:
        spec = cls(**parse_options(cls, text))
        if not 2 <= spec.classes <= cls.CLASSES:
            raise ValueError(f"{cls.KIND} classes={spec.classes} must be between 2 and {cls.CLASSES}")
        if spec.train < 1 or spec.val < 1 or spec.size < 8 or spec.seed < 0:
            raise ValueError(f"{cls.KIND} needs train >= 1, val >= 1, size >= 8 and seed >= 0")
        return spec


def parse_options(spec_type: type, text: str) -> dict[str, int]:
    """``key=value,...`` → ``{key: int}`` for the fields of a procedural spec; ValueError naming the known keys."""
    values = {}
    fields = list(spec_type.__dataclass_fields__)
    for item in filter(None, (s.strip() for s in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or key not in fields:
            raise ValueError(f"{spec_type.KIND} option {item!r} is not key=value with key one of {', '.join(fields)}")
        try:
            values[key] = int(value)
        except ValueError:
            raise ValueError(f"{spec_type.KIND} option {key}={value!r} is not an integer") from None
    return values


@lru_cache(maxsize=4)
def _photos(folder: str) -> tuple[Image.Image, ...]:
    paths = list_images(folder)
    if not paths:
        raise FileNotFoundError(f"no background photos in {folder}; the shapes data set needs assets/backgrounds/")
    return tuple(load_image(p) for p in paths)


def _background(rng: np.random.Generator, size: tuple[int, int], photos: Sequence[Image.Image]) -> np.ndarray:
    """A random crop of a random photo, flipped half the time, with a little brightness jitter."""
    h, w = size
    photo = photos[int(rng.integers(len(photos)))]
    pw, ph = photo.size
    scale = rng.uniform(0.3, 1.0)
    ch = min(ph, pw * h / w) * scale
    cw = ch * w / h
    x0, y0 = rng.uniform(0, pw - cw), rng.uniform(0, ph - ch)
    crop = photo.resize((w, h), Image.Resampling.BILINEAR, box=(x0, y0, x0 + cw, y0 + ch))
    if rng.random() < 0.5:
        crop = crop.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return np.asarray(crop, dtype=np.float32) * rng.uniform(0.7, 1.2)


def _mask(label: int, rng: np.random.Generator, size: tuple[int, int]) -> np.ndarray:
    """Anti-aliased coverage in [0, 1] of one object with random size, rotation and position."""
    h, w = size
    side = min(h, w)
    radius = rng.uniform(0.16, 0.34) * side
    margin = 0.8 * radius  # the object may be clipped a little at the border, never mostly
    cy, cx = rng.uniform(margin, h - margin), rng.uniform(margin, w - margin)
    angle = rng.uniform(0, 2 * math.pi)
    c, s = math.cos(angle), math.sin(angle)
    k = SUPERSAMPLE
    canvas = Image.new("L", (w * k, h * k), 0)
    draw = ImageDraw.Draw(canvas)
    for poly, paint in SHAPES[CLASS_NAMES[label]]:
        pts = [((cx + radius * (c * x - s * y)) * k, (cy + radius * (s * x + c * y)) * k) for x, y in poly]
        draw.polygon(pts, fill=255 if paint else 0)
    return np.asarray(canvas.reduce(k), dtype=np.float32) / 255.0


def _colour(rng: np.random.Generator, behind: np.ndarray) -> np.ndarray:
    """A saturated random colour that stands out from the mean colour ``behind`` the object."""
    best, best_dist = None, -1.0
    for _ in range(8):
        hue = rng.uniform(0, 1)
        sat, val = rng.uniform(0.5, 1.0), rng.uniform(0.35, 1.0)
        i = int(hue * 6) % 6
        f = hue * 6 - int(hue * 6)
        p, q, t = val * (1 - sat), val * (1 - f * sat), val * (1 - (1 - f) * sat)
        rgb = np.array([(val, t, p), (q, val, p), (p, val, t), (p, q, val), (t, p, val), (val, p, q)][i]) * 255
        dist = float(np.linalg.norm(rgb - behind))
        if dist > best_dist:
            best, best_dist = rgb, dist
        if dist >= 120:
            break
    return best.astype(np.float32)


def render_with_mask(
    seed: int, split: str, index: int, num_classes: int, size: tuple[int, int], photos_dir: str | Path = BACKGROUNDS
) -> tuple[np.ndarray, int, np.ndarray]:
    """Image ``index`` of a split as ``(H, W, 3)`` uint8, its label, and the object's coverage ``(H, W)`` in [0, 1].

    Classes cycle with the index, so every split is balanced.
    """
    label = index % num_classes
    rng = np.random.default_rng([seed, SPLITS[split], index])
    bg = _background(rng, size, _photos(str(photos_dir)))
    alpha = _mask(label, rng, size)
    behind = (bg * alpha[..., None]).sum(axis=(0, 1)) / max(float(alpha.sum()), 1e-6)
    img = bg * (1 - alpha[..., None]) + _colour(rng, behind) * alpha[..., None]
    return np.clip(img + 0.5, 0, 255).astype(np.uint8), label, alpha


def render(
    seed: int, split: str, index: int, num_classes: int, size: tuple[int, int], photos_dir: str | Path = BACKGROUNDS
) -> tuple[np.ndarray, int]:
    """Image ``index`` of a split as ``(H, W, 3)`` uint8 and its label."""
    img, label, _ = render_with_mask(seed, split, index, num_classes, size, photos_dir)
    return img, label


class ShapesDataset:
    """One split of ``shapes`` at a given resolution; ``ds[i]`` is ``(H×W×3 uint8 array, label)``.

    Another procedural set subclasses it with its own ``CLASS_NAMES`` and ``render_with_mask``.
    """

    CLASS_NAMES = CLASS_NAMES
    render_with_mask = staticmethod(render_with_mask)

    def __init__(
        self, spec: ShapesSpec, split: str, size: tuple[int, int] | None = None, photos_dir: str | Path = BACKGROUNDS
    ):
        if split not in SPLITS:
            raise ValueError(f"split must be one of {tuple(SPLITS)}, got {split!r}")
        self.spec, self.split = spec, split
        self.size = tuple(size) if size else (spec.size, spec.size)
        self.photos_dir = str(photos_dir)
        self.class_names = list(self.CLASS_NAMES[: spec.classes])
        self._cache: dict[int, tuple[np.ndarray, int]] = {}
        self._cached_bytes = 0

    def __len__(self) -> int:
        return self.spec.train if self.split == "train" else self.spec.val

    def render_options(self) -> dict[str, int]:
        """Keyword arguments of ``render_with_mask`` beyond the common ones (a scene task's grid)."""
        return {}

    def with_mask(self, index: int) -> tuple[np.ndarray, int, np.ndarray]:
        """Image ``index``, its label and the coverage ``(H, W)`` of what decides its class."""
        if not 0 <= index < len(self):
            raise IndexError(f"index {index} out of range for {len(self)} images")
        return self.render_with_mask(
            self.spec.seed, self.split, index, self.spec.classes, self.size, self.photos_dir, **self.render_options()
        )

    def __getitem__(self, index: int) -> tuple[np.ndarray, int]:
        """Rendered once per process up to :data:`CACHE_BYTES` (rendering can cost a third of a small model's
        step); a caller gets its own copy, so nothing it does reaches the cache."""
        if index in self._cache:
            img, label = self._cache[index]
            return img.copy(), label
        img, label, _ = self.with_mask(index)
        if self._cached_bytes + img.nbytes <= CACHE_BYTES:
            self._cache[index] = img.copy(), label
            self._cached_bytes += img.nbytes
        return img, label
