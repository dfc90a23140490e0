"""The target share in the app (app/target_share.py, the Target share tab, ``/target_share``): one image's shares and
the mean over N validation images are the core's numbers, the heavy part runs as a job that counts its images, and a
model of other data is refused in words."""

from __future__ import annotations

import gradio as gr
import numpy as np
import pytest
from gradio_client import Client

from ssog_core import save_checkpoint
from ssog_core.interventions import heavy
from ssog_core.interventions.target_share import close_mu, image_target_share, read_target_share, target_share_report
from ssog_core.runtime.jobs import Cancelled
from tests.app_fixtures import write_checkpoints, write_images
from tests.test_target_share import META, model_of

STEERED, DOT, SHAPES = "pointer_mu.safetensors", "pointer_dot.safetensors", "ssog_test.safetensors"


@pytest.fixture(scope="module")
def ctx(tmp_path_factory):
    from app.state import AppContext

    root = tmp_path_factory.mktemp("target-share")
    write_checkpoints(root / "ckpt", depth=2)  # shapes models: not pointer
    save_checkpoint(root / "ckpt" / STEERED, model_of("ssog", ("mu",), seed=3), META)
    save_checkpoint(root / "ckpt" / DOT, model_of("dot", seed=4), META)
    write_images(root / "assets")
    return AppContext(root / "ckpt", root / "assets", upload_dir=tmp_path_factory.mktemp("uploads"))


@pytest.fixture(scope="module")
def view(ctx):
    from app.tabs import target_share as tab

    with gr.Blocks():
        return tab.build(ctx, {"checkpoint": gr.State(STEERED), "image_sha": gr.State(None)})


@pytest.mark.parametrize("name", [STEERED, DOT])
def test_one_image_is_its_row_of_the_readout(ctx, name):
    """Image i read alone gives the shares that image has among the first i + 1, unedited and with its μ gates
    closed (a model that steers μ), and the scene it was read on."""
    from app import target_share as shares

    loaded = ctx.model(name)
    one = shares.one_image(ctx, loaded, 5)
    np.testing.assert_allclose(one.shares, read_target_share(loaded.model, META, 6).per_image()[5], rtol=1e-6)
    edits = close_mu(loaded.model)
    if edits:
        closed = read_target_share(loaded.model, META, 6, edits).per_image()[5]
        np.testing.assert_allclose(one.closed_mu, closed, rtol=1e-6)
        assert not np.allclose(one.closed_mu, one.shares, atol=1e-4)  # closing the gates changes where it looks
    else:
        assert one.closed_mu is None
    assert one.scene.discs.shape == (3, *one.scene.image.shape[:2]) and one.class_name == META["class_names"][5 % 6]
    assert shares.one_image(ctx, loaded, 5) is one  # kept per model and image
    with pytest.raises(ValueError, match="from 0 to 39"):
        image_target_share(loaded.model, META, 40)


def test_the_job_counts_its_passes_and_gives_the_report(ctx):
    """20 images in batches of 50: one batch per pass, two passes for a model that steers μ; a stop ends it."""
    loaded = ctx.model(STEERED)
    seen: list[tuple[int, int]] = []
    out = heavy.target_share((loaded.model, META), 20, lambda d, t: seen.append((d, t)), lambda: False)
    assert seen == [(0, 40), (20, 40), (40, 40)]
    assert out == target_share_report(loaded.model, META, 20)
    seen.clear()
    heavy.target_share((ctx.model(DOT).model, META), 12, lambda d, t: seen.append((d, t)), lambda: False)
    assert seen == [(0, 12), (12, 12)]
    with pytest.raises(Cancelled):
        heavy.target_share((loaded.model, META), 20, lambda d, t: None, lambda: True)


def test_a_model_of_other_data_is_refused_in_words(ctx, view):
    from app import target_share as shares
    from app.tabs import target_share as tab

    loaded = ctx.model(SHAPES)
    for call in (lambda: shares.one_image(ctx, loaded, 0), lambda: shares.readout(ctx, loaded, 10)):
        with pytest.raises(ValueError, match="defined on pointer scenes; this model's data is shapes:"):
            call()
    out = tab.render(ctx, view, SHAPES, 0, None)
    assert "defined on pointer scenes" in out[view.note] and out[view.figure] is None
    *_, last = tab.on_read(ctx, view, SHAPES, 20)
    assert "defined on pointer scenes" in last[view.mean_note] and last[view.plot] is None
    with pytest.raises(ValueError, match="evaluate 1 to 40 images"):
        shares.readout(ctx, ctx.model(STEERED), 41)


def test_the_tab_draws_one_image_and_the_mean_with_the_cores_numbers(ctx, view):
    from app.tabs import target_share as tab

    loaded = ctx.model(STEERED)
    out = tab.render(ctx, view, STEERED, 3, None)
    one = image_target_share(loaded.model, META, 3)
    assert out[view.figure].endswith("target_share_pointer_mu_val3.png")
    assert ", ".join(f"{s:.2f}" for s in one.shares) in out[view.note]
    assert ", ".join(f"{s:.2f}" for s in one.closed_mu) in out[view.note]
    report = target_share_report(loaded.model, META, 20)
    ctx.cache.effects.get(("target_share", loaded.key, 20), lambda: report)  # the job's answer (the API test runs it)
    last = list(tab.on_read(ctx, view, STEERED, 20))[-1]
    rows = last[view.table]["value"]
    assert [r[0] for r in rows] == ["layer 0", "layer 1"] and last[view.shown] == STEERED
    for row, layer, closed, change in zip(rows, report["layers"], report["closed_mu"]["layers"],
                                          report["closed_mu"]["change"], strict=True):  # fmt: skip
        assert row[1] == f"{layer['share']:.3f} [{layer['ci95'][0]:.3f}, {layer['ci95'][1]:.3f}]"
        assert row[2].startswith(f"{closed['share']:.3f} [") and row[3].startswith(f"{change['change']:+.3f} [")
    assert "first **20** validation images" in last[view.mean_note]
    shown = last[view.plot]
    assert [t.name for t in shown.data] == ["unedited", "μ gates closed"]
    np.testing.assert_allclose(shown.data[0].y, [r["share"] for r in report["layers"]])
    # another model picked: the mean of the first leaves the page
    moved = tab.render(ctx, view, DOT, 0, STEERED)
    assert moved[view.plot] is None and moved[view.shown] is None


@pytest.fixture(scope="module")
def served(ctx):
    from app.layout import build_app
    from app.main import launch
    from ssog_core.testing.app_process import free_port

    demo = build_app(ctx)
    launch(demo, "127.0.0.1", free_port(), prevent_thread_lock=True, quiet=True)
    try:
        yield demo, Client(demo.local_url, verbose=False)
    finally:
        demo.close()


def test_the_api_returns_the_commands_json_and_refuses_other_data_in_words(ctx, served):
    from app import queues

    demo, client = served
    loaded = ctx.model(STEERED)
    got = client.predict(STEERED, 16, api_name="/target_share")
    want = target_share_report(loaded.model, META, 16)
    assert got.keys() == want.keys() and got["images"] == want["images"] and got["chance"] == want["chance"]
    # equal to float rounding: the worker may sum in another order
    flat = lambda d: np.array([[r["share"], *r["ci95"], *r["heads"]] for r in d])  # noqa: E731
    np.testing.assert_allclose(flat(got["layers"]), flat(want["layers"]), rtol=1e-9)
    np.testing.assert_allclose(flat(got["closed_mu"]["layers"]), flat(want["closed_mu"]["layers"]), rtol=1e-9)
    change = lambda d: [[c["change"], *c["ci95"]] for c in d["closed_mu"]["change"]]  # noqa: E731
    np.testing.assert_allclose(change(got), change(want), rtol=1e-9)
    assert client.predict(DOT, 12, api_name="/target_share")["closed_mu"] is None
    with pytest.raises(Exception, match="defined on pointer scenes"):
        client.predict(SHAPES, 10, api_name="/target_share")
    with pytest.raises(Exception, match="evaluate 1 to 40 images"):  # the default N, 100, on a split of 40
        client.predict(DOT, api_name="/target_share")
    fn = next(f for f in demo.fns.values() if f.api_name == "target_share")
    assert fn.concurrency_id == queues.HEAVY  # its N images wait in the heavy queue
