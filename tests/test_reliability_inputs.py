"""The bad-input corpus, through the app's handlers (what the page shows) and through the API
(``gradio_client`` against a running app). Every bad file gets its own clear message, nothing crashes, the pickles
never run, and the next request succeeds; the awkward-but-valid pictures work in every tab.
"""

from __future__ import annotations

import re
import shutil

import gradio as gr
import numpy as np
import pytest
from gradio_client import Client, handle_file

from app import layout
from app.export_maps import maps_for
from app.layout import build_app, build_page
from app.main import launch
from app.state import AppContext, default_twin
from app.tabs import compare, export, geometry, playground, steering
from ssog_core.analysis.session import NO_TWIN
from ssog_core.testing.app_process import free_port
from tests.app_fixtures import write_checkpoints, write_images
from tests.reliability_corpus import BOMB_SIDE, bad_checkpoints, bad_images

GOOD, TWIN = "ssog_test.safetensors", "dot_test.safetensors"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    ckpts = write_checkpoints(root / "ckpt", depth=2)
    write_images(root / "assets")
    return {
        "root": root,
        "images": bad_images(root / "images"),
        "checkpoints": bad_checkpoints(root / "bad_ckpt", ckpts["ssog"]),
        "marker": root / "bad_ckpt" / "PWNED",
    }


@pytest.fixture(scope="module")
def ctx(corpus, tmp_path_factory):
    return AppContext(corpus["root"] / "ckpt", corpus["root"] / "assets", upload_dir=tmp_path_factory.mktemp("up"))


@pytest.fixture(scope="module")
def page(ctx):
    return build_page(ctx)[1]


@pytest.fixture(scope="module")
def client(corpus, tmp_path_factory):
    ctx = AppContext(corpus["root"] / "ckpt", corpus["root"] / "assets", upload_dir=tmp_path_factory.mktemp("api-up"))
    demo = build_app(ctx)
    launch(demo, "127.0.0.1", free_port(), prevent_thread_lock=True, quiet=True)
    try:
        yield Client(demo.local_url, verbose=False, download_files=False)
    finally:
        demo.close()


REFUSED_IMAGES = ["empty", "text_as_png", "truncated_png", "truncated_jpeg", "bomb"]
VALID_IMAGES = ["one_pixel", "gray16", "cmyk_jpeg", "animated_gif", "rgba_transparent"]
CHECKPOINTS = ["empty", "truncated", "wrong_shapes", "nan_weights", "unknown_fields", "pickle_pt", "pickle_pt_alone",
               "pickle_renamed"]  # fmt: skip


def test_the_corpus_is_what_it_claims(corpus):
    images = corpus["images"]
    assert set(images) == set(REFUSED_IMAGES) | set(VALID_IMAGES)
    bomb = images["bomb"][0].read_bytes()
    assert len(bomb) < 100_000 and int.from_bytes(bomb[16:20], "big") == BOMB_SIDE  # IHDR width, never decoded
    assert images["truncated_jpeg"][0].read_bytes()[:3] == b"\xff\xd8\xff"
    assert set(corpus["checkpoints"]) == set(CHECKPOINTS)


def _works(ctx: AppContext, page: layout.Page, sha: str, every_tab: bool) -> None:
    """An accepted picture goes through both models, the steering analysis and the playground underlay; with
    ``every_tab`` every tab also draws its figures of it."""
    stored = ctx.image(sha)
    for name in (GOOD, TWIN):
        maps = maps_for(ctx, ctx.model(name), stored, 0.5)
        assert maps.grid == (8, 8) and np.isfinite(maps.accumulated.numpy()).all()
    assert steering.analyse(ctx, ctx.model(GOOD), stored).offsets is not None
    pg = page.playground
    assert playground.on_underlay(ctx, pg, playground.initial_value(), True, sha)[pg.canvas]["bg"].startswith(
        "data:image/jpeg"
    )
    if every_tab:
        ex, st, cmp, geo = page.export, page.steering, page.compare, page.geometry
        out = export.render(ctx, ex, GOOD, TWIN, sha, 0.5, 1)
        assert out[ex.figure] is not None and "net exporters" in out[ex.text], out[ex.text]
        out = steering.render(ctx, st, GOOD, sha, 0, [1, 1])
        assert out[st.steering]["value"] is not None and out[st.query_figure] is not None, out[st.note]
        assert compare.render(ctx, cmp, GOOD, TWIN, sha, 0.5, 0)[cmp.figure] is not None
        assert geometry.render(ctx, geo, TWIN, 0, sha)[geo.figure]["value"] is not None  # a dot model's maps


@pytest.mark.parametrize("key", REFUSED_IMAGES)
def test_bad_image_upload_in_the_page_says_why_and_the_next_one_works(ctx, page, corpus, key):
    path, expected = corpus["images"][key]
    out = layout.on_image_upload(ctx, page, str(path))
    assert set(out) == {page.status}  # the page keeps its current picture
    text = out[page.status]
    assert text.startswith("⚠️") and re.search(expected, text), text
    good = layout.on_image_pick(ctx, page, "scene.png")
    assert len(good[page.image_sha]) == 64 and "scene.png" in good[page.status]


@pytest.mark.slow
@pytest.mark.parametrize("key", VALID_IMAGES)
def test_awkward_images_are_converted_and_work_in_every_tab(ctx, page, corpus, key):
    path, _ = corpus["images"][key]
    out = layout.on_image_upload(ctx, page, str(path))
    sha, text = out[page.image_sha], out[page.status]
    assert len(sha) == 64 and path.name in text and not text.startswith("⚠️")
    img = ctx.image(sha).image
    assert img.mode == "RGB"
    a = np.asarray(img)
    if key == "one_pixel":
        assert img.size == (1, 1) and a[0, 0].tolist() == [200, 30, 60]
    elif key == "gray16":
        assert (a[..., 0] == a[..., 1]).all() and (a[..., 1] == a[..., 2]).all() and a.std() > 1
    elif key == "rgba_transparent":
        assert a[0, 0].tolist() == [255, 255, 255] and a[48, 48].tolist() != [255, 255, 255]  # on white
    elif key == "animated_gif":
        assert img.size == (64, 64)  # the first frame
    _works(ctx, page, sha, every_tab=key == "one_pixel")  # the figures of the most extreme one


@pytest.mark.parametrize("key", CHECKPOINTS)
def test_bad_checkpoint_upload_in_the_page_says_why(ctx, page, corpus, key):
    files, expected = corpus["checkpoints"][key]
    names = ctx.checkpoint_names()
    out = layout.on_checkpoint_upload(ctx, page, [str(p) for p in files], GOOD)
    assert set(out) == {page.status}  # pickers unchanged
    assert out[page.status].startswith("⚠️") and re.search(expected, out[page.status]), out[page.status]
    assert ctx.checkpoint_names() == names and not corpus["marker"].exists()
    geo = page.geometry
    assert geometry.render(ctx, geo, GOOD, 0, None)[geo.figure]["value"] is not None  # the next request works


@pytest.mark.slow
def test_bad_checkpoints_in_the_folder_give_messages_in_every_tab(corpus, page, tmp_path):
    """Files dropped into the checkpoint folder by hand are listed, and each tab says what is wrong with them."""
    folder = tmp_path / "ckpt"
    shutil.copytree(corpus["root"] / "ckpt", folder)
    bad = {key: files[0] for key, (files, _) in corpus["checkpoints"].items() if files[0].suffix == ".safetensors"}
    for path in bad.values():
        shutil.copy(path, folder / path.name)
    ctx = AppContext(folder, corpus["root"] / "assets", upload_dir=tmp_path / "up")
    sha = ctx.open_bundled("scene.png").sha256
    assert layout.default_checkpoint(ctx, ctx.checkpoint_names()) == GOOD
    demo = build_app(ctx)  # the page builds with broken files in the folder
    assert isinstance(demo, gr.Blocks)
    geo, st, ex, cmp = page.geometry, page.steering, page.export, page.compare
    for key, path in bad.items():
        expected = corpus["checkpoints"][key][1]
        for text in (
            geometry.render(ctx, geo, path.name, 0, sha)[geo.note],
            steering.render(ctx, st, path.name, sha, 0, None)[st.note],
            export.render(ctx, ex, path.name, TWIN, sha, 0.5, 0)[ex.text],
            compare.render(ctx, cmp, path.name, TWIN, sha, 0.5, 0)[cmp.text],
            playground.preset_choices(ctx, path.name)[1],
        ):
            assert re.search(expected, text), (key, text)
        assert default_twin(ctx, path.name) == NO_TWIN
    assert geometry.render(ctx, geo, GOOD, 0, sha)[geo.figure]["value"] is not None
    assert not corpus["marker"].exists()


# ---------------------------------------------------------------------------------------------- through the API


@pytest.mark.parametrize("key", REFUSED_IMAGES + VALID_IMAGES)
def test_images_through_the_api(client, corpus, key):
    path, expected = corpus["images"][key]
    if expected:
        with pytest.raises(Exception, match=expected):
            client.predict(handle_file(str(path)), api_name="/upload_image")
    else:
        out = client.predict(handle_file(str(path)), api_name="/upload_image")
        assert out["name"] == path.name and len(out["sha256"]) == 64
        ex = client.predict(GOOD, out["sha256"], 0.5, api_name="/export_summary")
        assert ex["grid"] == [8, 8] and 0 <= ex["exporter_share"] <= 1
        head = client.predict(playground.initial_value(), out["sha256"], api_name="/head_field")
        assert head["underlay"].startswith("data:image/jpeg")
    ok = client.predict(GOOD, "scene.png", 0.5, api_name="/export_summary")  # the next request succeeds
    assert ok["grid"] == [8, 8]


@pytest.mark.slow
@pytest.mark.parametrize("key", CHECKPOINTS)
def test_checkpoints_through_the_api(client, corpus, key):
    files, expected = corpus["checkpoints"][key]
    names = client.predict(api_name="/checkpoints")
    with pytest.raises(Exception, match=expected):
        client.predict([handle_file(str(p)) for p in files], api_name="/upload_checkpoint")
    assert not corpus["marker"].exists()
    assert client.predict(api_name="/checkpoints") == names
    assert client.predict(GOOD, api_name="/geometry_summary")["card"]["attention"] == "ssog"


def test_a_good_checkpoint_through_the_api_is_served(client, corpus):
    name = client.predict([handle_file(str(corpus["root"] / "ckpt" / TWIN))], api_name="/upload_checkpoint")
    assert name == "uploaded/" + TWIN and name in client.predict(api_name="/checkpoints")
    assert client.predict(name, "scene.png", 0.25, api_name="/export_summary")["alpha"] == 0.25
