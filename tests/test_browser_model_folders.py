"""Model folders reaching the app in a real browser: a hub name typed beside the picker (opened from a Hugging Face
cache laid out as huggingface_hub lays it out, the offline sentence when it is not there), a zipped folder through
the upload button, and the Intervene tab's image count sized to the bundled pictures for such a model.

Same Chromium, flags and server as :mod:`tests.test_browser`."""

from __future__ import annotations

import pytest

from ssog_core.testing.app_process import AppProcess
from tests.app_fixtures import write_images
from tests.test_app_model_folders import hub_cache, timm_folder, zipped
from tests.test_browser import STARTUP, browser_page, open_tab

playwright = pytest.importorskip("playwright.sync_api")
pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("e2e_folders")
    (root / "ckpt").mkdir()
    write_images(root / "assets")
    hub_cache(root / "hub", "lab-org/tiny-vit", timm_folder(root / "hub_src", seed=9))
    archive = zipped(timm_folder(root / "my vit", seed=3), root / "my vit.zip", "my vit/")
    env = {"GRADIO_TEMP_DIR": str(root / "gradio"), "HF_HUB_CACHE": str(root / "hub")}
    with AppProcess(root / "ckpt", root / "assets", root / "app.log", env=env, startup_timeout=STARTUP) as app:
        yield {"url": app.url, "log": root / "app.log", "zip": archive}


def _status_has(page, text: str) -> None:
    page.wait_for_function("t => document.querySelector('#status').innerText.includes(t)", arg=text)


def test_a_hub_name_and_a_zipped_folder_open_in_the_browser(server):
    with browser_page(server["log"], "folders_failure", 120_000) as page:
        page.goto(server["url"])
        box = page.locator("#ckpt-hub input, #ckpt-hub textarea").first
        box.fill("lab-org/nope")
        box.press("Enter")
        _status_has(page, "hf-hub:lab-org/nope is not in the local Hugging Face cache")
        assert "hf download lab-org/nope" in page.inner_text("#status")
        box.fill("lab-org/tiny-vit")
        box.press("Enter")
        _status_has(page, "Opened hf-hub:lab-org/tiny-vit from the local Hugging Face cache")
        assert page.input_value("#ckpt input").startswith("hf-hub:lab-org/tiny-vit")

        with page.expect_file_chooser() as chooser:
            page.click("#ckpt-upload")
        chooser.value.set_files([str(server["zip"])])
        _status_has(page, "Loaded uploaded/my_vit")
        assert page.input_value("#ckpt input").startswith("uploaded/my_vit")

        open_tab(page, "intervene")
        page.wait_for_function("() => document.querySelector('#iv-n').innerText.includes('bundled pictures (N, of 4)')")
        assert page.input_value("#iv-n input[type=number]") == "4"
        assert "measured against the unedited model's predictions" in page.inner_text("#tab-intervene")
