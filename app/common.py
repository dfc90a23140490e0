"""Small helpers every tab uses: the handlers' return type, visible messages and download files."""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

import gradio as gr
from gradio.blocks import Block
from matplotlib.figure import Figure

from app.state import AppError
from ssog_core.checkpoint.format import CheckpointError
from ssog_core.data.images import ImageError
from ssog_core.nn.hook_points import in_context
from ssog_core.runtime.jobs import JobError
from ssog_core.viz import figures as viz

Updates = dict[Block, Any]  # what a handler returns: {component: new value or gr.update(...)} for those it changes
EXPECTED_ERRORS = (AppError, CheckpointError, ImageError, JobError, ValueError)  # their sentences show as they are
DOWNLOAD_ROOT = Path(tempfile.gettempdir()) / "ssog-lab-downloads"
KEEP_DOWNLOADS = 64  # download folders kept; older ones are removed as new ones are made


def warn(message: str) -> str:
    """Show ``message`` as a toast (when called inside a request) and return it for a status line."""
    gr.Warning(message)
    return f"⚠️ {message}"


def error_text(e: Exception) -> str:
    """A person-readable message for an expected failure (no tracebacks in the UI)."""
    return str(e) if isinstance(e, EXPECTED_ERRORS) else f"unexpected error: {type(e).__name__}: {e}"


def write_downloads(files: Mapping[str, bytes | str]) -> list[str]:
    """Write ``{file name: content}`` into a fresh folder Gradio may serve; returns the paths."""
    DOWNLOAD_ROOT.mkdir(parents=True, exist_ok=True)
    folders = sorted(DOWNLOAD_ROOT.iterdir(), key=lambda p: p.stat().st_mtime)
    for old in folders[:-KEEP_DOWNLOADS]:
        shutil.rmtree(old, ignore_errors=True)
    folder = Path(tempfile.mkdtemp(prefix=time.strftime("%H%M%S-"), dir=DOWNLOAD_ROOT))
    paths = []
    for name, content in files.items():
        p = folder / name
        if isinstance(content, str):
            p.write_text(content, encoding="utf-8")
        else:
            p.write_bytes(content)
        paths.append(str(p))
    return paths


def shown_figure(fig: Figure, stem: str, settings: Mapping[str, Any]) -> str:
    """A figure as a named PNG (settings in its metadata) for a ``gr.Image``: the image's own download button
    then saves this name, not a generic ``image.webp``."""
    return write_downloads({f"{viz.safe_token(stem)}.png": viz.figure_bytes(fig, "png", settings)})[0]


T = TypeVar("T")


def stoppable(work: Callable[[Callable[[], bool]], T], poll: float = 0.5) -> Iterator[T | None]:
    """Run ``work(stop)`` in a thread and yield ``None`` every ``poll`` seconds while it runs, then its result.

    For long handlers as generators: Gradio can cancel a generator only between two values, and cancelling a plain
    function leaves its thread running. The thread carries the caller's context (an edit or eval block around the
    call acts in ``work`` too: :func:`~ssog_core.nn.hook_points.in_context`). When the generator is closed early (a
    cancelled job, a Stop button), ``stop()`` turns true and ``work`` is expected to return soon after (it raises,
    and nothing is yielded).
    """
    flag = threading.Event()
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["result"] = work(flag.is_set)
        except BaseException as e:  # handed to the generator's thread
            box["error"] = e

    thread = threading.Thread(target=in_context(target), daemon=True)
    thread.start()
    try:
        while thread.is_alive():
            thread.join(poll)
            if thread.is_alive():
                yield None
        if "error" in box:
            raise box["error"]
        yield box["result"]
    finally:
        flag.set()
