"""experiments/head_fields.py on tiny float64 models: a steered head's share explained by its own fixed part against a
float64 reference from the measures' fixed-field path; what it reports for a head, a layer and the whole model made
content-blind is that edit's own effect; shares normalised against the uniform field's; the section counts from the
numbers, names diffuse heads and sets the 14×14 pointer models' layers side by side; the data sets' files are the ones
experiments/ablation.py keeps; a second run resumes, measures models of an older format again and skips missing ones;
and the committed section is what the committed results JSON says."""

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
    assert (entry["format"], entry["steered"], entry["images"]["first"], entry["atoms_per_head"]) == (
        hf.FORMAT,
        False,
        24,
        4,
    )
    assert all({"share_uniform", "normalised_fit", "diffuse", "entropy"} <= set(h) for h in entry["heads"])
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


def _head(layer: int, head: int, share: float, uniform: float = 0.2, **more) -> dict:
    """A head's JSON as heads_json writes it, its normalised shares from the float64 formula."""
    diffuse = 1 - uniform < 0.1
    fit, field = (
        (None, None) if diffuse else ((share - uniform) / (1 - uniform), (share - 0.01 - uniform) / (1 - uniform))
    )
    return {"layer": layer, "head": head, "mean_distance_px": 3.0 + layer, "share_fit": share,
            "share_field": share - 0.01, "share_uniform": uniform, "normalised_fit": fit, "normalised_field": field,
            "diffuse": diffuse, "entropy": 1.5, "prefix_share": 0.0, "atoms": [], **more}  # fmt: skip


def _model(heads: list[dict], accuracy: float, steered: bool = False, dot: bool = False) -> dict:
    e = {"steered": steered, "unedited_accuracy": accuracy, "grid": [7, 5], "heads": heads,
         "content_blind": {"fit": _effect(0.5, -0.4), "field": _effect(0.55, -0.35)}}  # fmt: skip
    if dot:
        e["layers_replaced"] = [_effect(0.8, -0.1)]
    return e


def test_a_share_normalised_against_the_uniform_fields_is_the_part_of_the_distance_it_closes():
    g = torch.Generator().manual_seed(3)
    for share, uniform in (torch.rand(20, 2, generator=g, dtype=torch.float64) * torch.tensor([1.0, 0.85])).tolist():
        assert hf.norm(share, uniform) == pytest.approx((share - uniform) / (1 - uniform), rel=1e-12)
    assert hf.norm(0.95, 0.93) is None  # within DIFFUSE_TV of uniform: diffuse
    assert hf.norm(0.93, 0.9 - 1e-9) is not None and hf.norm(0.5, 0.5) == 0.0  # just outside: defined


def test_the_section_counts_the_heads_from_the_numbers_names_diffuse_heads_and_replaces_only_itself(tmp_path):
    dot = _model(
        [
            _head(0, 0, 0.6, replace_with_fit=_cell(0.30, 0.2, 0.4), ablate_head=_cell(1.0, 0.5, 1.5)),
            _head(0, 1, 0.8, replace_with_fit=_cell(0.01, -0.02, 0.04), ablate_head=_cell(0.0, -0.1, 0.1)),
            _head(0, 2, 0.97, 0.95, replace_with_fit=_cell(-0.01, -0.03, 0.01), ablate_head=_cell(0.0, -0.1, 0.1)),
        ],
        0.9,
        dot=True,
    )
    steered = _model([_head(0, h, 0.5, share_fixed_part=s) for h, s in enumerate((0.2, 0.4, 0.6))], 0.95, True)
    text = hf.section({"dot_layouts": dot, "ssog_layouts": steered}, 123, "python experiments/head_fields.py")
    assert text.startswith(hf.MARKS[0]) and text.endswith(hf.MARKS[1])
    assert "first **123** validation images" in text
    assert "2 of 3 heads change log p(true) within noise and 1 cost measurably (largest: L0H0 -0.300" in text
    # L0H2 lies within 0.05 TV of uniform: named diffuse, left out of the normalised means
    assert "1 of 3 heads are diffuse (L0H2: entropy 1.50–1.50 nats against ln N = 3.56, share_fit 0.970–0.970" in text
    assert "The other 2 heads' fits close a mean 0.625 of their distance from uniform" in text  # (0.5 + 0.75) / 2
    assert (
        "| `dot_layouts` | 0.9000 | 1 of 3 | 0.450 (0.200–0.950) | 0.790 (0.600–0.970) | 0.625 (0.500–0.750) |" in text
    )
    assert "accuracy 0.9000 → 0.5000" in text
    assert "one layer at a time, no layer keeps accuracy within noise; layer 0 costs accuracy (-0.100)." in text
    assert "**Contradicts:** layouts: the dot twin's layer 0 needs content" in text
    assert "**Supports:** layouts: the steered SSOG model, whose content only steers fixed atoms, scores 0.9500" in text
    # fixed parts 0.2, 0.4, 0.6 against uniform 0.2: normalised 0, 0.25, 0.5; steering moves them 1 − 0.4 = 0.6
    assert "explain 0.400 (0.200–0.600) of them (the uniform field 0.200 (0.200–0.200); normalised 0.250" in text
    assert "mean total-variation distance of 0.600 from their fixed part" in text
    head = "| 0 | 0 | 3.0 | 1.50 | 0.200 | 0.600 | 0.500 | 0.590 | 0.487 | +0.000 | -0.300 [-0.400, -0.200] |"
    assert head in text
    assert (
        "| 0 | 2 | 3.0 | 1.50 | 0.950 | 0.970 | diffuse | 0.960 | diffuse | +0.000 | +0.010 [-0.010, +0.030] · |"
        in text
    )
    assert "14×14 pointer" not in text  # no model of the ablation measured: no subsection
    doc = tmp_path / "RESULTS.md"
    doc.write_text("# Results\n\nkept\n")
    for _ in range(2):
        hf.replace_section(doc, hf.MARKS, text)
    assert doc.read_text() == f"# Results\n\nkept\n\n{text}\n"


def test_the_pointer14_models_layers_stand_side_by_side_before_and_after_and_a_missing_run_is_named():
    def two_layers(shares: tuple[float, float], accuracy: float, steered: bool = False) -> dict:
        heads = [_head(layer, h, shares[layer], 0.95 if (layer, h) == (1, 0) else 0.2) for layer in range(2)
                 for h in range(2)]  # fmt: skip
        if steered:
            heads = [{**h, "share_fixed_part": 0.6} for h in heads]
        return _model(heads, accuracy, steered, dot=not steered)

    results = {
        f"dot_{hf.EARLY}": two_layers((0.6, 0.7), 0.49),
        f"dot_{hf.CONVERGED}": two_layers((0.68, 0.9), 0.5),
        f"ssog_mu_{hf.EARLY}": two_layers((0.36, 0.84), 0.48, True),
        f"ssog_mu_{hf.CONVERGED}": two_layers((0.52, 0.84), 1.0, True),
        f"ssog_{hf.EARLY}": two_layers((0.6, 0.6), 0.45, True),
    }
    text = hf.section(results, 50, "python experiments/head_fields.py")
    assert "Not there yet at 10,000 steps: fixed field, steered, steered ±2 (still training)." in text
    # layer 0: both heads at uniform 0.2; layer 1: one head diffuse (uniform 0.95), the other normalised alone
    assert "| dot twin | 0 | 0.200 | 0.600 | 0.500 | 3.0 | 0.200 | 0.680 | 0.600 | 3.0 |" in text
    assert (
        "| dot twin | 1 | 0.575 | 0.700 | 0.625 (1 diffuse) | 4.0 | 0.575 | 0.900 | 0.875 (1 diffuse) | 4.0 |" in text
    )
    assert "| steered | 1 | 0.575 | 0.600 | 0.500 (1 diffuse) | 4.0 | — | — | — | — |" in text
    # +μδ: normalised fit over the three non-diffuse heads (0.2, 0.2, 0.8) → (0.4, 0.4, 0.8)
    assert (
        "- **+μδ.** Accuracy 0.4800 → 1.0000 (first 50 images); diffuse heads 1 → 1 of 4; normalised fit "
        "0.400 → 0.533; mean distance 3.5 → 3.5 px." in text
    )
    assert "pointer14-converged: the +μδ SSOG model, whose content only steers fixed atoms, scores 1.0000" in text
    assert "- **steered.**" not in text  # no converged model to set beside the early one
    assert "- **At 10,000 steps** +μδ solved the task (at least 0.667 of these images right); dot twin did not." in text
    assert "although the fixed field" not in text and "no geometric part" not in text  # neither rule's numbers hold

    results[f"ssog_fixed_{hf.CONVERGED}"] = two_layers((1.0, 1.0), 0.99)
    for data in (hf.EARLY, hf.CONVERGED):  # every dot head that is not diffuse within ±0.05 of its uniform share
        results[f"dot_{data}"]["heads"] = [
            _head(h["layer"], h["head"], 0.212, 0.2) for h in results[f"dot_{data}"]["heads"]
        ]
    text = hf.section(results, 50, "python experiments/head_fields.py")
    assert "- **At 10,000 steps** fixed field, +μδ solved the task (at least 0.667 of these images right); dot " in text
    assert (
        "- **+μδ**, every head made content-blind, loses 0.400 of accuracy (-0.400 [-0.410, -0.390]), although the "
        "fixed field solves the same task with content-blind attention (0.9900)" in text
    )
    assert "has a normalised fit within ±0.05 (+0.015 to +0.015), however sharp (layer 0's entropy 1.50–1.50" in text


def test_the_data_sets_files_are_the_ones_the_ablation_keeps_and_the_matched_trios():
    spec = importlib.util.spec_from_file_location("ablation_experiment", ROOT / "experiments" / "ablation.py")
    ablation = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = ablation
    spec.loader.exec_module(ablation)
    rows = {**ablation.VARIANTS, ablation.OFFSET_ROW[0]: ablation.OFFSET_ROW[1]}
    names = {"dot": "dot", "ssog_fixed": "fixed", "ssog_mu": "+mu", "ssog": "steered", "ssog_offset2": "steered ±2"}
    for data, epochs in ((hf.EARLY, None), (hf.CONVERGED, ablation.CONVERGED)):
        got = hf.checkpoints_of(data, ROOT / "checkpoints", ablation.MODELS)
        want = {k: ablation.Run("pointer", "small", v, 0, tuple(rows[v]), epochs).model for k, v in names.items()}
        assert got == want
    trio = hf.checkpoints_of("pointer20", ROOT / "checkpoints", ablation.MODELS)
    assert trio == {k: ablation.Run("pointer", "large", names[k], 0, tuple(rows[names[k]])).model for k in hf.KINDS}
    with pytest.raises(ValueError, match="unknown data set 'pointer7'"):
        hf.checkpoints_of("pointer7", ROOT / "checkpoints", ablation.MODELS)


def test_a_second_run_takes_each_models_kept_numbers_and_a_new_n_or_format_measures_again(
    tmp_path, monkeypatch, capsys
):
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "matched_dot_layouts.safetensors").write_bytes(b"")
    kept = tmp_path / "out" / "head_fields" / "dot_layouts.json"
    kept.parent.mkdir(parents=True)
    entry = {"format": hf.FORMAT, "checkpoint": "checkpoints/matched_dot_layouts.safetensors",
             "images": {"first": 40}, "heads": []}  # fmt: skip
    kept.write_text(json.dumps(entry))

    def no_loading(path):
        raise RuntimeError(f"loaded {Path(path).name}")

    monkeypatch.setattr(hf, "load_checkpoint", no_loading)
    assert hf.run_all(tmp_path / "ckpt", tmp_path / "out", 40, ("layouts",)) == {"dot_layouts": entry}
    assert "skipping ssog_fixed_layouts: no " in capsys.readouterr().out  # not there: named, not measured
    with pytest.raises(RuntimeError, match="loaded matched_dot_layouts.safetensors"):
        hf.run_all(tmp_path / "ckpt", tmp_path / "out", 41, ("layouts",))
    kept.write_text(json.dumps({**entry, "format": hf.FORMAT - 1}))
    with pytest.raises(RuntimeError, match="loaded matched_dot_layouts.safetensors"):
        hf.run_all(tmp_path / "ckpt", tmp_path / "out", 40, ("layouts",))
    models = tmp_path / "models"
    models.mkdir()
    (models / "pointer-g14-plus-mu-s0-e40.safetensors").write_bytes(b"")
    with pytest.raises(RuntimeError, match="loaded pointer-g14-plus-mu-s0-e40.safetensors"):
        hf.run_all(tmp_path / "ckpt", tmp_path / "out", 40, (hf.CONVERGED,), models)
    assert "skipping dot_pointer14-converged: no " in capsys.readouterr().out


def test_the_committed_section_is_what_the_committed_results_say():
    results = json.loads((ROOT / "experiments" / "results" / "head_fields.json").read_text())
    n = results["images"]
    text = (ROOT / "docs" / "RESULTS.md").read_text()
    assert text.count(hf.MARKS[0]) == text.count(hf.MARKS[1]) == 1
    block = text[text.index(hf.MARKS[0]) : text.index(hf.MARKS[1]) + len(hf.MARKS[1])]
    command = hf.command_of(n, results["threads"], results["data"])
    assert block == hf.section(results["models"], n, command)
    models = ROOT / "experiments" / "results" / "models"
    there = {f"{k}_{d}" for d in results["data"] for k, f in hf.checkpoints_of(d, ROOT / "checkpoints", models).items()
             if f.is_file()}  # fmt: skip
    assert set(results["models"]) <= there  # a model whose file appeared later is measured by the next run
    assert {f"{k}_{d}" for k in hf.KINDS for d in hf.MATCHED} <= set(results["models"])
    assert all(e["format"] == hf.FORMAT for e in results["models"].values())
