"""The new user's tour of issue 43 in a real browser: an edit list and its results do not survive a switch to another
model, a dot model's Intervene says and offers what it takes (no gates plot), the training tab on a model folder,
Compare opening on two models, and pictures uploaded on the page named by the Intervene section.

Same Chromium, flags and server as :mod:`tests.test_browser`."""

from __future__ import annotations

import zipfile

import pytest
import torch

from ssog_core import ViT, save_checkpoint
from ssog_core.checkpoint.standard import save_timm_folder, timm_twin
from ssog_core.testing.app_process import AppProcess
from tests.app_fixtures import designed_ssog, shapes_image, write_images
from tests.test_app_intervene_api import SHAPES
from tests.test_browser import STARTUP, browser_page, open_tab

playwright = pytest.importorskip("playwright.sync_api")
pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("e2e_tour")
    (root / "ckpt").mkdir()
    save_checkpoint(root / "ckpt" / "ssog_shapes.safetensors", designed_ssog(depth=2), SHAPES)
    torch.manual_seed(4)
    lab = ViT(num_classes=5, img_size=32, patch_size=4, dim=32, depth=2, num_heads=4, attn="dot")
    save_timm_folder(timm_twin(lab).float(), root / "ckpt" / "digits-vit")
    write_images(root / "assets")
    archive = root / "digits.zip"
    with zipfile.ZipFile(archive, "w") as z:
        for i in range(5):
            shapes_image(40, seed=i).save(root / f"{i}.png")
            z.write(root / f"{i}.png", f"digits/{i}.png")
    env = {"GRADIO_TEMP_DIR": str(root / "gradio")}
    with AppProcess(root / "ckpt", root / "assets", root / "app.log", env=env, startup_timeout=STARTUP) as app:
        yield {"url": app.url, "log": root / "app.log", "zip": archive}


def _has(page, selector: str, text: str) -> None:
    page.wait_for_function("([s, t]) => document.querySelector(s).innerText.includes(t)", arg=[selector, text])


def _pick_checkpoint(page, name: str) -> None:
    page.click("#ckpt input")
    page.locator("[role=option]", has_text=name).first.click()


def test_the_tour_in_the_browser(server):
    with browser_page(server["log"], "tour_failure", 120_000) as page:
        page.goto(server["url"])
        open_tab(page, "intervene")
        _has(page, "#iv-note", "ssog_shapes.safetensors")
        page.click("#iv-add")  # the first op with its starting fields: close_gate, layer 0, every gate
        _has(page, "#iv-list", "gates closed")
        page.click("#iv-apply")
        _has(page, "#iv-pred", "Edited prediction")

        _pick_checkpoint(page, "digits-vit")  # a model folder: the edit list and the results were the other model's
        _has(page, "#iv-note", "it takes ablate_head and patch_head with what='output' and replace_with_field")
        _has(page, "#iv-list", "No edits yet")
        assert "Edited prediction" not in page.inner_text("#iv-pred")
        assert not page.locator("#iv-gates").is_visible()
        page.click("#iv-op input")
        offered = page.locator("[role=option]").all_inner_texts()
        assert [o.replace("✓", "").strip() for o in offered] == ["ablate_head", "patch_head", "replace_with_field"]
        page.keyboard.press("Escape")

        open_tab(page, "training")
        _has(page, "#tab-training", "has no training history (it is a model folder")
        assert "no such checkpoint file" not in page.inner_text("#tab-training")

        open_tab(page, "compare")
        page.wait_for_function("() => document.querySelector('#cmp-b input').value !== ''")
        assert page.input_value("#cmp-a input") == "digits-vit"
        assert page.input_value("#cmp-b input") == "ssog_shapes.safetensors"  # never A = B while there is another

        open_tab(page, "intervene")
        with page.expect_file_chooser() as chooser:
            page.click("#pics-files")
        chooser.value.set_files([str(server["zip"])])
        _has(page, "#status", "Kept **5** pictures as **uploaded: digits**".replace("**", ""))
        assert page.input_value("#pics input") == "uploaded: digits"
        _has(page, "#iv-n", "pictures of digits (N, of 5)")


def test_a_dot_models_playground_measures_its_heads_then_offers_their_fits(server, tmp_path):
    """A dot model uploaded while the playground is open: its heads are measured as fields (the note names the
    pictures and shows the progress), then their fits are the presets, and one opens on the canvas."""
    torch.manual_seed(11)
    dot = ViT(num_classes=5, img_size=32, patch_size=4, dim=32, depth=2, num_heads=2, attn="dot")
    path = save_checkpoint(tmp_path / "fresh_dot.safetensors", dot)  # records no data: the bundled pictures
    with browser_page(server["log"], "tour_presets_failure", 300_000) as page:
        page.goto(server["url"])
        page.wait_for_selector("#pg-canvas .atom")
        page.evaluate(  # every text the note shows, however briefly
            """() => { window.notes = []; const note = document.querySelector('#pg-preset-note');
            new MutationObserver(() => window.notes.push(note.innerText)).observe(note,
            {childList: true, subtree: true, characterData: true}); }"""
        )
        with page.expect_file_chooser() as chooser:
            page.click("#ckpt-upload")
        chooser.value.set_files(str(path))
        _has(page, "#pg-preset-note", "Presets are the heads of uploaded/fresh_dot.safetensors (dot-product) as fields")
        notes = page.evaluate("() => window.notes")
        measuring = (
            "Measuring the heads' fields of uploaded/fresh_dot.safetensors (dot-product) on 4 bundled picture(s)"
        )
        assert any(n.startswith(measuring) and "not one of this model's" in n for n in notes), notes
        assert page.locator("#pg-preset").is_visible()
        page.click("#pg-preset input")
        offered = page.locator("[role=option]").all_inner_texts()
        assert len(offered) == 2 * 2 and offered[0].strip().startswith("fit: layer 0 · head 0 (its 4 atoms explain")
        page.locator("[role=option]").nth(3).click()
        _has(page, "#pg-preset-note", "Layer 1, head 1 of uploaded/fresh_dot.safetensors as its 4 fitted atoms")
