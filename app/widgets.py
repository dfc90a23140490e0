"""The widgets several tabs build alike, in one place: a layer slider with its range updates, and the "Make files"
row of downloads (a button, the files it makes, a status line)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import gradio as gr
from gradio.blocks import Block

from app.state import AppContext, AppError


def layer_slider(label: str, elem_id: str, **more: Any) -> gr.Slider:
    """A layer picker: whole layers from 0; its range follows the checkpoint (:func:`layer_update`)."""
    return gr.Slider(0, 1, value=0, step=1, label=label, elem_id=elem_id, **more)


def layer_update(layer: Any, depth: int | None, keep: bool = False, **more: Any) -> dict[str, Any]:
    """A layer slider for a model of ``depth`` layers: its range and its value in one update, the value kept inside
    the range (Gradio refuses a value above a slider's maximum). With ``keep`` the value is sent only when it had
    to move into the range: a render must not write back an older value over one the user set while it ran.
    Without a depth (no model to ask) the range widens to hold the value, which a render clamps later."""
    value = int(layer or 0)
    if depth is None:
        return gr.update(maximum=max(value, 1), value=value, **more)
    top = depth - 1
    if keep and value <= top:
        return gr.update(maximum=max(top, 1), **more)
    return gr.update(maximum=max(top, 1), value=min(value, top), **more)


def model_depth(ctx: AppContext, name: str | None) -> int | None:
    """How many layers checkpoint ``name`` has, or None when there is no such model to ask."""
    try:
        return int(ctx.model(name).config.depth) if name else None
    except AppError:
        return None


@dataclass(frozen=True)
class Downloads:
    """A button that makes files, the files it made (to download) and a line saying what happened."""

    button: gr.Button
    files: gr.File
    status: gr.Markdown

    def on_click(self, make: Callable[..., Any], inputs: Sequence[Block]) -> None:
        """``make(*inputs)`` returns ``{files: paths, status: text}`` (or the status alone when it fails)."""
        self.button.click(make, list(inputs), [self.files, self.status], api_visibility="private")


def downloads(button: str = "Make files", button_id: str | None = None, files_id: str | None = None) -> Downloads:
    return Downloads(
        gr.Button(button, size="sm", elem_id=button_id),
        gr.File(label="files", file_count="multiple", interactive=False, elem_id=files_id),
        gr.Markdown(),
    )
