"""End to end in a real browser: Playwright driving Debian's Chromium (headless, offline) against ``python -m app``.

One app server (a subprocess on a free port) and one browser for the whole tour, which is a single test so that
pytest-xdist cannot split it over workers. Screenshots of every step go to ``artifacts/`` (kept by CI).
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlparse

import pytest

from app.state import AppContext
from app.tabs import geometry
from ssog_core.testing.app_process import AppProcess
from tests.app_fixtures import write_bad_files, write_checkpoints, write_images, write_upstream_checkpoint
from tests.test_images import bomb_png

playwright = pytest.importorskip("playwright.sync_api")

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]  # fmt: skip
ROOT = Path(__file__).resolve().parents[1]
STARTUP = 600  # s for the app to answer: importing torch and Gradio takes minutes on a loaded 2-core box
ARTIFACTS = ROOT / "artifacts"
pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,
    pytest.mark.timeout(1500),  # one long tour: on a loaded 2-core box it outlasts the suite's 600 s default
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Debian's chromium is not installed"),
]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("e2e")
    write_checkpoints(root / "ckpt", depth=2)
    images = write_images(root / "assets")
    bad = write_bad_files(root / "bad")
    bad_ckpt = root / "bad" / "half.safetensors"
    bad_ckpt.write_bytes((root / "ckpt" / "ssog_test.safetensors").read_bytes()[:5000])
    upstream = write_upstream_checkpoint(root / "ref")
    env = {"GRADIO_TEMP_DIR": str(root / "gradio")}
    with AppProcess(root / "ckpt", root / "assets", root / "app.log", env=env, startup_timeout=STARTUP) as app:
        yield {"url": app.url, "images": images, "bad": bad, "bad_ckpt": bad_ckpt, "log": root / "app.log",
               "upstream": upstream, "ckpt": root / "ckpt"}  # fmt: skip


def shot(page, name: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def img_src(page, selector: str) -> str:
    el = page.query_selector(selector)
    return (el.get_attribute("src") or "") if el else ""


def wait_src_change(page, selector: str, old: str, timeout: float = 60_000) -> None:
    page.wait_for_function(
        "([sel, old]) => { const e = document.querySelector(sel); return e && e.src && e.src !== old; }",
        arg=[selector, old], timeout=timeout,
    )  # fmt: skip


def click_image_until(page, image: str, fx: float, fy: float, appears: str, tries: int = 3) -> None:
    """Click at (``fx``, ``fy``) of ``image``'s box until ``appears`` is in the page: on a busy machine a click
    that lands while the picture is being replaced is lost, and a person would click again."""
    for attempt in range(tries):
        box = page.locator(image).bounding_box()
        page.mouse.click(box["x"] + box["width"] * fx, box["y"] + box["height"] * fy)
        try:
            page.wait_for_selector(appears, state="attached", timeout=30_000)
            return
        except playwright.TimeoutError:
            if attempt == tries - 1:
                raise


@contextmanager
def browser_page(log: Path, failure: str, timeout: float) -> Iterator:
    """A page in Debian's Chromium. On failure: a screenshot named ``failure`` and the app's log. At the end: no
    request left this machine."""
    requests: list[str] = []
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.on("request", lambda r: requests.append(r.url))
        page.set_default_timeout(timeout)
        try:
            yield page
        except Exception:
            shot(page, failure)
            print(log.read_text()[-4000:])
            raise
        finally:
            browser.close()
    foreign = [u for u in requests if urlparse(u).scheme in ("http", "https", "ws", "wss")
               and urlparse(u).hostname not in ("127.0.0.1", "localhost")]  # fmt: skip
    assert not foreign, f"the page reached outside this machine: {foreign[:5]}"


def open_tab(page, tab: str) -> None:
    page.click(f"#tab-{tab}-button")


def test_browser_tour(server):
    with browser_page(server["log"], "failure", 60_000) as page:
        page.goto(server["url"])
        page.wait_for_selector("#pg-canvas .atom")
        page.wait_for_function("() => document.querySelector('#pg-canvas img.fld').src.startsWith('data:')")
        drag_an_atom(page)
        tau_keeps_the_query(page)
        atoms_move_from_the_keyboard(page)
        lambda_labels_do_not_pile_up(page)
        switch_a_preset(page)
        geometry_tab(page)
        layer_controls_redraw(page)
        figure_downloads_are_named(page)
        geometry_click_opens_the_head(page, server["ckpt"])
        a_trained_head_opens_zoomed_to_its_atoms(page)
        export_tab_upload(page, server["images"]["rgba"])
        steering_tab_click(page)
        bad_upload_keeps_serving(page, server["bad"]["text"])
        bad_checkpoint_upload(page, server["bad_ckpt"])
        session_save_and_restore(page, server["log"].parent)
        session_with_an_uploaded_checkpoint(page, server["upstream"], server["log"].parent)
        phone_width(page)


def drag_an_atom(page) -> None:
    """The field follows the pointer while dragging (server-function preview), then the release reaches Python."""
    before = img_src(page, "#pg-canvas img.fld")
    readout_before = page.inner_text("#pg-readout")
    atom = page.locator("#pg-canvas .atom").nth(0).bounding_box()
    x, y = atom["x"] + atom["width"] / 2, atom["y"] + atom["height"] / 2
    page.mouse.move(x, y)
    page.mouse.down()
    page.mouse.move(x + 90, y + 60, steps=15)
    wait_src_change(page, "#pg-canvas img.fld", before)  # a preview frame arrived before the release
    page.mouse.up()
    page.wait_for_function(
        "() => /release → update \\d+ ms/.test(document.querySelector('#pg-canvas .lat').textContent)"
    )
    page.wait_for_function("old => document.querySelector('#pg-readout').innerText !== old", arg=readout_before)
    moved = page.locator("#pg-canvas .atom").nth(0).bounding_box()
    assert moved["x"] > atom["x"] + 60 and moved["y"] > atom["y"] + 40
    assert page.evaluate("() => window.ssogCanvasStats.frames") >= 1
    shot(page, "01_playground_drag")


def switch_a_preset(page) -> None:
    before = img_src(page, "#pg-canvas img.fld")
    page.click("#pg-preset input")
    page.locator("[role=option]", has_text="vertical strip").click()
    page.wait_for_function("() => document.querySelector('#pg-preset-note').innerText.includes('vertical strip')")
    wait_src_change(page, "#pg-canvas img.fld", before)
    assert page.locator("#pg-canvas .atom").count() == 3  # the trained head's atoms
    note = page.inner_text("#pg-preset-note")
    assert "layer" in note and "head" in note
    shot(page, "02_playground_preset")


def geometry_tab(page) -> None:
    open_tab(page, "geometry")
    page.wait_for_selector("#geo-figure img[src]", state="attached")
    page.wait_for_function("() => document.querySelector('#geo-card').innerText.includes('parameters')")
    page.wait_for_selector("#geo-gates .js-plotly-plot", state="attached")
    assert "2 layers × 4 heads × 3 atoms" in page.inner_text("#geo-note")
    shot(page, "03_geometry")


def export_tab_upload(page, image: Path) -> None:
    open_tab(page, "export")
    page.wait_for_selector("#ex-figure img[src]", state="attached")  # the bundled default image first
    before = img_src(page, "#ex-figure img")
    with page.expect_file_chooser() as chooser:
        page.click("#img-upload")
    chooser.value.set_files(str(image))
    page.wait_for_function("() => document.querySelector('#status').innerText.includes('rgba.png')")
    wait_src_change(page, "#ex-figure img", before)
    text = page.inner_text("#ex-summary")
    assert "net exporters" in text and "dot_test" in text and "α = 0.50" in text
    shot(page, "04_export_upload")


def steering_tab_click(page) -> None:
    open_tab(page, "steering")
    page.wait_for_function("() => document.querySelector('#st-note').innerText.includes('rgba.png')")
    page.wait_for_selector("#st-click img[src]", state="attached")
    page.wait_for_selector("#st-steer img[src]", state="attached")
    assert not page.query_selector("#st-qfig img[src]")
    click_image_until(page, "#st-click img", 0.8, 0.3, "#st-qfig img[src]")  # patch (2, 6) of 8×8
    page.wait_for_function("() => document.querySelector('#st-query').innerText.includes('query patch (2, 6)')")
    assert "%" in page.inner_text("#st-pred")
    shot(page, "05_steering_click")


def bad_upload_keeps_serving(page, bad: Path) -> None:
    with page.expect_file_chooser() as chooser:
        page.click("#img-upload")
    chooser.value.set_files(str(bad))
    page.wait_for_function("() => document.querySelector('#status').innerText.includes('not an image')")
    page.get_by_text("not an image Pillow can read").first.wait_for()
    shot(page, "06_bad_upload_message")
    open_tab(page, "playground")
    before = img_src(page, "#pg-canvas img.fld")
    page.fill("#pg-tau input[type=number]", "2")
    page.press("#pg-tau input[type=number]", "Enter")
    wait_src_change(page, "#pg-canvas img.fld", before)  # still serving


def bad_checkpoint_upload(page, bad: Path) -> None:
    with page.expect_file_chooser() as chooser:
        page.click("#ckpt-upload")
    chooser.value.set_files(str(bad))
    page.wait_for_function("() => document.querySelector('#status').innerText.includes('truncated or corrupt')")
    assert page.input_value("#ckpt input") == "ssog_test.safetensors"  # the selection did not change


def session_save_and_restore(page, folder: Path) -> None:
    """Save the view, change it, restore the file: the playground comes back as it was."""
    open_tab(page, "session")
    page.click("#ses-save")
    link = page.wait_for_selector("#ses-file a[href]", state="attached")
    with page.expect_download() as download:
        link.click()
    path = folder / download.value.suggested_filename
    download.value.save_as(path)
    saved = json.loads(path.read_text())
    assert saved["format"] == "ssog-lab-session/1" and saved["playground"]["head"]["tau"] == 2.0
    open_tab(page, "playground")
    page.fill("#pg-tau input[type=number]", "3")
    page.press("#pg-tau input[type=number]", "Enter")
    page.wait_for_function("() => document.querySelector('#pg-canvas .info').innerText.length > 0")
    open_tab(page, "session")
    page.set_input_files("#ses-upload input[type=file]", str(path))
    page.wait_for_function("() => document.querySelector('#ses-status').innerText.includes('Session restored')")
    open_tab(page, "playground")
    assert page.input_value("#pg-tau input[type=number]") == "2"
    shot(page, "07_session_restored")


def canvas_info(page) -> str:
    return page.inner_text("#pg-canvas .inf")


def centre(box: dict) -> tuple[float, float]:
    return box["x"] + box["width"] / 2, box["y"] + box["height"] / 2


def on_canvas(page, selector: str, count: int) -> list[tuple[float, float, float, float]]:
    """The boxes of the first ``count`` matches of ``selector``, relative to the canvas's grid."""
    grid = page.locator("#pg-canvas .pg").bounding_box()
    boxes = [page.locator(selector).nth(i).bounding_box() for i in range(count)]
    return [(b["x"] - grid["x"], b["y"] - grid["y"], b["width"], b["height"]) for b in boxes]


def tau_keeps_the_query(page) -> None:
    """τ (and the mode) never move the ★ or the atoms; only the grid size may."""
    assert "★ query (11, 11)" in canvas_info(page)
    cell = page.locator("#pg-canvas .pg").bounding_box()["width"] / 24
    x, y = centre(page.locator("#pg-canvas .star").bounding_box())
    page.mouse.move(x, y)
    page.mouse.down()
    page.mouse.move(x - 5 * cell, y - 5 * cell, steps=8)
    page.mouse.up()
    page.wait_for_function("() => document.querySelector('#pg-canvas .inf').textContent.includes('★ query (6, 6)')")
    star, atoms = on_canvas(page, "#pg-canvas .star", 1), on_canvas(page, "#pg-canvas .atom", 3)
    before = img_src(page, "#pg-canvas img.fld")
    page.fill("#pg-tau input[type=number]", "1.5")
    page.press("#pg-tau input[type=number]", "Enter")
    wait_src_change(page, "#pg-canvas img.fld", before)
    page.wait_for_timeout(300)  # the value Python sends back has arrived with the image
    assert "★ query (6, 6)" in canvas_info(page), canvas_info(page)
    assert on_canvas(page, "#pg-canvas .star", 1) == star  # where on the canvas, wherever the page scrolled it
    assert on_canvas(page, "#pg-canvas .atom", 3) == atoms
    shot(page, "08_tau_keeps_query")


def lambda_labels_do_not_pile_up(page) -> None:
    """λ labels of clustered atoms stay readable (no two overlap)."""
    x, y = centre(page.locator("#pg-canvas .atom").nth(0).bounding_box())
    for k in (1, 2):
        page.mouse.dblclick(x + 14 * k, y + 6 * k)
        page.wait_for_function(f"() => document.querySelectorAll('#pg-canvas .atom').length === {3 + k}")
    page.wait_for_timeout(300)
    boxes = [page.locator("#pg-canvas .lam").nth(i).bounding_box() for i in range(5)]
    for i, a in enumerate(boxes):
        for b in boxes[i + 1 :]:
            overlap = min(a["x"] + a["width"], b["x"] + b["width"]) > max(a["x"], b["x"]) and min(
                a["y"] + a["height"], b["y"] + b["height"]
            ) > max(a["y"], b["y"])
            assert not overlap, f"λ labels overlap: {a} {b}"
    shot(page, "09_lambda_labels")


def plot_title(page, selector: str) -> str:
    el = page.query_selector(f"{selector} .gtitle")
    return el.text_content() if el else ""


def layer_controls_redraw(page) -> None:
    """A typed value, the keyboard and the mouse all redraw, and the figure names its layer."""
    page.wait_for_function("() => (document.querySelector('#geo-layer-plot .gtitle') || {}).textContent")
    assert plot_title(page, "#geo-layer-plot").startswith("Layer 0")
    page.fill("#geo-layer input[type=number]", "1")
    page.press("#geo-layer input[type=number]", "Enter")
    page.wait_for_function("() => document.querySelector('#geo-layer-plot .gtitle').textContent.startsWith('Layer 1')")
    page.focus("#geo-layer input[type=range]")
    page.keyboard.press("ArrowLeft")
    page.wait_for_function("() => document.querySelector('#geo-layer-plot .gtitle').textContent.startsWith('Layer 0')")
    assert page.input_value("#geo-layer input[type=number]") == "0"
    open_tab(page, "steering")
    page.wait_for_selector("#st-steer img[src]", state="attached")
    page.wait_for_function("() => document.querySelector('#st-note').innerText.includes('layer 0')")
    page.focus("#st-layer input[type=range]")
    page.keyboard.press("ArrowRight")
    page.wait_for_function("() => document.querySelector('#st-note').innerText.includes('layer 1')")
    page.fill("#st-layer input[type=number]", "0")
    page.press("#st-layer input[type=number]", "Enter")
    page.wait_for_function("() => document.querySelector('#st-note').innerText.includes('layer 0')")
    shot(page, "10_layer_controls")


def figure_downloads_are_named(page) -> None:
    """A figure's own download button saves a named PNG, not a generic image.webp."""
    for tab, figure in (("geometry", "#geo-figure"), ("steering", "#st-steer")):
        open_tab(page, tab)
        link = page.wait_for_selector(f"{figure} a[download]", state="attached")
        name = link.get_attribute("download")
        assert name.endswith(".png") and "ssog_test" in name, name


def session_with_an_uploaded_checkpoint(page, upstream: tuple[Path, Path], folder: Path) -> None:
    """An uploaded upstream checkpoint saves and restores, the image picker follows a
    restored session, and messages carry no emoji a font-less machine draws as an empty box."""
    page.click("#img-pick input")
    page.locator("[role=option]", has_text="gray.png").click()
    page.wait_for_function("() => document.querySelector('#status').innerText.includes('gray.png')")
    with page.expect_file_chooser() as chooser:
        page.click("#ckpt-upload")
    chooser.value.set_files([str(p) for p in upstream])
    page.wait_for_function("() => document.querySelector('#status').innerText.includes('ref_ssog_full')")
    status = page.inner_text("#status")
    assert not any(ord(c) >= 0x1F000 or c in "\u2705\ufe0f" for c in status), status
    assert page.input_value("#ckpt input") == "uploaded/ref_ssog_full.safetensors"
    open_tab(page, "session")
    page.click("#ses-save")
    page.wait_for_function("() => /saved|error/i.test(document.querySelector('#ses-status').innerText)")
    assert "Session saved" in page.inner_text("#ses-status"), page.inner_text("#ses-status")
    link = page.wait_for_selector("#ses-file a[href]", state="attached")
    with page.expect_download() as download:
        link.click()
    path = folder / download.value.suggested_filename
    download.value.save_as(path)
    saved = json.loads(path.read_text())
    assert saved["checkpoint"] == "uploaded/ref_ssog_full.safetensors" and saved["image"]["name"] == "gray.png"
    page.click("#img-pick input")
    page.locator("[role=option]", has_text="scene.png").click()
    page.wait_for_function("() => document.querySelector('#status').innerText.includes('scene.png')")
    page.click("#ckpt input")
    page.locator("[role=option]", has_text="ssog_test.safetensors").click()
    page.click("#ses-upload button[aria-label=Clear]")  # the file restored in the step before
    page.set_input_files("#ses-upload input[type=file]", str(path))
    page.wait_for_function("() => document.querySelector('#ses-status').innerText.includes('restored')")
    page.wait_for_timeout(300)
    assert page.input_value("#ckpt input") == "uploaded/ref_ssog_full.safetensors"
    assert page.input_value("#img-pick input") == "gray.png"
    shot(page, "11_session_uploaded_restored")


def atoms_move_from_the_keyboard(page) -> None:
    """An atom is a focusable button with a name; arrow keys move it a cell and Python gets the new head. The atom
    keeps the keyboard focus through every redraw, so a keyboard user presses one key after another and never has
    to focus it again (no ``focus()`` after the first), also when a redraw replaces its marker."""
    atom = page.locator("#pg-canvas .atom").nth(1)
    assert "atom 2" in atom.get_attribute("aria-label") and atom.get_attribute("tabindex") == "0"
    before = atom.bounding_box()
    readout = page.inner_text("#pg-readout")
    cell = page.locator("#pg-canvas .pg").bounding_box()["height"] / 24
    acked = "n => window.ssogCanvasStats.release.length > n"  # Python answered the key's release: a redraw
    focused = "() => document.activeElement.matches('#pg-canvas .atom[data-i=\"1\"]')"
    atom.focus()
    for rows in (1, 2, 3):
        releases = page.evaluate("() => window.ssogCanvasStats.release.length")
        page.keyboard.press("ArrowDown")
        page.wait_for_function(acked, arg=releases)
        page.wait_for_timeout(200)  # the answer's redraw is done
        assert page.evaluate(focused), page.evaluate("() => document.activeElement.outerHTML.slice(0, 80)")
        after = page.locator("#pg-canvas .atom").nth(1).bounding_box()
        assert abs(after["y"] - before["y"] - rows * cell) < 1.5 and after["x"] == before["x"], rows
    # a redraw that replaces the marker, as Gradio replaces a node whose place in the template changed
    page.evaluate("() => { const a = document.querySelector('#pg-canvas .atom[data-i=\"1\"]');"
                  " a.replaceWith(a.cloneNode(true)); }")  # fmt: skip
    page.wait_for_function(focused)
    for _ in range(3):  # back where it was, for the steps that follow: three keys in a row, no wait between
        page.keyboard.press("ArrowUp")
    page.wait_for_function("old => document.querySelector('#pg-readout').innerText === old", arg=readout)
    assert page.evaluate(focused)


def phone_width(page) -> None:
    """At 390 px the canvas fits the viewport (it was a fixed 440 px, cut off)."""
    page.set_viewport_size({"width": 390, "height": 844})
    try:
        open_tab(page, "playground")
        page.wait_for_timeout(500)
        box = page.locator("#pg-canvas .pg").bounding_box()
        assert box["x"] >= 0 and box["x"] + box["width"] <= 390, box
        ky = page.locator("#pg-canvas .ky").bounding_box()
        assert ky["x"] + ky["width"] <= 390 and abs(ky["height"] - box["height"]) < 2, ky
        page.locator("#pg-kernels").hover()  # the toolbar shows on hover
        title, bar = (page.locator(f"#pg-kernels {c}").first.bounding_box() for c in (".gtitle", ".modebar"))
        assert bar is None or title["y"] >= bar["y"] + bar["height"] - 1 or title["x"] + title["width"] <= bar["x"]
        xt = [page.locator(f"#pg-kernels .{a}title").bounding_box() for a in ("x", "x2")]
        assert xt[0]["x"] + xt[0]["width"] <= xt[1]["x"], xt  # the two x-axis titles do not collide
        st = [page.locator("#pg-kernels .annotation-text").nth(i).bounding_box() for i in (0, 1)]
        assert st[0]["x"] + st[0]["width"] <= st[1]["x"], st  # nor the two subplot titles
        shot(page, "12_phone")
    finally:
        page.set_viewport_size({"width": 1400, "height": 1000})
    phone = page.context.browser.new_page(viewport={"width": 390, "height": 844})
    phone.set_default_timeout(60_000)
    try:  # a page opened on a phone draws the export maps one layer at a time, in two columns
        phone.goto(page.url)
        phone.wait_for_selector("#pg-canvas .atom")
        phone.click("button[aria-label='More tabs']")  # at this width the tabs are in Gradio's overflow menu
        phone.locator(".overflow-dropdown button", has_text="Export maps").click()
        phone.wait_for_selector("#ex-figure img[src]", state="attached")
        assert phone.is_checked("#ex-layout input[value=narrow]")
        phone.wait_for_function("() => { const i = document.querySelector('#ex-figure img');"
                                " return i.src.includes('_narrow') && i.complete && i.naturalWidth > 0; }")  # fmt: skip
        w, h = phone.evaluate("() => { const i = document.querySelector('#ex-figure img');"
                              " return [i.naturalWidth, i.naturalHeight]; }")  # fmt: skip
        assert h > w
        shot(phone, "15_phone_export")
        phone_geometry(phone)
    finally:
        phone.close()


def overlaps(a: dict, b: dict) -> bool:
    return a["x"] < b["x"] + b["width"] and b["x"] < a["x"] + a["width"] and \
        a["y"] < b["y"] + b["height"] and b["y"] < a["y"] + a["height"]  # fmt: skip


def boxes(page, selector: str) -> list[dict]:
    return [page.locator(selector).nth(i).bounding_box() for i in range(page.locator(selector).count())]


def phone_geometry(phone) -> None:
    """At 390 px the geometry tab fits the page: the atom table scrolls sideways inside its frame to its last
    column, and no plot's titles or colour bars run into each other or into a panel (each did before)."""
    phone.click("button[aria-label='More tabs']")
    phone.locator(".overflow-dropdown button", has_text="Checkpoint geometry").click()
    phone.wait_for_selector("#geo-atoms table tbody tr", state="attached")
    phone.wait_for_selector("#geo-stats .colorbar")
    assert phone.evaluate("() => document.documentElement.scrollWidth") <= 390
    viewport = "#geo-atoms .virtual-table-viewport"
    phone.locator(viewport).evaluate("e => { e.scrollLeft = e.scrollWidth; }")
    phone.wait_for_timeout(300)
    frame = phone.locator(viewport).bounding_box()
    last = phone.locator("#geo-atoms thead th").last.bounding_box()
    assert frame["x"] <= last["x"] and last["x"] + last["width"] <= frame["x"] + frame["width"] + 1, (last, frame)
    for plot in ("#geo-layer-plot", "#geo-stats"):
        titles = boxes(phone, f"{plot} .annotation-text")
        assert len(titles) >= 2 and not any(overlaps(a, b) for a, b in itertools.pairwise(titles)), (plot, titles)
    bars, panels = boxes(phone, "#geo-stats .colorbar"), boxes(phone, "#geo-stats .nsewdrag")
    assert len(bars) == len(panels) == 2 and not any(overlaps(c, p) for c in bars for p in panels), (bars, panels)
    shot(phone, "16_phone_geometry")


def geometry_click_opens_the_head(page, ckpt_dir: Path) -> None:
    """Linked views: a click on a head's panel in the geometry grid opens that head in the playground."""
    open_tab(page, "geometry")
    page.wait_for_selector("#geo-figure img[src]", state="attached")
    ctx = AppContext(ckpt_dir, ckpt_dir)
    _, boxes = geometry.geometry_png(ctx, ctx.model("ssog_test.safetensors"))
    x0, y0, x1, y1 = boxes[1 * 2 + 1]  # head rows × layer columns: head 1 of layer 1
    page.evaluate("f => { const b = document.querySelector('#geo-figure img').getBoundingClientRect();"
                  " window.scrollBy(0, b.y + f * b.height - 400); }", (y0 + y1) / 2)  # fmt: skip
    x, y, w, h, nw, nh = page.evaluate(
        "() => { const i = document.querySelector('#geo-figure img'), b = i.getBoundingClientRect();"
        " return [b.x, b.y, b.width, b.height, i.naturalWidth, i.naturalHeight]; }"
    )
    scale = min(w / nw, h / nh)  # the picture is drawn contained in its box
    left, top = x + (w - nw * scale) / 2, y + (h - nh * scale) / 2
    page.mouse.click(left + (x0 + x1) / 2 * nw * scale, top + (y0 + y1) / 2 * nh * scale)
    page.wait_for_function("() => document.querySelector('#pg-preset-note').innerText.includes('layer 1, head 1')")
    assert page.get_attribute("#tab-playground-button", "aria-selected") == "true"
    page.wait_for_function("() => document.querySelector('#pg-canvas .inf').textContent.includes('★ query (3, 3)')")
    shot(page, "13_geometry_click_playground")


def a_trained_head_opens_zoomed_to_its_atoms(page) -> None:
    """A head opened from a model is shown zoomed to the ★ and its atoms (trained atoms pile up near the ★); a
    dragged atom follows the pointer in the zoomed window, and unticking the zoom shows the whole grid."""
    assert page.is_checked("#pg-zoom input")
    view = page.get_attribute("#pg-canvas .pg", "data-view").split(",")
    assert float(view[2]) < 8 or float(view[3]) < 8, view  # a window of the 8×8 grid
    assert "zoomed: rows" in page.inner_text("#pg-canvas .info")
    x, y = centre(page.locator("#pg-canvas .atom").nth(0).bounding_box())
    box = page.locator("#pg-canvas .pg").bounding_box()
    tx, ty = box["x"] + box["width"] * 0.3, box["y"] + box["height"] * 0.7
    page.mouse.move(x, y)
    page.mouse.down()
    page.mouse.move(tx, ty, steps=8)
    page.wait_for_timeout(300)
    ax, ay = centre(page.locator("#pg-canvas .atom").nth(0).bounding_box())
    cell = box["width"] / float(view[3])
    assert abs(ax - tx) < 0.1 * cell + 2 and abs(ay - ty) < 0.1 * cell + 2, (ax, ay, tx, ty)  # 0.1-cell steps
    page.mouse.up()
    page.wait_for_function("() => /release → update/.test(document.querySelector('#pg-canvas .lat').textContent)")
    page.wait_for_timeout(300)
    shot(page, "14_playground_zoomed")
    rows, cols = (float(v) for v in page.get_attribute("#pg-canvas .pg", "data-view").split(",")[2:4])
    box = page.locator("#pg-canvas .pg").bounding_box()
    assert abs(box["height"] / box["width"] - rows / cols) < 0.02  # the canvas has the window's shape
    page.uncheck("#pg-zoom input")
    page.wait_for_function("() => !document.querySelector('#pg-canvas .info').innerText.includes('zoomed')")
    assert page.get_attribute("#pg-canvas .pg", "data-view").split(",")[2:4] == ["8", "8"]
    box = page.locator("#pg-canvas .pg").bounding_box()
    assert abs(box["height"] - box["width"]) < 2


@pytest.fixture(scope="module")
def deep_server(tmp_path_factory):
    """A checkpoint deeper than the layer sliders' initial maximum of 1, so a restored layer 3 needs a new range."""
    root = tmp_path_factory.mktemp("e2e-deep")
    write_checkpoints(root / "ckpt", depth=4)
    images = write_images(root / "assets")
    env = {"GRADIO_TEMP_DIR": str(root / "g")}
    with AppProcess(root / "ckpt", root / "assets", root / "app.log", env=env, startup_timeout=STARTUP) as app:
        yield {"url": app.url, "images": images, "log": root / "app.log", "root": root}


def test_a_session_restored_on_a_fresh_page(deep_server):
    """Upload a picture; Export maps at α 0.8, layer 3; save the session; reload the page; restore it; open Export:
    no "greater than maximum" refusal, the panels render, and the atom sliders show the restored atom."""
    with browser_page(deep_server["log"], "failure_fresh_page", 90_000) as page:
        page.goto(deep_server["url"])
        page.wait_for_selector("#pg-canvas .atom")
        page.click("#pg-preset input")
        page.locator("[role=option]").first.click()  # a trained head: its atoms are not the defaults
        page.wait_for_function("() => document.querySelector('#pg-preset-note').innerText.includes('head')")
        label = page.get_attribute("#pg-canvas .atom", "aria-label")
        assert "row" in label and not re.search(r"\.\d{3}", label), label  # rounded for a screen reader
        big = deep_server["root"] / ("a_photo_with_a_long_descriptive_name_" * 3 + "12000x12000.png")
        big.write_bytes(bomb_png(12000, 12000))
        with page.expect_file_chooser() as chooser:
            page.click("#img-upload")
        chooser.value.set_files(str(big))  # refused by its size with the app's own message, wrapped in view
        page.wait_for_function("() => document.querySelector('#status').innerText.includes('over the 25 MP')")
        assert "12000×12000 = 144 MP" in page.inner_text("#status")
        assert page.evaluate("() => { const s = document.querySelector('#status'); "
                             "return s.scrollWidth <= s.clientWidth + 1; }")  # fmt: skip
        with page.expect_file_chooser() as chooser:
            page.click("#img-upload")
        chooser.value.set_files(str(deep_server["images"]["rgba"]))
        page.wait_for_function("() => document.querySelector('#status').innerText.includes('rgba.png')")
        open_tab(page, "export")
        page.wait_for_selector("#ex-figure img[src]", state="attached")
        for slider, value, drawn in (("#ex-alpha", "0.8", "alpha0.80"), ("#ex-layer", "3", "_L3_")):
            page.fill(f"{slider} input[type=number]", value)
            page.press(f"{slider} input[type=number]", "Enter")
            page.wait_for_function("s => document.querySelector('#ex-figure img').src.includes(s)", arg=drawn)
        open_tab(page, "session")
        page.click("#ses-save")
        link = page.wait_for_selector("#ses-file a[href]", state="attached")
        with page.expect_download() as download:
            link.click()
        path = deep_server["root"] / download.value.suggested_filename
        download.value.save_as(path)
        saved = json.loads(path.read_text())
        assert saved["export"]["layer"] == 3 and saved["export"]["alpha"] == 0.8
        atom = saved["playground"]["head"]["atoms"][saved["playground"]["selected_atom"]]

        page.reload()
        page.wait_for_selector("#pg-canvas .atom")
        open_tab(page, "session")
        page.set_input_files("#ses-upload input[type=file]", str(path))
        page.wait_for_function("() => document.querySelector('#ses-status').innerText.includes('restored')")
        assert "rgba.png" in page.inner_text("#status")  # the status line names the restored picture
        open_tab(page, "export")
        page.wait_for_function("() => (document.querySelector('#ex-figure img') || {}).src?.includes('_L3_')")
        assert page.input_value("#ex-layer input[type=number]") == "3"
        assert page.get_by_text("greater than maximum").count() == 0
        assert "⚠" not in page.inner_text("#ex-summary")
        open_tab(page, "playground")
        for slider, key in (("#pg-sy", "sy"), ("#pg-sx", "sx"), ("#pg-w", "w")):
            assert float(page.input_value(f"{slider} input[type=number]")) == round(atom[key], 3), slider
        shot(page, "14_session_restored_fresh_page")
