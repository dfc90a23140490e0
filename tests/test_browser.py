"""End to end in a real browser: Playwright driving Debian's Chromium (headless, offline) against ``python -m app``.

One app server (a subprocess on a free port) and one browser for the whole tour, which is a single test so that
pytest-xdist cannot split it over workers. Screenshots of every step go to ``artifacts/`` (kept by CI).
"""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import urlparse

import pytest

from app.process import AppProcess
from tests.app_fixtures import write_bad_files, write_checkpoints, write_images

playwright = pytest.importorskip("playwright.sync_api")

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]  # fmt: skip
ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "artifacts"
pytestmark = [
    pytest.mark.browser,
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
    env = {"GRADIO_TEMP_DIR": str(root / "gradio")}
    with AppProcess(root / "ckpt", root / "assets", root / "app.log", env=env) as app:
        yield {"url": app.url, "images": images, "bad": bad, "bad_ckpt": bad_ckpt, "log": root / "app.log"}


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


def open_tab(page, tab: str) -> None:
    page.click(f"#tab-{tab}-button")


def test_browser_tour(server):
    requests: list[str] = []
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.on("request", lambda r: requests.append(r.url))
        page.set_default_timeout(60_000)
        try:
            page.goto(server["url"])
            page.wait_for_selector("#pg-canvas .atom")
            page.wait_for_function("() => document.querySelector('#pg-canvas img.fld').src.startsWith('data:')")
            drag_an_atom(page)
            switch_a_preset(page)
            geometry_tab(page)
            export_tab_upload(page, server["images"]["rgba"])
            steering_tab_click(page)
            bad_upload_keeps_serving(page, server["bad"]["text"])
            bad_checkpoint_upload(page, server["bad_ckpt"])
            session_save_and_restore(page, server["log"].parent)
        except Exception:
            shot(page, "failure")
            print(server["log"].read_text()[-4000:])
            raise
        finally:
            browser.close()
    foreign = [u for u in requests if urlparse(u).scheme in ("http", "https", "ws", "wss")
               and urlparse(u).hostname not in ("127.0.0.1", "localhost")]  # fmt: skip
    assert not foreign, f"the page reached outside this machine: {foreign[:5]}"


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
    page.wait_for_selector("#st-click img[src]", state="attached")
    page.wait_for_selector("#st-steer img[src]", state="attached")
    assert not page.query_selector("#st-qfig img[src]")
    box = page.locator("#st-click img").bounding_box()
    page.mouse.click(box["x"] + box["width"] * 0.8, box["y"] + box["height"] * 0.3)  # patch (2, 6) of 8×8
    page.wait_for_selector("#st-qfig img[src]", state="attached")
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
