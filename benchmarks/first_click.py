"""Whether a user's first click costs what the second does: a fresh ``python -m app`` (the bundled checkpoints),
one uploaded photo, then ``/export_summary`` on it three times in a row.

    python benchmarks/first_click.py [--checkpoint matched_ssog_layouts.safetensors]

Prints how long the page took to answer after the start, the warm-up the app reported, each call's time and the
load average (on a shared machine the numbers move with what else runs).
"""

from __future__ import annotations

import argparse
import os
import re
import tempfile
import time
from pathlib import Path

import numpy as np
from gradio_client import Client, handle_file
from PIL import Image

from ssog_core.testing.app_process import AppProcess

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", default="matched_ssog_layouts.safetensors", help="a file in checkpoints/")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        photo = Path(tmp) / "photo.jpg"
        pixels = np.random.default_rng(0).integers(0, 256, (480, 640, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(photo, quality=90)
        with AppProcess(ROOT / "checkpoints", ROOT / "assets", Path(tmp) / "app.log") as app:
            warm = re.findall(r"warmed up in .* s", app.log_tail(None))
            print(f"page answered {app.startup_s:.1f} s after start; {warm[0] if warm else 'no warm-up reported'}")
            client = Client(app.url, verbose=False, download_files=False)
            sha = client.predict(handle_file(str(photo)), api_name="/upload_image")["sha256"]
            for i in range(3):
                t = time.perf_counter()
                client.predict(args.checkpoint, sha, 0.5, "none", api_name="/export_summary")
                print(f"export maps call {i + 1}: {time.perf_counter() - t:.2f} s")
    print(f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
