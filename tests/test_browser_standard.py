"""A standard ViT in a real browser: a transformers folder in the checkpoint folder is picked by its label, its
heads are measured as fields in the Checkpoint-geometry tab (both figures, both charts, the table), a fitted head
opens in the playground from a click on its panel, its export maps name the class token's share, and it is distilled
into SSOG (the report beside its fields, the student in the picker, Compare with its teacher).

Same Chromium, flags and server as :mod:`tests.test_browser`."""

from __future__ import annotations

import re

import pytest
import torch

from app.state import AppContext
from app.tabs import geometry
from ssog_core.interventions import heavy
from ssog_core.testing.app_process import AppProcess
from tests.app_fixtures import write_images
from tests.test_browser import STARTUP, browser_page, img_src, open_tab, shot, wait_src_change

transformers = pytest.importorskip("transformers")
playwright = pytest.importorskip("playwright.sync_api")
pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(1500)]

IMAGES, ATOMS = 4, 2  # the four bundled pictures write_images makes; two atoms per head


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from tests.test_app_standard_vit import MEAN, STD, _hf_model

    root = tmp_path_factory.mktemp("e2e_standard")
    _hf_model().save_pretrained(root / "ckpt" / "hf_vit")
    transformers.ViTImageProcessor(image_mean=MEAN, image_std=STD).save_pretrained(root / "ckpt" / "hf_vit")
    write_images(root / "assets")
    env = {"GRADIO_TEMP_DIR": str(root / "gradio")}
    with AppProcess(root / "ckpt", root / "assets", root / "app.log", env=env, startup_timeout=STARTUP) as app:
        yield {"url": app.url, "log": root / "app.log", "ckpt": root / "ckpt", "assets": root / "assets"}


def fit_panel_boxes(server) -> list[tuple[float, float, float, float]]:
    """Where each head's panel sits in the fits' figure, drawn here from the same measurement the server makes."""
    ctx = AppContext(server["ckpt"], server["assets"])
    loaded = ctx.model("hf_vit")
    with torch.no_grad():
        stats = heavy.head_fields((loaded.model, loaded.meta), IMAGES, ctx.assets_dir, ATOMS, lambda *_: None,
                                  lambda: False)  # fmt: skip
    return geometry.field_pngs(ctx, loaded, stats, IMAGES, ATOMS)["fit"][1]


def test_a_standard_vit_in_the_browser(server):
    with browser_page(server["log"], "standard_failure", 120_000) as page:
        page.goto(server["url"])
        page.click("#ckpt input")
        option = page.locator("[role=option]", has_text="hf_vit")
        assert "transformers folder: vit, 2 layers × 3 heads, 1 prefix token" in option.inner_text()
        option.click()
        assert page.input_value("#ckpt input").startswith("hf_vit")

        open_tab(page, "geometry")  # what a model without a field shows, then every head as a field
        page.wait_for_function("() => document.querySelector('#geo-note').innerText.includes('no field, atoms')")
        page.fill("#geo-field-images input[type=number]", str(IMAGES))
        page.press("#geo-field-images input[type=number]", "Enter")
        page.fill("#geo-field-atoms input[type=number]", str(ATOMS))
        page.press("#geo-field-atoms input[type=number]", "Enter")
        page.click("#geo-field-measure")
        page.wait_for_selector("#geo-fit-figure img[src]", state="attached")
        page.wait_for_selector("#geo-field-figure img[src]", state="attached")
        for chart in ("#geo-field-distance", "#geo-field-share"):
            page.wait_for_selector(f"{chart} .js-plotly-plot", state="attached")
        note = page.inner_text("#geo-field-note")
        assert f"every head measured on {IMAGES} bundled picture(s)" in note and "prefix token" in note, note
        text = page.inner_text("#geo-field-table")
        assert "mean distance (px)" in text and len(re.findall(r"^[01]\s+[012]\s+\d", text, re.M)) == 6, text
        shot(page, "standard_01_head_fields")

        x0, y0, x1, y1 = fit_panel_boxes(server)[2 * 2 + 1]  # head rows × layer columns: head 2 of layer 1
        page.locator("#geo-fit-figure img").scroll_into_view_if_needed()
        x, y, w, h, nw, nh = page.evaluate(
            "() => { const i = document.querySelector('#geo-fit-figure img'), b = i.getBoundingClientRect();"
            " return [b.x, b.y, b.width, b.height, i.naturalWidth, i.naturalHeight]; }"
        )
        scale = min(w / nw, h / nh)  # the picture is drawn contained in its box
        left, top = x + (w - nw * scale) / 2, y + (h - nh * scale) / 2
        page.mouse.click(left + (x0 + x1) / 2 * nw * scale, top + (y0 + y1) / 2 * nh * scale)
        opened = "Layer 1, head 2 of hf_vit as 2 fitted atoms"
        page.wait_for_function(f"() => document.querySelector('#pg-preset-note').innerText.includes('{opened}')")
        assert page.get_attribute("#tab-playground-button", "aria-selected") == "true"
        assert page.locator("#pg-canvas .atom").count() == ATOMS
        shot(page, "standard_02_fit_in_playground")

        open_tab(page, "export")
        page.wait_for_selector("#ex-figure img[src]", state="attached")
        before = img_src(page, "#ex-figure img")
        page.wait_for_function(
            "() => document.querySelector('#ex-summary').innerText.includes('prefix tokens (class, distillation')"
        )
        text = page.inner_text("#ex-summary")
        assert "hf_vit" in text and "net exporters" in text, text
        page.fill("#ex-alpha input[type=number]", "0.3")
        page.press("#ex-alpha input[type=number]", "Enter")
        wait_src_change(page, "#ex-figure img", before)
        shot(page, "standard_03_export")

        open_tab(page, "geometry")  # distilled into SSOG: trains on 2 pictures, holds the other 2 out
        page.fill("#geo-field-images input[type=number]", "2")
        page.press("#geo-field-images input[type=number]", "Enter")
        page.fill("#geo-distill-steps input[type=number]", "3")
        page.press("#geo-distill-steps input[type=number]", "Enter")
        page.click("#geo-distill")
        page.wait_for_selector("#geo-distill-figure img[src]", state="attached")
        note = page.inner_text("#geo-distill-note")
        assert "Wrote hf_vit_distilled.safetensors into the checkpoint folder" in note and "2 held-out" in note, note
        assert len(re.findall(r"^[01]\s+[012]\s+\d", page.inner_text("#geo-distill-table"), re.M)) == 6
        shot(page, "standard_04_distilled")
        page.click("#geo-distill-compare")
        page.wait_for_selector("#cmp-figure img[src]", state="attached")
        assert page.get_attribute("#tab-compare-button", "aria-selected") == "true"
        assert (
            page.input_value("#cmp-a input").startswith("hf_vit_distilled")
            and page.input_value("#cmp-b input") == "hf_vit"
        )
        page.click("#ckpt input")
        assert page.locator("[role=option]", has_text="hf_vit_distilled.safetensors").count() == 1
