"""A session file: checkpoint, image hash, playground head and the tabs' settings, to restore the same view
(in the app, or headless with ``python -m ssog_core.figures --session FILE``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from app.state import AppContext, AppError
from ssog_core.playground import HeadSpec

FORMAT = "ssog-lab-session/1"
MAX_SESSION_BYTES = 1024**2


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
) -> dict[str, Any]:
    """Everything needed to see the same thing again (the image by its SHA-256, not its pixels)."""
    image = None
    if sha:
        try:
            image = {"sha256": sha, "name": ctx.image(sha).name}
        except AppError:
            image = {"sha256": sha, "name": None}
    head = HeadSpec.from_dict(canvas).to_dict()
    return {
        "format": FORMAT,
        "checkpoint": ckpt,
        "image": image,
        "playground": {"head": head, "selected_atom": int(canvas.get("sel", 0)), "image_underlay": bool(underlay)},
        "geometry": {"layer": int(geo_layer or 0)},
        "steering": {"layer": int(st_layer or 0), "query": list(query) if query else None},
        "export": {"twin": twin, "alpha": float(alpha), "layer": int(ex_layer or 0)},
        "compare": {"a": cmp_a, "b": cmp_b, "alpha": float(cmp_alpha), "layer": int(cmp_layer or 0)},
    }


def read_session(path: str | Path) -> dict[str, Any]:
    """Parse and check a session file; raises :class:`AppError` with the reason."""
    p = Path(path)
    if not p.is_file():
        raise AppError("the session file did not arrive; try again")
    if p.stat().st_size > MAX_SESSION_BYTES:
        raise AppError(f"{p.name} is too large for a session file")
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise AppError(f"{p.name} is not a JSON session file: {e}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise AppError(f'{p.name} is not an SSOG Lab session (expected "format": "{FORMAT}")')
    try:
        HeadSpec.from_dict(data["playground"]["head"])
    except (KeyError, TypeError, ValueError) as e:
        raise AppError(f"{p.name} has an unusable playground head: {e}") from None
    return data
