"""The bad-input corpus, generated on the spot: every file a user might upload by mistake (or malice).

Each entry is ``(path, expected)``: ``expected`` is a regular expression the refusal message must match, or
``None`` for awkward files that must simply work. The 20000×20000 PNG bomb is written by hand as a few kB of
zlib-compressed zeros; nothing here ever decodes it.
"""

from __future__ import annotations

import json
import pickle
import struct
import zlib
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from safetensors import safe_open
from safetensors.torch import save_file

from tests.app_fixtures import shapes_image
from tests.helpers import RunsCode

BOMB_SIDE = 20_000


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def png_bomb(path: Path, side: int = BOMB_SIDE) -> Path:
    """A valid 1-bit grayscale PNG of ``side``² black pixels (400 MP for 20000): ~50 MB of zero rows that
    compress to a few tens of kB. Written without Pillow, so building it decodes nothing."""
    row = 1 + (side + 7) // 8  # filter byte + packed bits
    z = zlib.compressobj(9)
    block = bytes(row * 256)
    idat = b"".join(z.compress(block) for _ in range(side // 256))
    idat += z.compress(bytes(row * (side % 256))) + z.flush()
    ihdr = struct.pack(">IIBBBBB", side, side, 1, 0, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", idat) + _chunk(b"IEND", b""))
    return path


def bad_images(folder: Path) -> dict[str, tuple[Path, str | None]]:
    """Image uploads: the ones that must be refused (with the message they must give) and the ones that must work."""
    folder.mkdir(parents=True, exist_ok=True)
    rgb = shapes_image(96)
    out: dict[str, tuple[Path, str | None]] = {}

    def put(key: str, name: str, data: bytes, expected: str | None) -> None:
        (folder / name).write_bytes(data)
        out[key] = (folder / name, expected)

    put("empty", "empty.png", b"", r"empty\.png is empty \(0 bytes\)")
    put("text_as_png", "notes.png", b"lab notes, not a picture\n" * 20, r"notes\.png is not an image Pillow can read")
    rgb.save(folder / "whole.png")
    png = (folder / "whole.png").read_bytes()
    put("truncated_png", "cut.png", png[: len(png) // 2], r"cut\.png could not be decoded \(truncated or corrupt")
    rgb.save(folder / "whole.jpg", quality=90)
    jpg = (folder / "whole.jpg").read_bytes()
    put("truncated_jpeg", "cut.jpg", jpg[: len(jpg) // 2], r"cut\.jpg could not be decoded \(truncated or corrupt")
    out["bomb"] = (png_bomb(folder / "bomb.png"), r"bomb\.png is too large to decode safely")
    # awkward but valid: each must become an RGB picture the models can read
    Image.new("RGB", (1, 1), (200, 30, 60)).save(folder / "one_pixel.png")
    out["one_pixel"] = (folder / "one_pixel.png", None)
    gray16 = (np.asarray(rgb.convert("L"), dtype=np.uint16) * 257).astype(np.uint16)
    Image.fromarray(gray16).save(folder / "gray16.png")
    out["gray16"] = (folder / "gray16.png", None)
    rgb.convert("CMYK").save(folder / "cmyk.jpg", quality=90)
    out["cmyk_jpeg"] = (folder / "cmyk.jpg", None)
    frames = [shapes_image(64, seed=s) for s in range(3)]
    frames[0].save(folder / "animated.gif", save_all=True, append_images=frames[1:], duration=100, loop=0)
    out["animated_gif"] = (folder / "animated.gif", None)
    rgba = rgb.convert("RGBA")
    alpha = np.zeros((96, 96), np.uint8)
    alpha[24:72, 24:72] = 255  # an opaque square on a fully transparent page
    rgba.putalpha(Image.fromarray(alpha))
    rgba.save(folder / "transparent.png")
    out["rgba_transparent"] = (folder / "transparent.png", None)
    return out


def _rewrite(good: Path, dest: Path, state_fn=None, config_fn=None) -> Path:
    """A copy of checkpoint ``good`` with its tensors and / or header config changed."""
    with safe_open(str(good), framework="pt") as f:
        header = dict(f.metadata())
        state = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open is not iterable)
    if state_fn:
        state_fn(state)
    if config_fn:
        cfg = json.loads(header["config"])
        config_fn(cfg)
        header["config"] = json.dumps(cfg)
    save_file(state, str(dest), metadata=header)
    return dest


def bad_checkpoints(folder: Path, good: Path) -> dict[str, tuple[list[Path], str]]:
    """Checkpoint uploads that must be refused: the files of one upload and the message it must give.

    ``folder / "PWNED"`` is the marker the pickles would create; it must never exist."""
    folder.mkdir(parents=True, exist_ok=True)
    marker = folder / "PWNED"
    out: dict[str, tuple[list[Path], str]] = {}
    (folder / "empty.safetensors").write_bytes(b"")
    out["empty"] = ([folder / "empty.safetensors"], r"empty\.safetensors is empty \(0 bytes\)")
    data = good.read_bytes()
    (folder / "cut.safetensors").write_bytes(data[: len(data) * 2 // 3])
    out["truncated"] = ([folder / "cut.safetensors"], r"cut\.safetensors is not a readable safetensors file")

    def wrong_shape(state):
        key = next(k for k in state if k.endswith("attn.mu"))
        state[key] = torch.zeros(7, 3, 2)

    _rewrite(good, folder / "wrong_shape.safetensors", wrong_shape)
    out["wrong_shapes"] = ([folder / "wrong_shape.safetensors"], r"attn\.mu has shape \(7, 3, 2\), expected")

    def nan(state):
        w = state["blocks.0.mlp.0.weight"].clone()
        w[0, 0] = float("nan")
        state["blocks.0.mlp.0.weight"] = w

    _rewrite(good, folder / "nan.safetensors", nan)
    out["nan_weights"] = ([folder / "nan.safetensors"], r"blocks\.0\.mlp\.0\.weight contains NaN or infinite values")

    def future_fields(cfg):
        cfg.update(num_experts=8, rotary="yarn")

    _rewrite(good, folder / "future.safetensors", config_fn=future_fields)
    out["unknown_fields"] = ([folder / "future.safetensors"], r"unknown model config field\(s\): num_experts, rotary")
    with open(folder / "evil.pt", "wb") as f:
        pickle.dump({"blocks.0.attn.mu": RunsCode(marker)}, f)
    (folder / "evil.json").write_text(json.dumps({"num_classes": 5, "img_size": 32, "patch_size": 4}))
    out["pickle_pt"] = ([folder / "evil.pt", folder / "evil.json"], r"evil\.pt was refused: .* could run code")
    out["pickle_pt_alone"] = ([folder / "evil.pt"], r"evil\.pt is a upstream-implementation file: upload it together")
    (folder / "evil.safetensors").write_bytes((folder / "evil.pt").read_bytes())
    out["pickle_renamed"] = ([folder / "evil.safetensors"], r"evil\.safetensors is not a readable safetensors file")
    return out
