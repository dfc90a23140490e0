"""Regenerate the README's screenshots of every tab from a real browser session.

    python experiments/screenshots.py [--checkpoint-dir checkpoints] [--assets-dir assets] [--image NAME] [--out DIR]

Starts ``python -m app`` on a free port, drives Debian's Chromium with Playwright (offline) through the tabs of the
model the app opens first — a trained preset drawn over the picture, the learned geometry, a clicked patch in the
steering tab's deepest layer, the export maps beside the dot twin, the comparison, the fields at the last step of its
training — and writes one PNG per tab (default: docs/figures/screenshots/, where the README shows them).
"""

from __future__ import annotations

import argparse
import io
import sys
import time
from pathlib import Path

from PIL import Image
from playwright.sync_api import TimeoutError as PlaywrightTimeout
from playwright.sync_api import sync_playwright

from ssog_core.testing.app_process import AppProcess

ROOT = Path(__file__).resolve().parents[1]

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-background-networking"]
SLOW = 180_000  # ms: figures of a real checkpoint on a busy 2-core machine can take a while


def wait_image(page, selector: str, old: str = "") -> None:
    page.wait_for_function(
        "([sel, old]) => { const e = document.querySelector(sel); return e && e.src && e.src !== old; }",
        arg=[selector, old],
        timeout=SLOW,
    )


def snap(page, out: Path, name: str, top: str = "#tabs") -> None:
    """Screenshot from ``top`` (the tab bar) down, stored as a 256-colour PNG (a third of the size, same look)."""
    page.evaluate("sel => document.querySelector(sel).scrollIntoView()", top)
    time.sleep(0.5)
    path = out / f"{name}.png"
    Image.open(io.BytesIO(page.screenshot())).convert("RGB").quantize(
        256, method=Image.Quantize.FASTOCTREE, dither=Image.Dither.NONE
    ).save(path, optimize=True)
    print(path)


def tour(url: str, out: Path, image: str | None) -> None:
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1150})
        page.set_default_timeout(SLOW)
        page.on("pageerror", lambda e: print("page error:", e, file=sys.stderr))
        page.goto(url)
        page.wait_for_selector("#pg-canvas .atom")
        if image:
            page.click("#img-pick input")
            page.locator("[role=option]", has_text=image).first.click()
            page.wait_for_function("n => document.querySelector('#status').innerText.includes(n)", arg=image)
        page.click("#pg-preset input")
        strips = page.locator("[role=option]", has_text="strip")
        if not strips.count():  # no head is a strip by the presets' thresholds: the most elongated one reads best
            strips = page.locator("[role=option]", has_text="elongated")
        if not strips.count():  # else the first of the model's own heads: any of them beats the example head
            strips = page.locator("[role=option]")
        before = page.get_attribute("#pg-canvas img.fld", "src")
        strips.first.click()
        wait_image(page, "#pg-canvas img.fld", before)
        page.check("#pg-underlay input")
        page.wait_for_function("() => document.querySelector('#pg-canvas img.bg').src.startsWith('data:image/jpeg')")
        snap(page, out, "1_playground")
        page.click("#tab-geometry-button")
        wait_image(page, "#geo-figure img")
        snap(page, out, "2_geometry")
        page.click("#tab-steering-button")
        wait_image(page, "#st-click img")
        last = page.get_attribute("#st-layer input[type=range]", "max")  # the deepest layer steers the most
        before = page.get_attribute("#st-steer img", "src") or ""
        page.fill("#st-layer input[type=number]", last)
        page.press("#st-layer input[type=number]", "Enter")
        wait_image(page, "#st-steer img", before)
        for attempt in range(3):  # on a busy machine a click that lands while the picture is replaced is lost
            box = page.locator("#st-click img").bounding_box()
            page.mouse.click(box["x"] + box["width"] * 0.55, box["y"] + box["height"] * 0.45)
            try:
                page.wait_for_selector("#st-qfig img[src]", state="attached", timeout=SLOW // 3)
                break
            except PlaywrightTimeout:
                if attempt == 2:
                    raise
        snap(page, out, "3_steering")
        page.click("#tab-export-button")
        wait_image(page, "#ex-figure img")
        snap(page, out, "4_export_maps")
        page.click("#tab-compare-button")
        wait_image(page, "#cmp-figure img")
        snap(page, out, "5_compare")
        page.click("#tab-training-button")
        wait_image(page, "#train-grid img")
        for plot in ("#train-gates", "#train-acc", "#train-geometry"):  # drawn above and below the fields
            page.wait_for_selector(f"{plot} .js-plotly-plot", state="attached")
        time.sleep(1.0)
        snap(page, out, "6_training", top="#train-step")  # the fields, under the gate and accuracy curves
        browser.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint-dir", type=Path, default=ROOT / "checkpoints")
    ap.add_argument("--assets-dir", type=Path, default=ROOT / "assets")
    ap.add_argument("--image", help="bundled image to select (default: the first)")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "figures" / "screenshots")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    log_path = args.out / "app.log"
    with AppProcess(args.checkpoint_dir, args.assets_dir, log_path) as app:
        try:
            tour(app.url, args.out, args.image)
        except Exception:
            print(app.log_tail(3000), file=sys.stderr)
            raise
    log_path.unlink()


if __name__ == "__main__":
    main()
