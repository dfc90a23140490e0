"""Distill into SSOG in the app (app/distill.py, the geometry tab, ``/distill``): the heavy job fits what the fields
measure, trains and reports; the service writes the student into the checkpoint folder under a new name, where the
pickers offer it and Compare opens it beside its teacher; a stop writes nothing; refusals are in words. The teacher
is the small dot model tests/test_distill.py trains, on pictures made here (the bundled pictures)."""

from __future__ import annotations

import json

import pytest
import torch
from gradio_client import Client

from ssog_core import ViT, load_checkpoint, save_checkpoint
from ssog_core.distill import job
from ssog_core.distill.loop import Recipe
from ssog_core.distill.student import DistillError
from ssog_core.interventions import heavy
from ssog_core.interventions.validation import Pictures
from ssog_core.runtime.jobs import Cancelled
from tests.test_distill import SIZE, lab_teacher, picture_folder

DOT, SSOG = "dot_quadrants.safetensors", "ssog_quadrants.safetensors"
STEER = ("mu", "sigma", "lambda")


@pytest.fixture(scope="module")
def ctx(tmp_path_factory):
    from app.state import AppContext

    root = tmp_path_factory.mktemp("app-distill")
    lab_teacher(root / "ckpt" / DOT)
    save_checkpoint(root / "ckpt" / SSOG, ViT(num_classes=4, img_size=SIZE, patch_size=4, dim=8, depth=1, num_heads=2))
    picture_folder(root / "assets", 24, 2)  # the bundled pictures: a model that records no data is measured on them
    return AppContext(root / "ckpt", root / "assets", upload_dir=tmp_path_factory.mktemp("uploads"))


def asked(ctx, n: int = 12, steps: int = 5, steer: tuple[str, ...] = STEER) -> job.DistillRequest:
    return job.DistillRequest(DOT, Pictures(bundled=ctx.assets_dir), n, 3, steer, Recipe(steps=steps))


def folder_files(ctx) -> set[str]:
    return {p.name for p in ctx.checkpoint_dir.iterdir()}


@pytest.mark.slow
def test_the_job_trains_on_what_the_fields_measure_and_reports_on_the_pictures_after_them(ctx, tmp_path):
    """The student's field is the fields' fit on the same N and K (training steers it, never moves it); progress
    counts the steps with their loss; the report is on the 12 pictures after the first 12."""
    loaded = ctx.model(DOT)
    seen: list[tuple] = []
    out = job.distill((loaded.model, loaded.meta), asked(ctx), lambda *a: seen.append(a), lambda: False)
    assert {a[1] for a in seen} == {5} and [a[0] for a in seen if "loss" in a[2]] == [1, 2, 3, 4, 5]
    assert "fitting 3 atoms to every head on 12 bundled picture(s)" in seen[0][2] and seen[-1][0] == 5
    (tmp_path / "s.safetensors").write_bytes(out.student)
    student, meta = load_checkpoint(tmp_path / "s.safetensors")
    stats = heavy.head_fields((loaded.model, loaded.meta), 12, Pictures(bundled=ctx.assets_dir), 3, lambda *a: None,
                              lambda: False)  # fmt: skip
    for layer, block in enumerate(student.blocks):
        field, fit = block.attn.fixed_field(), stats.fits[layer]
        torch.testing.assert_close(field.mu.double(), fit.mu, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(field.sigma.double(), fit.sigma, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(field.lam().double(), fit.lam, rtol=1e-4, atol=1e-5)
    assert student.config.attn == "ssog" and meta["distill"]["teacher"] == DOT and meta["step"] == 5
    report = out.report
    assert report["held_out"] == {"pictures": ctx.assets_dir.name, "reference": "unedited prediction", "after": 12,
                                  "count": 12} and report["held_out_images"] == 12  # fmt: skip
    assert report["pictures"]["first"] == 12 and report["step"] == 5 and len(report["heads"]) == 2 * 3
    assert report["content_scored"].startswith("nothing")


@pytest.mark.slow
def test_a_stop_ends_the_job_and_a_picture_set_with_nothing_to_hold_out_is_refused(ctx):
    loaded = ctx.model(DOT)
    steps: list[int] = []

    def progress(done, total, detail=""):
        steps.append(done) if "loss" in detail else None

    with pytest.raises(Cancelled):  # asked after every step: it ends at the one it was asked at
        job.distill((loaded.model, loaded.meta), asked(ctx, steps=50), progress, lambda: len(steps) >= 2)
    assert steps == [1, 2]
    with pytest.raises(Cancelled):  # asked before every batch of the fit
        job.distill((loaded.model, loaded.meta), asked(ctx), lambda *a: None, lambda: True)
    with pytest.raises(DistillError, match="24 bundled picture.* leave none to hold out: .*set N below 24"):
        job.distill((loaded.model, loaded.meta), asked(ctx, n=30), lambda *a: None, lambda: False)
    with pytest.raises(DistillError, match="has ssog attention"):
        job.distill(load_checkpoint(ctx.checkpoint_dir / SSOG), asked(ctx), lambda *a: None, lambda: False)


def test_refusals_come_in_words_before_a_slot_is_taken(ctx):
    from app import distill as distilling

    pictures = Pictures(bundled=ctx.assets_dir)
    for name, steps, steer, words in [
        (SSOG, 10, "mu", "has ssog attention; distillation turns dot-product heads into SSOG fields"),
        (DOT, 0, "mu", "distil for 1 to 10000 steps, not 0"),
        (DOT, 2.5, "mu", "steps must be a whole number"),
        (DOT, 10, "mu,nu", "steer takes distinct taps from mu, sigma, lambda"),
    ]:
        with pytest.raises(ValueError, match=words):
            distilling.request(ctx, ctx.model(name), 12, 3, steer, steps, pictures)
    assert distilling.stem("hf-hub:org/deit-small@main") == "deit-small" and distilling.stem("uploaded/a b") == "a_b"


@pytest.mark.slow
def test_the_service_writes_a_new_student_the_pickers_offer_and_a_stop_writes_nothing(ctx):
    """Through the worker engine: the student and its report are in the folder, it opens, its twin is its teacher;
    a second one gets the next name and says the first was there; a run stopped after its first step leaves the
    folder as it was."""
    from app import distill as distilling
    from app import queues
    from app.state import default_twin

    loaded = ctx.model(DOT)
    request = distilling.request(ctx, loaded, 12, 3, "mu", 3, Pictures(bundled=ctx.assets_dir))
    first = distilling.run(ctx, loaded, request)
    assert first.name == "dot_quadrants_distilled.safetensors" and first.existed == []
    assert first.name in ctx.checkpoint_names() and ctx.model(first.name).is_ssog
    written = json.loads((ctx.checkpoint_dir / "dot_quadrants_distilled.report.json").read_text())
    assert written == first.report and written["student"] == first.name and written["teacher"] == DOT
    assert default_twin(ctx, first.name) == DOT  # the export twin and Compare's B: its teacher
    second = distilling.run(ctx, loaded, request)
    assert second.name == "dot_quadrants_distilled_2.safetensors" and second.existed == [first.name]
    before = folder_files(ctx)
    watch = queues.Watch()
    stop = lambda: watch.job is not None and watch.job.progress[0] >= 1  # noqa: E731
    with pytest.raises(Cancelled):
        distilling.run(ctx, loaded, distilling.request(ctx, loaded, 12, 3, "mu", 400, request.pictures), stop, watch)
    assert folder_files(ctx) == before  # no student, no report, no temporary file


@pytest.mark.slow
def test_the_tab_shows_progress_then_the_report_and_compare_opens_the_student_beside_its_teacher(ctx):
    from app import layout
    from app.tabs import geometry

    demo, page = layout.build_page(ctx)
    ui = page.geometry
    updates = list(geometry.on_distill(ctx, ui, DOT, 12, 3, "mu,sigma,lambda", 4, None, layout.chooser.BUNDLED))
    notes = [u[ui.distill_note] for u in updates]
    assert notes[0] == f"Distilling **{DOT}** into SSOG…"
    last = updates[-1]
    shown = last[ui.distill_shown]
    assert shown["teacher"] == DOT and shown["student"].startswith("dot_quadrants_distilled")
    report = json.loads((ctx.checkpoint_dir / shown["student"].replace(".safetensors", ".report.json")).read_text())
    assert f"Wrote **{shown['student']}** into the checkpoint folder" in last[ui.distill_note]
    assert f"{report['step0']['agreement']:.3f} → {report['final']['agreement']:.3f}" in last[ui.distill_note]
    rows = last[ui.distill_table]["value"]
    assert len(rows) == 6 and rows[0][2] == round(report["heads"][0]["share_fit"], 4)
    assert last[ui.distill_figure]["value"].endswith(".png") and last[ui.distill_compare]["visible"]
    refused = list(geometry.on_distill(ctx, ui, SSOG, 12, 3, "mu", 4, None, None))
    assert len(refused) == 1 and "has ssog attention" in refused[0][ui.distill_note]
    # the pickers offer it; Compare opens it as A beside its teacher as B
    fresh = layout.on_new_student(ctx, page, DOT)
    assert (shown["student"], shown["student"]) in fresh[page.checkpoint]["choices"]
    sha = ctx.open_bundled(ctx.bundled_images()[0]).sha256
    opened = layout.on_compare_student(ctx, page, shown, sha, 0.5, 0)
    assert opened[page.compare.a]["value"] == shown["student"] and opened[page.compare.b]["value"] == DOT
    assert opened[page.active] == "compare" and opened[page.compare.figure].endswith(".png")
    # another model: the report leaves; the teacher or the student keep it
    assert geometry.render(ctx, ui, SSOG, 0, sha, None, shown)[ui.distill_shown] is None
    assert ui.distill_shown not in geometry.render(ctx, ui, shown["student"], 0, sha, None, shown)
    demo.close()


@pytest.mark.slow
def test_the_endpoint_distils_in_the_heavy_queue_and_refuses_in_words(ctx):
    from app import queues
    from app.layout import build_app
    from app.main import launch
    from ssog_core.testing.app_process import free_port

    demo = build_app(ctx)
    launch(demo, "127.0.0.1", free_port(), prevent_thread_lock=True, quiet=True)
    try:
        client = Client(demo.local_url, verbose=False)
        got = client.predict(DOT, 12, 3, "mu", 3, "the bundled pictures", api_name="/distill")
        name = got["student"]
        assert name in client.predict(api_name="/checkpoints") and got["report"]["student"] == name
        assert got["report"]["recipe"]["steps"] == 3 and got["report"]["steer"] == "mu"
        with pytest.raises(Exception, match="has ssog attention"):
            client.predict(SSOG, 12, 3, "mu", 3, "", api_name="/distill")
        with pytest.raises(Exception, match="distil for 1 to 10000 steps"):
            client.predict(DOT, 12, 3, "mu", 0, "", api_name="/distill")
        fn = next(f for f in demo.fns.values() if f.api_name == "distill")
        assert fn.concurrency_id == queues.HEAVY
    finally:
        demo.close()
