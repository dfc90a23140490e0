"""experiments/head_fields.py on tiny float64 models: a steered head's share explained by its own fixed part against a
float64 reference from the measures' fixed-field path; what it reports for a head, a layer and the whole model made
content-blind is that edit's own effect; the section counts from the numbers; a second run resumes; and the committed
section is what the committed results JSON says."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

from ssog_core.analysis.measures import attention_maps
from ssog_core.interventions.effects import outcomes, validation_effect
from ssog_core.interventions.ops import ReplaceWithField
from ssog_core.interventions.run import mean_attention
from tests.test_effects import eval_set
from tests.test_pattern_point import GRID, lab_model

ROOT = Path(__file__).resolve().parents[1]


def _script():
    spec = importlib.util.spec_from_file_location("head_fields_experiment", ROOT / "experiments" / "head_fields.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


hf = _script()


def test_a_steered_heads_share_explained_by_its_fixed_part_is_one_minus_its_mean_tv_from_it():
    model, data = lab_model("ssog"), eval_set(6, seed=1)
    got = hf.fixed_part_share(model, data, GRID)
    x = data.batch(0, len(data), torch.device("cpu"), torch.float64)
    steered, fixed = attention_maps(model, x, steered=True), attention_maps(model, x, steered=False)
    want = torch.zeros(len(model.blocks), 3, dtype=torch.float64)
    for layer, (a, f) in enumerate(zip(steered.attn, fixed.attn, strict=True)):
        for h in range(3):
            tv = [0.5 * float((a[b, h, q] - f[b, h, q]).abs().sum()) for b in range(len(x)) for q in range(35)]
            want[layer, h] = 1 - sum(tv) / len(tv)
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12)
    assert float(got.max()) < 1 - 1e-3  # content moved every head: the reference is not the trivial 1


def test_what_it_reports_for_a_head_a_layer_and_the_whole_model_is_that_edits_own_effect():
    model, data = lab_model("dot"), eval_set(24, seed=2)
    entry = hf.measure(model, data, "tiny")
    assert (entry["steered"], entry["images"]["first"], entry["atoms_per_head"]) == (False, 24, 4)
    assert [(h["layer"], h["head"]) for h in entry["heads"]] == [(i, h) for i in range(3) for h in range(3)]
    attention, before = mean_attention(model, data.batches(model)), outcomes(model, data)

    def change(edits):
        v = validation_effect(model, data, edits, unedited=before, attention=attention)
        return (v.accuracy.change, v.logp_true.change, *v.logp_true.ci95)

    cell = entry["heads"][5]["replace_with_fit"]  # layer 1, head 2
    acc, logp, *ci = change([ReplaceWithField(1, 2, "fit", 4)])
    assert (cell["accuracy_drop"], cell["logp_drop"]) == pytest.approx((-acc, -logp), abs=1e-12)
    assert cell["ci95"] == pytest.approx([-ci[1], -ci[0]], abs=1e-12)
    layer = entry["layers_replaced"][2]
    assert (layer["accuracy_change"], layer["logp_change"], *layer["logp_ci95"]) == pytest.approx(
        change([ReplaceWithField(2, None, "fit", 4)]), abs=1e-12
    )
    for how in ("fit", "field"):
        whole = entry["content_blind"][how]
        assert (whole["accuracy_change"], whole["logp_change"], *whole["logp_ci95"]) == pytest.approx(
            change([ReplaceWithField(i, None, how, 4) for i in range(3)]), abs=1e-12
        )
    assert abs(entry["content_blind"]["fit"]["logp_change"]) > 1e-3  # content-blind moved this model
    assert entry["unedited_accuracy"] == pytest.approx(float(before.correct(data.labels).double().mean()))


def _cell(drop: float, lo: float, hi: float) -> dict:
    return {"accuracy_drop": 0.0, "logp_drop": drop, "ci95": [lo, hi], "within_noise": lo <= 0 <= hi}


def _effect(acc: float, change: float) -> dict:
    return {"accuracy": acc, "accuracy_change": change, "accuracy_ci95": [change - 0.01, change + 0.01],
            "mcnemar_p": 0.5, "logp_change": change, "logp_ci95": [change - 0.1, change + 0.1]}  # fmt: skip


def _head(layer: int, head: int, share: float, **more) -> dict:
    return {"layer": layer, "head": head, "mean_distance_px": 3.0, "share_fit": share, "share_field": share - 0.01,
            "prefix_share": 0.0, "atoms": [], **more}  # fmt: skip


def test_the_section_counts_the_heads_from_the_numbers_and_replaces_only_itself(tmp_path):
    blind = {"fit": _effect(0.5, -0.4), "field": _effect(0.55, -0.35)}
    dot = {
        "steered": False,
        "unedited_accuracy": 0.9,
        "content_blind": blind,
        "layers_replaced": [_effect(0.8, -0.1)],
        "heads": [
            _head(0, 0, 0.6, replace_with_fit=_cell(0.30, 0.2, 0.4), ablate_head=_cell(1.0, 0.5, 1.5)),
            _head(0, 1, 0.8, replace_with_fit=_cell(0.01, -0.02, 0.04), ablate_head=_cell(0.0, -0.1, 0.1)),
            _head(0, 2, 0.7, replace_with_fit=_cell(-0.01, -0.03, 0.01), ablate_head=_cell(0.0, -0.1, 0.1)),
        ],
    }
    steered = {"steered": True, "unedited_accuracy": 0.95, "content_blind": blind,
               "heads": [_head(0, h, 0.5, share_fixed_part=s) for h, s in enumerate((0.2, 0.4, 0.6))]}  # fmt: skip
    text = hf.section({"dot_layouts": dot, "ssog_layouts": steered}, 123, "python experiments/head_fields.py")
    assert text.startswith(hf.MARKS[0]) and text.endswith(hf.MARKS[1])
    assert "first **123** validation images" in text
    assert "2 of 3 heads change log p(true) within noise and 1 cost measurably (largest: L0H0 -0.300" in text
    assert "accuracy 0.9000 → 0.5000" in text
    assert "one layer at a time, no layer keeps accuracy within noise; layer 0 costs accuracy (-0.100)." in text
    assert "**Contradicts:** layouts: the dot twin's layer 0 needs content" in text
    assert "**Supports:** layouts: the steered SSOG model, whose content only steers fixed atoms, scores 0.9500" in text
    assert "mean total-variation distance of 0.600 from their fixed part" in text  # 1 − mean(0.2, 0.4, 0.6)
    assert "| 0 | 0 | 3.0 | 0.600 | 0.590 | +0.000 | -0.300 [-0.400, -0.200] | -1.000 [-1.500, -0.500] |" in text
    assert "| 0 | 1 | 3.0 | 0.800 | 0.790 | +0.000 | -0.010 [-0.040, +0.020] · |" in text
    doc = tmp_path / "RESULTS.md"
    doc.write_text("# Results\n\nkept\n")
    for _ in range(2):
        hf.replace_section(doc, hf.MARKS, text)
    assert doc.read_text() == f"# Results\n\nkept\n\n{text}\n"


def test_a_second_run_takes_each_models_kept_numbers_and_a_new_n_measures_again(tmp_path, monkeypatch):
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "matched_dot_layouts.safetensors").write_bytes(b"")
    kept = tmp_path / "out" / "head_fields" / "dot_layouts.json"
    kept.parent.mkdir(parents=True)
    entry = {"checkpoint": "checkpoints/matched_dot_layouts.safetensors", "images": {"first": 40}, "heads": []}
    kept.write_text(json.dumps(entry))

    def no_loading(path):
        raise RuntimeError(f"loaded {Path(path).name}")

    monkeypatch.setattr(hf, "load_checkpoint", no_loading)
    assert hf.run_all(tmp_path / "ckpt", tmp_path / "out", 40) == {"dot_layouts": entry}
    with pytest.raises(RuntimeError, match="loaded matched_dot_layouts.safetensors"):
        hf.run_all(tmp_path / "ckpt", tmp_path / "out", 41)


def test_the_committed_section_is_what_the_committed_results_say():
    results = json.loads((ROOT / "experiments" / "results" / "head_fields.json").read_text())
    n = results["images"]
    text = (ROOT / "docs" / "RESULTS.md").read_text()
    assert text.count(hf.MARKS[0]) == text.count(hf.MARKS[1]) == 1
    block = text[text.index(hf.MARKS[0]) : text.index(hf.MARKS[1]) + len(hf.MARKS[1])]
    command = hf.command_of(n, results["threads"], results["data"])
    assert block == hf.section(results["models"], n, command)
    assert {f"{kind}_{data}" for kind in hf.KINDS for data in results["data"]} == set(results["models"])
