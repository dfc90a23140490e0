"""The Training tab and ``/history``: a checkpoint's recorded history drawn and served as it is stored."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gradio_client import Client
from PIL import Image

from app import history as app_history
from app.layout import build_app
from app.main import launch
from app.state import AppContext, AppError
from app.tabs import training
from ssog_core.analysis.trajectory import snapshot_layer_fields
from ssog_core.checkpoint.format import read_history
from ssog_core.cli import train
from ssog_core.testing.app_process import free_port
from ssog_core.viz import figures as viz
from tests.app_fixtures import write_checkpoints, write_images

RUN = [
    *("--data", "shapes:size=16,train=48,val=16,classes=3", "--transfer-sizes", "none", "--epochs", "3"),
    *("--dim", "16", "--depth", "2", "--heads", "2", "--atoms", "2", "--batch-size", "8", "--no-progress"),
    *("--lr", "0.01", "--field-lr-mult", "20", "--gate-lr-mult", "60"),
]  # 18 steps: the gates open and the fields move


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("training-tab")
    write_checkpoints(root / "ckpt", depth=2)  # saved without a history
    write_images(root / "assets")
    assert train.main([*RUN, "--out", str(root / "run")]) == 0
    (root / "ckpt" / "trained.safetensors").write_bytes((root / "run" / "model.safetensors").read_bytes())
    return root


@pytest.fixture(scope="module")
def ctx(folder, tmp_path_factory):
    return AppContext(folder / "ckpt", folder / "assets", upload_dir=tmp_path_factory.mktemp("uploads"))


class FakeUI:
    """Stand-ins for the tab's components: the handlers only use them as dictionary keys."""

    def __init__(self) -> None:
        for name in ("note", "gates", "accuracy", "geometry", "step", "step_text", "grid", "status", "pending"):
            setattr(self, name, name)


@pytest.mark.slow
def test_render_draws_the_history_with_the_slider_range_and_value_in_one_update(ctx, folder):
    ui = FakeUI()
    history = read_history(folder / "ckpt" / "trained.safetensors")
    out = training.render(ctx, ui, "trained.safetensors")
    n = len(history.steps)  # the slider counts snapshots from 1, as its text does
    assert out["step"]["minimum"] == 1 and out["step"]["maximum"] == n and out["step"]["value"] == n
    assert out["step"]["visible"] and out["step_text"].startswith(f"Snapshot {n} of {n}:")
    gates = out["gates"]["value"]
    assert gates.layout.yaxis.type == "log"
    cold = [t for t in gates.data if t.name.startswith("cold start")][0]
    assert cold.y[0] == pytest.approx(4.354e-4, rel=1e-3) and cold.line.dash == "dash"
    mu0 = [t for t in gates.data if t.name == "s(μδ) layer 0"][0]
    assert list(mu0.x) == history.steps and mu0.y[0] == pytest.approx(cold.y[0]) and mu0.y[-1] > 2 * cold.y[0]
    val = [t for t in out["accuracy"]["value"].data if t.name == "validation"][0]
    assert list(val.x) == [6, 12, 18] and list(val.y) == pytest.approx([r[1] for r in history.val])
    assert "18 steps" in out["note"]


def test_the_step_slider_shows_the_fields_at_that_snapshot(ctx):
    ui = FakeUI()
    first, last = (training.on_step(ctx, ui, "trained.safetensors", i) for i in (1, 1e9))
    a, b = (np.asarray(Image.open(out["grid"]).convert("RGB")) for out in (first, last))
    assert a.shape == b.shape and a.shape[2] == 3 and not np.array_equal(a, b)  # the fields moved
    assert "step 0" in first["step_text"] and "step 18" in last["step_text"]
    assert first["step_text"].startswith("Snapshot 1 of ")  # slider position 1 is snapshot 1
    assert training.on_step(ctx, ui, "trained.safetensors", 3)["step_text"].startswith("Snapshot 3 of ")
    n = len(read_history(ctx.resolve("trained.safetensors")).steps)
    assert training.on_tick(ctx, "trained.safetensors", 1) == 2 and training.on_tick(ctx, "trained.safetensors", n) == 1


def test_the_fields_at_a_step_are_the_geometry_figure_in_one_window_for_every_step(ctx):
    """The tab draws a step's fields with the geometry tab's renderer. Its last snapshot is the trained model and
    measures as the geometry tab measures the model (densities, atoms, stats, gates); the panels show one window,
    that of every snapshot's fields together, which holds the geometry figure's own window of the model."""
    loaded = ctx.model("trained.safetensors")
    view = training.training_view(ctx, loaded)
    grid, mode, n = loaded.config.grid, loaded.config.field, len(view.history.steps)
    steps = [snapshot_layer_fields(view.history, i, grid, mode) for i in range(n)]
    for got, want in zip(steps[-1], loaded.fields, strict=True):  # float64 from the history, float32 in the model
        for key in ("density", "mu", "sigma", "lam", "entropy", "radius", "spread", "reach"):
            torch.testing.assert_close(getattr(got, key), getattr(want, key), rtol=1e-4, atol=1e-6, msg=key)
        assert got.gates == pytest.approx(want.gates, rel=1e-5) and set(got.gates) == {"mu", "sigma", "lambda"}
    assert view.window == viz.visible_extent([lf for fields in steps for lf in fields])
    model_window = viz.visible_extent(loaded.fields)
    assert view.window[0] >= model_window[0] and view.window[1] >= model_window[1]
    assert not torch.equal(steps[0][0].density, steps[-1][0].density)  # the fields moved during training
    fig = training.fields_figure(loaded, view, n - 1)
    panels = [ax for ax in fig.axes if ax.get_label() != "<colorbar>"]
    assert len(panels) == len(loaded.fields) * loaded.config.num_heads
    wy, wx = view.window
    assert all(ax.get_xlim() == (-wx, wx) and ax.get_ylim() == (wy, -wy) for ax in panels)
    drawn = np.asarray(Image.open(training.on_step(ctx, FakeUI(), "trained.safetensors", n)["grid"]).convert("RGB"))
    shared = viz.figure_rgb(viz.geometry_figure(loaded.fields, f"trained.safetensors at step {view.history.steps[-1]}",
                                                window=view.window))  # fmt: skip
    assert drawn.shape == shared.shape and np.mean(drawn != shared) < 1e-3  # the model's own figure, at most a digit


def test_a_checkpoint_without_history_says_so_in_one_line(ctx):
    out = training.render(ctx, FakeUI(), "ssog_test.safetensors")
    assert "no training history" in out["note"] and out["step"]["visible"] is False
    assert "Checkpoints here with one: trained.safetensors." in out["note"]  # where to look instead
    with pytest.raises(AppError, match="no training history"):
        app_history.history_of(ctx, "dot_test.safetensors")


def test_the_session_keeps_a_training_step_and_restores_it_on_render(ctx, folder):
    ui = FakeUI()
    ui.checkpoint = "checkpoint"
    part = training.session_part(ctx, ui)
    history = read_history(folder / "ckpt" / "trained.safetensors")
    saved = part.save({"snapshot": 8, "checkpoint": "trained.safetensors"})  # the 8th snapshot
    assert saved == {"step": history.steps[7]}
    restored = part.restore(saved, None)
    assert restored == {"pending": history.steps[7]}
    out = training.render(ctx, ui, "trained.safetensors", restored["pending"])
    assert out["step"]["value"] == 8 and out["step"]["maximum"] == len(history.steps)
    assert (
        training.snapshot_index(history, 10**6) == len(history.steps) - 1 and training.snapshot_index(history, 0) == 0
    )
    assert part.save({"snapshot": 3, "checkpoint": "ssog_test.safetensors"}) == {}  # no history: nothing to keep


def test_history_endpoint_serves_the_stored_history(ctx, folder):
    demo = build_app(ctx)
    launch(demo, "127.0.0.1", free_port(), prevent_thread_lock=True, quiet=True)
    try:
        client = Client(demo.local_url, verbose=False)
        out = client.predict("trained.safetensors", api_name="/history")
        history = read_history(folder / "ckpt" / "trained.safetensors")
        assert out["steps"] == history.steps and set(out["gates"]) == {"mu", "sigma", "lambda"}
        assert np.array(out["gates"]["mu"]).shape == (len(history.steps), 2)
        assert np.array(out["fields"]["mu"]).shape == (len(history.steps), 2, 2, 2, 2)  # step, layer, head, atom, yx
        assert np.array(out["fields"]["tau"]).shape == (len(history.steps), 2)
        assert [s for s, _ in out["val_acc"]] == [6, 12, 18]
        with pytest.raises(Exception, match="no training history"):
            client.predict("ssog_test.safetensors", api_name="/history")
    finally:
        demo.close()
