"""The Target share tab in a real browser (Playwright driving Debian's Chromium, offline) against ``python -m app``
serving a small ``pointer`` model that steers μ: one validation image drawn with its discs outlined and its shares
in words, then the mean over 20 validation images per layer, the numbers the core gives."""

from __future__ import annotations

from pathlib import Path

import pytest

from ssog_core import save_checkpoint
from ssog_core.interventions.target_share import image_target_share, target_share_report
from ssog_core.testing.app_process import AppProcess
from tests.app_fixtures import write_images
from tests.test_browser import CHROMIUM, STARTUP, browser_page, img_src, shot, wait_src_change
from tests.test_target_share import META, model_of

playwright = pytest.importorskip("playwright.sync_api")

NAME = "pointer_mu.safetensors"
pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,
    pytest.mark.timeout(1500),
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Debian's chromium is not installed"),
]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("target-share-e2e")
    model = model_of("ssog", ("mu",), seed=3)
    (root / "ckpt").mkdir()
    save_checkpoint(root / "ckpt" / NAME, model, META)
    write_images(root / "assets")
    env = {"GRADIO_TEMP_DIR": str(root / "gradio")}
    log = root / "app.log"
    with AppProcess(root / "ckpt", root / "assets", log, env=env, startup_timeout=STARTUP) as app:
        yield {"url": app.url, "log": log, "model": model}


def text(page, selector: str) -> str:
    return page.inner_text(selector).replace("*", "")


def test_the_target_share_tab_shows_one_image_and_the_mean_per_layer(server):
    model = server["model"]
    with browser_page(server["log"], "target_share_failure", 120_000) as page:
        page.goto(server["url"])
        page.wait_for_selector("#pg-canvas .atom")
        page.click("button[aria-label='More tabs']")  # the last tab: at 1400 px in Gradio's overflow menu
        page.locator(".overflow-dropdown button", has_text="Target share").click()
        page.wait_for_function("() => document.querySelector('#ts-note').innerText.includes('validation image')")
        page.wait_for_selector("#ts-figure img")
        one = image_target_share(model, META, 0)
        assert ", ".join(f"{s:.2f}" for s in one.shares) in text(page, "#ts-note")
        assert ", ".join(f"{s:.2f}" for s in one.closed_mu) in text(page, "#ts-note")

        before = img_src(page, "#ts-figure img")
        page.fill("#ts-index input", "4")
        page.press("#ts-index input", "Enter")
        wait_src_change(page, "#ts-figure img", before)
        page.wait_for_function("() => document.querySelector('#ts-note').innerText.includes('validation image 4')")
        four = image_target_share(model, META, 4)
        assert ", ".join(f"{s:.2f}" for s in four.shares) in text(page, "#ts-note")
        shot(page, "target_share_01_image")

        page.fill("#ts-n input[type=number]", "20")
        page.press("#ts-n input[type=number]", "Enter")
        page.click("#ts-read")
        page.wait_for_function("() => document.querySelector('#ts-table') && "
                               "document.querySelector('#ts-table').innerText.includes('layer 1')")  # fmt: skip
        report = target_share_report(model, META, 20)
        table = page.inner_text("#ts-table")
        for layer, closed, change in zip(report["layers"], report["closed_mu"]["layers"], report["closed_mu"]["change"],
                                         strict=True):  # fmt: skip
            assert f"{layer['share']:.3f} [{layer['ci95'][0]:.3f}, {layer['ci95'][1]:.3f}]" in table
            assert f"{closed['share']:.3f} [" in table and f"{change['change']:+.3f} [" in table
        assert "first 20 validation images" in text(page, "#ts-mean-note")
        page.wait_for_selector("#ts-plot .js-plotly-plot")
        shot(page, "target_share_02_mean")
