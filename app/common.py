"""Small helpers every tab uses: visible messages, download files, a bounded cache of analysis results."""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import gradio as gr
from matplotlib.figure import Figure

from app.state import AppError
from ssog_core import viz
from ssog_core.checkpoint import CheckpointError
from ssog_core.images import ImageError

T = TypeVar("T")
EXPECTED_ERRORS = (AppError, CheckpointError, ImageError, ValueError)
DOWNLOAD_ROOT = Path(tempfile.gettempdir()) / "ssog-lab-downloads"
KEEP_DOWNLOADS = 64  # download folders kept; older ones are removed as new ones are made


def warn(message: str) -> str:
    """Show ``message`` as a toast (when called inside a request) and return it for a status line."""
    gr.Warning(message)
    return f"⚠️ {message}"


def error_text(e: Exception) -> str:
    """A person-readable message for an expected failure (no tracebacks in the UI)."""
    return str(e) if isinstance(e, EXPECTED_ERRORS) else f"unexpected error: {type(e).__name__}: {e}"


class LRU:
    """A small thread-safe least-recently-used cache: memory stays flat across repeated requests."""

    def __init__(self, size: int):
        self.size = size
        self._data: OrderedDict[Hashable, Any] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable, make: Callable[[], T]) -> T:
        with self._lock:
            if key in self._data:
                self._data.move_to_end(key)
                return self._data[key]
        value = make()  # computed outside the lock: other requests keep being served meanwhile
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            while len(self._data) > self.size:
                self._data.popitem(last=False)
        return value

    def __len__(self) -> int:
        return len(self._data)


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
