"""Reports (:mod:`ssog_core.analysis.report`): the model card, the atom table, top classes and the raw-number files."""

from __future__ import annotations

import io
import json
import math

import numpy as np
import pytest
import torch

from ssog_core.analysis import report
from ssog_core.analysis.measures import export_maps, layer_fields, steering_offsets
from ssog_core.nn.cost import count_params
from tests.app_fixtures import CLASS_NAMES, designed_ssog


def test_report_card_atoms_classes_and_files(tmp_path):
    model = designed_ssog()
    meta = {"accuracy": 0.5, "command": "python -m x", "transforms": {"train": "pad-crop", "eval": "as is"}}
    card = report.model_card(model, meta)
    assert card["parameters"] == count_params(model) and card["FLOPs per forward"] > 0
    assert card["accuracy"] == 0.5 and card["training command"] == "python -m x"
    assert card["transforms"] == "train: pad-crop; eval: as is"
    fields = layer_fields(model)
    rows = report.atom_rows(fields)
    assert len(rows) == 3 * 4 * 3 and len(rows[0]) == len(report.ATOM_COLUMNS)
    assert rows[5][5] == -rows[5][3] and rows[5][6] == -rows[5][4]
    assert report.initial_gate_scale(model.config) == pytest.approx(math.log1p(math.exp(-2.0)) + 1e-4)
    logits = torch.tensor([[0.1, 2.0, -1.0, 0.5, 0.0]])
    top = report.top_classes(logits, CLASS_NAMES, k=3)
    assert list(top) == ["square", "star", "circle"] and sum(top.values()) < 1
    x = torch.rand(1, 3, 32, 32)
    maps = export_maps(model, x)
    arrays = report.export_arrays(maps)
    npz = np.load(io.BytesIO(report.npz_bytes(arrays, {"alpha": 0.5})))
    assert json.loads(str(npz["settings"])) == {"alpha": 0.5}
    np.testing.assert_array_equal(npz["net"], maps.net[0].numpy())
    csv_text = report.maps_csv(maps, {"checkpoint": "c"})
    assert csv_text.startswith("# checkpoint: c\nmap,layer,row,col,value\n")
    assert len(csv_text.strip().splitlines()) == 2 + 3 * 3 * 64 + 2 * 64
    offsets = report.steering_arrays(steering_offsets(model, x))
    assert offsets["shift_0"].shape == (8, 8, 4, 2)
