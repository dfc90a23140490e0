"""One word per idea: a strip is a head whose long/short spread is ≥ ``presets.STRIP_RATIO`` (3) everywhere (presets,
the per-layer counts behind every results table, the docs); an elongated field (≥ ``ELONGATED_RATIO``, 2) is never
called a strip, and no other module keeps a threshold of its own."""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

import numpy as np
import torch

from ssog_core.analysis import report
from ssog_core.analysis.measures import layer_fields
from ssog_core.analysis.presets import ELONGATED_RATIO, STRIP_RATIO, HeadShape
from tests.app_fixtures import designed_ssog

ROOT = Path(__file__).resolve().parents[1]
SOURCES = [p for d in ("ssog_core", "app", "experiments", "benchmarks") for p in sorted((ROOT / d).rglob("*.py"))]
DOCS = [ROOT / "README.md", *(ROOT / "docs").glob("*.md"), ROOT / "checkpoints" / "MODEL_CARD.md"]


def test_the_thresholds():
    assert (STRIP_RATIO, ELONGATED_RATIO) == (3.0, 2.0)


def test_per_layer_strip_counts_use_the_strip_threshold_not_the_elongated_one(monkeypatch):
    """``layer_geometry`` (the ablation and matched-trio tables' "strips") counts exactly the heads whose spread
    ratio, computed here in float64, reaches STRIP_RATIO: an elongated head of 2.5× is not one."""
    model = designed_ssog(depth=2, heads=4)
    rng = np.random.default_rng(7)
    ratios = np.array([[1.0, 2.5, 2.999, 3.0], [3.7, 1.3, 2.0, 5.1]])
    fields = []
    for lf, r in zip(layer_fields(model), ratios, strict=True):
        short = rng.uniform(0.4, 1.7, size=4)
        long_first = rng.random(4) < 0.5  # either axis may be the long one
        spread = np.stack([np.where(long_first, short * r, short), np.where(long_first, short, short * r)], -1)
        fields.append(dataclasses.replace(lf, spread=torch.tensor(spread, dtype=torch.float32)))
    monkeypatch.setattr(report, "layer_fields", lambda m: fields)
    rows = report.layer_geometry(model)
    expected = (np.float64(ratios) >= STRIP_RATIO - 1e-6).sum(1)  # float32 spreads: 3.0 may land a hair below
    assert [row["strips"] for row in rows] == expected.tolist() == [1, 2]
    assert [row["max_elongation"] for row in rows] == list(np.float32(ratios.max(1)).astype(float))


def test_a_preset_strip_needs_the_strip_ratio_and_an_elongated_field_is_not_one():
    grid = (14, 14)
    elongated = HeadShape(0, 0, spread_y=2.5 * 1.4, spread_x=1.4, centre_y=0.0, centre_x=0.0, grid=grid)
    strip = HeadShape(0, 1, spread_y=1.2, spread_x=3.2 * 1.2, centre_y=0.0, centre_x=0.0, grid=grid)
    assert elongated.kinds() == ["vertically elongated field"]
    assert strip.kinds() == ["horizontal strip", "horizontally elongated field"]


def test_no_module_keeps_a_strip_or_elongation_threshold_of_its_own():
    own = []
    for path in SOURCES:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
                names = [t.id for t in node.targets if isinstance(t, ast.Name)]
                if any(("STRIP" in n or "ELONGAT" in n) for n in names) and isinstance(node.value.value, float):
                    own.append(f"{path.relative_to(ROOT)}: {', '.join(names)}")
    home = "ssog_core/analysis/presets.py"
    assert [o for o in own if not o.startswith(home)] == [] and f"{home}: STRIP_RATIO" in own


def test_nothing_calls_a_ratio_below_three_a_strip():
    """In code and docs: no "≥ 2 ... strip", and no strip given with a measured ratio under 3."""
    below = re.compile(r"(?:≥|>=)\s*2(?:\.0)?\s*(?:×|x)?[^.\n]{0,40}\bstrips?\b")
    measured = re.compile(r"\bstrip\b[^.;\n]{0,40}?\((?:σ ratio |spread ratio |ratio )?([0-9]+\.[0-9]+)×?\)")
    found = []
    for path in [*SOURCES, *DOCS]:
        text = " ".join(path.read_text(encoding="utf-8").split())  # sentences across line breaks
        found += [f"{path.name}: {m.group(0)}" for m in below.finditer(text)]
        found += [f"{path.name}: {m.group(0)}" for m in measured.finditer(text) if float(m.group(1)) < STRIP_RATIO]
    assert found == []
