"""The app as a user first meets it: the bundled checkpoints, the converged +μδ pointer model open first, its
matched twins one pick away, and every instrument on it in a real browser (Playwright driving Debian's Chromium,
offline), validation work at 50 images."""

from __future__ import annotations

from pathlib import Path

import pytest

from ssog_core.testing.app_process import AppProcess
from tests.test_browser import (
    CHROMIUM,
    STARTUP,
    browser_page,
    click_image_until,
    img_src,
    open_tab,
    shot,
    wait_src_change,
)

playwright = pytest.importorskip("playwright.sync_api")

ROOT = Path(__file__).resolve().parents[1]
POINTER = "matched_ssog_mu_pointer14.safetensors"  # the first screen: converged, its accuracy rests on its steering
FIXED = "matched_ssog_fixed_pointer14.safetensors"  # its matched twin without steering, one pick away
MODELS = [ROOT / "checkpoints" / f"matched_{k}_pointer14.safetensors" for k in ("ssog_mu", "ssog", "ssog_fixed", "dot")]
pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,
    pytest.mark.timeout(1500),
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Debian's chromium is not installed"),
    pytest.mark.skipif(not all(p.is_file() for p in MODELS), reason="the bundled pointer models are not here"),
]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("bundled")
    env = {"GRADIO_TEMP_DIR": str(root / "gradio")}
    log = root / "app.log"
    with AppProcess(ROOT / "checkpoints", ROOT / "assets", log, env=env, startup_timeout=STARTUP) as app:
        yield {"url": app.url, "log": log}


def test_the_converged_pointer_models_in_the_browser(server):
    with browser_page(server["log"], "bundled_failure", 120_000) as page:
        page.goto(server["url"])
        page.wait_for_selector("#pg-canvas .atom")
        opens_on_the_pointer_model(page)
        a_trained_head_as_preset(page)
        training_history(page)
        geometry_with_gates(page)
        steering_at_a_patch(page)
        export_maps_with_the_blank_control(page)
        an_edit_on_the_picture_and_on_50_validation_images(page)
        the_transfer_curve_the_bundle_stored(page)
        the_twin_without_steering_one_pick_away(page)


def opens_on_the_pointer_model(page) -> None:
    """The first model is the converged +μδ pointer model, its label saying it solved its task, shown on a picture of
    its own data set."""
    shown = page.input_value("#ckpt input")  # the picker shows the file's name with its note
    assert shown.startswith(f"{POINTER} (") and "solved" in shown, shown
    assert page.input_value("#img-pick input").startswith("pointer_val")
    page.wait_for_function(f"() => document.querySelector('#pg-preset-note').innerText.includes('{POINTER}')")
    shot(page, "bundled_01_open")


def a_trained_head_as_preset(page) -> None:
    """Presets are the model's own heads; picking one redraws the field with its atoms."""
    page.click("#pg-preset input")
    options = page.locator("[role=option]")
    assert options.count() >= 1
    before = img_src(page, "#pg-canvas img.fld")
    options.first.click()
    wait_src_change(page, "#pg-canvas img.fld", before)
    note = page.inner_text("#pg-preset-note")
    assert "layer" in note and "head" in note
    assert page.locator("#pg-canvas .atom").count() == 4  # the trained head's four atoms


def training_history(page) -> None:
    """The history the checkpoint carries: gate scales from their cold start, accuracy per epoch, snapshots."""
    open_tab(page, "training")
    page.wait_for_selector("#train-gates .js-plotly-plot", state="attached")
    page.wait_for_selector("#train-acc .js-plotly-plot", state="attached")
    page.wait_for_selector("#train-grid img[src]", state="attached")
    assert "snapshot" in page.inner_text("#train-note").lower()
    shot(page, "bundled_02_training")


def geometry_with_gates(page) -> None:
    open_tab(page, "geometry")
    page.wait_for_selector("#geo-figure img[src]", state="attached")
    page.wait_for_selector("#geo-gates .js-plotly-plot", state="attached")
    assert "4 layers × 4 heads × 4 atoms" in page.inner_text("#geo-note")
    shot(page, "bundled_03_geometry")


def steering_at_a_patch(page) -> None:
    """A click on the 56×56 picture picks a patch of the 14×14 grid."""
    open_tab(page, "steering")
    page.wait_for_selector("#st-click img[src]", state="attached")
    click_image_until(page, "#st-click img", 0.536, 0.25, "#st-qfig img[src]")  # patch (3, 7) of 14×14
    page.wait_for_function("() => document.querySelector('#st-query').innerText.includes('query patch (3, 7)')")
    assert "%" in page.inner_text("#st-pred")
    shot(page, "bundled_04_steering")


def export_maps_with_the_blank_control(page) -> None:
    """Export maps beside the dot twin, then the blank control with its noise floor."""
    open_tab(page, "export")
    page.wait_for_selector("#ex-figure img[src]", state="attached")
    assert "matched_dot_pointer14" in page.inner_text("#ex-summary")
    page.click("#ex-control input")
    page.locator("[role=option]", has_text="blank").first.click()
    page.wait_for_selector("#ex-control-figure img[src]", state="attached")
    page.wait_for_function("() => /noise/.test(document.querySelector('#ex-summary').innerText)")
    shot(page, "bundled_05_export_control")


def pick_op(page, op: str, shown: tuple[str, ...], hidden: tuple[str, ...]) -> None:
    """Choose ``op``; the form then shows its fields only."""
    page.click("#iv-op input")
    page.locator("[role=option]", has_text=op).first.click()
    for name in shown:
        page.wait_for_selector(f"#iv-{name}", state="visible")
    for name in hidden:
        page.wait_for_selector(f"#iv-{name}", state="hidden")


def an_edit_on_the_picture_and_on_50_validation_images(page) -> None:
    """The form follows the op (ablate_head: layer, head, mode; close_gate: layer, tap, head). Close layer 0's
    gates: the picture's prediction edited, then the accuracy change on 50 validation images with its interval."""
    open_tab(page, "intervene")
    # as a person does: the tab has shown its model before an op is picked (its answer keeps a later pick:
    # tests/test_app_intervene.py), so the open list is not redrawn under the click
    page.wait_for_function("() => document.querySelector('#iv-note').innerText.includes('matched_ssog_mu_pointer14')")
    pick_op(page, "ablate_head", ("layer", "head", "mode"), ("tap", "factor", "source", "what", "atom", "dy", "dx"))
    pick_op(page, "close_gate", ("layer", "tap", "head"), ("mode", "factor", "source", "what", "atom", "dy", "dx"))
    page.click("#iv-add")
    page.wait_for_function("() => document.querySelector('#iv-list').innerText.includes('gates closed')")
    page.click("#iv-apply")
    page.wait_for_function("() => document.querySelector('#iv-pred').innerText.includes('Edited prediction')")
    page.fill("#iv-n input[type=number]", "50")
    page.press("#iv-n input[type=number]", "Enter")
    page.click("#iv-eval")
    page.wait_for_function("() => /95% interval/.test(document.querySelector('#iv-val').innerText)")
    assert "first 50 validation images" in page.inner_text("#iv-val").replace("*", "")
    shot(page, "bundled_06_intervene")


def the_transfer_curve_the_bundle_stored(page) -> None:
    """The scaling tab draws the zero-shot transfer curve ``ablation.py bundle`` wrote into the file."""
    open_tab(page, "scaling")
    page.wait_for_function(
        "() => document.querySelector('#sc-transfer-note').innerText.includes('Zero-shot resolution transfer')"
    )
    page.wait_for_selector("#sc-transfer .js-plotly-plot", state="attached")
    assert POINTER in page.inner_text("#sc-transfer-note")
    shot(page, "bundled_07_transfer")


def the_twin_without_steering_one_pick_away(page) -> None:
    """The fixed-field model of the same recipe is one pick in the checkpoint picker, its label saying it solved the
    task too."""
    page.click("#ckpt input")
    option = page.locator("[role=option]", has_text=FIXED)
    assert "fixed field" in option.inner_text() and "solved" in option.inner_text()
    option.click()
    page.wait_for_function(f"() => document.querySelector('#sc-transfer-note').innerText.includes('{FIXED}')")
    assert page.input_value("#ckpt input").startswith(FIXED)
