"""What a new user's tour of the app found (issue 43), each fixed and held here: pictures chosen on the page and
named wherever a number made from them is shown; views that reset when the model changes; words that match what a
model takes; a dot model's heads as playground presets from their fits; an honest progress estimate for Apply's
first pass; help text that names model folders and ``hf-hub:``; the training tab on a model folder; Compare that
opens on two models."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import gradio as gr
import numpy as np
import pytest
import torch
from PIL import Image

from app import fields, interventions, queues
from app import pictures as chooser
from app.api import Endpoints
from app.export_maps import control_for, maps_for, validation_for
from app.layout import build_page, compared_with
from app.main import parser
from app.state import AppContext, AppError
from app.tabs import export, geometry, intervene, playground, training
from ssog_core import ViT, save_checkpoint
from ssog_core.analysis.controls import describe
from ssog_core.analysis.measures import export_maps
from ssog_core.analysis.session import NO_TWIN
from ssog_core.checkpoint.standard import save_timm_folder, timm_twin
from ssog_core.interventions.edit import ops_for
from tests.app_fixtures import designed_ssog, dot_twin, shapes_image, write_images
from tests.test_app_intervene_api import SHAPES


@pytest.fixture(scope="module")
def ctx(tmp_path_factory):
    root = tmp_path_factory.mktemp("tour")
    (root / "ckpt").mkdir()
    save_checkpoint(root / "ckpt" / "ssog_shapes.safetensors", designed_ssog(depth=2), SHAPES)
    save_checkpoint(root / "ckpt" / "dot_shapes.safetensors", dot_twin(depth=2), SHAPES)
    torch.manual_seed(4)
    lab = ViT(num_classes=5, img_size=32, patch_size=4, dim=32, depth=2, num_heads=4, attn="dot")
    save_timm_folder(timm_twin(lab).float(), root / "ckpt" / "digits-vit")
    write_images(root / "assets")
    return AppContext(root / "ckpt", root / "assets", upload_dir=tmp_path_factory.mktemp("uploads"))


@pytest.fixture(scope="module")
def page(ctx):
    return build_page(ctx)[1]


def picture_zip(path: Path, count: int) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        for i in range(count):
            img = shapes_image(40, seed=i)
            tmp = path.parent / f"p{i}.png"
            img.save(tmp)
            z.write(tmp, f"digits/{i:02d}.png")
        z.writestr("digits/readme.txt", "not a picture")
    return path


# ---------------------------------------------------------------------------------------- pictures on the page


def test_uploaded_pictures_are_a_choice_and_name_every_number_made_from_them(ctx, tmp_path):
    name = chooser.add(ctx, [str(picture_zip(tmp_path / "digits.zip", 5))])
    assert name == chooser.UPLOADED + "digits" and name in chooser.choices(ctx) and chooser.count(ctx, name) == 5
    assert chooser.choices(ctx)[:2] == [chooser.RECORDED, chooser.BUNDLED]
    loaded = ctx.model("ssog_shapes.safetensors")  # a model with recorded data: the chosen pictures win
    stats = fields.measure(ctx, loaded, 3, 2, pictures=chooser.chosen(ctx, name))
    assert stats.measured_on == "3 picture(s) of `digits`"
    bundled = fields.measure(ctx, loaded, 3, 2, pictures=chooser.chosen(ctx, chooser.BUNDLED))
    assert bundled.measured_on == "3 bundled picture(s)"
    recorded = fields.measure(ctx, loaded, 3, 2)
    assert recorded.measured_on.startswith("the first 3 validation images of `shapes:")
    distance, share = geometry.plots.head_field_charts(fields.measured_alike(ctx, 3, 2))
    titles = {t.legendgrouptitle.text for t in distance.data}  # each model's legend group names its images
    assert {"ssog_shapes.safetensors on 3 picture(s) of digits", "ssog_shapes.safetensors on 3 bundled picture(s)"} <= (
        titles
    )
    assert {t.legendgrouptitle.text for t in share.data} == titles
    edits = [{"op": "ablate_head", "layer": 0, "head": 1}]
    out = interventions.intervene(ctx, "ssog_shapes.safetensors", "scene.png", edits, 4, pictures=name)
    assert out["validation"]["images"] == {"pictures": "digits", "first": 4, "reference": "unedited prediction"}
    assert out["validation"]["reference"] == "unedited prediction"


def test_a_bad_pictures_upload_or_choice_is_refused_in_words(ctx, tmp_path):
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(AppError, match="holds no pictures"):
        chooser.add(ctx, [str(tmp_path / "notes.txt")])
    (tmp_path / "broken.png").write_bytes(b"not a png")
    with pytest.raises(AppError, match="broken.png"):
        chooser.add(ctx, [str(tmp_path / "broken.png"), str(tmp_path / "notes.txt")])
    for bad in ("uploaded: ../ckpt", "uploaded: nothing", "somewhere"):
        with pytest.raises(AppError, match="no pictures"):
            chooser.chosen(ctx, bad)


def test_the_intervene_section_names_the_chosen_pictures(ctx, page, tmp_path):
    ui = page.intervene
    name = chooser.add(ctx, [str(picture_zip(tmp_path / "seven.zip", 7))])
    out = intervene.render(ctx, ui, "ssog_shapes.safetensors", None, None, name)
    assert out[ui.n]["label"] == "pictures of seven (N, of 7)" and out[ui.n]["maximum"] == 7
    assert out[ui.evaluation]["label"].startswith("The pictures of seven, with a noise floor, as chosen")
    out = intervene.render(ctx, ui, "ssog_shapes.safetensors", None, None, chooser.BUNDLED)
    assert out[ui.n]["label"] == "bundled pictures (N, of 4)"
    assert intervene.render(ctx, ui, "ssog_shapes.safetensors")[ui.n]["label"] == "validation images (N)"


# ---------------------------------------------------------------------------------------- views follow the model


def test_intervene_forgets_the_previous_models_edits_and_results(ctx, page):
    ui = page.intervene
    other = intervene.render(ctx, ui, "digits-vit", None, "ssog_shapes.safetensors")
    assert other[ui.edits] == [] and other[ui.listing].startswith("_No edits yet")
    assert other[ui.prediction] == "" and all(other[m] is None for m in ui.maps) and other[ui.attention] is None
    assert other[ui.validation] == "" and other[ui.per_class] is None and other[ui.tables]["visible"] is False
    assert other[ui.shown] == "digits-vit"
    same = intervene.render(ctx, ui, "digits-vit", None, "digits-vit")  # the op or the pictures changed: kept
    assert ui.edits not in same and ui.prediction not in same


def test_the_fields_section_shows_no_other_models_numbers(ctx, page):
    geo = page.geometry
    shown = {"checkpoint": "ssog_shapes.safetensors", "images": 3, "atoms": 2, "pictures": None}
    out = geometry.render(ctx, geo, "digits-vit", 0, None, shown)
    assert out[geo.field_table]["visible"] is False and out[geo.share]["visible"] is False
    assert out[geo.field_shown] is None
    assert geo.field_table not in geometry.render(ctx, geo, "ssog_shapes.safetensors", 0, None, shown)
    waiting = next(geometry.on_measure(ctx, geo, "digits-vit", 3, 2))  # the first page while the job waits
    assert (
        waiting[geo.field_table]["visible"] is False
        and "Measuring every head of **digits-vit**" in waiting[geo.field_note]
    )


# ---------------------------------------------------------------------------------------- words match the model


def test_a_dot_model_is_offered_what_its_layers_take_and_told_so(ctx, page):
    ui = page.intervene
    out = intervene.render(ctx, ui, "dot_shapes.safetensors")
    ops = [c[0] if isinstance(c, tuple) else c for c in out[ui.op]["choices"]]
    assert ops == ["ablate_head", "patch_head", "replace_with_field"]
    assert "it takes ablate_head and patch_head with what='output' and replace_with_field." in out[ui.note]
    assert out[ui.gates_plot]["visible"] is False and out[ui.gates_table]["visible"] is False
    assert "gates" not in out[ui.sweep]["label"]
    ssog = intervene.render(ctx, ui, "ssog_shapes.safetensors")
    assert ssog[ui.gates_plot]["visible"] is True and "gates closed" in ssog[ui.sweep]["label"]


def test_a_fixed_field_model_is_not_offered_gate_ops():
    model = designed_ssog(depth=2)
    for block in model.blocks:
        block.attn.taps = ()
    ops = ops_for(model)
    assert "close_gate" not in ops and "scale_gate" not in ops and "swap_axes" in ops


def test_the_export_controls_help_names_the_pictures_used(ctx, page):
    ex = page.export
    sha = ctx.find_image("scene.png").sha256
    folder = export.render(ctx, ex, "digits-vit", NO_TWIN, sha, 0.5, 0)[ex.control]["info"]
    assert "4 bundled picture(s)" in folder and "64 validation images" not in folder
    recorded = export.render(ctx, ex, "ssog_shapes.safetensors", NO_TWIN, sha, 0.5, 0)[ex.control]["info"]
    assert "the first 64 validation images of `shapes:" in recorded


def pictures_batch(folder: Path, size: int) -> torch.Tensor:
    """Every picture of ``folder`` as a model input at ``size`` (in [0, 1], no normalisation), by hand."""
    arrays = [np.asarray(Image.open(p).convert("RGB").resize((size, size), Image.Resampling.BICUBIC))
              for p in sorted(folder.iterdir())]  # fmt: skip
    return torch.from_numpy(np.stack(arrays)).permute(0, 3, 1, 2).float() / 255


def test_the_validation_control_stands_on_the_chosen_pictures_and_names_them(ctx, page, tmp_path):
    ex, ckpt, alpha = page.export, "ssog_shapes.safetensors", 0.5
    name = chooser.add(ctx, [str(picture_zip(tmp_path / "mine.zip", 5))])
    loaded, stored, chosen = ctx.model(ckpt), ctx.find_image("scene.png"), chooser.chosen(ctx, name)
    x = pictures_batch(chosen.folder, 32)  # a model with recorded data: the chosen pictures win
    with torch.no_grad():
        direct = export_maps(loaded.model, x, alpha)
        predicted = loaded.model(x).argmax(-1)
    want = direct.accumulated.double().mean(0)
    out = export.render(ctx, ex, ckpt, NO_TWIN, stored.sha256, alpha, 0, None, "validation", "wide", name)
    mine = "5 picture(s) of `mine`, each in the class the model predicts"
    assert f"Control: **the mean over {mine}**" in out[ex.text] and mine in out[ex.control]["info"]
    raw = maps_for(ctx, loaded, stored, alpha)
    got = control_for(ctx, loaded, stored, raw, "validation", pictures=chosen)
    assert got.images == 5
    np.testing.assert_allclose(got.accumulated[0].double().numpy(), want.numpy(), atol=1e-5)
    bundled = control_for(ctx, loaded, stored, raw, "validation", pictures=chooser.chosen(ctx, chooser.BUNDLED))
    recorded = control_for(ctx, loaded, stored, raw, "validation")
    for other, images in ((bundled, 4), (recorded, 60)):  # each its own images, not the chosen ones
        assert other.images == images and not torch.allclose(other.accumulated[0].double(), want, atol=1e-3)
    assert torch.equal(validation_for(ctx, loaded, alpha, pictures=chosen).labels, predicted)
    classes = export.per_class(ctx, ex, ckpt, alpha, "validation", name)
    assert classes[ex.classes_status] == f"{mine} (chosen at the top of the page)."
    assert json.loads(Image.open(classes[ex.classes]).info["Description"])["pictures"] == mine
    api = Endpoints(ctx, page.session_parts(ctx)).export_summary(ckpt, "scene.png", alpha, "validation", name)
    assert api["control_images"] == 5 and api["control_pictures"] == mine
    np.testing.assert_allclose(np.array(api["accumulated_control"]), want.numpy(), atol=1e-5)
    # the recorded data: the help, the summary line and the per-class note as they were
    out = export.render(ctx, ex, ckpt, NO_TWIN, stored.sha256, alpha, 0, None, "validation", "wide", chooser.RECORDED)
    assert f"Control: **{describe('validation', 60)}**" in out[ex.text]
    assert "the first 64 validation images of `shapes:" in out[ex.control]["info"]
    recorded_api = Endpoints(ctx, page.session_parts(ctx)).export_summary(ckpt, "scene.png", alpha, "validation")
    np.testing.assert_array_equal(np.array(recorded_api["accumulated_control"]), recorded.accumulated[0].numpy())
    assert export.per_class(ctx, ex, ckpt, alpha, "none")[ex.classes_status] == "60 validation images of `" + (
        SHAPES["data"] + "`."
    )


def test_the_training_tab_says_a_model_folder_records_no_history(ctx, page):
    tr = page.training
    note = training.render(ctx, tr, "digits-vit")[tr.note]
    assert "no such checkpoint file" not in note
    assert "**digits-vit** has no training history (it is a model folder" in note


def test_compare_opens_on_two_models():
    names = ["digits-vit", "other-vit"]
    assert compared_with(names, "digits-vit", NO_TWIN) == "other-vit"
    assert compared_with(names, "digits-vit", "twin") == "twin"
    assert compared_with(["digits-vit"], "digits-vit", NO_TWIN) == "digits-vit"  # the only model


def test_the_help_names_model_folders_and_hf_hub():
    text = " ".join(parser().format_help().split())  # argparse wraps lines
    assert "model folders" in text and "hf-hub:" in text and "folder of .safetensors checkpoints" not in text


# ---------------------------------------------------------------------------------------- presets and progress


def test_a_dot_models_heads_become_presets_from_their_fits(ctx, page):
    pg = page.playground
    choices, note = playground.preset_choices(ctx, "dot_shapes.safetensors")
    assert choices == [] and "become presets once measured" in note and "no presets" not in note
    loaded = ctx.model("dot_shapes.safetensors")
    stats = fields.measure(ctx, loaded, 3, 2)
    choices, note = playground.preset_choices(ctx, "dot_shapes.safetensors")
    assert len(choices) == 2 * 4 and choices[0].startswith("fit: layer 0 · head 0 (its 2 atoms explain")
    assert stats.measured_on in note
    opened = playground.on_preset(ctx, pg, "dot_shapes.safetensors", choices[5], False)
    assert "Layer 1, head 1 of dot_shapes.safetensors as its 2 fitted atoms" in opened[pg.preset_note]


def test_opening_a_dot_models_playground_measures_its_heads_and_offers_their_fits(ctx, page, tmp_path):
    pg = page.playground
    torch.manual_seed(7)
    dot = ViT(num_classes=5, img_size=32, patch_size=4, dim=32, depth=2, num_heads=2, attn="dot")
    name = ctx.add_upload([str(save_checkpoint(tmp_path / "never_measured.safetensors", dot))])  # records no data
    assert playground.preset_choices(ctx, name)[0] == []
    with queues.one_per_user(None):  # a heavy job of this user's runs: the presets wait, and the note says why
        *_, busy = playground.on_open(ctx, pg, name)
    assert "become presets once measured" in busy[pg.preset_note] and queues.BUSY in busy[pg.preset_note]
    steps = list(playground.on_open(ctx, pg, name))
    doing = (
        f"Measuring the heads' fields of **{name}** (dot-product) on 4 bundled picture(s) (the model records no "
        "validation set), once: each head's 4-atom fit becomes a preset. The canvas holds the demo head until then, "
        "not one of this model's"
    )
    assert steps[0] == {pg.preset: gr.update(choices=[], value=None, visible=False), pg.preset_note: f"{doing}…"}
    assert all(s[pg.preset_note].startswith(f"{doing}: ") for s in steps[1:-1])  # its progress while it runs
    done = steps[-1]
    assert done[pg.preset]["visible"] and len(done[pg.preset]["choices"]) == 2 * 2
    assert done[pg.preset]["choices"][0].startswith("fit: layer 0 · head 0 (its 4 atoms explain")
    assert "measured on 4 bundled picture(s)" in done[pg.preset_note]
    again = list(playground.on_open(ctx, pg, name))  # measured once: the presets at once
    assert again == [playground.on_checkpoint(ctx, pg, name)]
    assert list(playground.on_open(ctx, pg, "ssog_shapes.safetensors")) == [
        playground.on_checkpoint(ctx, pg, "ssog_shapes.safetensors")
    ]  # an SSOG model's presets are its own heads: nothing to measure


def test_apply_measures_its_first_pass_with_an_estimate_from_the_batches_done(ctx, page):
    """replace_with_field first needs the mean attention over the fixed images: a separate step whose progress
    counts them and whose time left comes from the batches done; the next Apply needs nothing first."""
    ui = page.intervene
    sha = ctx.find_image("scene.png").sha256
    edits = [{"op": "replace_with_field", "layer": 1, "head": 0}]
    loaded = ctx.model("ssog_shapes.safetensors")
    asked = interventions.request(ctx, sha, edits)
    assert interventions.preparing(ctx, loaded, asked) == 60  # the shapes split's 60 validation images, one pass
    pages = list(intervene.on_prepare(ctx, ui, "ssog_shapes.safetensors", sha, edits))
    assert pages[-1] == {ui.status: ""} and interventions.preparing(ctx, loaded, asked) == 0
    assert not list(intervene.on_prepare(ctx, ui, "ssog_shapes.safetensors", sha, edits))  # nothing left to make
    assert intervene.on_apply(ctx, ui, "ssog_shapes.safetensors", sha, edits)[ui.status] == ""


def test_the_meter_estimates_from_measured_batches(monkeypatch):
    clock = iter([0.0, 10.0])
    monkeypatch.setattr(interventions.time, "monotonic", lambda: next(clock))
    meter = interventions.Meter(500, batch=100)
    assert meter.note() == "0 of 500 images"
    meter.tick()
    meter.tick()  # the second ask: the first batch is done, 10 s after the start
    assert meter.note() == "100 of 500 images, about 40 s left"
