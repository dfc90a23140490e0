"""Effects of interventions: the intervals on synthetic effects of known size, McNemar's test, the validation and
head-importance sweeps against plain edited forward passes, the one-image effect (Δ log p exact where a probability
underflows), and the one run entry (the request whole, what a memo keeps, the playground through it)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ssog_core.data.sources import DataError
from ssog_core.interventions.edit import EditError, parse_edits
from ssog_core.interventions.effects import (
    Outcomes,
    bootstrap_ci,
    compare,
    dataset_means,
    image_effect,
    mcnemar,
    outcomes,
    validation_effect,
)
from ssog_core.interventions.importance import Cancelled, head_importance, importance_edits
from ssog_core.interventions.ops import AblateHead
from ssog_core.interventions.result import InterventionResult, Memo, run_intervention
from ssog_core.interventions.run import edited, mean_attention
from ssog_core.interventions.validation import EvalSet, load_eval_set
from tests.test_interventions import images, model_for

NAMES = [f"c{i}" for i in range(5)]


def eval_set(n: int = 30, seed: int = 0) -> EvalSet:
    g = torch.Generator().manual_seed(seed)
    pixels = torch.randint(0, 256, (n, 28, 20, 3), generator=g, dtype=torch.uint8)
    return EvalSet(pixels, torch.arange(n) % 5, NAMES, "test")


@pytest.mark.parametrize("effect", [0.0, 0.15, 2.0])
def test_bootstrap_intervals_find_effects_of_known_size(effect):
    rng = np.random.default_rng(1)
    diff = effect + rng.normal(0, 1, 2000)
    lo, hi = bootstrap_ci(diff)
    assert lo <= effect <= hi
    assert (lo <= 0 <= hi) == (effect == 0.0)  # zero within noise; a small and a large effect are both found
    assert hi - lo == pytest.approx(2 * 1.96 / np.sqrt(2000), rel=0.15)  # the width of a normal mean's interval


def test_bootstrap_intervals_cover_the_true_change_about_95_percent_of_the_time():
    rng = np.random.default_rng(2)
    hits = [lo <= 0.3 <= hi for lo, hi in bootstrap_ci(0.3 + rng.normal(0, 1, (300, 150)), n_boot=500)]
    assert 0.90 <= np.mean(hits) <= 0.98


def test_mcnemar_exact_and_mid_p():
    assert mcnemar(0, 0) == (1.0, 1.0)
    exact, mid = mcnemar(5, 0)
    assert exact == pytest.approx(2 / 32) and mid == pytest.approx(1 / 32)
    assert mcnemar(3, 7) == mcnemar(7, 3)
    assert mcnemar(10, 10)[0] == 1.0


def test_compare_reports_accuracy_log_p_and_classes_with_intervals():
    labels = torch.arange(400) % 4
    before = Outcomes(labels.clone(), torch.full((400,), -0.1, dtype=torch.float64))
    pred = labels.clone()
    pred[labels == 2] = 0  # the edit breaks class 2 only
    after = Outcomes(pred, torch.where(labels == 2, -3.0, before.logp_true))
    eff = compare(before, after, labels, ["a", "b", "c", "d"])
    assert eff.accuracy.unedited == 1.0 and eff.accuracy.edited == 0.75 and eff.lost == 100 and eff.gained == 0
    assert eff.logp_true.change == pytest.approx(-2.9 / 4) and not eff.logp_true.within_noise
    assert eff.mcnemar_p < 1e-20
    rows = {r["class"]: r for r in eff.per_class}
    assert rows["c"]["accuracy"]["edited"] == 0.0 and not rows["c"]["within_noise"]
    assert rows["a"]["within_noise"] and rows["a"]["logp_true"]["ci95"] == [0.0, 0.0]
    d = eff.to_dict()
    assert set(d) == {"n", "accuracy", "logp_true", "per_class"} and d["accuracy"]["ci95"][1] < 0


def test_no_edit_is_no_effect():
    model, data = model_for(), eval_set(20)
    eff = validation_effect(model, data, [])
    assert eff.accuracy.change == 0 and eff.logp_true.ci95 == (0.0, 0.0) and eff.mcnemar_p == 1.0


@pytest.mark.slow
def test_head_importance_reusing_the_lower_layers_equals_full_edited_passes():
    model, data = model_for(), eval_set(30)
    imp = head_importance(model, data, batch_size=8)
    before = outcomes(model, data)
    c0 = before.correct(data.labels).double().mean()
    sweep = importance_edits(model)
    assert len(sweep) == 2 * 3 * 3 + 3 * 3  # every head ablated and replaced by its fit, every layer's three gates
    attention = mean_attention(model, data.batches(model, 8))  # the fits the sweep made from the same images
    for e in sweep:
        after = outcomes(model, data, [e], attention=attention)
        by_op = {"ablate_head": imp.ablate, "replace_with_field": imp.replace}
        cell = by_op[e.op][e.layer][e.head] if e.op in by_op else imp.close_gate[e.tap][e.layer]
        assert cell.accuracy_drop == pytest.approx(float(c0 - after.correct(data.labels).double().mean()), abs=1e-12)
        torch.testing.assert_close(cell.logp_drop, float((before.logp_true - after.logp_true).mean()))
    d = imp.to_dict()
    assert len(d["ablate_head"]) == 3 and set(d["close_gate"]) == {"mu", "sigma", "lambda"}
    assert set(d["ablate_head"][0][0]) == {"accuracy_drop", "logp_drop", "ci95", "within_noise"}


def test_head_importance_of_a_dot_model_has_no_gate_rows_and_can_be_stopped():
    model, data = model_for(attn="dot"), eval_set(10)
    assert head_importance(model, data).close_gate == {}
    with pytest.raises(Cancelled):
        head_importance(model, data, stop=lambda: True)


def test_one_image_effect():
    model, img = model_for(), images(1)
    none = image_effect(model, img, [])
    assert none.dlogp == 0 and torch.equal(none.difference, torch.zeros_like(none.difference)) and none.layer is None
    eff = image_effect(
        model, img, [{"op": "ablate_head", "layer": 1, "head": 2}, {"op": "swap_axes", "layer": 2, "head": 0}]
    )
    assert eff.layer == 1 and eff.removed == {2}
    assert torch.equal(eff.probs_unedited, none.probs_unedited) and not torch.equal(eff.probs_edited, none.probs_edited)
    top = int(none.probs_unedited.argmax())
    assert eff.dlogp == pytest.approx(float(eff.probs_edited[top].log() - none.probs_unedited[top].log()))
    assert [n for n, _ in eff.top(NAMES, edited_side=False, k=2)][0] == NAMES[top]
    assert eff.attention_edited.shape == (3, 35, 35)


def test_the_validation_images_are_the_first_of_the_recorded_split():
    meta = {"data": "shapes:train=4,val=30,classes=5", "class_names": None}
    data = load_eval_set(meta, (28, 20), 12)
    assert data.images.shape == (12, 28, 20, 3) and data.labels.tolist() == [i % 5 for i in range(12)]
    with pytest.raises(ValueError, match="evaluate 1 to 30 images"):
        load_eval_set(meta, (28, 20), 31)
    with pytest.raises(DataError, match="does not record its data"):
        load_eval_set({}, (28, 20), 5)


def test_dlogp_is_a_difference_of_log_softmaxes_even_where_the_probability_underflows():
    """Δ log p comes from one function (``predictions.prediction_change``): exact against a float64 log-sum-exp
    where the edited probability of the unedited winner is exp(−4000), 0 as a float64 softmax."""
    model, img = model_for(), images(1)
    with torch.no_grad():
        model.head.weight.mul_(3e4)
        model.head.bias.zero_()
    edit = [{"op": "ablate_head", "layer": 0, "head": 2}]
    eff = image_effect(model, img, edit)
    with torch.no_grad():
        z0 = model(img)[0].numpy()
        with edited(model, edit):
            z1 = model(img)[0].numpy()
    top = int(z0.argmax())
    want = (z1[top] - np.logaddexp.reduce(z1)) - (z0[top] - np.logaddexp.reduce(z0))
    assert want < -1000 and float(eff.probs_edited[top]) == 0.0
    assert eff.dlogp == pytest.approx(want, rel=1e-9)
    quick = image_effect(model, img, edit, maps=False)  # the prediction only: the same answer, no maps
    assert quick.dlogp == pytest.approx(want, rel=1e-9) and quick.accumulated_edited is None
    assert set(InterventionResult(parse_edits(edit), NAMES, quick, None).to_dict()) == {"unedited", "edited"}


class Kept(dict):
    """A cache as the app's LRU is one (``get(key, make)``) that records what it had to make."""

    def __init__(self) -> None:
        super().__init__()
        self.made: list[tuple] = []

    def get(self, key, make):
        if key not in self:
            self.made.append(key)
            self[key] = make()
        return self[key]


def test_the_run_entry_takes_the_request_whole_and_keeps_what_a_memo_holds():
    model, img, other = model_for(), images(1, seed=1), images(1, seed=2)
    meta = {"data": "shapes:train=4,val=30,classes=5", "class_names": None}
    edits = [{"op": "ablate_head", "layer": 1, "head": 0, "mode": "dataset_mean"},
             {"op": "patch_head", "layer": 2, "head": 1, "source": "b", "what": "output"}]  # fmt: skip
    asked, cache = [], Kept()

    def source(name: str) -> torch.Tensor:
        asked.append(name)
        return other

    def request() -> dict:
        memo = Memo(cache, "m")
        return run_intervention(model, meta, edits, img, 12, sources=source, memo=memo, image_key="a").to_dict()

    first = request()
    assert sorted(cache.made) == [("eval", "m", 12, None), ("maps", "m", "a"), ("means", "m", None)] and asked == ["b"]
    assert request() == first and len(cache.made) == 3  # the second request makes nothing again
    means, data = dataset_means(model, meta), load_eval_set(meta, (28, 20), 12)
    by_hand = InterventionResult(
        parse_edits(edits),
        [f"class {i}" for i in range(5)],
        image_effect(model, img, edits, {"b": other}, means),
        validation_effect(model, data, edits, {"b": other}, means),
    )
    by_hand.validation.images = data.describe()
    assert first == by_hand.to_dict()
    assert run_intervention(model, meta, edits, img, 12, sources={"b": other}).to_dict() == first  # no memo
    with pytest.raises(EditError, match="patch source image 'b' is not there"):
        run_intervention(model, meta, edits, img, 0, sources={})


def test_the_playgrounds_prediction_change_goes_through_the_run_entry(tmp_path, monkeypatch):
    from app import interventions as app_interventions
    from app.state import AppContext
    from app.tabs import playground
    from ssog_core import save_checkpoint
    from tests.app_fixtures import designed_ssog, write_images
    from tests.test_app_intervene_api import SHAPES

    (tmp_path / "ckpt").mkdir()
    save_checkpoint(tmp_path / "ckpt" / "ssog.safetensors", designed_ssog(depth=2), SHAPES)
    write_images(tmp_path / "assets")
    ctx = AppContext(tmp_path / "ckpt", tmp_path / "assets", upload_dir=tmp_path / "uploads")
    calls, real = [], app_interventions.run
    monkeypatch.setattr(app_interventions, "run", lambda *a, **k: calls.append({"maps": a[2].maps}) or real(*a, **k))
    sha, edits = ctx.find_image("scene.png").sha256, [AblateHead(1, 0, "zero")]
    text = playground.prediction_change(ctx, "ssog.safetensors", sha, edits, "Layer 1, head 0")
    assert calls == [{"maps": False}]
    loaded = ctx.model("ssog.safetensors")
    assert ("logits", loaded.key, sha) in ctx.cache.effects  # kept by the entry's memo, under the app's key
    eff = run_intervention(loaded.model, loaded.meta, edits, loaded.input(ctx.find_image(sha).image)).image
    assert f"Δ log p({SHAPES['class_names'][eff.change.top]}) = {round(eff.dlogp, 4) + 0.0:+.4f}" in text
