"""The Session tab: save the view (checkpoint, image hash, playground head, each tab's settings) as a session file,
or restore one. The format is :mod:`ssog_core.analysis.session`, which
``python -m ssog_core.figures --session FILE`` reads
too; restoring sets components of every tab, so its handler lives with the page (:mod:`app.layout`)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gradio as gr

from app.state import AppContext, AppError
from ssog_core.analysis import session
from ssog_core.analysis.playground import HeadSpec
from ssog_core.analysis.session import Session


@dataclass(frozen=True)
class SessionUI:
    """The tab's components, by name."""

    save: gr.Button
    file: gr.File  # the saved session, to download
    upload: gr.File  # a session to restore
    status: gr.Markdown


def make_session(
    ctx: AppContext,
    ckpt: str | None,
    sha: str | None,
    canvas: Any,
    underlay: bool,
    geo_layer: float,
    st_layer: float,
    query: Any,
    twin: str | None,
    alpha: float,
    ex_layer: float,
    cmp_a: str | None,
    cmp_b: str | None,
    cmp_alpha: float,
    cmp_layer: float,
    edits: list[dict] | None = None,
) -> Session:
    """The page's current values as a session (the image by its SHA-256, not its pixels)."""
    name = None
    if sha:
        with contextlib.suppress(AppError):  # an image no longer in memory is saved by its hash alone
            name = ctx.image(sha).name
    return Session(
        head=HeadSpec.from_dict(canvas),
        checkpoint=ckpt,
        image_sha256=sha or None,
        image_name=name,
        selected_atom=int(canvas.get("sel", 0)),
        image_underlay=bool(underlay),
        geometry_layer=int(geo_layer or 0),
        steering_layer=int(st_layer or 0),
        steering_query=(int(query[0]), int(query[1])) if query else None,
        export_twin=twin,
        export_alpha=float(alpha),
        export_layer=int(ex_layer or 0),
        compare_a=cmp_a,
        compare_b=cmp_b,
        compare_alpha=float(cmp_alpha),
        compare_layer=int(cmp_layer or 0),
        intervene_edits=tuple(edits or ()),
    )


def read_session(path: str | Path) -> Session:
    """An uploaded session file, checked (:func:`ssog_core.analysis.session.read`); raises with the reason."""
    if not Path(path).is_file():
        raise AppError("the session file did not arrive; try again")
    return session.read(path)


def build() -> SessionUI:
    gr.Markdown(
        "A session file records the checkpoint, the image (by SHA-256), the playground head and each "
        "tab's settings. Restore it here, or export the same figures headless with "
        "`python -m ssog_core.figures --session FILE`."
    )
    with gr.Row():
        save = gr.Button("Save session", elem_id="ses-save")
        file = gr.File(label="session.json", interactive=False, elem_id="ses-file")
        upload = gr.File(label="Restore a session (.json)", file_types=[".json"], elem_id="ses-upload")
    status = gr.Markdown(elem_id="ses-status")
    return SessionUI(save=save, file=file, upload=upload, status=status)
