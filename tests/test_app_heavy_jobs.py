"""Heavy work leaves the serving process (app/interventions.py, ssog_core/interventions/heavy.py): validation
edits, head importance and a twin's accuracy run as engine jobs, report their progress in images, give the numbers
the same computation gives in process, and are cached only when complete."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import threading
import time
from types import SimpleNamespace

import pytest
import torch

from ssog_core import load_checkpoint, save_checkpoint
from ssog_core.interventions import heavy
from ssog_core.interventions.importance import head_importance
from ssog_core.interventions.result import InterventionRequest, run_intervention
from ssog_core.interventions.validation import load_eval_set
from ssog_core.runtime.jobs import Cancelled
from tests.app_fixtures import designed_ssog

BIG = {"data": "shapes:train=4,val=250,classes=5", "class_names": ["circle", "square", "triangle", "star", "cross"]}
EDITS = [
    {"op": "swap_axes", "layer": 1, "head": 1},
    {"op": "ablate_head", "layer": 0, "head": 2, "mode": "dataset_mean"},
]


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    path = save_checkpoint(tmp_path_factory.mktemp("heavy") / "ssog_shapes.safetensors", designed_ssog(depth=2), BIG)
    model, meta = load_checkpoint(path)
    return model.requires_grad_(False), meta


def recorder():
    seen: list[tuple[int, int]] = []
    return seen, lambda done, total: seen.append((done, total))


def test_progress_counts_validation_images_pass_by_pass(loaded):
    """250 images in batches of 100: the unedited and the edited pass the first time, the edited one after (the
    worker keeps the unedited outcomes); the numbers are the run entry's own."""
    heavy._kept._data.clear()
    seen, progress = recorder()
    out = heavy.intervene(loaded, InterventionRequest(EDITS, eval_images=250), progress, lambda: False)
    assert seen == [(0, 500), (100, 500), (200, 500), (250, 500), (350, 500), (450, 500), (500, 500)]
    seen.clear()
    again = heavy.intervene(loaded, InterventionRequest(EDITS, eval_images=250), progress, lambda: False)
    assert seen == [(0, 250), (100, 250), (200, 250), (250, 250)]
    model, meta = loaded
    ref = run_intervention(model, meta, EDITS, None, 250).validation.to_dict()
    assert out.validation.to_dict() == again.validation.to_dict() == ref
    assert ref["logp_true"]["change"] != 0  # the edits change something

    seen.clear()
    imp = heavy.importance(loaded, 250, "zero", None, progress, lambda: False)
    assert seen == [(0, 250), (100, 250), (200, 250), (250, 250)]
    data = load_eval_set(meta, model.config.img_size, 250)
    assert imp.to_dict() == head_importance(model, data, "zero").to_dict()


def test_a_stop_between_batches_ends_the_job(loaded):
    asks = iter([False, False, True])
    seen, progress = recorder()
    with pytest.raises(Cancelled):
        heavy.importance(loaded, 250, "zero", None, progress, lambda: next(asks))
    assert seen == [(0, 250), (100, 250), (200, 250)]


# ------------------------------------------------------------------------------------------ the app, on workers


@pytest.fixture(scope="module")
def ctx(tmp_path_factory):
    from app.state import AppContext
    from tests.app_fixtures import write_images
    from tests.test_app_intervene_api import SHAPES

    root = tmp_path_factory.mktemp("heavy-app")
    (root / "ckpt").mkdir()
    save_checkpoint(root / "ckpt" / "ssog_shapes.safetensors", designed_ssog(depth=2), SHAPES)
    save_checkpoint(root / "ckpt" / "ssog_big.safetensors", designed_ssog(depth=2), BIG)
    write_images(root / "assets")
    return AppContext(root / "ckpt", root / "assets", upload_dir=tmp_path_factory.mktemp("uploads"))


@pytest.fixture(scope="module")
def ui(ctx):
    from app.layout import build_page

    return build_page(ctx)[1].intervene


NOTE = re.compile(r"Evaluating the edits: (waiting for a (heavy slot|worker)|computing \d+ of \d+ images)…")


def test_the_tabs_heavy_work_runs_on_a_worker_with_its_progress_on_the_page(ctx, ui, monkeypatch):
    from app import common, interventions, queues
    from app.tabs import intervene

    # the page is told every millisecond, so a job that ends within the default half second still shows a note
    monkeypatch.setattr(queues, "stoppable", lambda work: common.stoppable(work, poll=0.001))
    heavy._kept._data.clear()
    pids = queues.start_workers(queues.engine())
    assert len(pids) == queues.HEAVY_LIMIT and os.getpid() not in pids
    pages = list(intervene.on_evaluate(ctx, ui, "ssog_shapes.safetensors", EDITS, 37))
    notes = [p[ui.validation] for p in pages[1:-1]]
    assert notes and all(NOTE.fullmatch(n) for n in notes), notes
    assert "first **37** validation images" in pages[-1][ui.validation]
    *_, swept = intervene.on_sweep(ctx, ui, "ssog_shapes.safetensors", 23, "zero")
    assert swept[ui.sweep_note].startswith("23 validation images, unedited accuracy ")
    assert not heavy._kept._data  # nothing was computed in this process: the worker memo here stayed empty
    loaded = ctx.model("ssog_shapes.safetensors")
    mine = run_intervention(loaded.model, loaded.meta, EDITS, None, 37).validation.to_dict()
    asked = interventions.request(ctx, None, EDITS, 37)
    assert interventions.run(ctx, loaded, asked).validation.to_dict() == mine  # same numbers (cached)


def test_a_stopped_job_is_not_cached_and_frees_its_worker(ctx):
    """A stop asked once the job was submitted (at the first look at it, 0.2 s in, long before 250 images are
    swept): the job ends Cancelled, nothing is cached, and the next job runs."""
    from app import interventions, pictures, queues

    loaded = ctx.model("ssog_big.safetensors")
    watch = queues.Watch()
    key = ("importance", loaded.key, 250, "zero", pictures.chosen(ctx, None))
    with pytest.raises(Cancelled):
        interventions.importance(ctx, loaded, 250, "zero", stop=lambda: watch.job is not None, watch=watch)
    assert watch.job is not None and watch.job.done() and key not in ctx.cache.effects
    t0 = time.monotonic()
    assert interventions.importance(ctx, loaded, 250, "zero").n == 250 and key in ctx.cache.effects
    assert time.monotonic() - t0 > 0.2  # the sweep takes longer than the stop took to arrive


def kill_workers(engine) -> list[int]:
    """SIGKILL every process of the local pool now (the pool's own list: a fresh pool has fresh pids)."""
    pool = engine.backend._pool
    pids = list(pool._processes) if pool is not None and pool._processes else []
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return pids


@pytest.mark.slow  # several worker starts: over a minute on a loaded machine
def test_a_worker_killed_mid_job_runs_it_again_or_says_why_and_frees_the_slot(ctx, ui):
    from app import interventions, queues
    from app.tabs import intervene

    engine = queues.engine()
    queues.start_workers(engine)
    loaded = ctx.model("ssog_big.safetensors")
    who = SimpleNamespace(username="kim")
    watch = queues.Watch()
    killer = threading.Thread(target=lambda: until(lambda: watch.job is not None) or kill_workers(engine))
    killer.start()
    with queues.one_per_user(who):
        once = interventions.importance(ctx, loaded, 200, "zero", watch=watch)
    killer.join()
    model, meta = loaded.model, loaded.meta
    assert once.to_dict() == head_importance(model, load_eval_set(meta, model.config.img_size, 200), "zero").to_dict()

    done = threading.Event()

    def keep_killing() -> None:
        while not done.is_set():
            kill_workers(engine)
            time.sleep(0.05)

    threading.Thread(target=keep_killing, daemon=True).start()
    try:
        *_, page = intervene.on_sweep(ctx, ui, "ssog_big.safetensors", 190, "zero", who)
    finally:
        done.set()
    assert page[ui.sweep_note].startswith("⚠️ the worker running this job died each time it ran")  # said as is
    assert "kim" not in queues._running
    assert interventions.importance(ctx, loaded, 190, "zero").n == 190  # a fresh pool serves the next job


def until(condition, seconds: float = 300.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_batch_export_runs_on_a_worker_with_the_numbers_of_this_process(ctx, monkeypatch):
    """The validation images' export maps (the validation control, the per-class view) are a heavy job: computing
    them here would fail (patched), yet they come back, equal to this process's own."""
    from app.export_maps import validation_for
    from ssog_core.analysis.controls import validation_maps
    from ssog_core.analysis.measures import DEFAULT_IMAGES

    def here(*args, **kwargs):
        raise AssertionError("the validation maps were computed in the serving process")

    monkeypatch.setattr(heavy, "validation_maps", here)
    loaded = ctx.model("ssog_shapes.safetensors")
    got = validation_for(ctx, loaded, 0.35)
    assert validation_for(ctx, loaded, 0.35) is got  # kept once complete
    monkeypatch.undo()
    ref = validation_maps(loaded.model, loaded.meta, 0.35, DEFAULT_IMAGES)
    assert got.class_names == ref.class_names and got.alpha == ref.alpha and torch.equal(got.labels, ref.labels)
    for a, b in ((got.accumulated, ref.accumulated), (got.rollout, ref.rollout)):
        assert a.dtype == b.dtype == torch.float32 and not torch.equal(a, torch.zeros_like(a))
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)  # one torch thread there, maybe more here
