"""`python -m app`'s command line: `--help` answers at once (Gradio, torch and the page load only to serve) and
names every flag, and README's "The app" lists every flag too."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

from app.main import parser

ROOT = Path(__file__).resolve().parents[1]
HELP_SECONDS = 5.0  # the heavy imports took 14–24 s on 2 busy cores; the parser alone takes well under a second


def flags() -> list[str]:
    return [o for a in parser()._actions for o in a.option_strings if o.startswith("--") and o != "--help"]


def test_help_is_fast_and_names_every_flag():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "app", "--help"], capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=120)  # fmt: skip
    seconds = time.perf_counter() - start
    assert done.returncode == 0, done.stderr
    assert seconds < HELP_SECONDS, f"--help took {seconds:.1f} s: something heavy is imported at module level"
    assert len(flags()) >= 8 and all(f in done.stdout for f in flags())
    assert "gradio" not in done.stderr.lower()


def test_readme_lists_every_flag():
    section = re.search(r"^## The app\n(.*?)^## ", (ROOT / "README.md").read_text(encoding="utf-8"), re.S | re.M)
    assert section, "README has no '## The app' section"
    missing = [f for f in flags() if f"`{f}" not in section.group(1)]
    assert missing == [], f"README's app section does not name {missing}"


def test_the_command_line_imports_nothing_heavy():
    """What --help's speed rests on, checked without a clock: the command line's module loads neither torch nor
    Gradio nor the page."""
    code = "import sys, app.main; print(sorted({'torch', 'gradio', 'app.layout', 'app.state'} & set(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stdout + done.stderr
