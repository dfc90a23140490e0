"""Bad input, fuzzed (``hypothesis``): session files, ``--data`` specs, checkpoint files and pictures, broken in
every way the strategies can think of, give either a usable result or the project's own error with a message;
never another exception (which the app would show as a traceback, or as a bare "Error").

Each target runs a fixed, derandomized set of at most 200 examples, so CI sees the same inputs every time.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image
from safetensors.torch import save_file

from ssog_core import ViT, save_checkpoint
from ssog_core.analysis.session import FORMAT, Session, SessionError, dumps, loads
from ssog_core.checkpoint.format import CheckpointError, load_checkpoint
from ssog_core.cli import train
from ssog_core.data.images import ImageError, load_image
from ssog_core.data.sources import DATA_KINDS, parse_data_spec
from tests.test_session import random_session

FUZZ = settings(
    max_examples=200,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
)

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=10), inner, max_size=5),
    max_leaves=20,
)


def _paths(value, prefix=()):
    """Every key path of a nested dict / list."""
    yield prefix
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _paths(v, (*prefix, i))


@st.composite
def mutated(draw, valid: dict, values=JSON) -> dict:
    """``valid`` with 1-4 entries replaced by arbitrary JSON values or deleted."""
    data = copy.deepcopy(valid)
    for _ in range(draw(st.integers(1, 4))):
        paths = [p for p in _paths(data) if p]
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent = data
        for key in path[:-1]:
            parent = parent[key]
        if isinstance(parent, dict) and draw(st.booleans()):
            del parent[path[-1]]
        else:
            parent[path[-1]] = draw(values)
    return data


# ------------------------------------------------------------------------------------------------ session files

VALID_SESSION = random_session(3).to_dict()


@FUZZ
@given(
    st.one_of(
        mutated(VALID_SESSION).map(json.dumps),
        JSON.map(json.dumps),
        st.text(max_size=300),
        st.binary(max_size=300),
        st.integers(1, 200_000).map(lambda n: "[" * n),
        st.integers(1, 50_000).map(lambda n: '{"format": "' + FORMAT + '", "playground": ' + "[" * n),
    )
)
def test_a_session_file_loads_or_says_what_is_wrong(text):
    try:
        session = loads(text, "fuzzed.json")
    except SessionError as e:
        assert str(e) and "Traceback" not in str(e)
        return
    assert isinstance(session, Session) and loads(dumps(session)) == session  # what loads, saves and loads again


# ------------------------------------------------------------------------------------------------ --data specs

SPEC_WORDS = st.sampled_from([*DATA_KINDS, "classes", "train", "val", "size", "seed", "=", ",", ":", "-1", "0",
                              "2", "99999999999999999999", "1e3", "x", "/", "..", " ", "\x00", "٣"])  # fmt: skip


@FUZZ
@given(text=st.one_of(st.lists(SPEC_WORDS, max_size=12).map("".join), st.text(max_size=40)))
def test_a_data_spec_parses_or_says_what_is_accepted(text, capsys):
    try:
        kind, _ = parse_data_spec(text)
    except ValueError as e:
        assert str(e).startswith(f"data {text!r}") or "option" in str(e) or "must be" in str(e) or "needs" in str(e)
    else:
        assert kind in DATA_KINDS
    with contextlib.suppress(SystemExit):  # the command line: its own message, exit code 2, or the config
        train.parse_args(["--data", text])
        return
    err = capsys.readouterr().err
    assert "error: argument --data" in err and "Traceback" not in err


# ------------------------------------------------------------------------------------------------ checkpoints

TINY = dict(num_classes=3, img_size=8, patch_size=4, dim=8, depth=1, num_heads=2, num_atoms=2)
WORK = Path(tempfile.mkdtemp(prefix="fuzz-ckpt-"))
GOOD = save_checkpoint(WORK / "good.safetensors", ViT(**TINY), {"class_names": ["a", "b", "c"]}).read_bytes()
HEADER_SIZE = int.from_bytes(GOOD[:8], "little")
HEADER = json.loads(GOOD[8 : 8 + HEADER_SIZE])
DATA = GOOD[8 + HEADER_SIZE :]
DTYPES = ["F64", "F32", "F16", "BF16", "I64", "I32", "I16", "I8", "U8", "BOOL", "F8_E4M3", "C64", "X"]


def _file(header: dict, data: bytes = DATA) -> bytes:
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text + data


def _loads_or_refuses(blob: bytes) -> None:
    path = WORK / "fuzzed.safetensors"
    path.write_bytes(blob)
    try:
        model, _ = load_checkpoint(path)
    except CheckpointError as e:
        assert "fuzzed.safetensors" in str(e)
        return
    assert all(p.dtype == torch.float32 and torch.isfinite(p).all() for p in model.parameters())


TENSOR_ENTRY = st.fixed_dictionaries(
    {},
    optional={
        "dtype": st.sampled_from(DTYPES) | JSON,
        "shape": st.lists(st.integers(-2, 2**40), max_size=4) | JSON,
        "data_offsets": st.lists(st.integers(-2, 2**40), max_size=3) | JSON,
    },
)
CONFIG_VALUES = st.one_of(JSON, st.integers(-5, 10**9), st.sampled_from(["ssog", "dot", "rbf", "axial", ""]))


@st.composite
def broken_header(draw) -> bytes:
    header = copy.deepcopy(HEADER)
    what = draw(st.sampled_from(["tensor", "config", "meta", "format", "extra"]))
    if what == "tensor":
        name = draw(st.sampled_from(sorted(k for k in header if k != "__metadata__")))
        header[name] = {**header[name], **draw(TENSOR_ENTRY)}
    elif what == "config":
        config = json.loads(header["__metadata__"]["config"])
        header["__metadata__"]["config"] = json.dumps(draw(mutated(config, CONFIG_VALUES)))
    elif what == "meta":
        header["__metadata__"]["meta"] = draw(st.text(max_size=30) | JSON.map(json.dumps))
    elif what == "format":
        header["__metadata__"]["format"] = draw(st.text(max_size=12))
    else:
        header[draw(st.text(max_size=10))] = draw(JSON)
    return _file(header)


@FUZZ
@given(
    st.one_of(
        st.integers(0, len(GOOD) - 1).map(lambda n: GOOD[:n]),  # truncated anywhere
        st.integers(0, 2**64 - 1).map(lambda n: n.to_bytes(8, "little") + GOOD[8:]),  # any header length
        broken_header(),
        st.binary(max_size=200),
    )
)
def test_a_checkpoint_file_loads_or_says_what_is_wrong(blob):
    _loads_or_refuses(blob)


STORED = {k: v.clone() for k, v in ViT(**TINY).state_dict().items()}
RETYPE = st.sampled_from([torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int8, torch.uint8,
                          torch.bool])  # fmt: skip


@FUZZ
@given(st.data())
def test_tensors_of_the_wrong_shape_or_dtype_are_refused_or_loaded_as_float32(data):
    """A well-formed file whose tensors do not fit the config: reshaped, cut, retyped, missing or extra."""
    state = {k: v.clone() for k, v in STORED.items()}
    for _ in range(data.draw(st.integers(1, 3))):
        name = data.draw(st.sampled_from(sorted(state)))
        change = data.draw(st.sampled_from(["reshape", "cut", "retype", "drop", "extra", "nan"]))
        t = state[name]
        if change == "reshape":
            state[name] = t.reshape(-1)
        elif change == "cut" and t.numel() > 1:
            state[name] = t.reshape(-1)[: t.numel() // 2].contiguous()
        elif change == "retype":
            state[name] = t.to(data.draw(RETYPE))
        elif change == "drop":
            del state[name]
        elif change == "extra":
            state[name + "_extra"] = torch.rand(3)
        elif t.is_floating_point():
            state[name] = torch.full_like(t, float("nan"))
    buf = WORK / "typed.safetensors"
    save_file(state, str(buf), metadata=HEADER["__metadata__"])
    _loads_or_refuses(buf.read_bytes())


# ------------------------------------------------------------------------------------------------ pictures


def _encode(img: Image.Image, fmt: str, **kw) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format=fmt, **kw)
    return buf.getvalue()


RNG = np.random.default_rng(0)
PHOTO = Image.fromarray(RNG.integers(0, 255, (12, 16, 3), dtype=np.uint8))
SEEDS = [
    _encode(PHOTO, "PNG"),
    _encode(PHOTO, "JPEG"),
    _encode(PHOTO.convert("P"), "GIF"),
    _encode(PHOTO, "BMP"),
    _encode(PHOTO, "WEBP"),
    _encode(PHOTO, "TIFF"),
    _encode(PHOTO.convert("CMYK"), "JPEG"),
    _encode(Image.fromarray(np.arange(192, dtype=np.uint16).reshape(12, 16) * 300), "PNG"),
]


@st.composite
def corrupted(draw) -> bytes:
    """A valid picture of some format with bytes flipped, cut out or inserted, or cut short."""
    data = bytearray(draw(st.sampled_from(SEEDS)))
    for _ in range(draw(st.integers(1, 6))):
        at = draw(st.integers(0, len(data) - 1))
        action = draw(st.sampled_from(["flip", "cut", "insert", "truncate"]))
        if action == "flip":
            data[at] = draw(st.integers(0, 255))
        elif action == "cut":
            del data[at : at + draw(st.integers(1, 16))]
        elif action == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=16))
        else:
            del data[max(at, 1) :]
        if not data:
            break
    return bytes(data)


@FUZZ
@given(corrupted())
def test_a_corrupted_picture_decodes_or_says_why(data):
    try:
        img = load_image(data, max_pixels=1_000_000)
    except ImageError as e:
        assert str(e).startswith("image ")
        return
    assert img.mode == "RGB" and img.size[0] >= 1 and img.size[1] >= 1


ORIENTED = {  # EXIF orientation → the array a viewer shows (an independent reading of the EXIF standard)
    1: lambda a: a,
    2: lambda a: a[:, ::-1],
    3: lambda a: a[::-1, ::-1],
    4: lambda a: a[::-1],
    5: lambda a: a.transpose(1, 0, 2),
    6: lambda a: np.rot90(a, -1),
    7: lambda a: a[::-1, ::-1].transpose(1, 0, 2),  # transverse: mirrored across the anti-diagonal
    8: lambda a: np.rot90(a, 1),
}


@pytest.mark.parametrize("orientation", range(1, 9))
@pytest.mark.parametrize("fmt", ["PNG", "JPEG"])
def test_exif_rotation_is_applied(orientation, fmt):
    a = np.zeros((48, 80, 3), dtype=np.uint8)
    a[:24, :40] = (250, 10, 10)  # red top-left quarter, green bottom-right
    a[24:, 40:] = (10, 250, 10)
    exif = Image.Exif()
    exif[0x0112] = orientation
    out = np.asarray(load_image(_encode(Image.fromarray(a), fmt, exif=exif.tobytes())), dtype=np.int16)
    want = np.ascontiguousarray(ORIENTED[orientation](a)).astype(np.int16)
    assert out.shape == want.shape
    error = np.abs(out - want)
    assert error.max() == 0 if fmt == "PNG" else error.mean() < 4  # JPEG: a little ringing at the edges only


def test_palette_with_a_transparent_colour_is_composited_on_white():
    img = Image.new("P", (5, 4), 0)
    img.putpalette([0, 0, 255, 200, 0, 0] + [0] * 762)
    img.putpixel((1, 1), 1)
    for fmt in ("PNG", "GIF"):
        out = np.asarray(load_image(_encode(img, fmt, transparency=0)))
        assert tuple(out[0, 0]) == (255, 255, 255) and tuple(out[1, 1]) == (200, 0, 0), fmt


def test_an_animated_gif_gives_its_first_frame_and_cmyk_keeps_its_colours():
    frames = [Image.new("RGB", (6, 5), c) for c in ((200, 20, 20), (20, 200, 20), (20, 20, 200))]
    gif = _encode(frames[0], "GIF", save_all=True, append_images=frames[1:], duration=50, loop=0)
    out = np.asarray(load_image(gif), dtype=int)
    assert np.abs(out - (200, 20, 20)).max() <= 8  # the first frame's colour (GIF palettes quantise a little)
    cmyk = np.asarray(load_image(_encode(PHOTO.convert("CMYK"), "JPEG", quality=95)), dtype=int)
    assert np.abs(cmyk - np.asarray(PHOTO, dtype=int)).mean() < 8  # RGB again, not inverted or shifted


# --------------------------------------------------------------------------------------------------- edit lists

EDIT_MODEL = ViT(num_classes=3, img_size=20, patch_size=4, dim=16, depth=2, num_heads=2, attn="ssog").eval()
VALID_EDITS = [  # one of every registered op that needs no sources, as a user would write them
    {"op": "close_gate", "layer": 1, "tap": "mu"},
    {"op": "scale_gate", "layer": 0, "tap": "sigma", "factor": 0.5},
    {"op": "ablate_head", "layer": 0, "head": 1},
    {"op": "drop_atom", "layer": 1, "head": 0, "atom": 2},
    {"op": "move_atom", "layer": 1, "head": 1, "atom": 0, "dy": 0.5, "dx": -1.0},
    {"op": "swap_axes", "layer": 0, "head": 0},
]
EDIT_VALUES = JSON | st.sampled_from([float("nan"), float("inf"), -1, 10**9, 2.5, "mu", "zero", [], {}])


def _apply(items) -> None:
    """Parse, check and run an edit list on a small model: the project's EditError, or a finite forward."""
    from ssog_core.interventions.edit import EditError, check_edits, parse_edits
    from ssog_core.interventions.run import edited

    try:
        edits = parse_edits(items)
        check_edits(EDIT_MODEL, edits)
    except EditError as e:
        assert str(e).strip()
        return
    with torch.no_grad(), edited(EDIT_MODEL, edits):
        assert torch.isfinite(EDIT_MODEL(torch.rand(1, 3, 20, 20))).all()


def test_the_valid_edits_apply():
    from ssog_core.interventions.edit import EDITS

    assert {e["op"] for e in VALID_EDITS} <= set(EDITS)
    _apply(VALID_EDITS)


def _broken(edits: list[dict]) -> st.SearchStrategy:
    """The list with 1-4 of its values replaced by odd JSON (NaN, inf, huge, nested, wrong types) or removed."""
    return st.just(edits) if not edits else mutated({"edits": edits}, EDIT_VALUES).map(lambda d: d.get("edits", []))


@FUZZ
@given(st.lists(st.sampled_from(VALID_EDITS), max_size=6).flatmap(_broken))
def test_an_edit_list_applies_or_says_what_is_wrong(items):
    _apply(items)


@FUZZ
@given(JSON | st.lists(JSON, max_size=5) | st.integers(0, 5000).map(lambda n: [VALID_EDITS[0]] * n))
def test_any_json_as_an_edit_list_applies_or_is_refused(items):
    _apply(items)


def test_deeply_nested_and_huge_edit_lists_are_refused_in_words():
    from ssog_core.interventions.edit import EditError, parse_edits

    nested: list = []
    for _ in range(5000):
        nested = [nested]
    for items in (nested, [VALID_EDITS[0]] * 10_000, [{"op": "close_gate", "layer": 0, "tap": "mu", "x": nested}]):
        with pytest.raises(EditError):
            parse_edits(items)
