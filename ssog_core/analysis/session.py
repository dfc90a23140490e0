"""The session file: one JSON document that records what the app shows, so the same view can be restored in the
app or drawn headless (``python -m ssog_core figures --session FILE``).

Format ``ssog-lab-session/1``::

    {"format": "ssog-lab-session/1",
     "checkpoint": "ssog_layouts.safetensors",            # a picker name, or null
     "image": {"sha256": "…", "name": "bird.jpg"},         # the picture by the hash of its file, or null
     "playground": {"head": {…HeadSpec…}, "selected_atom": 0, "image_underlay": false},
     "geometry": {"layer": 0},
     "steering": {"layer": 0, "query": [row, col] or null},
     "export": {"twin": "dot_layouts.safetensors" or "(none)", "alpha": 0.5, "layer": 0},
     "compare": {"a": "…", "b": "…", "alpha": 0.5, "layer": 0},
     "intervene": {"edits": [{"op": "swap_axes", "layer": 5, "head": 0}, …]},  # ssog_core.interventions
     "target_share": {"index": 17, "images": 100}}        # the validation image shown, the mean's N

Only ``format`` and ``playground.head`` are required: a missing section or entry takes its default, so files
written by hand (or by an older app) still load. Any other top-level object is a section of a tab this module does
not know (:attr:`Session.more`): it is kept as it is, so a tab added to the app records its settings in the same
format, and checks them itself when it restores them. :func:`read` and :func:`loads` check everything and raise
:class:`SessionError` with the reason; :func:`dumps` writes what :func:`loads` reads.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ssog_core.analysis.head_spec import HeadSpec
from ssog_core.analysis.measures import DEFAULT_ALPHA

FORMAT = "ssog-lab-session/1"
MAX_BYTES = 1024**2  # a session is a few kB; anything this large is not one
NO_TWIN = "(none)"  # how a session (and the app's twin picker) says "no second checkpoint"
SECTIONS = ("playground", "geometry", "steering", "export", "compare")  # the sections this module reads


class SessionError(ValueError):
    """A session file that cannot be used, with the reason."""


@dataclass(frozen=True)
class Session:
    """Everything needed to see the same thing again (the image by its SHA-256, never its pixels)."""

    head: HeadSpec
    checkpoint: str | None = None
    image_sha256: str | None = None
    image_name: str | None = None
    selected_atom: int = 0
    image_underlay: bool = False
    geometry_layer: int = 0
    steering_layer: int = 0
    steering_query: tuple[int, int] | None = None
    export_twin: str | None = None  # a checkpoint name, NO_TWIN or None
    export_alpha: float = DEFAULT_ALPHA
    export_layer: int = 0
    compare_a: str | None = None
    compare_b: str | None = None
    compare_alpha: float = DEFAULT_ALPHA
    compare_layer: int = 0
    more: dict[str, dict[str, Any]] = field(default_factory=dict)  # other tabs' sections, as they were written

    @property
    def twin(self) -> str | None:
        """The export tab's second checkpoint, None when there is none."""
        return None if self.export_twin in (None, "", NO_TWIN) else self.export_twin

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (see the module docstring)."""
        image = {"sha256": self.image_sha256, "name": self.image_name} if self.image_sha256 else None
        query = list(self.steering_query) if self.steering_query else None
        out = {
            "format": FORMAT,
            "checkpoint": self.checkpoint,
            "image": image,
            "playground": {
                "head": self.head.to_dict(),
                "selected_atom": self.selected_atom,
                "image_underlay": self.image_underlay,
            },
            "geometry": {"layer": self.geometry_layer},
            "steering": {"layer": self.steering_layer, "query": query},
            "export": {"twin": self.export_twin, "alpha": self.export_alpha, "layer": self.export_layer},
            "compare": {
                "a": self.compare_a,
                "b": self.compare_b,
                "alpha": self.compare_alpha,
                "layer": self.compare_layer,
            },
            **self.more,
        }
        return out

    @classmethod
    def from_dict(cls, data: Any) -> Session:
        """Check and parse the JSON form; raises :class:`SessionError` naming the entry that is wrong."""
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise SessionError(f'not an SSOG Lab session (expected "format": "{FORMAT}")')
        pg = _section(data, "playground")
        try:
            head = HeadSpec.from_dict(pg.get("head"))
        except ValueError as e:
            raise SessionError(f"unusable playground head: {e}") from None
        image = data.get("image")
        if image is not None and not isinstance(image, dict):
            raise SessionError("image must be an object with sha256 and name, or null")
        image = image or {}
        geo, st, ex, cmp = (_section(data, k) for k in ("geometry", "steering", "export", "compare"))
        selected = _int(pg, "selected_atom", "playground")
        known = {"format", "checkpoint", "image", *SECTIONS}
        more = {k: _section(data, k) for k in data if k not in known}
        return cls(
            head=head,
            checkpoint=_name(data, "checkpoint", ""),
            image_sha256=_sha256(image.get("sha256")),
            image_name=_name(image, "name", "image"),
            selected_atom=min(max(selected, 0), len(head.atoms) - 1),
            image_underlay=bool(pg.get("image_underlay", False)),
            geometry_layer=_int(geo, "layer", "geometry"),
            steering_layer=_int(st, "layer", "steering"),
            steering_query=_cell(st.get("query")),
            export_twin=_name(ex, "twin", "export"),
            export_alpha=_alpha(ex, "export"),
            export_layer=_int(ex, "layer", "export"),
            compare_a=_name(cmp, "a", "compare"),
            compare_b=_name(cmp, "b", "compare"),
            compare_alpha=_alpha(cmp, "compare"),
            compare_layer=_int(cmp, "layer", "compare"),
            more=more,
        )


def _where(section: str, key: str) -> str:
    return f"{section}.{key}" if section else key


def _section(data: dict[str, Any], key: str) -> dict[str, Any]:
    value = data.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise SessionError(f"{key} must be an object")
    return value


def _int(d: dict[str, Any], key: str, section: str) -> int:
    value = d.get(key)
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise SessionError(f"{_where(section, key)} must be a whole number ≥ 0, got {value!r}")
    return int(value)


def _alpha(d: dict[str, Any], section: str) -> float:
    value = d.get("alpha")
    if value is None:
        return DEFAULT_ALPHA
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
        raise SessionError(f"{section}.alpha must be a number in [0, 1], got {value!r}")
    return float(value)


def _name(d: dict[str, Any], key: str, section: str) -> str | None:
    value = d.get(key)
    if value is not None and not isinstance(value, str):
        raise SessionError(f"{_where(section, key)} must be a name (a string) or null, got {value!r}")
    return value or None


def _sha256(value: Any) -> str | None:
    if value in (None, ""):
        return None
    if not isinstance(value, str) or len(value) != 64 or any(c not in "0123456789abcdef" for c in value):
        raise SessionError("image.sha256 must be the 64 hex digits of the file's SHA-256")
    return value


def _cell(value: Any) -> tuple[int, int] | None:
    if value is None:
        return None
    if not (isinstance(value, (list, tuple)) and len(value) == 2 and all(isinstance(v, int) for v in value)):
        raise SessionError(f"steering.query must be [row, col] or null, got {value!r}")
    return int(value[0]), int(value[1])


def dumps(session: Session) -> str:
    """The session as the JSON text of a session file."""
    return json.dumps(session.to_dict(), indent=2, ensure_ascii=False)


def loads(text: str | bytes, source: str = "the session") -> Session:
    """Parse a session file's text; errors name ``source``."""
    if len(text) > MAX_BYTES:
        raise SessionError(f"{source} is too large for a session file")
    try:
        data = json.loads(text)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SessionError(f"{source} is not a JSON session file: {e}") from None
    except RecursionError:  # lists or objects nested thousands deep: no session is
        raise SessionError(f"{source} is not a session file: its JSON is nested too deeply") from None
    try:
        return Session.from_dict(data)
    except SessionError as e:
        raise SessionError(f"{source}: {e}") from None


def read(path: str | Path) -> Session:
    """Read and check a session file (its size before its content)."""
    p = Path(path)
    try:
        if p.stat().st_size > MAX_BYTES:
            raise SessionError(f"{p.name} is too large for a session file")
        data = p.read_bytes()
    except OSError as e:
        raise SessionError(f"cannot read {p.name}: {e.strerror or e}") from None
    return loads(data, p.name)
