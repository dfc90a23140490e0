"""The Session tab, and the protocol every tab follows to be saved in and restored from a session file.

The file's format is :mod:`ssog_core.analysis.session` (``python -m ssog_core figures --session FILE`` reads it
too). Each tab owns one section of it and declares it as a :class:`SessionPart`: which component each of the
section's keys is read from, and a ``restore`` that sets the tab's own controls from the section. A restore sets a
control's range before its value (a layer slider's maximum depends on the checkpoint's depth), so a restored page
never holds a value its control refuses. The page (:mod:`app.layout`) only collects the parts: saving reads every
part's components, restoring hands every part its section.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gradio as gr
from gradio.blocks import Block

from app.common import Updates
from app.state import AppContext, AppError
from ssog_core.analysis import session
from ssog_core.analysis.session import Session


@dataclass
class Restoring:
    """What every part's restore may read: the checkpoint and image the page shows once the session is restored
    (the session's, else the page's current ones), and the notes of what could not be restored."""

    checkpoint: str | None
    image_sha: str | None
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class SessionPart:
    """One tab's section of a session file.

    ``fields`` maps each key of the section to the component it is saved from; ``save`` turns those components'
    values (by key) into the section's JSON (default: as they are). ``restore(section, restoring)`` returns the
    updates of the tab's components, every control's range before (in the same update as) its value; ``outputs``
    lists every component it may change. A new tab adds its part to :attr:`app.layout.Page.session_parts`;
    sections :mod:`ssog_core.analysis.session` does not know are kept in the file as they were written.
    """

    section: str
    fields: Mapping[str, Block]
    restore: Callable[[Mapping[str, Any], Restoring], Updates]
    outputs: Sequence[Block]
    save: Callable[[Mapping[str, Any]], dict[str, Any]] = dict


@dataclass(frozen=True)
class SessionUI:
    """The tab's components, by name."""

    save: gr.Button
    file: gr.File  # the saved session, to download
    upload: gr.File  # a session to restore
    status: gr.Markdown


def inputs(parts: Sequence[SessionPart]) -> list[Block]:
    """Every part's components, in the order :func:`make_session` reads their values."""
    return [c for p in parts for c in p.fields.values()]


def outputs(parts: Sequence[SessionPart]) -> list[Block]:
    """Every component a restore may change, each once."""
    return list(dict.fromkeys(c for p in parts for c in p.outputs))


def by_section(parts: Sequence[SessionPart], values: Sequence[Any]) -> dict[str, dict[str, Any]]:
    """The values of :func:`inputs` (as an event hands them over) by section and key."""
    it = iter(values)
    return {part.section: {key: next(it) for key in part.fields} for part in parts}


def make_session(
    ctx: AppContext,
    parts: Sequence[SessionPart],
    ckpt: str | None,
    sha: str | None,
    values: Mapping[str, Mapping[str, Any]],
) -> Session:
    """The page's current values (by section and field key) as a checked session; the image by its SHA-256,
    never its pixels."""
    name = None
    if sha:
        with contextlib.suppress(AppError):  # an image no longer in memory is saved by its hash alone
            name = ctx.image(sha).name
    data: dict[str, Any] = {
        "format": session.FORMAT,
        "checkpoint": ckpt or None,
        "image": {"sha256": sha, "name": name} if sha else None,
    }
    for part in parts:
        saved = part.save(values.get(part.section, {}))
        if saved or part.section in session.SECTIONS:  # a new tab's section is written only when it holds something
            data[part.section] = saved
    return Session.from_dict(data)


def restore_parts(parts: Sequence[SessionPart], s: Session, restoring: Restoring) -> Updates:
    """Every part restored from its section of ``s`` (defaults filled in for what the file left out)."""
    data = s.to_dict()
    out: Updates = {}
    for part in parts:
        out.update(part.restore(data.get(part.section) or {}, restoring))
    return out


def read_session(path: str | Path) -> Session:
    """An uploaded session file, checked (:func:`ssog_core.analysis.session.read`); raises with the reason."""
    if not Path(path).is_file():
        raise AppError("the session file did not arrive; try again")
    return session.read(path)


def build() -> SessionUI:
    gr.Markdown(
        "A session file records the checkpoint, the image (by SHA-256), the playground head and each "
        "tab's settings. Restore it here, or export the same figures headless with "
        "`python -m ssog_core figures --session FILE`."
    )
    with gr.Row():
        save = gr.Button("Save session", elem_id="ses-save")
        file = gr.File(label="session.json", interactive=False, elem_id="ses-file")
        upload = gr.File(label="Restore a session (.json)", file_types=[".json"], elem_id="ses-upload")
    status = gr.Markdown(elem_id="ses-status")
    return SessionUI(save=save, file=file, upload=upload, status=status)
