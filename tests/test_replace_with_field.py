"""replace_with_field: a head's attention replaced by its positional field or its K-atom fit, made from the mean patch
attention of the validation images. The mean is each layer's renormalised patch rows averaged over images; the patch
rows of a replaced head are the field's (a float64 loop reference) or the fit's (the dense SSOG oracle), scaled to the
mass left after each patch query's mean mass on the prefix tokens, and the prefix queries' rows are their means over the
validation images, so no query stays content-scored; it acts on SSOG, dot, RBF and
standard ViTs, passes through the one run entry (on a model folder without a validation set: on pictures, against
the unedited model's predictions), and head importance gains its column."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

from ssog_core import ViT
from ssog_core.analysis import head_as_field as hf
from ssog_core.checkpoint.format import load_checkpoint
from ssog_core.cli.intervene import main as intervene_main
from ssog_core.data.images import list_images, model_input
from ssog_core.interventions.edit import EditError, parse_edits
from ssog_core.interventions.effects import outcomes, validation_effect
from ssog_core.interventions.hooks import run_with_cache, run_with_hooks
from ssog_core.interventions.importance import head_importance
from ssog_core.interventions.ops import ReplaceWithField
from ssog_core.interventions.result import (
    InterventionResult,
    Memo,
    class_names,
    run_intervention,
    validation_attention,
)
from ssog_core.interventions.run import edited, mean_attention
from ssog_core.interventions.validation import load_eval_set
from ssog_core.nn.config import standard_config
from tests.dense_oracle import ssog_matrix
from tests.test_effects import Kept, eval_set
from tests.test_interventions import CFG, images, model_for
from tests.test_pattern_point import GRID, lab_model

F64 = dict(rtol=1e-9, atol=1e-12)
MODELS = ["ssog", "dot", "rbf", "standard"]


def standard_vit() -> ViT:
    """A float64 timm-style ViT on a 7×5 grid with a class token and a register (two prefix tokens)."""
    cfg = standard_config("timm", img_size=(28, 20), patch_size=4, dim=12, depth=3, num_heads=3,
                          num_classes=5, mlp_hidden=24, num_registers=1, pos_prefix=1)  # fmt: skip
    model = ViT(cfg)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(0.4 * torch.randn(p.shape, generator=gen))
    return model.double().eval()


def model_of(kind: str) -> torch.nn.Module:
    return standard_vit() if kind == "standard" else lab_model(kind)


def patterns(model: torch.nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    """Every layer's unedited pattern for the images ``x`` at once."""
    names = [f"blocks.{i}.attn.pattern" for i in range(len(model.blocks))]
    with torch.no_grad():
        _, cache = run_with_cache(model, x, names)
    return [cache[n] for n in names]


def mean_rows(a: torch.Tensor, p: int) -> torch.Tensor:
    """``(H, N, N)``: patch queries' rows over patch keys, renormalised, averaged over images."""
    rows = a[:, :, p:, p:]
    return (rows / rows.sum(-1, keepdim=True)).mean(0)


def field_rows_by_loop(mean: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
    """Each head's positional field (each displacement query − key averaged over its pairs) applied to every query
    and renormalised over its keys, written as loops."""
    gh, gw = grid
    cells = [(i, j) for i in range(gh) for j in range(gw)]
    out = torch.zeros_like(mean)
    for h in range(mean.shape[0]):
        total, count = {}, {}
        for q, (qi, qj) in enumerate(cells):
            for k, (ki, kj) in enumerate(cells):
                d = (qi - ki, qj - kj)
                total[d] = total.get(d, 0.0) + float(mean[h, q, k])
                count[d] = count.get(d, 0) + 1
        for q, (qi, qj) in enumerate(cells):
            row = [total[(qi - ki, qj - kj)] / count[(qi - ki, qj - kj)] for ki, kj in cells]
            row = torch.tensor(row, dtype=torch.float64)
            out[h, q] = row / row.sum()
    return out


def replaced(a: torch.Tensor, p: int, heads: list[int], rows: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """The pattern ``a`` with every query of ``heads`` content-blind, from ``ref``, the same layer's pattern on the
    reference images: a prefix query's row is its mean over them; a patch query puts its mean mass on each prefix
    token and the rest on ``rows`` (``(H, N, N)``)."""
    out = a.clone()
    for h in heads:
        for q in range(a.shape[-1]):
            mean = ref[:, h, q].double().mean(0)
            if q < p:
                out[:, h, q] = mean
            else:
                out[:, h, q, :p] = mean[:p]
                out[:, h, q, p:] = (1.0 - mean[:p].sum()) * rows[h, q - p]
    return out


@pytest.mark.parametrize("kind", MODELS)
def test_the_mean_attention_is_each_layers_patch_rows_averaged_over_the_images(kind):
    model, x = model_of(kind), images(5, seed=1)
    p = model.num_prefix_tokens
    got = mean_attention(model, x.split(2))  # batches of 2, 2, 1
    with edited(model, [{"op": "ablate_head", "layer": 0, "head": 1}]):
        inside = mean_attention(model, x.split(2))  # the unedited model, inside an edit block too
    for layer, a in enumerate(patterns(model, x)):
        assert (got[layer].images, got[layer].grid, got[layer].num_prefix) == (5, GRID, p)
        torch.testing.assert_close(got[layer].mean, mean_rows(a.double(), p), **F64)
        torch.testing.assert_close(inside[layer].mean, got[layer].mean, rtol=0, atol=0)


@pytest.mark.parametrize("kind", MODELS)
def test_a_head_replaced_by_its_positional_field_is_what_the_loop_reference_says(kind):
    model, ref, x = model_of(kind), images(4, seed=2), images(2, seed=3)
    p = model.num_prefix_tokens
    attention = mean_attention(model, [ref])
    rows = field_rows_by_loop(mean_rows(patterns(model, ref)[1].double(), p), GRID)
    want_pattern = replaced(patterns(model, x)[1], p, [2], rows, patterns(model, ref)[1])
    want = run_with_hooks(model, x, {"blocks.1.attn.pattern": lambda a, n: want_pattern})
    edit = {"op": "replace_with_field", "layer": 1, "head": 2, "replacement": "field"}
    with edited(model, [edit], attention=attention):
        logits, cache = run_with_cache(model, x, ["blocks.1.attn.pattern"])
    torch.testing.assert_close(cache["blocks.1.attn.pattern"], want_pattern, **F64)
    torch.testing.assert_close(logits, want, **F64)
    assert (logits - model(x)).abs().max() > 1e-4  # content stopped scoring: the output moved
    torch.testing.assert_close(cache["blocks.1.attn.pattern"].sum(-1), torch.ones(2, 3, p + 35, dtype=torch.float64))


def test_every_head_of_a_layer_replaced_by_its_fit_has_the_fitted_atoms_rows():
    model, ref, x = model_of("dot"), images(4, seed=4), images(2, seed=5)
    p = model.num_prefix_tokens
    attention = mean_attention(model, [ref])
    fit = hf.fit_atoms(attention[2].mean, GRID, 2)
    b = lambda t: t[None, None, None].expand(1, *GRID, *t.shape)  # noqa: E731  (one field for every query)
    rows = ssog_matrix(b(fit.mu), b(fit.sigma), b(fit.lam.log()), torch.tensor(1.0, dtype=torch.float64), GRID,
                       "factorized")[0]  # fmt: skip
    edit = ReplaceWithField(2, None, "fit", 2)
    assert edit.describe() == "layer 2: every head's attention replaced by its 2-atom fit"
    with edited(model, [edit], attention=attention):
        _, cache = run_with_cache(model, x, ["blocks.2.attn.pattern"])
    torch.testing.assert_close(
        cache["blocks.2.attn.pattern"],
        replaced(patterns(model, x)[2], p, [0, 1, 2], rows, patterns(model, ref)[2]),
        **F64,
    )


def test_a_class_token_readout_is_edited_too():
    """A model that reads out its class token: every head of the last layer replaced by its fit moves the logits (the
    class query's row is content-blind too), and no query of an edited head depends on the image any more."""
    model, ref, x = model_of("standard"), images(4, seed=8), images(3, seed=9)
    assert model.config.pool == "token" and model.num_prefix_tokens == 2
    last = len(model.blocks) - 1
    edit = {"op": "replace_with_field", "layer": last, "replacement": "fit", "atoms": 2}
    with edited(model, [edit], attention=mean_attention(model, [ref])):
        logits, cache = run_with_cache(model, x, [f"blocks.{last}.attn.pattern"])
    assert (logits - model(x)).abs().max() > 1e-3
    a = cache[f"blocks.{last}.attn.pattern"]
    torch.testing.assert_close(a, a[:1].expand_as(a), rtol=0, atol=1e-12)  # the same pattern for every image


def test_a_content_blind_model_replaced_whole_by_its_fits_does_not_move():
    """A fixed-field SSOG model's heads are content-blind fields of two atoms, which their 2-atom fits recover: every
    head of every layer replaced (the whole model) leaves the logits where they were; a steered model moves."""
    torch.manual_seed(0)
    fixed = ViT(**{**CFG, "depth": 2, "num_atoms": 2}, steer=(), cold_init=False).double().eval()
    with torch.no_grad():  # well-separated atoms (σ ≈ 1.3 cells) with unequal weights: one best fit
        for layer, block in enumerate(fixed.blocks):
            for h in range(CFG["num_heads"]):
                block.attn.mu[h] = torch.tensor([[1.0 + 0.5 * h - 0.3 * layer, -1.0], [-1.5, 1.5 - 0.5 * h]])
            block.attn.raw_sigma.fill_(0.6)
            block.attn.log_lambda.normal_(0, 0.3)
    ref, x = images(2, seed=6), images(3, seed=7)
    edits = [ReplaceWithField(layer, None, "fit", 2) for layer in range(2)]
    with edited(fixed, edits, attention=mean_attention(fixed, [ref])):
        moved = fixed(x)
    torch.testing.assert_close(moved, fixed(x), rtol=0, atol=1e-6)
    steered = model_for(depth=2)
    with edited(steered, edits, attention=mean_attention(steered, [ref])):
        edited_logits = steered(x)
    assert (edited_logits - steered(x)).abs().max() > 1e-3


def test_replace_with_field_is_refused_in_words():
    model = lab_model("dot")
    unmade = pytest.raises(EditError, match="needs the mean attention of the validation images")
    with unmade, edited(model, [{"op": "replace_with_field", "layer": 0, "head": 1}]):
        pass
    with pytest.raises(EditError, match="atoms must be a whole number from 1 to 8, got 9"):  # the fit's one maximum
        parse_edits([{"op": "replace_with_field", "layer": 0, "atoms": 9}])
    with pytest.raises(EditError, match="unknown replacement 'mean'; expected fit or field"):
        parse_edits([{"op": "replace_with_field", "layer": 0, "replacement": "mean"}])
    no_head = pytest.raises(EditError, match=r"head 3 does not exist")
    with no_head, edited(model, [{"op": "replace_with_field", "layer": 0, "head": 3}], attention=[]):
        pass
    attention = mean_attention(model, [images(2)])
    other_size = pytest.raises(EditError, match=r"images of the validation images' size \(7×5 patches\)")
    field = [{"op": "replace_with_field", "layer": 0, "replacement": "field"}]
    with edited(model, field, attention=attention), other_size:
        model(images(1, size=(24, 20)))
    with pytest.raises(EditError, match="images of one size"):
        mean_attention(model, [images(1), images(1, size=(24, 20))])


def test_the_run_entry_makes_the_mean_attention_once_and_measures_like_every_edit():
    model, img = lab_model("ssog"), images(1, seed=8)
    meta = {"data": "shapes:train=4,val=30,classes=5", "class_names": None}
    edits = [{"op": "replace_with_field", "layer": 1, "head": 0, "atoms": 1},
             {"op": "replace_with_field", "layer": 2, "replacement": "field"}]  # fmt: skip
    cache = Kept()
    got = run_intervention(model, meta, edits, img, 12, memo=Memo(cache, "m")).to_dict()
    assert ("attention", "m", None) in cache.made and ("means", "m", None) not in cache.made
    attention = validation_attention(model, meta)
    assert attention[0].images == 30  # the head means' images: the first 500 of the split, here all 30
    data = load_eval_set(meta, (28, 20), 12)
    by_hand = validation_effect(model, data, edits, attention=attention)
    by_hand.images = data.describe()
    assert got["validation"] == {**by_hand.to_dict(), "reference": "label"}
    assert set(got["validation"]["accuracy"]) == {"unedited", "edited", "ci95", "mcnemar_p"}
    with edited(model, edits, attention=attention):
        edited_logits = model(img)
    assert torch.tensor(got["edited"]["probs"]).allclose(torch.softmax(edited_logits[0], -1).float(), atol=1e-6)
    assert got["edited"]["probs"] != got["unedited"]["probs"]
    result = run_intervention(model, meta, edits, img, 0, maps=False)
    assert isinstance(result, InterventionResult) and "every head's attention replaced" in result.report()


def test_head_importance_has_each_head_replaced_by_its_fit():
    model, data = model_for(attn="dot", depth=1, num_registers=2), eval_set(12)
    imp = head_importance(model, data, batch_size=5)
    attention = mean_attention(model, data.batches(model, 5))  # what the sweep measures when given none
    before = outcomes(model, data)
    assert len(imp.replace) == 1 and len(imp.replace[0]) == CFG["num_heads"] and imp.atoms == 4
    for layer, head in [(0, 1), (0, 2)]:
        after = outcomes(model, data, [ReplaceWithField(layer, head, "fit", 4)], attention=attention)
        cell = imp.replace[layer][head]
        torch.testing.assert_close(cell.logp_drop, float((before.logp_true - after.logp_true).mean()))
        assert cell.ci95[0] <= cell.logp_drop <= cell.ci95[1]
    d = imp.to_dict()["replace_with_fit"]
    assert d["atoms"] == 4 and set(d["cells"][0][0]) == {"accuracy_drop", "logp_drop", "ci95", "within_noise"}


def test_a_transformers_folder_loses_on_pictures_what_its_heads_stop_scoring(tmp_path, capsys):
    """Every head of a folder without a validation set replaced by its positional field, measured on pictures
    through the CLI: agreement with the unedited model and log p(its class), counted by hand from transformers' own
    float64 forward (unedited) and the edited model, the fields made from all the pictures (not the first N)."""
    transformers = pytest.importorskip("transformers")
    mean, std = [0.45, 0.5, 0.55], [0.22, 0.3, 0.26]
    torch.manual_seed(5)
    config = transformers.ViTConfig(hidden_size=24, num_hidden_layers=3, num_attention_heads=3, image_size=28,
                                    patch_size=7, num_labels=5, intermediate_size=40)  # fmt: skip
    hf_model = transformers.ViTForImageClassification(config)
    with torch.no_grad():  # sharp attention: a field replaces something far from uniform
        for p in hf_model.parameters():
            p.copy_(torch.randn_like(p))
    folder, pictures = tmp_path / "hf_vit", tmp_path / "pictures"
    hf_model.save_pretrained(folder)
    transformers.ViTImageProcessor(image_mean=mean, image_std=std).save_pretrained(folder)
    pictures.mkdir()
    rng = np.random.default_rng(6)
    for i in range(7):  # at the model's size, so no resampling stands between the two computations
        Image.fromarray(rng.integers(0, 256, (28, 28, 3), dtype=np.uint8)).save(pictures / f"p{i}.png")
    edits = [{"op": "replace_with_field", "layer": layer, "replacement": "field"} for layer in range(3)]
    (tmp_path / "e.json").write_text(json.dumps(edits))
    args = ["--checkpoint", str(folder), "--edits", str(tmp_path / "e.json"), "--eval", "6"]
    assert intervene_main([*args, "--pictures", str(pictures), "--json", str(tmp_path / "out.json")]) == 0
    text = capsys.readouterr().out
    got = json.loads((tmp_path / "out.json").read_text())["validation"]

    paths = list_images(pictures)
    x64 = torch.tensor(np.stack([np.asarray(Image.open(p)) for p in paths[:6]]), dtype=torch.float64) / 255
    x64 = ((x64 - torch.tensor(mean, dtype=torch.float64)) / torch.tensor(std, dtype=torch.float64)).permute(0, 3, 1, 2)
    with torch.no_grad():
        logp0 = torch.log_softmax(hf_model.double().eval()(x64).logits, -1)
    model, meta = load_checkpoint(folder)
    x = model_input(paths, (28, 28), meta)[0]
    with torch.no_grad(), edited(model, edits, attention=mean_attention(model, [x])):
        logp1 = torch.log_softmax(model(x[:6]).double(), -1)
    ref = logp0.argmax(-1)
    agree = (logp1.argmax(-1) == ref).double()
    lost = int((agree == 0).sum())
    dlogp = (logp1.gather(-1, ref[:, None]) - logp0.gather(-1, ref[:, None])).mean()
    assert got["reference"] == "unedited prediction" and got["n"] == 6
    assert got["images"] == {"pictures": "pictures", "first": 6, "reference": "unedited prediction"}
    assert got["accuracy"]["unedited"] == 1.0 and got["accuracy"]["edited"] == pytest.approx(float(agree.mean()))
    assert got["accuracy"]["mcnemar_p"] == pytest.approx(min(1.0, 2 * 0.5**lost))  # no image can be gained
    assert got["logp_true"]["change"] == pytest.approx(float(dlogp), rel=1e-4, abs=1e-5)
    assert abs(float(dlogp)) > 1e-2, float(dlogp)  # the fields changed what the model says
    names = class_names(model, meta)
    assert [(r["class"], r["n"]) for r in got["per_class"]] == [(names[c], int((ref == c).sum())) for c in
                                                                sorted(set(ref.tolist()))]  # fmt: skip
    assert "pictures (6): agreement with the unedited model 1.0000" in text and "accuracy" not in text
    assert "log p(the unedited model's class)" in text
    with pytest.raises(ValueError, match="evaluate 1 to 7 pictures"):
        run_intervention(model, meta, edits, None, 8, pictures=pictures)
