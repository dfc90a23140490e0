"""The protocol every tab follows to be saved in and restored from a session file (the Session tab,
:mod:`app.tabs.session`, is only its buttons).

The file's format is :mod:`ssog_core.analysis.session` (``python -m ssog_core.figures --session FILE`` reads it
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

from gradio.blocks import Block

from app.common import Updates
from app.state import AppContext, AppError, StoredImage
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


def session_of(ctx: AppContext, ckpt: str | None, sha: str | None, sections: Mapping[str, Any]) -> Session:
    """A checked session of a checkpoint, an image (by its SHA-256, never its pixels; its name when this server
    still holds it) and tabs' sections as they are written in a session file."""
    name = None
    if sha:
        with contextlib.suppress(AppError):  # an image no longer in memory is saved by its hash alone
            name = ctx.image(sha).name
    data: dict[str, Any] = {
        "format": session.FORMAT,
        "checkpoint": ckpt or None,
        "image": {"sha256": sha, "name": name} if sha else None,
        **sections,
    }
    return Session.from_dict(data)


def make_session(
    ctx: AppContext,
    parts: Sequence[SessionPart],
    ckpt: str | None,
    sha: str | None,
    values: Mapping[str, Mapping[str, Any]],
) -> Session:
    """The page's current values (by section and field key) as a checked session."""
    sections: dict[str, Any] = {}
    for part in parts:
        saved = part.save(values.get(part.section, {}))
        if saved or part.section in session.SECTIONS:  # a new tab's section is written only when it holds something
            sections[part.section] = saved
    return session_of(ctx, ckpt, sha, sections)


def restoring_of(
    ctx: AppContext, s: Session, ckpt: str | None, sha: str | None
) -> tuple[Restoring, StoredImage | None]:
    """What the page shows once ``s`` is restored: the session's checkpoint and image where this server has them,
    else the page's current ``ckpt`` and ``sha`` (with a note each); the session's image when it is held."""
    restoring = Restoring(ckpt, sha)
    if s.checkpoint and not ctx.offers(s.checkpoint):
        restoring.notes.append(f"checkpoint {s.checkpoint!r} is not in the checkpoint folder")
    else:
        restoring.checkpoint = s.checkpoint
    stored = None
    if s.image_sha256:
        try:
            stored = ctx.image(s.image_sha256)
            restoring.image_sha = stored.sha256
        except AppError as e:
            restoring.notes.append(f"image {s.image_name or s.image_sha256[:12]}: {e}")
    return restoring, stored


def restore_parts(parts: Sequence[SessionPart], s: Session, restoring: Restoring) -> Updates:
    """Every part restored from its section of ``s`` (defaults filled in for what the file left out)."""
    data = s.to_dict()
    out: Updates = {}
    for part in parts:
        out.update(part.restore(data.get(part.section) or {}, restoring))
    return out


def restored_text(notes: Sequence[str]) -> str:
    """The status line of a restore: done, and what could not be restored."""
    return "Session restored." + (" Not restored: " + "; ".join(notes) + "." if notes else "")


def read_session(path: str | Path) -> Session:
    """An uploaded session file, checked (:func:`ssog_core.analysis.session.read`); raises with the reason."""
    if not Path(path).is_file():
        raise AppError("the session file did not arrive; try again")
    return session.read(path)
