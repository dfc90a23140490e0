"""The session file (:mod:`ssog_core.analysis.session`): what the app saves, the figures CLI and the app read back."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ssog_core.analysis.head_spec import DEFAULT_SPEC, MAX_ATOMS, Atom, HeadSpec
from ssog_core.analysis.measures import DEFAULT_ALPHA
from ssog_core.analysis.session import FORMAT, MAX_BYTES, NO_TWIN, Session, SessionError, dumps, loads, read

SHA = "0123456789abcdef" * 4


def random_session(seed: int) -> Session:
    rng = np.random.default_rng(seed)
    gh, gw = (int(v) for v in rng.integers(3, 30, size=2))
    atoms = tuple(
        Atom(float(rng.uniform(0, gh)), float(rng.uniform(0, gw)), float(rng.uniform(0.3, 4)),
             float(rng.uniform(0.3, 4)), float(rng.uniform(0.05, 2)))
        for _ in range(int(rng.integers(1, MAX_ATOMS + 1)))
    )  # fmt: skip
    head = HeadSpec((gh, gw), (int(rng.integers(gh)), int(rng.integers(gw))), float(rng.uniform(0.5, 3)), atoms,
                    ["factorized", "axial"][seed % 2])  # fmt: skip
    return Session(
        head=head,
        checkpoint=f"ckpt_{seed}.safetensors",
        image_sha256=SHA,
        image_name="bird.jpg" if seed % 2 else None,
        selected_atom=int(rng.integers(len(atoms))),
        image_underlay=bool(seed % 2),
        geometry_layer=int(rng.integers(6)),
        steering_layer=int(rng.integers(6)),
        steering_query=(int(rng.integers(gh)), int(rng.integers(gw))) if seed % 3 else None,
        export_twin=["dot.safetensors", NO_TWIN, None][seed % 3],
        export_alpha=float(rng.uniform(0, 1)),
        export_layer=int(rng.integers(6)),
        compare_a="a.safetensors",
        compare_b=None,
        compare_alpha=float(rng.uniform(0, 1)),
        compare_layer=int(rng.integers(6)),
    )


@pytest.mark.parametrize("seed", range(6))
def test_round_trip_through_json(seed):
    s = random_session(seed)
    assert Session.from_dict(s.to_dict()) == s
    assert loads(dumps(s)) == s
    assert Session.from_dict(json.loads(dumps(s))).head.field().mu.shape == (1, len(s.head.atoms), 2)


def test_the_file_layout_is_format_1():
    """The JSON an app of this version writes, and what an older app wrote, are the same document."""
    written = {
        "format": "ssog-lab-session/1",
        "checkpoint": "ssog_layouts.safetensors",
        "image": {"sha256": SHA, "name": "bird.jpg"},
        "playground": {"head": DEFAULT_SPEC.to_dict(), "selected_atom": 2, "image_underlay": True},
        "geometry": {"layer": 3},
        "steering": {"layer": 1, "query": [4, 7]},
        "export": {"twin": "(none)", "alpha": 0.25, "layer": 5},
        "compare": {"a": "ssog_layouts.safetensors", "b": "dot_layouts.safetensors", "alpha": 0.5, "layer": 0},
    }
    s = Session.from_dict(written)
    assert s.to_dict() == written and written["format"] == FORMAT
    assert (s.checkpoint, s.image_sha256, s.image_name, s.selected_atom) == (written["checkpoint"], SHA, "bird.jpg", 2)
    assert (s.steering_query, s.export_alpha, s.export_layer, s.twin) == ((4, 7), 0.25, 5, None)
    assert s.head == DEFAULT_SPEC and s.compare_b == "dot_layouts.safetensors"


def test_missing_entries_take_their_defaults():
    s = Session.from_dict({"format": FORMAT, "playground": {"head": DEFAULT_SPEC.to_dict()}})
    assert s == Session(head=DEFAULT_SPEC)
    assert (s.checkpoint, s.image_sha256, s.steering_query, s.twin) == (None, None, None, None)
    assert s.export_alpha == s.compare_alpha == DEFAULT_ALPHA and s.to_dict()["image"] is None
    big = Session.from_dict({"format": FORMAT, "playground": {"head": DEFAULT_SPEC.to_dict(), "selected_atom": 99}})
    assert big.selected_atom == len(DEFAULT_SPEC.atoms) - 1  # kept inside the head
    assert Session(head=DEFAULT_SPEC, export_twin="dot.safetensors").twin == "dot.safetensors"


HEAD = DEFAULT_SPEC.to_dict()


@pytest.mark.parametrize(
    "data, message",
    [
        ([], "not an SSOG Lab session"),
        ({"format": "ssog-lab-session/2", "playground": {"head": HEAD}}, "not an SSOG Lab session"),
        ({"format": FORMAT}, "unusable playground head"),
        ({"format": FORMAT, "playground": {"head": {**HEAD, "atoms": []}}}, "unusable playground head.*1 to 8"),
        ({"format": FORMAT, "playground": [HEAD]}, "playground must be an object"),
        ({"format": FORMAT, "playground": {"head": HEAD}, "export": {"alpha": 1.5}}, r"export.alpha .* \[0, 1\]"),
        ({"format": FORMAT, "playground": {"head": HEAD}, "compare": {"alpha": "x"}}, "compare.alpha"),
        ({"format": FORMAT, "playground": {"head": HEAD}, "geometry": {"layer": -1}}, "geometry.layer"),
        ({"format": FORMAT, "playground": {"head": HEAD}, "steering": {"layer": True}}, "steering.layer"),
        ({"format": FORMAT, "playground": {"head": HEAD}, "steering": {"query": [1]}}, "steering.query"),
        ({"format": FORMAT, "playground": {"head": HEAD}, "steering": {"query": [1.5, 2]}}, "steering.query"),
        ({"format": FORMAT, "playground": {"head": HEAD}, "image": {"sha256": "xyz"}}, "image.sha256"),
        ({"format": FORMAT, "playground": {"head": HEAD}, "image": "bird.jpg"}, "image must be an object"),
        ({"format": FORMAT, "playground": {"head": HEAD}, "export": 3}, "export must be an object"),
        ({"format": FORMAT, "playground": {"head": HEAD}, "checkpoint": 5}, "checkpoint must be a name"),
        ({"format": FORMAT, "playground": {"head": HEAD}, "compare": {"a": ["x"]}}, "compare.a must be a name"),
    ],
)
def test_bad_sessions_are_refused_with_the_entry_named(data, message):
    with pytest.raises(SessionError, match=message):
        Session.from_dict(data)


def test_read_checks_size_json_and_names_the_file(tmp_path):
    good = tmp_path / "good.json"
    good.write_text(dumps(random_session(1)), encoding="utf-8")
    assert read(good) == random_session(1)
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(SessionError, match="broken.json is not a JSON session file"):
        read(broken)
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"format": "other"}))
    with pytest.raises(SessionError, match="other.json: not an SSOG Lab session"):
        read(other)
    huge = tmp_path / "huge.json"
    with open(huge, "wb") as f:
        f.truncate(MAX_BYTES + 1)  # sparse: refused by its size, never read
    with pytest.raises(SessionError, match="too large"):
        read(huge)
    with pytest.raises(SessionError, match="cannot read missing.json"):
        read(tmp_path / "missing.json")
    assert isinstance(SessionError("x"), ValueError)  # the app and the CLI show it as an expected error
