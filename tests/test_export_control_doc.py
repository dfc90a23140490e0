"""``experiments/export_control.py``: its measures by hand, a run on small random models, and the section it writes."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from ssog_core import ViT, save_checkpoint

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def ec() -> ModuleType:
    spec = importlib.util.spec_from_file_location("export_control", ROOT / "experiments" / "export_control.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_measures_by_hand(ec):
    a = np.array([[[1.0, 2.0], [3.0, 4.0]], [[0.0, 0.0], [0.0, 0.0]]])
    b = np.array([[[2.0, 4.0], [6.0, 8.0]], [[1.0, 2.0], [3.0, 4.0]]])
    assert ec._corr(a, b) == pytest.approx(1.0)  # the flat second map is left out
    assert ec._corr(a[:1], -b[:1]) == pytest.approx(-1.0)
    masks = np.array([[[True, False], [False, False]], [[False, False], [False, True]]])
    assert ec._wins(b, masks) == 0.5  # image 0: 2 < 6; image 1: 4 > 2
    cover = np.zeros((12, 12))
    cover[5:7, 5:7] = 1
    assert not ec.outer_third(cover)
    cover[:, :] = 0
    cover[4:8, 0:3] = 1
    assert ec.outer_third(cover)


@pytest.mark.slow
def test_run_and_section_on_small_random_models(ec, tmp_path):
    meta = {"data": "layouts:classes=10,train=10,val=40,size=28", "class_names": ["c"] * 10}
    paths = {}
    for name, attn in (("SSOG", "ssog"), ("dot", "dot")):
        model = ViT(num_classes=10, img_size=28, patch_size=4, dim=16, depth=2, num_heads=2, attn=attn)
        paths[name] = save_checkpoint(tmp_path / f"{attn}.safetensors", model, meta)
    results = {name: ec.run(str(p), 6, 5) for name, p in paths.items()}
    r = results["SSOG"]
    assert r["control_images"] == 5 and r["validation"]["images"] == r["off_centre"]["images"] == 6
    assert r["validation"]["rendered"] == 6 and r["off_centre"]["rendered"] >= 6
    assert all(0 <= v <= 1 for v in r["off_centre"]["object_wins"].values())
    json.dumps(results)  # what the script writes
    doc = tmp_path / "RESULTS.md"
    doc.write_text("# Results\n\ntext\n\n<!-- small-data:begin -->\nsmall\n<!-- small-data:end -->\n")
    for _ in range(2):  # inserted before the small-data section, then replaced in place
        ec.write_section(doc, ec.section(results, 6))
        text = doc.read_text()
        assert text.count(ec.MARKERS[0]) == 1 and text.index(ec.MARKERS[1]) < text.index("<!-- small-data:begin -->")
    assert text.startswith("# Results\n\ntext\n") and "| SSOG | off-centre (6) |" in text
