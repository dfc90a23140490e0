"""Every callback of the app, called directly (no server), on tiny checkpoints and images made in tmp dirs.

Handlers return ``{component: value}`` for the components they change; the tests look the values up by the
components of a page built once (``page``). Bad inputs must come back as a visible message (never an exception
escaping to Gradio), and awkward but valid images (grayscale, RGBA, 16-bit) must work.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import time
from functools import partial
from pathlib import Path

import gradio as gr
import numpy as np
import pytest
import torch
from PIL import Image

from app import layout, plots
from app import session_protocol as session
from app.export_maps import control_for, maps_for, validation_for
from app.layout import build_page
from app.state import UPLOADED, AppContext, AppError, default_image, default_twin
from app.tabs import compare, export, geometry, playground, scaling, steering
from ssog_core import ViT, save_checkpoint
from ssog_core.analysis import latency
from ssog_core.analysis.controls import describe
from ssog_core.analysis.head_spec import MAX_ATOMS, HeadSpec, evaluate
from ssog_core.analysis.measures import DEFAULT_IMAGES, attention_maps, export_maps
from ssog_core.analysis.session import NO_TWIN, dumps
from ssog_core.data.images import model_input
from ssog_core.interventions.ops import CloseGate
from ssog_core.interventions.run import edited
from ssog_core.runtime.lru import LRU
from ssog_core.viz import figures as viz
from tests.app_fixtures import (
    designed_ssog,
    dot_twin,
    write_bad_checkpoints,
    write_bad_files,
    write_checkpoints,
    write_images,
)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("app")
    ckpts = write_checkpoints(root / "ckpt", depth=2)
    images = write_images(root / "assets")
    return {"root": root, "ckpt": root / "ckpt", "assets": root / "assets", "ckpts": ckpts, "images": images}


@pytest.fixture(scope="module")
def ctx(folders, tmp_path_factory):
    return AppContext(folders["ckpt"], folders["assets"], upload_dir=tmp_path_factory.mktemp("uploads"))


@pytest.fixture(scope="module")
def sha(ctx):
    return ctx.open_bundled("scene.png").sha256


@pytest.fixture(scope="module")
def page(ctx):
    return build_page(ctx)[1]


@pytest.fixture(scope="module")
def pg(page):
    return page.playground


def event(**data) -> gr.EventData:
    return gr.EventData(None, data)


def props(update: dict) -> dict:
    return {k: v for k, v in update.items() if k != "__type__"}


def values(out: dict, components: list) -> list:
    """A handler's values for ``components``, in their order (each one must be there)."""
    return [out[c] for c in components]


# ----------------------------------------------------------------------------------------------- state


def test_checkpoint_picker_is_confined_to_its_folder(ctx, folders):
    assert ctx.checkpoint_names() == ["dot_test.safetensors", "ssog_test.safetensors"]
    assert ctx.resolve("ssog_test.safetensors") == folders["ckpts"]["ssog"].resolve()
    outside = folders["root"] / "outside.safetensors"
    outside.write_bytes(folders["ckpts"]["ssog"].read_bytes())
    (folders["ckpt"] / "link.safetensors").symlink_to(outside)
    for bad in ["../outside.safetensors", "/etc/passwd", str(outside), "sub/x.safetensors", "a\x00b", "",
                "link.safetensors", "uploaded/../ckpt/ssog_test.safetensors", "..\\x.safetensors"]:  # fmt: skip
        with pytest.raises(AppError, match="refused|no checkpoint|not found|outside"):
            ctx.resolve(bad)
    with pytest.raises(AppError, match="not found"):
        ctx.model("missing.safetensors")
    (folders["ckpt"] / "link.safetensors").unlink()


def test_model_cache_is_bounded_and_follows_file_changes(ctx, folders, tmp_path):
    a = ctx.model("ssog_test.safetensors")
    assert ctx.model("ssog_test.safetensors") is a
    from app.state import MODEL_CACHE

    assert ctx.cache.models.size == MODEL_CACHE and len(ctx.cache.models) <= MODEL_CACHE
    path = folders["ckpts"]["dot"]
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    b = ctx.model("dot_test.safetensors")
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 2 * 10**9))
    assert ctx.model("dot_test.safetensors") is not b


def test_bad_checkpoint_uploads_are_refused_with_reasons_and_never_run_code(ctx, page, folders, tmp_path):
    bad = write_bad_checkpoints(tmp_path, folders["ckpts"]["ssog"])
    cases = {
        "truncated": "truncated or corrupt",
        "wrong_shape": "shape",
        "pickle_safetensors": "not a readable safetensors",
    }
    for key, message in cases.items():
        with pytest.raises(AppError, match=message):
            ctx.add_upload([str(bad[key])])
    with pytest.raises(AppError, match="together with a .json"):
        ctx.add_upload([str(bad["pickle"])])
    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps({"img_size": 32, "patch_size": 4}))
    with pytest.raises(AppError, match="could run code"):
        ctx.add_upload([str(bad["pickle"]), str(cfg)])
    assert not bad["marker"].exists()
    names_before = ctx.checkpoint_names()
    update = layout.on_checkpoint_upload(ctx, page, [str(bad["truncated"])], "ssog_test.safetensors")
    assert set(update) == {page.status}  # the pickers stay as they are
    assert "truncated" in update[page.status] and ctx.checkpoint_names() == names_before
    with pytest.raises(AppError, match="upload one .safetensors"):
        ctx.add_upload([str(cfg)])


def test_good_uploads_ours_and_an_upstream_pt_with_its_config(ctx, page, folders, tmp_path):
    name = ctx.add_upload([str(folders["ckpts"]["dot"])])
    assert name == UPLOADED + "dot_test.safetensors" and name in ctx.checkpoint_names()
    assert ctx.model(name).config.attn == "dot"
    ref = dot_twin(img_size=32, patch=4, dim=32, depth=2, heads=4)
    pt = tmp_path / "ref model.pt"
    torch.save({"model": {f"_orig_mod.{k}": v for k, v in ref.state_dict().items()}}, pt)
    kwargs = {"num_classes": 5, "img_size": 32, "patch_size": 4, "dim": 32, "depth": 2, "num_heads": 4, "attn": "dot"}
    (tmp_path / "ref.json").write_text(json.dumps(kwargs))
    name = ctx.add_upload([str(pt), str(tmp_path / "ref.json")])
    assert name == UPLOADED + "ref_model.safetensors"
    x = torch.rand(1, 3, 32, 32)
    torch.testing.assert_close(ctx.model(name).model(x), ref(x))
    updates = layout.checkpoint_updates(ctx, page, name)
    assert name in [value for _, value in updates[page.checkpoint]["choices"]]  # (label, name) pairs
    assert updates[page.checkpoint]["value"] == name
    for _ in range(10):  # disk use stays bounded: the oldest uploads go
        ctx.add_upload([str(folders["ckpts"]["dot"])])
    from app.state import MAX_UPLOADED_CHECKPOINTS

    assert len(list(ctx.upload_dir.glob("*.safetensors"))) == MAX_UPLOADED_CHECKPOINTS


def test_images_awkward_ones_work_bad_ones_are_refused(ctx, page, folders, tmp_path):
    for key in ("gray", "rgba", "16bit"):
        stored = ctx.open_upload(str(folders["images"][key]))
        assert stored.image.mode == "RGB" and stored.image.size == (96, 96)
        assert ctx.image(stored.sha256) is stored
    bad = write_bad_files(tmp_path)
    for key, message in {"text": "not an image", "truncated_image": "truncated or corrupt", "bomb": "MP limit"}.items():
        with pytest.raises(AppError, match=message):
            ctx.open_upload(str(bad[key]))
        out = layout.on_image_upload(ctx, page, str(bad[key]))
        assert set(out) == {page.status} and out[page.status].startswith("⚠️")
    with pytest.raises(AppError, match="no longer in memory"):
        ctx.image("0" * 64)
    with pytest.raises(AppError, match="not one of the bundled"):
        ctx.open_bundled("../ckpt/ssog_test.safetensors")
    out = layout.on_image_pick(ctx, page, "rgba.png")
    assert len(out[page.image_sha]) == 64 and out[page.thumb].height <= 96 and "rgba.png" in out[page.status]


# ----------------------------------------------------------------------------------------------- playground


def test_playground_render_and_preview(ctx):
    v = playground.initial_value()
    p, spec, view = playground.render(v)
    assert p["img"].startswith("data:image/png;base64,") and len(p["ky"]) == spec.grid[0] and max(p["kx"]) == 1
    assert p["lam"] == pytest.approx(view.lam.tolist(), abs=1e-4) and "entropy" in p["info"]
    assert playground.preview({"value": v, "overlay": True})["img"].startswith("data:image/png")
    for bad in (None, {"value": {"grid": [2, 2]}}, {"value": {**v, "atoms": []}}, {"value": {**v, "tau": "x"}}):
        out = playground.preview(bad)
        assert set(out) == {"error"} and out["error"]


def test_playground_release_pick_and_sliders(ctx, pg):
    v = playground.initial_value()
    v["atoms"][1]["y"] = 3.0
    canvas = playground.on_release(v, False, event(t=123.5))
    assert canvas["ack"] == 123.5 and canvas["img"].startswith("data:") and "value" not in canvas
    details = playground.on_details(pg, v)
    fig, rows = details[pg.kernels], details[pg.table]
    assert rows[1][1] == "(3.0, 11.0)" and len(fig.data) == 2 * (3 + 1)
    colours = [[t.line.color for t in fig.data if t.xaxis == axis][:3] for axis in ("x", "x2")]
    assert colours[0] == colours[1] and len(set(colours[0])) == 3 and None not in colours[0]  # atom r = legend r
    bad = playground.on_release({**v, "grid": [1, 1]}, False, event(t=1))
    assert "grid" in bad["err"]
    picked = playground.on_pick(pg, v, event(i=2))
    assert (picked[pg.sy]["value"], picked[pg.sx]["value"], picked[pg.w]["value"]) == (2.5, 2.5, 0.2)
    v["sel"], v["atoms"][2]["sx"] = 2, 0.86341
    out = playground.on_atom_param(pg, "sy", v, 4.0, False)
    atom = out[pg.canvas]["value"]["atoms"][2]
    assert (atom["sy"], atom["sx"], atom["w"]) == (4.0, 0.86341, 0.2) and out[pg.table][2][3] == "(4.00, 0.86)"
    assert playground.on_atom_param(pg, "w", v, 0.9, False)[pg.canvas]["value"]["atoms"][2]["w"] == 0.9
    bad = playground.on_atom_param(pg, "sy", v, 0.0, False)  # σ out of range: the canvas says why
    assert set(bad) == {pg.canvas} and "σ must be" in bad[pg.canvas]["err"]


def test_playground_grid_change_keeps_every_offset(ctx, pg):
    v = playground.initial_value()
    mu0 = evaluate(HeadSpec.from_dict(v)).mu
    nv = playground.on_head_param(pg, v, 2.0, 11, "axial", False)[pg.canvas]["value"]
    assert nv["grid"] == [11, 11] and nv["query"] == [5, 5] and nv["tau"] == 2.0 and nv["mode"] == "axial"
    torch.testing.assert_close(evaluate(HeadSpec.from_dict(nv)).mu, mu0)
    v["query"] = [6, 18]  # a corner query goes to the same relative place on the new grid
    assert playground.on_head_param(pg, v, 1.0, 48, "factorized", False)[pg.canvas]["value"]["query"] == [12, 36]
    bad = playground.on_head_param(pg, v, 1.0, 2, "factorized", False)
    assert set(bad) == {pg.canvas} and "between 3 and 96" in bad[pg.canvas]["err"]


@pytest.mark.parametrize("tau, mode", [(1.5, "factorized"), (1.0, "axial"), (3.0, "axial")])
def test_tau_and_mode_never_move_the_query_or_the_atoms(pg, tau, mode):
    """τ or the mode move neither the ★ nor the atoms, for the default query (the grid's centre) and others."""
    for query in ([6, 6], [12, 12], [0, 23]):
        v = playground.initial_value()
        dq = (query[0] - v["query"][0], query[1] - v["query"][1])
        v = {**v, "query": query, "atoms": [{**a, "y": a["y"] + dq[0], "x": a["x"] + dq[1]} for a in v["atoms"]]}
        nv = playground.on_head_param(pg, v, tau, 24, mode, False)[pg.canvas]["value"]
        assert nv["query"] == query and nv["atoms"] == v["atoms"] and (nv["tau"], nv["mode"]) == (tau, mode)


def test_playground_add_remove_reset_limits(ctx, pg):
    v = playground.initial_value()
    out = playground.on_add(pg, v, False, event(y=2.0, x=3.0))
    v = out[pg.canvas]["value"]
    assert len(v["atoms"]) == 4 and v["atoms"][-1]["y"] == 2.0 and v["sel"] == 3
    assert set(out) == set(pg.main_out + pg.atom_controls)
    while len(v["atoms"]) < MAX_ATOMS:
        v = playground.on_add(pg, v, False, event())[pg.canvas]["value"]
    assert playground.on_add(pg, v, False, event()) == gr.skip()  # the 9th is refused with a warning
    out = playground.on_remove(pg, v, False)
    assert len(out[pg.canvas]["value"]["atoms"]) == MAX_ATOMS - 1 and out[pg.add]["interactive"] is True
    one = {**playground.initial_value(), "atoms": playground.initial_value()["atoms"][:1]}
    assert playground.on_remove(pg, one, False) == gr.skip()
    reset = playground.on_reset(pg, False)
    assert reset[pg.canvas]["value"] == playground.initial_value() and len(reset) == 13


@pytest.mark.slow
def test_presets_underlay_and_figure(ctx, sha, pg):
    choices, note = playground.preset_choices(ctx, "ssog_test.safetensors")
    assert len(choices) == 4 and "layer" in choices[1]
    assert playground.preset_choices(ctx, "dot_test.safetensors")[0] == []
    assert playground.preset_choices(ctx, None)[0] == []
    assert "unavailable" in playground.preset_choices(ctx, "../x")[1]
    out = playground.on_preset(ctx, pg, "ssog_test.safetensors", choices[1], False)
    assert set(out) == set(pg.head_out)
    v = out[pg.canvas]["value"]
    loaded = ctx.model("ssog_test.safetensors")
    s = loaded.presets[1].shape
    # A preset sits on the model's own 8×8 patch grid (not its 15×15 displacement grid), so the
    # picture under it is cut into the patches the model sees; its field is the centre query's fixed attention
    assert v["grid"] == [8, 8] and v["query"] == [3, 3]
    fixed = attention_maps(loaded.model, torch.rand(1, 3, 32, 32), steered=False).attn[s.layer][0, s.head, 3 * 8 + 3]
    np.testing.assert_allclose(evaluate(HeadSpec.from_dict(v)).density.numpy().ravel(), fixed.numpy(), atol=1e-5)
    assert f"layer {s.layer}, head {s.head}" in out[pg.preset_note] and "8×8 patch grid" in out[pg.preset_note]
    assert out[pg.mode]["value"] == "factorized"
    assert "not a head" in playground.on_preset(ctx, pg, "ssog_test.safetensors", "nonsense", False)[pg.preset_note]
    over = playground.on_preset(ctx, pg, "ssog_test.safetensors", choices[1], True, sha)[pg.canvas]
    assert over["bg"].startswith("data:image/jpeg") and over["value"]["grid"] == [8, 8]
    note = playground.underlay_note(ctx, "ssog_test.safetensors", sha, v)
    assert "one of ssog_test.safetensors's 8×8 patches" in note and "96×96 px" in note and "32×32 px" in note
    assert "not ssog_test.safetensors's 8×8 patch grid" in playground.underlay_note(
        ctx, "ssog_test.safetensors", sha, playground.initial_value()
    )
    out = playground.on_underlay(ctx, pg, v, True, sha)
    assert out[pg.canvas]["bg"].startswith("data:image/jpeg;base64,") and out[pg.underlay]["value"] is True
    assert out[pg.status] == ""
    out = playground.on_underlay(ctx, pg, v, True, None)
    assert out[pg.canvas]["bg"] == "" and out[pg.underlay]["value"] is False
    assert "pick or upload an image" in out[pg.status]
    assert layout.refresh_underlay(ctx, pg, v, False, sha) == gr.skip()  # off: a new image changes nothing
    assert layout.refresh_underlay(ctx, pg, v, True, sha)[pg.canvas]["bg"].startswith("data:image/jpeg")
    out = playground.on_make_figure(ctx, pg, v, True, sha)
    files = out[pg.figure_files]
    assert sorted(Path(f).suffix for f in files) == [".png", ".svg"] and "grid8x8" in files[0]


# ----------------------------------------------------------------------------------------------- geometry


@pytest.mark.slow
def test_geometry_ssog_dot_and_missing(ctx, sha, page):
    geo = page.geometry
    out = geometry.render(ctx, geo, "ssog_test.safetensors", 1, sha)
    note, card, fig, gates, layer_plot, stats, table, slider = values(out, geo.outputs)
    assert "2 layers × 4 heads × 3 atoms" in note and "parameters" in card and "FLOPs" in card
    assert Path(fig["value"]).name == "geometry_ssog_test.png" and Path(fig["value"]).read_bytes()[:4] == b"\x89PNG"
    assert len(table["value"]) == 2 * 4 * 3 and slider["maximum"] == 1 and "value" not in slider  # it fits
    assert geometry.render(ctx, geo, "ssog_test.safetensors", 5, sha)[geo.layer]["value"] == 1  # clamped
    assert gates["value"].layout.title.text and layer_plot["value"].data[0].hovertemplate
    start = gates["value"].data[-1]  # the gates' start (this fixture: warm), on a log axis where it can be seen
    assert gates["value"].layout.yaxis.type == "log" and "warm start" in start.name and "0.127" in start.name
    assert list(start.y) == [pytest.approx(0.12703, rel=1e-3)] * 2
    cold = plots.gates_plot(ctx.model("ssog_test.safetensors").fields, 4.3535e-4, cold=True).data[-1]
    assert "cold start softplus(−8) + 1e-4 = 0.000435" in cold.name
    entropy = stats["value"].data[0]  # the colours span 0 … ln N nats, not the observed min … max
    assert (entropy.zmin, entropy.zmax) == (0.0, pytest.approx(np.log(64))) and stats["value"].data[1].zmin == 0
    out = geometry.render(ctx, geo, "dot_test.safetensors", 0, sha)
    note, card, fig, gates, layer_plot, stats, table, slider = values(out, geo.outputs)
    assert "no field" in note and fig["value"] is not None and fig["visible"]
    # a dot model shows no empty plot boxes, tables or dead sliders: what it lacks is hidden
    assert all(u == {"__type__": "update", "value": None, "visible": False} for u in (gates, layer_plot, table))
    assert slider["visible"] is False
    assert "largest-norm keys" in note and "key norms" in stats["value"].layout.title.text
    assert len(stats["value"].data) == 2 + 4  # one histogram per layer, one ratio line per head
    assert "No checkpoint found" in geometry.render(ctx, geo, None, 0, sha)[geo.note]
    assert "refused" in geometry.render(ctx, geo, "../../etc/passwd", 0, sha)[geo.note]
    assert geometry.on_layer(ctx, "ssog_test.safetensors", 0).layout.title.text.startswith("Layer 0")
    files = geometry.downloads(ctx, geo, "ssog_test.safetensors")[geo.files]
    assert {Path(f).name for f in files} >= {"geometry_ssog_test.png", "geometry_ssog_test.svg",
                                             "geometry_ssog_test_atoms.csv"}  # fmt: skip
    refused = geometry.downloads(ctx, geo, "dot_test.safetensors")
    assert refused[geo.files] is None and "no field to export" in refused[geo.files_status]


def test_a_head_clicked_in_the_geometry_grid_opens_in_the_playground(ctx, sha, page, pg):
    loaded = ctx.model("ssog_test.safetensors")
    png, boxes = geometry.geometry_png(ctx, loaded)
    width, height = Image.open(io.BytesIO(png)).size
    x0, y0, x1, y1 = boxes[2 * 2 + 1]  # head rows × layer columns: head 2 of layer 1
    click = gr.SelectData(None, {"index": [(x0 + x1) / 2 * width, (y0 + y1) / 2 * height], "value": None})
    assert geometry.head_at(ctx, loaded, click.index) == (1, 2)
    out = layout.on_geometry_click(ctx, page, "ssog_test.safetensors", False, sha, click)
    v = out[pg.canvas]["value"]
    assert v["grid"] == [8, 8] and "layer 1, head 2" in out[pg.preset_note]
    assert out[page.tabs].selected == "playground" and out[page.active] == "playground"
    assert set(out) == {*pg.head_out, page.tabs, page.active, page.geometry.status}
    assert out[pg.zoom] is True and out[pg.canvas]["fit"] is True  # a trained head opens zoomed to its atoms
    fixed = attention_maps(loaded.model, torch.rand(1, 3, 32, 32), steered=False).attn[1][0, 2, 3 * 8 + 3]
    np.testing.assert_allclose(evaluate(HeadSpec.from_dict(v)).density.numpy().ravel(), fixed.numpy(), atol=1e-5)
    missed = gr.SelectData(None, {"index": [1, 1], "value": None})
    missed_out = layout.on_geometry_click(ctx, page, "ssog_test.safetensors", False, sha, missed)
    assert set(missed_out) == {page.geometry.status} and "inside a head's panel" in missed_out[page.geometry.status]


# ----------------------------------------------------------------------------------------------- steering


@pytest.mark.slow
def test_steering_render_click_and_downloads(ctx, sha, page):
    st = page.steering
    out = steering.render(ctx, st, "ssog_test.safetensors", sha, 1, None, 3)
    note, click, pred, steer, qfig, slider, head, btn = values(out, st.outputs)
    assert "Click a patch" in note and steer["visible"] and qfig is None and head["choices"] == [0, 1, 2, 3]
    assert "μδ bound per atom" not in note and "resized 96×96 → 32×32 px" in note
    steer = steer["value"]
    assert abs(sum(pred.values()) - 1) < 0.2 and set(pred) <= set(ctx.model("ssog_test.safetensors").class_names)
    h, w = click.shape[:2]
    sel = gr.SelectData(None, {"index": [w * 0.7, h * 0.2], "value": None})
    out = steering.on_select(ctx, st, "ssog_test.safetensors", sha, 1, sel)
    q, click2, qfig, text = values(out, [st.query, st.click, st.query_figure, st.query_text])
    assert q == [1, 5] and Path(qfig).name.endswith("_L1_q1-5.png") and "(1, 5)" in text
    assert not np.array_equal(click, click2) and Path(steer).name == f"steering_ssog_test_{sha[:8]}_L1.png"
    assert "layer **1**" in note
    s = steering.analyse(ctx, ctx.model("ssog_test.safetensors"), ctx.image(sha))
    fixed, steered_row = steering.query_rows(s, 1, (1, 5))
    assert fixed.shape == steered_row.shape == (4, 8, 8) and not np.allclose(fixed, steered_row)
    np.testing.assert_allclose(steered_row.sum((1, 2)), 1, rtol=1e-5)
    files = steering.downloads(ctx, st, "ssog_test.safetensors", sha, 1, [1, 5])[st.files]
    names = {Path(f).name for f in files}
    assert any(n.endswith("_L1.png") for n in names) and any(n.endswith("_q1-5.svg") for n in names)
    out = steering.render(ctx, st, "dot_test.safetensors", sha, 0, [2, 2])
    note, click, pred, steer, qfig, slider, head, btn = values(out, st.outputs)
    assert "no field to steer" in note and steer == {"__type__": "update", "value": None, "visible": False}
    assert qfig is not None and head["visible"] is False and btn["visible"] is False
    assert "Pick an image" in steering.render(ctx, st, "ssog_test.safetensors", None, 0, None)[st.note]


def test_a_steering_query_opens_in_the_playground_with_a_content_gate(ctx, sha, page, pg):
    """Steering → playground: the clicked query's head on the model's grid, at the learned gate, and the gate
    slider turns content's steering down to the fixed field (which is the model's fixed attention row)."""
    out = layout.on_open_steered(ctx, page, "ssog_test.safetensors", sha, 1, [2, 5], 2, False)
    v = out[pg.canvas]["value"]
    assert v["grid"] == [8, 8] and v["query"] == [2, 5] and "query patch ★ (2, 5)" in out[pg.steer_note]
    assert out[pg.preset_note] == ""  # the steering note once, not twice
    assert "rollout" in page.export.alpha.info and "only rescales" in page.export.alpha.info
    assert out[pg.steer_group]["visible"] and out[pg.gate]["value"] == 1.0
    assert out[page.tabs].selected == "playground" and out[page.steering.query_text] == ""
    src = out[pg.steer_src]
    assert src == {"checkpoint": "ssog_test.safetensors", "image_sha256": sha, "layer": 1, "head": 2, "query": [2, 5]}
    gated = layout.on_gate(ctx, pg, src, 0.0, False, sha)
    fixed_canvas, status = gated[pg.canvas], gated[pg.status]
    loaded = ctx.model("ssog_test.safetensors")
    row = attention_maps(loaded.model, loaded.input(ctx.image(sha).image), steered=False).attn[1][0, 2, 2 * 8 + 5]
    density = evaluate(HeadSpec.from_dict(fixed_canvas["value"])).density.numpy().ravel()
    np.testing.assert_allclose(density, row.numpy(), atol=1e-5)
    assert fixed_canvas["value"]["atoms"] != v["atoms"] and status == ""
    assert gated[pg.sx]["value"] == round(fixed_canvas["value"]["atoms"][0]["sx"], 3)  # controls follow the head
    assert layout.on_gate(ctx, pg, None, 0.5, False, sha) == gr.skip()
    status = page.steering.query_text
    assert "click a patch" in layout.on_open_steered(ctx, page, "ssog_test.safetensors", sha, 1, None, 0, False)[status]
    assert "no field" in layout.on_open_steered(ctx, page, "dot_test.safetensors", sha, 0, [1, 1], 0, False)[status]


def test_letting_go_of_the_content_gate_shows_the_models_prediction_with_that_gate(ctx, sha, page, pg):
    """The gate slider is an intervention (scale_gate on the head, every query): at 0 the prediction is the
    closed gate's, at 1 the model's own."""
    src = layout.on_open_steered(ctx, page, "ssog_test.safetensors", sha, 1, [2, 5], 2, False)[pg.steer_src]
    loaded = ctx.model("ssog_test.safetensors")
    x = loaded.input(ctx.image(sha).image)
    with torch.inference_mode(), edited(loaded.model, [CloseGate(1, "all", 2)]):
        closed = torch.softmax(loaded.model(x)[0].double(), -1)
    text = layout.on_gate_release(ctx, pg, src, 0.0)[pg.gate_effect]
    assert "Layer 1, head 2: every gate × 0 at every query" in text
    assert f"**{loaded.class_names[int(closed.argmax())]}** {float(closed.max()):.4f} (Δ" in text
    assert "Δ log p(" in layout.on_gate_release(ctx, pg, src, 1.0)[pg.gate_effect]
    assert "= +0.0000)" in layout.on_gate_release(ctx, pg, src, 1.0)[pg.gate_effect]
    assert layout.on_gate_release(ctx, pg, None, 0.5) == gr.skip()
    gone = {**src, "image_sha256": "0" * 64}
    assert "no longer in memory" in layout.on_gate_release(ctx, pg, gone, 0.5)[pg.gate_effect]


# ----------------------------------------------------------------------------------------------- export + compare


@pytest.mark.slow
def test_export_maps_with_twin_and_downloads(ctx, sha, page):
    ex = page.export
    assert default_twin(ctx, "ssog_test.safetensors") == "dot_test.safetensors"
    assert default_twin(ctx, None) == NO_TWIN
    out = export.render(ctx, ex, "ssog_test.safetensors", "dot_test.safetensors", sha, 0.25, 1)
    text, fig, acc, slider, _ = values(out, ex.outputs)
    loaded = ctx.model("ssog_test.safetensors")
    x, _ = model_input([ctx.image(sha).image], loaded.config.img_size, loaded.meta)
    s = export_maps(loaded.model, x, 0.25).summary()
    assert f"[{s['acc_min']:.3f}, {s['acc_max']:.3f}]" in text and f"{s['exporter_share']:.0%}" in text
    assert "α = **0.25**" in text and "dot_test" in text and Path(fig).name.startswith("export_ssog_test-dot_test_")
    assert acc.data[0].zmid == 0 and acc.data[0].colorbar.title.text
    files = export.downloads(ctx, ex, "ssog_test.safetensors", "dot_test.safetensors", sha, 0.25, 1)[ex.files]
    names = sorted(Path(f).name for f in files)
    assert any("alpha0.25_RdBu_r.png" in n and "_L1_" in n for n in names)
    assert any(n.endswith(".svg") for n in names) and sum(n.endswith(".npz") for n in names) == 2
    npz = np.load(next(f for f in files if f.endswith(".npz")))
    assert json.loads(str(npz["settings"]))["alpha"] == 0.25 and npz["net"].shape == (2, 8, 8)
    assert "Pick an image" in export.render(ctx, ex, "ssog_test.safetensors", NO_TWIN, None, 0.5, 0)[ex.text]
    # the patch picked in Steering carries over: outlined on the maps, named in the text and the files
    out = export.render(ctx, ex, "ssog_test.safetensors", NO_TWIN, sha, 0.5, 0, [2, 5])
    text, fig, acc, _, _ = values(out, ex.outputs)
    assert "query patch (2, 5)" in text and "yellow" in text
    assert [(sh.x0, sh.y0) for sh in acc.layout.shapes] == [(4.5, 1.5)]
    assert json.loads(Image.open(fig).info["Description"])["query"] == [2, 5]


@pytest.mark.slow
def test_a_narrow_screen_gets_one_layer_in_two_columns(ctx, sha, page):
    """The phone layout: the six panels of one layer in three rows of two, no strip of every layer, so each
    panel keeps its size (the wide figure at 390 px shrinks every panel to ~55 px)."""
    ex = page.export
    wide = export.render(ctx, ex, "ssog_test.safetensors", NO_TWIN, sha, 0.5, 1)[ex.figure]
    narrow = export.render(ctx, ex, "ssog_test.safetensors", NO_TWIN, sha, 0.5, 1, None, "none", "narrow")[ex.figure]
    (ww, wh), (nw, nh) = Image.open(wide).size, Image.open(narrow).size
    assert ww > wh and nh > nw and Path(narrow).name.endswith("_narrow.png")
    assert json.loads(Image.open(narrow).info["Description"])["layout"] == "narrow"
    maps = ctx_maps(ctx, sha)
    panels = {}
    for flag in (False, True):
        fig = viz.export_maps_figure(Image.new("RGB", (32, 32)), [("m", maps)], 1, narrow=flag)
        panels[flag] = [ax for ax in fig.get_axes() if ax.get_images()]
    assert len(panels[True]) == 6 and len(panels[False]) == 6 + 2  # the wide one adds every layer's net export
    assert {ax.get_title().split("\n")[0] for ax in panels[True]} >= {"layer 1 pull-in", "layer 1 net export"}
    width = {flag: panels[flag][1].get_position().width for flag in panels}  # of the figure, at one screen width
    assert width[True] > 2.5 * width[False]


def ctx_maps(ctx, sha):
    loaded = ctx.model("ssog_test.safetensors")
    return export_maps(loaded.model, loaded.input(ctx.image(sha).image), 0.5)


@pytest.mark.slow
def test_export_maps_against_a_control_and_per_class(ctx, sha, page, tmp_path):
    ex, ckpt = page.export, "ssog_test.safetensors"
    loaded, stored = ctx.model(ckpt), ctx.image(sha)
    raw = maps_for(ctx, loaded, stored, 0.5)
    out = export.render(ctx, ex, ckpt, NO_TWIN, sha, 0.5, 0)
    assert out[ex.control_figure]["visible"] is False and "Control: **none (raw maps)**" in out[ex.text]
    for control in ("blank", "validation"):
        out = export.render(ctx, ex, ckpt, "dot_test.safetensors", sha, 0.5, 0, None, control)
        text, _, acc, _, shown = values(out, ex.outputs)
        c = control_for(ctx, loaded, stored, raw, control)
        assert f"Control: **{describe(control, c.images)}**" in text and text.count("raw − control in [") == 2
        assert shown["visible"] and json.loads(Image.open(shown["value"]).info["Description"])["control"] == control
        np.testing.assert_allclose(np.asarray(acc.data[0].z, float), raw.accumulated[0].numpy())  # the plot stays raw
    assert c.images == DEFAULT_IMAGES
    files = export.downloads(ctx, ex, ckpt, "dot_test.safetensors", sha, 0.5, 0, None, "validation")[ex.files]
    assert sum(Path(f).name.startswith("export_control_validation_") for f in files) == 2  # PNG + SVG
    npz = np.load(next(f for f in files if Path(f).name.startswith("export_maps_ssog_test") and f.endswith(".npz")))
    np.testing.assert_array_equal(npz["accumulated_difference"], npz["accumulated"] - npz["accumulated_control"])
    assert json.loads(str(npz["settings"]))["control"] == "validation"
    made = ctx.cache.validation.peek((loaded.key, DEFAULT_IMAGES, 0.5, False, None))  # None: the recorded data
    assert made is not None and validation_for(ctx, loaded, 0.5) is made  # computed once per checkpoint, α
    for control in ("none", "blank", "validation"):
        out = export.per_class(ctx, ex, ckpt, 0.5, control)
        assert Path(out[ex.classes]).suffix == ".png" and "64 validation images of `shapes:" in out[ex.classes_status]
    bare = save_checkpoint(tmp_path / "bare.safetensors", designed_ssog(depth=1), {"class_names": list("abcde")})
    name = ctx.add_upload([str(bare)])  # no recorded data: the bundled pictures, labelled by its predictions
    out = export.render(ctx, ex, name, NO_TWIN, sha, 0.5, 0, None, "validation")
    assert "the bundled pictures)**" in out[ex.text] and out[ex.control_figure]["visible"]
    assert "bundled pictures, each in the class" in export.per_class(ctx, ex, name, 0.5, "none")[ex.classes_status]


@pytest.mark.slow
def test_compare_side_by_side_and_mismatched_grids(ctx, sha, page, tmp_path):
    cmp = page.compare
    out = compare.render(ctx, cmp, "ssog_test.safetensors", "dot_test.safetensors", sha, 0.5, 1)
    text, fig, slider = values(out, cmp.outputs)
    assert "A — **ssog_test" in text and "B — **dot_test" in text and Path(fig).suffix == ".png"
    files = compare.downloads(ctx, cmp, "ssog_test.safetensors", "dot_test.safetensors", sha, 0.5, 1)[cmp.files]
    npz = np.load(next(f for f in files if f.endswith(".npz")))
    np.testing.assert_allclose(npz["accumulated_difference"], npz["A_accumulated"] - npz["B_accumulated"])
    other = write_checkpoints(tmp_path / "big", img_size=48, depth=1)["ssog"]
    name = ctx.add_upload([str(other)])
    # Different grids showed nothing; now A and B side by side, and why there is no A − B
    text, fig, _ = values(compare.render(ctx, cmp, "ssog_test.safetensors", name, sha, 0.5, 0), cmp.outputs)
    assert fig is not None and "8×8" in text and "12×12" in text and "needs equal grids" in text
    files = compare.downloads(ctx, cmp, "ssog_test.safetensors", name, sha, 0.5, 0)[cmp.files]
    npz = np.load(next(f for f in files if f.endswith(".npz")))
    assert npz["A_net"].shape[-2:] == (8, 8) and npz["B_net"].shape[-2:] == (12, 12)
    assert "accumulated_difference" not in npz


@pytest.mark.slow
def test_rbf_checkpoint_with_registers(ctx, sha, page, tmp_path):
    torch.manual_seed(2)
    model = ViT(num_classes=5, img_size=32, patch_size=4, dim=32, depth=2, num_heads=4, attn="rbf", num_registers=2)
    name = ctx.add_upload([str(save_checkpoint(tmp_path / "rbf_regs.safetensors", model))])
    geo = page.geometry
    note, card, fig, _, _, stats, _, _ = values(geometry.render(ctx, geo, name, 0, sha), geo.outputs)
    assert "**RBF (distance)** attention model" in note and "no field" in note and fig["value"] is not None
    assert "register tokens take" in note and {t.name for t in stats["value"].data} >= {"layer 0 (rbf)", "head 3"}
    text, fig, _, _, _ = values(export.render(ctx, page.export, name, NO_TWIN, sha, 0.5, 0), page.export.outputs)
    assert "prefix tokens (class, distillation, register) took" in text and fig is not None


def test_scaling_resolution_transfer(ctx, folders, page, tmp_path):
    sc = page.scaling
    note, transfer = values(scaling.render(ctx, sc, "ssog_test.safetensors"), sc.outputs)
    assert note.startswith("No resolution-transfer curve for **ssog_test.safetensors**") and "\n" not in note
    assert transfer["visible"] is False
    curve = [{"img_size": [48, 48], "tokens": 144, "accuracy": 0.41}, {"img_size": [32, 32], "tokens": 64,
              "accuracy": 0.61}, {"img_size": [16, 16], "tokens": 16, "accuracy": 0.2}]  # fmt: skip
    beside = folders["ckpt"] / "ssog_test.transfer.json"  # evaluate --json beside the checkpoint
    beside.write_text(json.dumps(curve))
    try:
        note, transfer = values(scaling.render(ctx, sc, "ssog_test.safetensors"), sc.outputs)
    finally:
        beside.unlink()
    assert "3 sizes, from `ssog_test.transfer.json`" in note and transfer["visible"]
    trace = transfer["value"].data[0]
    assert list(trace.x) == [16, 64, 144] and list(trace.y) == [0.2, 0.61, 0.41]
    trained = transfer["value"].layout.shapes[0]  # on a log axis a shape's x is log10 of the token count
    assert 10**trained.x0 == pytest.approx(64) and 10 ** transfer["value"].layout.annotations[0].x == pytest.approx(64)
    # written by train into the checkpoint's metadata, as a JSON string in the meta or in the header itself
    from safetensors import safe_open
    from safetensors.torch import save_file

    in_meta = save_checkpoint(tmp_path / "in_meta.safetensors", designed_ssog(depth=1),
                              {"resolution_transfer": json.dumps(curve)})  # fmt: skip
    with safe_open(str(in_meta), framework="pt") as f:
        header, state = dict(f.metadata()), {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
    header["meta"] = "{}"
    header["resolution_transfer"] = json.dumps(curve[:2])
    save_file(state, str(tmp_path / "in_header.safetensors"), metadata=header)
    for file, n in ((in_meta, 3), (tmp_path / "in_header.safetensors", 2)):
        name = ctx.add_upload([str(file)])
        note, transfer = values(scaling.render(ctx, sc, name), sc.outputs)
        assert f"({n} sizes, from the checkpoint's metadata)" in note and len(transfer["value"].data[0].x) == n
    bad = save_checkpoint(tmp_path / "bad_curve.safetensors", designed_ssog(depth=1),
                          {"resolution_transfer": '[{"tokens": 3}]'})  # fmt: skip
    assert "expected img_size" in scaling.render(ctx, sc, ctx.add_upload([str(bad)]))[sc.transfer_note]
    loaded = ctx.model("ssog_test.safetensors")
    assert latency.sizes(loaded) == [(16, 16), (32, 32), (48, 48), (64, 64), (96, 96)]


class FakeForwards:
    """A clock and a forward for :func:`app.tabs.latency.measure`: each forward advances the clock by a time that
    grows as N (SSOG) or N² (dot) with a spread, and is recorded; nothing is really timed."""

    def __init__(self) -> None:
        self.t, self.calls = 0.0, []

    def clock(self) -> float:
        return self.t

    def run(self, loaded, x) -> None:
        n = (x.shape[-2] // 4) * (x.shape[-1] // 4)
        self.calls.append((loaded.name[:4], n))
        spread = 1 + 0.1 * (len(self.calls) % 3)
        self.t += (n if loaded.is_ssog else n * n / 64) * 1e-4 * spread


def test_latency_is_warmed_up_interleaved_and_shown_with_its_spread(ctx, page):
    sc = page.scaling
    models = [ctx.model("ssog_test.safetensors"), ctx.model("dot_test.safetensors")]
    fake = FakeForwards()
    curves = latency.measure(models, repeats=5, warmup=2, clock=fake.clock, run=fake.run)
    points = [(m, n) for n in (16, 64, 144, 256, 576) for m in ("ssog", "dot_")]  # size by size, model by model
    assert fake.calls == points * 2 + (points + points[::-1]) * 2 + points  # warmed up, then rounds, each reversed
    ssog, dot = curves
    assert ssog.tokens == dot.tokens == [16, 64, 144, 256, 576] and all(len(s) == 5 for s in ssog.samples)
    assert ssog.exponent() == pytest.approx(1, abs=0.05) and dot.exponent() == pytest.approx(2, abs=0.05)
    q1, q3 = ssog.quantile(0.25), ssog.quantile(0.75)
    assert all(a <= m <= b for a, m, b in zip(q1, ssog.ms, q3, strict=True)) and all(
        b > a for a, b in zip(q1, q3, strict=True)
    )
    timing = partial(latency.measure, repeats=5, warmup=2, clock=fake.clock, run=fake.run)
    measured = scaling.on_measure(ctx, sc, "ssog_test.safetensors", timing)
    text, plot = measured[sc.latency_note], measured[sc.latency]
    assert "ssog_test.safetensors" in text and "dot_test.safetensors" in text
    assert re.search(r"slope \*\*(0\.9\d|1\.0\d)\*\*", text) and re.search(r"slope \*\*(1\.9\d|2\.0\d)\*\*", text)
    assert "up to 576 tokens" in text and "4096" not in text and "median of 5 runs after 2 warm-ups" in text
    assert latency.cpu_model() in text and "torch thread" in text and "IQR" in text
    assert [t.name.split(" ")[0] for t in plot.data[:2]] == ["ssog_test.safetensors", "dot_test.safetensors"]
    assert list(plot.data[0].x) == [16, 64, 144, 256, 576] and plot.data[0].error_y.array is not None
    guides = plot.data[2:]
    assert len({g.line.dash for g in guides}) == 2 and {"∝ N", "∝ N²"} == {g.name.split(" (")[0] for g in guides}
    assert latency.cpu_model() in plot.layout.title.text
    assert "pick a checkpoint" in scaling.on_measure(ctx, sc, None)[sc.latency_note]


# ----------------------------------------------------------------------------------------------- session + main


def session_values(v: dict, **sections: dict) -> dict:
    """What the page's session fields hold, by section (as :func:`app.session_protocol.by_section` hands them over)."""
    base = {"playground": {"head": v, "underlay": False}, "geometry": {"layer": 0},
            "steering": {"layer": 0, "query": None}, "export": {"twin": NO_TWIN, "alpha": 0.5, "layer": 0},
            "compare": {"a": None, "b": None, "alpha": 0.5, "layer": 0},
            "training": {"snapshot": 0, "checkpoint": None}, "intervene": {"edits": []},
            "target_share": {"index": 0, "images": 100}}  # fmt: skip
    return {k: {**base[k], **sections.get(k, {})} for k in base}


def test_session_round_trip(ctx, sha, page, pg, tmp_path):
    v = playground.initial_value()
    v["atoms"][0]["x"] = 4.0
    parts = page.session_parts(ctx)
    values = session_values(
        v, playground={"underlay": True}, geometry={"layer": 1}, steering={"layer": 1, "query": [2, 3]},
        export={"twin": "dot_test.safetensors", "alpha": 0.3, "layer": 1},
        compare={"a": "ssog_test.safetensors", "b": "dot_test.safetensors", "alpha": 0.6},
    )  # fmt: skip
    data = session.make_session(ctx, parts, "ssog_test.safetensors", sha, values).to_dict()
    assert data["image"] == {"sha256": sha, "name": "scene.png"} and data["playground"]["head"]["atoms"][0]["x"] == 4
    path = tmp_path / "s.json"
    path.write_text(json.dumps(data))
    ses = page.session
    out = layout.restore_session(ctx, page, str(path))
    top = [page.checkpoint, page.image_sha, page.thumb, page.image_pick, page.status, page.steering.query,
           page.steering.query_text, ses.status]  # fmt: skip
    assert set(out) == set(top) | set(session.outputs(parts))
    assert out[page.checkpoint]["value"] == "ssog_test.safetensors" and out[page.image_sha] == sha
    assert out[page.image_pick]["value"] == "scene.png"  # the picker names the restored image
    assert out[pg.canvas]["value"]["atoms"][0]["x"] == 4.0 and out[pg.canvas]["bg"].startswith("data:image/jpeg")
    assert out[page.steering.query] == [2, 3] and out[page.export.alpha]["value"] == 0.3
    assert out[page.export.twin]["value"] == "dot_test.safetensors" and out[page.compare.alpha]["value"] == 0.6
    assert out[ses.status] == "Session restored."
    data["image"]["sha256"] = "f" * 64
    data["checkpoint"] = "gone.safetensors"
    data["export"]["twin"] = "gone_too.safetensors"
    path.write_text(json.dumps(data))
    out = layout.restore_session(ctx, page, str(path), "dot_test.safetensors", sha)
    assert page.checkpoint not in out and page.image_sha not in out  # what cannot be restored stays as it is
    assert "gone.safetensors" in out[ses.status] and "no longer in memory" in out[ses.status]
    assert "gone_too.safetensors" in out[ses.status] and out[page.export.twin]["value"] == NO_TWIN
    assert out[pg.canvas]["value"]["atoms"] and out[pg.canvas]["bg"]  # the page's own image under the head
    path.write_text("{not json")
    assert "not a JSON session" in layout.restore_session(ctx, page, str(path))[ses.status]
    path.write_text(json.dumps({"format": "other"}))
    refused = layout.restore_session(ctx, page, str(path))
    assert set(refused) == {ses.status} and "not an SSOG Lab session" in refused[ses.status]
    flat = [values[p.section][k] for p in parts for k in p.fields]  # as the save event hands them over
    saved = layout.save_session(ctx, page, "ssog_test.safetensors", sha, *flat)
    file, text = saved[ses.file], saved[ses.status]
    assert text == "Session saved."
    assert session.read_session(file) == session.make_session(ctx, parts, "ssog_test.safetensors", sha, values)


def test_sessions_save_and_restore_uploaded_checkpoints(ctx, sha, page, tmp_path):
    """A checkpoint uploaded as upstream .pt + .json is named ``uploaded/…``, and saving a
    session with it selected failed (the ``/`` went into the file name). Any picker name saves and restores."""
    from tests.app_fixtures import write_upstream_checkpoint

    name = ctx.add_upload([str(p) for p in write_upstream_checkpoint(tmp_path)])
    assert name.startswith(UPLOADED)
    v = playground.initial_value()
    ses = page.session
    flat = [session_values(v)[p.section][k] for p in page.session_parts(ctx) for k in p.fields]
    for ckpt in (name, "ssog_test.safetensors"):
        saved = layout.save_session(ctx, page, ckpt, sha, *flat)
        file, text = saved[ses.file], saved[ses.status]
        assert text == "Session saved." and Path(file).is_file() and "/" not in Path(file).name
        assert json.loads(Path(file).read_text())["checkpoint"] == ckpt
        out = layout.restore_session(ctx, page, file)
        assert out[page.checkpoint]["value"] == ckpt and out[ses.status] == "Session restored."
    assert Path(file).name == "ssog_session_ssog_test.json"


def test_a_tab_the_session_module_does_not_know_records_its_own_section(ctx, sha, page, tmp_path):
    """The protocol a new tab follows: it declares its section's fields and restores them itself; the file keeps
    the section as written."""
    level = gr.Slider(0, 1, value=0)
    part = session.SessionPart(
        "lens", {"level": level},
        lambda section, restoring: {level: gr.update(maximum=max(section["level"], 1), value=section["level"])},
        [level],
    )  # fmt: skip
    parts = [*page.session_parts(ctx), part]
    values = {**session_values(playground.initial_value()), "lens": {"level": 7}}
    s = session.make_session(ctx, parts, "ssog_test.safetensors", sha, values)
    path = tmp_path / "s.json"
    path.write_text(dumps(s))
    restored = session.read_session(path)
    assert restored.more == {"lens": {"level": 7}}
    out = session.restore_parts(parts, restored, session.Restoring("ssog_test.safetensors", sha))
    assert out[level]["maximum"] == 7 and out[level]["value"] == 7


def test_the_target_share_tab_saves_its_image_and_n_and_refuses_bad_ones(ctx, sha, page, tmp_path):
    ts, parts = page.target_share, page.session_parts(ctx)
    plain = session.make_session(ctx, parts, "ssog_test.safetensors", sha, session_values(playground.initial_value()))
    assert "target_share" not in plain.to_dict()  # the defaults write no section
    values = session_values(playground.initial_value(), target_share={"index": 17, "images": 250})
    path = tmp_path / "s.json"
    path.write_text(dumps(session.make_session(ctx, parts, "ssog_test.safetensors", sha, values)))
    assert json.loads(path.read_text())["target_share"] == {"index": 17, "images": 250}
    out = layout.restore_session(ctx, page, str(path))
    assert out[ts.index] == 17 and out[ts.n] == 250 and out[page.session.status] == "Session restored."
    data = json.loads(path.read_text())
    data["target_share"] = {"index": -3, "images": 5}
    path.write_text(json.dumps(data))
    out = layout.restore_session(ctx, page, str(path))
    assert ts.index not in out and ts.n not in out
    assert "target share image -3" in out[page.session.status] and "target share images 5" in out[page.session.status]


def test_messages_use_no_emoji_a_plain_font_cannot_draw(ctx, page, folders):
    """The "✅" mark drew as an empty box on a machine without an emoji font."""
    text = layout.on_checkpoint_upload(ctx, page, [str(folders["ckpts"]["dot"])], None)[page.status]
    assert "Loaded" in text and not any(ord(c) >= 0x1F000 or c in "\u2705\ufe0f" for c in text)


def test_lazy_rendering_and_checkpoint_defaults(ctx, page, tmp_path):
    calls, last, shown = [], gr.State(None), gr.Markdown()
    run = layout.lazy("export", lambda *a: calls.append(a) or {shown: "x"}, last)
    assert run("playground", None, 1, 2) == gr.skip() and not calls
    out = run("export", None, 1, 2)
    assert out[shown] == "x" and run("export", out[last], 1, 2) == gr.skip() and len(calls) == 1
    assert layout.default_checkpoint(ctx, ctx.checkpoint_names()) == "ssog_test.safetensors"
    bundled = tmp_path / "bundled"
    bundled.mkdir()
    names = ("dot_layouts.safetensors", "ssog_layouts.safetensors", "matched_ssog_layouts.safetensors",
             "matched_ssog_mu_pointer14.safetensors")  # fmt: skip
    for name in names:
        shutil.copy(ctx.checkpoint_dir / "ssog_test.safetensors", bundled / name)
    demo = AppContext(bundled, ctx.assets_dir, upload_dir=tmp_path / "up")
    assert layout.default_checkpoint(demo, demo.checkpoint_names()) == "matched_ssog_mu_pointer14.safetensors"
    (bundled / "matched_ssog_mu_pointer14.safetensors").unlink()
    assert layout.default_checkpoint(demo, demo.checkpoint_names()) == "matched_ssog_layouts.safetensors"
    (bundled / "matched_ssog_layouts.safetensors").unlink()
    assert layout.default_checkpoint(demo, demo.checkpoint_names()) == "ssog_layouts.safetensors"
    follow = [page.playground.preset, page.playground.preset_note, page.export.twin, page.compare.a, page.compare.b]
    presets, note, twin, a, b = values(layout.on_checkpoint_change(ctx, page, "ssog_test.safetensors"), follow)
    dot = layout.on_checkpoint_change(ctx, page, "dot_test.safetensors")
    assert dot[page.playground.preset]["visible"] is False  # no dead picker
    assert (
        len(presets["choices"]) == 4
        and presets["visible"]
        and twin["value"] == "dot_test.safetensors"
        and b["value"] == twin["value"]
    )
    empty = AppContext(tmp_path / "none", tmp_path / "none", upload_dir=tmp_path / "up")
    (tmp_path / "up").mkdir()
    assert "No checkpoint found" in layout.folder_status(empty, [])


BUNDLED = Path(__file__).resolve().parents[1] / "checkpoints"


@pytest.mark.skipif(not (BUNDLED / "matched_ssog_mu_pointer14.safetensors").is_file(), reason="no bundled checkpoints")
def test_the_first_screen_opens_the_converged_pointer_model_and_labels_every_bundled_model(tmp_path):
    """The bundled folder opens on the converged +μδ pointer model, on a picture of its data set, with its fixed-field
    model as the matched twin for steering and the dot twin as the other attention kind; the picker says what each
    bundled model is (solved, or still on its plateau)."""
    ctx = AppContext(BUNDLED, BUNDLED.parent / "assets", upload_dir=tmp_path)
    names = ctx.checkpoint_names()
    first = layout.default_checkpoint(ctx, names)
    assert first == "matched_ssog_mu_pointer14.safetensors"
    assert default_image(ctx, first).name.startswith("pointer_")
    assert default_twin(ctx, first) == "matched_dot_pointer14.safetensors"
    assert default_twin(ctx, first, "ssog_fixed") == "matched_ssog_fixed_pointer14.safetensors"
    labels = {name: label for label, name in layout.checkpoint_choices(names)}
    assert set(labels) == set(names)
    for kind in ("ssog_mu", "ssog", "ssog_fixed"):
        assert labels[f"matched_{kind}_pointer14.safetensors"].endswith(": 10,000 steps, solved)")
    assert "still on its plateau" in labels["matched_dot_pointer14.safetensors"]
    for kind in ("ssog", "ssog_fixed", "dot"):
        assert "fully trained" in labels[f"matched_{kind}_layouts.safetensors"]
    assert labels["ssog_layouts.safetensors"] == "ssog_layouts.safetensors"  # a file without a note: its name


def test_build_app_without_checkpoints_serves_the_playground(tmp_path):
    (tmp_path / "up").mkdir()
    empty = AppContext(tmp_path / "none", tmp_path / "none", upload_dir=tmp_path / "up")
    t = time.perf_counter()
    demo = layout.build_app(empty)
    assert isinstance(demo, gr.Blocks) and time.perf_counter() - t < 60
    config = demo.get_config_file()
    names = {c.get("props", {}).get("elem_id") for c in config["components"]}
    assert {"pg-canvas", "ckpt", "ex-figure", "st-click", "geo-figure"} <= names


def test_caches_stay_bounded(ctx):
    cache, made = LRU(2), []
    for key in [1, 2, 1, 3, 4, 1]:
        cache.get(key, lambda k=key: made.append(k) or k)
    assert len(cache) == 2 and made == [1, 2, 3, 4, 1]
    assert cache.peek(4) == 4 and cache.peek(3) is None and 1 in cache and 3 not in cache
    cache.put(5, 5)  # peeking at 4 made it the more recent one: 1 goes
    assert 1 not in cache and {4, 5} == {k for k in (1, 2, 3, 4, 5) if k in cache}
    with pytest.raises(ValueError, match="at least one"):
        LRU(0)
    sizes = {name: getattr(ctx.cache, name).size for name in vars(ctx.cache)}
    want = {
        "models": 4,
        "images": 32,
        "cards": 8,
        "figures": 8,
        "steering": 3,
        "export_maps": 8,
        "validation": 4,
        "effects": 16,
        "head_fields": 8,
    }
    assert sizes == want
    assert all(len(c) <= c.size for c in vars(ctx.cache).values())


DEMO = Path(__file__).resolve().parents[1] / "checkpoints"


@pytest.mark.slow
@pytest.mark.skipif(not (DEMO / "ssog_layouts.safetensors").is_file(), reason="demo checkpoints not in checkpoints/")
def test_demo_checkpoints_open_in_every_tab(page, tmp_path):
    demo = AppContext(DEMO, DEMO.parent / "assets", upload_dir=tmp_path)
    stored = default_image(demo) or demo.open_upload(str(write_images(tmp_path / "img")["rgb"]))
    geo = geometry.render(demo, page.geometry, "ssog_layouts.safetensors", 0, stored.sha256)
    note, card, fig, *_ = values(geo, page.geometry.outputs)
    assert fig is not None and "accuracy" in card
    twin = default_twin(demo, "ssog_layouts.safetensors")
    ex = export.render(demo, page.export, "ssog_layouts.safetensors", twin, stored.sha256, 0.5, 0)
    assert ex[page.export.figure] is not None and "net exporters" in ex[page.export.text]
    st = steering.render(demo, page.steering, "ssog_layouts.safetensors", stored.sha256, 0, [1, 1])
    assert st[page.steering.query_figure] is not None


@pytest.mark.slow
def test_a_restored_session_sets_every_range_before_its_value(page, pg, tmp_path):
    """A freshly loaded page has layer sliders with maximum 1; a session saved on a deeper model at layer 3 must
    come back with each slider's maximum widened in the same update as its value (else "Value 3 is greater than
    maximum value 1" and Error panels), and the atom sliders must show the restored atom, not the defaults."""
    deep = AppContext(tmp_path / "ckpt", tmp_path / "ckpt", upload_dir=tmp_path)
    write_checkpoints(tmp_path / "ckpt", depth=4)
    stored = deep.open_upload(str(write_images(tmp_path / "img")["rgb"]))
    head = HeadSpec.from_dict(playground.initial_value()).with_atom(0, sy=3.15, sx=0.07, w=0.41)
    layers = {"layer": 3}
    data = {"format": "ssog-lab-session/1", "checkpoint": "ssog_test.safetensors",
            "image": {"sha256": stored.sha256, "name": stored.name},
            "playground": {"head": head.to_dict(), "selected_atom": 0},
            "geometry": layers, "steering": {**layers, "query": [1, 2]},
            "export": {"twin": "dot_test.safetensors", "alpha": 0.8, "layer": 3},
            "compare": {"a": "ssog_test.safetensors", "b": "dot_test.safetensors", "alpha": 0.8,
                        "layer": 3}}  # fmt: skip
    path = tmp_path / "s.json"
    path.write_text(json.dumps(data))
    out = layout.restore_session(deep, page, str(path))
    for slider in (page.geometry.layer, page.steering.layer, page.export.layer, page.compare.layer):
        assert out[slider]["value"] == 3 and out[slider]["maximum"] == 3, slider
    assert out[pg.sy]["value"] == 3.15 and out[pg.sx]["value"] == 0.07 and out[pg.w]["value"] == 0.41
    assert out[pg.sx]["minimum"] <= 0.07  # a steered atom narrower than the model's floor still fits the slider
    assert "Image" in out[page.status] and stored.name in out[page.status]
    assert out[page.export.alpha]["value"] == 0.8 and out[page.steering.query] == [1, 2]
    ex = page.export
    shown = export.render(deep, ex, "ssog_test.safetensors", "dot_test.safetensors", stored.sha256, 0.8, 3)
    assert shown[ex.figure] is not None and shown[ex.layer]["maximum"] == 3
