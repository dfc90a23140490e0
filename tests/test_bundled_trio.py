"""The bundled matched trio holds the standard its model card claims: read from the files, not from the card."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

from ssog_core.analysis.measures import layer_fields
from ssog_core.checkpoint.format import load_checkpoint, read_history

ROOT = Path(__file__).resolve().parents[1]
CKPTS = ROOT / "checkpoints"
TRIO = [CKPTS / f"matched_{kind}_layouts.safetensors" for kind in ("ssog", "ssog_fixed", "dot")]
COLD = 4.35e-4  # softplus(−8) + 1e-4, every steering gate's start

pytestmark = pytest.mark.skipif(not all(p.is_file() for p in TRIO), reason="the matched trio is not in checkpoints/")


def test_the_trio_differs_only_in_attention_and_is_small():
    spec = importlib.util.spec_from_file_location("matched_trio", ROOT / "experiments" / "matched_trio.py")
    trio = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(trio)
    metas = [load_checkpoint(p)[1] for p in TRIO]
    differ = trio.differing_flags([m["command"] for m in metas])
    assert {f.split(" ")[0] for f in differ} <= {"--attn", "--steer"}, differ
    assert len({m["step"] for m in metas}) == 1 and all(p.stat().st_size <= 15 * 2**20 for p in TRIO)


def test_the_steered_model_meets_the_standard_and_its_history_shows_the_gates_open():
    model, meta = load_checkpoint(TRIO[0])
    assert meta["accuracy"] >= 0.90
    fields = layer_fields(model)
    assert all(s >= 10 * COLD for lf in fields for s in lf.gates.values())
    assert fields[-1].reach.mean() >= 2 * fields[0].reach.mean()
    history = read_history(TRIO[0])
    assert len(history.steps) >= 100 and history.steps[0] == 0
    start, end = (np.array([history.gates[t][i] for t in ("mu", "sigma", "lambda")]) for i in (0, -1))
    assert np.allclose(start, COLD, rtol=0.05) and (end >= 10 * COLD).all()
    mu = history.fields["mu"]
    assert np.abs(mu[-1] - mu[0]).max() > 0.5  # some atom moved by more than half a cell


POINTER = {  # the converged pointer models by their ablation row
    variant: CKPTS / f"{stem}_pointer14.safetensors"
    for variant, stem in (("+mu", "matched_ssog_mu"), ("steered", "matched_ssog"), ("fixed", "matched_ssog_fixed"),
                          ("dot", "matched_dot"))
}  # fmt: skip
pointer_models = pytest.mark.skipif(
    not all(p.is_file() for p in POINTER.values()), reason="the pointer models are not in checkpoints/"
)


def _module(name: str, monkeypatch: pytest.MonkeyPatch):
    """An experiment script as a module (registered, as its dataclasses need)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "experiments" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)
    spec.loader.exec_module(module)
    return module


@pointer_models
def test_the_pointer_models_are_the_sweeps_converged_seed_0_with_their_history(monkeypatch):
    """Same command but --attn / --steer, 10,000 steps from scratch on the 14×14 board, small files, the accuracy
    each file records the one the sweep's results file holds for that run, and a history from step 0 that shows
    where each left its plateau (or that the dot twin did not)."""
    ablation = _module("ablation", monkeypatch)
    metas = {v: load_checkpoint(p)[1] for v, p in POINTER.items()}
    differ = _module("matched_trio", monkeypatch).differing_flags([m["command"] for m in metas.values()])
    assert {f.split(" ")[0] for f in differ} <= {"--attn", "--steer"}, differ
    assert {m["step"] for m in metas.values()} == {10_000}
    assert sum(p.stat().st_size for p in POINTER.values()) <= 15 * 2**20
    rows = {ablation.row_key(r): r for r in ablation.read_results()}
    for variant, meta in metas.items():
        assert "pointer:grid=14," in meta["data"] and "--seed 0" in meta["command"]
        row = rows["pointer", 14, variant, 0, ablation.CONVERGED, None, None]
        assert row["val_acc"] == pytest.approx(meta["accuracy"], abs=1e-4)
        history = read_history(POINTER[variant])
        assert history.steps[0] == 0 and history.steps[-1] == 10_000
        left = ablation.plateau_exit(row)
        assert (left is None) == (variant == "dot"), (variant, left)


@pointer_models
@pytest.mark.slow
def test_the_pointer_models_evaluate_to_their_recorded_accuracy():
    from ssog_core.train.accuracy import evaluate_model_sizes

    for path in POINTER.values():
        model, meta = load_checkpoint(path)
        (row,) = evaluate_model_sizes(model, meta["data"], [tuple(model.config.img_size)], meta["class_names"])
        assert row["n"] == 2000 and row["accuracy"] == pytest.approx(meta["accuracy"], abs=1.5e-3), path.name
