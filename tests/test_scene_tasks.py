"""The scene tasks ``pointer`` and ``relation``: determinism, the grid knob, masks, spec errors, and labels read back
from the pixels alone (also after the training augmentations), so a rendering bug cannot hide behind the label."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ssog_core.data import pointer, relation
from ssog_core.data.scene import PALETTE
from ssog_core.data.sources import Transformed, open_data, parse_data_spec

SIZES = {"pointer": 6, "relation": 6}


def _centroid(mask: np.ndarray) -> np.ndarray:
    ys, xs = np.nonzero(mask)
    return np.array([xs.mean(), ys.mean()])


def _blobs(mask: np.ndarray) -> list[np.ndarray]:
    """Connected components (4-neighbour) of a boolean mask, largest first, as boolean masks."""
    seen = np.zeros_like(mask, dtype=bool)
    found = []
    for y0, x0 in zip(*np.nonzero(mask), strict=True):
        if seen[y0, x0]:
            continue
        stack, part = [(y0, x0)], np.zeros_like(seen)
        seen[y0, x0] = True
        while stack:
            y, x = stack.pop()
            part[y, x] = True
            for dy, dx in ((1, 0), (-1, 0), (0, 1), (0, -1)):
                v, u = y + dy, x + dx
                if 0 <= v < mask.shape[0] and 0 <= u < mask.shape[1] and mask[v, u] and not seen[v, u]:
                    seen[v, u] = True
                    stack.append((v, u))
        found.append(part)
    return sorted(found, key=lambda p: -p.sum())


def _touches_border(mask: np.ndarray) -> bool:
    return bool(mask[0].any() or mask[-1].any() or mask[:, 0].any() or mask[:, -1].any())


def _colour_mask(img: np.ndarray, rgb: tuple[int, int, int]) -> np.ndarray:
    """Pixels within reach of a palette colour at any of the shades the renderer uses (0.85–1.0)."""
    x = img.astype(np.float64)
    target = np.asarray(rgb, dtype=np.float64)
    best = np.min([np.linalg.norm(x - target * s, axis=-1) for s in (0.85, 0.925, 1.0)], axis=0)
    return best < 30


def pointed_colour(img: np.ndarray) -> int:
    """The palette class whose disc lies most nearly where the cue points (black tail → white head)."""
    white = _blobs((img > 225).all(axis=-1))[0]
    black = next(b for b in _blobs((img < 40).all(axis=-1)) if not _touches_border(b))  # a pad-crop's border is black
    tail, head = _centroid(black), _centroid(white)
    aim = math.atan2(*(head - tail)[::-1])
    best, best_err = -1, math.inf
    for label, rgb in enumerate(PALETTE.values()):
        blobs = [b for b in _blobs(_colour_mask(img, rgb)) if b.sum() >= 12]
        for blob in blobs:
            c = _centroid(blob)
            err = abs((math.atan2(*(c - head)[::-1]) - aim + math.pi) % (2 * math.pi) - math.pi)
            if err < best_err:
                best, best_err = label, err
    assert best_err < math.radians(25), "the cue points at no target"
    return best


def mark_shape(img: np.ndarray, blob: np.ndarray, cell: float) -> str:
    """Disc, ring or plus, from the whiteness at the mark's centre and at four points on its diagonals."""
    white = img.min(axis=-1).astype(np.float64)
    cx, cy = _centroid(blob)
    r = relation.RADIUS * cell

    def at(x: float, y: float) -> float:  # bilinear
        x0, y0 = int(math.floor(x - 0.5)), int(math.floor(y - 0.5))
        fx, fy = x - 0.5 - x0, y - 0.5 - y0
        w = white[y0 : y0 + 2, x0 : x0 + 2]
        return float(
            w[0, 0] * (1 - fx) * (1 - fy) + w[0, 1] * fx * (1 - fy) + w[1, 0] * (1 - fx) * fy + w[1, 1] * fx * fy
        )

    centre = at(cx + 0.5, cy + 0.5) > 200
    d = 0.6 * r
    corners = np.mean([at(cx + 0.5 + sx * d, cy + 0.5 + sy * d) for sx in (-1, 1) for sy in (-1, 1)]) > 200
    return {(True, True): "disc", (False, True): "ring", (True, False): "plus"}[(centre, corners)]


def relation_class(img: np.ndarray, cell: float) -> str:
    """Axis and same/different of the two white marks, read from the pixels."""
    marks = _blobs((img > 225).all(axis=-1))
    assert len(marks) == 2 or (len(marks) > 2 and marks[2].sum() < 4), "not two white marks"
    a, b = marks[0], marks[1]
    (ax, ay), (bx, by) = _centroid(a), _centroid(b)
    dx, dy = abs(ax - bx), abs(ay - by)
    axis = "row" if dy < 1.5 else "column" if dx < 1.5 else "diagonal"
    if axis == "diagonal":
        assert abs(dx - dy) < 2.0, (dx, dy)
    same = mark_shape(img, a, cell) == mark_shape(img, b, cell)
    return f"{axis} {'same' if same else 'different'}"


def read_label(kind: str, img: np.ndarray, grid: int) -> str:
    if kind == "pointer":
        return pointer.CLASS_NAMES[pointed_colour(img)]
    return relation_class(img, img.shape[0] / grid)


@pytest.mark.parametrize("kind", ["pointer", "relation"])
def test_deterministic_per_seed_split_and_index(kind):
    a = open_data(f"{kind}:grid=16,train=40,val=10")
    b = open_data(f"{kind}:grid=16,train=40,val=10")
    img, label = a.train[13]
    assert img.shape == (64, 64, 3) and img.dtype == np.uint8 and a.native_size == (64, 64)
    assert label == 13 % SIZES[kind] and a.num_classes == SIZES[kind]
    np.testing.assert_array_equal(img, b.train[13][0])
    assert not np.array_equal(img, a.train[14][0])
    assert not np.array_equal(img, a.val[3][0]) and not np.array_equal(a.train[3][0], a.val[3][0])
    other = open_data(f"{kind}:grid=16,seed=1")
    assert not np.array_equal(img, other.train[13][0])
    with pytest.raises(IndexError):
        a.train[40]


@pytest.mark.parametrize("kind", ["pointer", "relation"])
@pytest.mark.parametrize("grid", [12, 20])
def test_labels_read_back_from_pixels(kind, grid):
    data = open_data(f"{kind}:grid={grid},train=60")
    names = data.class_names
    for i in range(60):
        img, label = data.train[i]
        assert read_label(kind, img, grid) == names[label], f"image {i}"


@pytest.mark.parametrize("kind", ["pointer", "relation"])
def test_labels_survive_the_training_augmentations(kind):
    data = open_data(f"{kind}:grid=20,train=48")
    augmented = Transformed(data.train, (80, 80), ("pad-crop", "flip"), seed=5)
    flipped = 0
    for i in range(48):
        img, label = augmented[(i, 3)]
        flipped += not np.array_equal(img, data.train[i][0][:, :])
        assert read_label(kind, img, 20) == data.class_names[label], f"image {i}"
        assert read_label(kind, np.ascontiguousarray(data.train[i][0][:, ::-1]), 20) == data.class_names[label]
    assert flipped > 30  # the augmentations did change most images


def test_pointer_layout_keeps_its_promises():
    rng = np.random.default_rng(7)
    for grid in (12, 14, 20, 24):
        reach = pointer.min_reach(grid)
        for _ in range(200):
            cue, targets = pointer.layout(rng, grid)
            assert len(targets) == pointer.TARGETS
            assert all(2.5 <= v <= grid - 2.5 for v in cue)
            for i, t in enumerate(targets):
                assert all(2.0 <= v <= grid - 2.0 for v in t)
                assert math.dist(t, cue) >= reach
                for u in targets[i + 1 :]:
                    assert math.dist(t, u) >= 3.5
                    a = math.atan2(t[1] - cue[1], t[0] - cue[0]) - math.atan2(u[1] - cue[1], u[0] - cue[0])
                    assert abs((a + math.pi) % (2 * math.pi) - math.pi) >= math.radians(60) - 1e-9
    assert pointer.min_reach(24) > 4  # beyond the ±4-cell offset bound on the large board


def test_relation_pairs_are_far_apart_on_one_axis():
    rng = np.random.default_rng(3)
    for grid in (12, 20, 24):
        for axis in relation.AXES:
            for _ in range(100):
                (ax, ay), (bx, by) = relation.pair(rng, axis, grid)
                assert all(2.0 <= v <= grid - 2.0 for v in (ax, ay, bx, by))
                dx, dy = abs(ax - bx), abs(ay - by)
                gap = {"row": dx, "column": dy, "diagonal": dx}[axis]
                other = {"row": dy, "column": dx, "diagonal": abs(dx - dy)}[axis]
                assert gap >= relation.min_gap(grid) - 1e-9 and other < 1e-9
    assert relation.min_gap(24) > 8  # beyond twice the ±4-cell offset bound


@pytest.mark.parametrize("kind", ["pointer", "relation"])
def test_mask_covers_what_decides_the_class(kind):
    data = open_data(f"{kind}:grid=20,train=12")
    for i in range(12):
        img, label, mask = data.train.with_mask(i)
        assert mask.shape == img.shape[:2] and mask.dtype == np.float32
        assert mask.min() >= 0 and mask.max() <= 1
        white = (img > 225).all(axis=-1)
        assert mask[white].min() > 0.5  # every white pixel (cue head or mark) is evidence
        evidence = {label} if kind == "pointer" else set()  # relation: every coloured mark is a distractor
        if kind == "pointer":
            assert mask[(img < 40).all(axis=-1)].min() > 0.5  # the cue's tail
            assert mask[_colour_mask(img, list(PALETTE.values())[label])].mean() > 0.9  # the pointed target
        others = np.zeros_like(white)
        for j, rgb in enumerate(PALETTE.values()):
            if j not in evidence:
                others |= _colour_mask(img, rgb)
        assert others.sum() > 20 and mask[others].mean() < 0.1  # the distractors are not covered


@pytest.mark.parametrize("kind", ["pointer", "relation"])
def test_same_scene_at_another_resolution(kind):
    """The grid knob sets the board; rendering at twice the pixels draws the same scene (resolution transfer)."""
    spec = {"pointer": pointer.PointerSpec, "relation": relation.RelationSpec}[kind].parse("grid=14")
    render = {"pointer": pointer.render_with_mask, "relation": relation.render_with_mask}[kind]
    small, label, _ = render(0, "val", 4, spec.classes, (56, 56), grid=14)
    big, label_big, _ = render(0, "val", 4, spec.classes, (112, 112), grid=14)
    assert label == label_big
    down = big.reshape(56, 2, 56, 2, 3).astype(np.float64).mean(axis=(1, 3))
    assert np.abs(down - small).mean() < 12
    assert read_label(kind, big, 14) == spec.CLASS_NAMES[label]


@pytest.mark.parametrize(
    "text, message",
    [
        ("pointer:grid=8", "grid=8 must be between 12 and 64"),
        ("relation:grid=100", "between 12 and 64"),
        ("pointer:grid=2x", "is not an integer"),
        ("relation:size=64", "key one of grid, train, val, seed"),
        ("pointer:train=0", "train >= 1"),
        ("relation:grid", "is not key=value"),
    ],
)
def test_a_wrong_spec_is_refused_in_words(text, message):
    with pytest.raises(ValueError, match=message):
        parse_data_spec(text)


def test_rendered_once_and_never_changed_through_a_caller():
    data = open_data("pointer:grid=12,train=4")
    first, _ = data.train[2]
    first[:] = 0  # a caller writing into its image
    again, _ = data.train[2]
    assert again.any() and again.flags.writeable
    np.testing.assert_array_equal(again, data.train.with_mask(2)[0])
