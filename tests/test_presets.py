"""Presets (:mod:`ssog_core.analysis.presets`): the trained heads the playground offers, picked by the shape of
their field."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ssog_core.analysis.measures import head_fields
from ssog_core.analysis.presets import find_presets, head_shapes
from tests.app_fixtures import designed_ssog


def test_presets_pick_the_designed_shapes():
    fields = head_fields(designed_ssog())
    presets = {p.kind: p for p in find_presets(fields)}
    assert list(presets) == ["tight local blob", "vertical strip", "horizontal strip", "broad global field"]
    assert len({(p.shape.layer, p.shape.head) for p in presets.values()}) == 4
    v, h, broad = (
        presets["vertical strip"].shape,
        presets["horizontal strip"].shape,
        presets["broad global field"].shape,
    )
    blob = presets["tight local blob"].shape
    assert v.spread_y > 2 * v.spread_x and h.spread_x > 2 * h.spread_y
    assert broad.spread_y * broad.spread_x > 4 * blob.spread_y * blob.spread_x
    assert "layer" in presets["vertical strip"].label and "head" in presets["vertical strip"].label


def test_presets_never_call_a_round_field_a_strip():
    model = designed_ssog(depth=1, heads=2)
    with torch.no_grad():  # every head round and local: only the blob kind fits
        attn = model.blocks[0].attn
        attn.raw_sigma.fill_(0.0)
        attn.mu.zero_()
    presets = find_presets(head_fields(model))
    assert [p.kind for p in presets] == ["tight local blob"]


def test_head_shapes_moments_against_numpy():
    fields = head_fields(designed_ssog(img_size=20, patch=4, dim=16, depth=1, heads=4))  # 5×5 grid
    shapes = head_shapes(fields)
    d = fields[0].density[2].double().numpy()
    oy, ox = np.mgrid[-4:5, -4:5]
    cy, cx = (d * oy).sum(), (d * ox).sum()
    s = shapes[2]
    assert (s.centre_y, s.centre_x) == pytest.approx((cy, cx))
    assert s.spread_y == pytest.approx(np.sqrt((d * (oy - cy) ** 2).sum()))
    assert s.spread_x == pytest.approx(np.sqrt((d * (ox - cx) ** 2).sum()))
