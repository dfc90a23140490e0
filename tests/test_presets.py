"""Presets (:mod:`ssog_core.analysis.presets`): the trained heads the playground offers, picked by the shape of
their field."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ssog_core.analysis.measures import layer_fields
from ssog_core.analysis.presets import HeadShape, find_presets, head_shapes
from tests.app_fixtures import designed_ssog


def test_presets_pick_the_designed_shapes():
    fields = layer_fields(designed_ssog())
    presets = {p.kind: p for p in find_presets(fields)}
    assert list(presets) == ["tight local blob", "vertical strip", "horizontal strip", "broad field"]
    assert len({(p.shape.layer, p.shape.head) for p in presets.values()}) == 4
    v, h, broad = (
        presets["vertical strip"].shape,
        presets["horizontal strip"].shape,
        presets["broad field"].shape,
    )
    blob = presets["tight local blob"].shape
    assert v.spread_y >= 3 * v.spread_x and h.spread_x >= 3 * h.spread_y and v.spread_y >= 8 / 4  # the stated rule
    assert broad.spread_y * broad.spread_x > 4 * blob.spread_y * blob.spread_x
    label = presets["vertical strip"].label
    assert "layer" in label and "head" in label and f"spread {v.spread_y:.1f} × {v.spread_x:.1f} cells" in label


def test_presets_never_call_a_round_field_a_strip():
    model = designed_ssog(depth=1, heads=2)
    with torch.no_grad():  # every head round and local: only the blob kind fits
        attn = model.blocks[0].attn
        attn.raw_sigma.fill_(0.0)
        attn.mu.zero_()
    presets = find_presets(layer_fields(model))
    assert [p.kind for p in presets] == ["tight local blob"]


def test_head_shapes_moments_against_numpy():
    fields = layer_fields(designed_ssog(img_size=20, patch=4, dim=16, depth=1, heads=4))  # 5×5 grid
    shapes = head_shapes(fields)
    d = fields[0].density[2].double().numpy()
    oy, ox = np.mgrid[-4:5, -4:5]
    cy, cx = (d * oy).sum(), (d * ox).sum()
    s = shapes[2]
    assert (s.centre_y, s.centre_x) == pytest.approx((cy, cx))
    assert s.spread_y == pytest.approx(np.sqrt((d * (oy - cy) ** 2).sum()))
    assert s.spread_x == pytest.approx(np.sqrt((d * (ox - cx) ** 2).sum()))


def shape(sy: float, sx: float, grid: int = 14, centre: float = 0.0) -> HeadShape:
    return HeadShape(0, 0, sy, sx, centre, 0.0, (grid, grid))


def test_a_head_is_named_by_its_measured_spread_against_stated_thresholds():
    """A 0.6 × 1.2-cell field is a blob, not a "horizontal strip" (a ratio alone named it one); a strip is long
    (≥ ¼ of the grid side) as well as thin (≥ 3×)."""
    assert shape(0.6, 1.2).kinds() == ["horizontally elongated field"]
    assert "vertical strip" in shape(4.81, 1.5).kinds()  # 3.2× and 4.81 ≥ 14 / 4
    assert "vertical strip" not in shape(4.81, 1.74).kinds()  # 2.8×: elongated, not a strip
    assert shape(4.81, 1.74).kinds() == ["vertically elongated field"]
    assert shape(3.0, 1.0, grid=40).kinds() == ["vertically elongated field"]  # thin but short on a 40-cell grid
    assert shape(0.8, 0.7).kinds() == ["tight local blob"] and shape(0.8, 0.7, centre=2).kinds() == []
    assert shape(3.7, 3.1).kinds() == ["broad field"]
