"""Image loading: everything a user might upload is decoded as RGB or refused with a clear message."""

from __future__ import annotations

import argparse
import io
import zlib

import numpy as np
import pytest
import torch
from PIL import Image

from ssog_core.data.images import ImageError, load_image, model_input, parse_size, to_tensor


def _png(img: Image.Image, **kw) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="PNG", **kw)
    return buf.getvalue()


def _jpeg(img: Image.Image) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="JPEG")
    return buf.getvalue()


def bomb_png(width: int, height: int) -> bytes:
    """A tiny PNG whose header claims width × height grey pixels (a decompression bomb)."""
    import struct

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    raw = zlib.compress(b"\x00" * (width + 1) * 8)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
        + chunk(b"IDAT", raw)
        + chunk(b"IEND", b"")
    )


RNG = np.random.default_rng(0)
PHOTO = Image.fromarray(RNG.integers(0, 255, (24, 32, 3), dtype=np.uint8))


@pytest.mark.parametrize(
    "data, message",
    [
        (b"", "is empty"),
        (b"just some text, not an image", "not an image Pillow can read"),
        (_png(PHOTO)[:200], "could not be decoded"),
        (_jpeg(PHOTO)[:300], "could not be decoded"),
        (bomb_png(20000, 20000), "too large to decode safely|over the 40 MP limit"),
        (bomb_png(8000, 6000), "over the 40 MP limit"),
    ],
    ids=["empty", "text", "truncated-png", "truncated-jpeg", "bomb-20000", "over-cap"],
)
def test_bad_images_are_refused_with_a_reason(data, message):
    with pytest.raises(ImageError, match=message):
        load_image(data)


def test_text_file_named_png(tmp_path):
    p = tmp_path / "photo.png"
    p.write_text("hello")
    with pytest.raises(ImageError, match="photo.png is not an image"):
        load_image(p)


def test_sixteen_bit_grayscale_is_rescaled():
    a = np.linspace(0, 65535, 12 * 10).reshape(12, 10).astype(np.uint16)
    img = load_image(_png(Image.fromarray(a, mode="I;16")))
    assert img.mode == "RGB" and img.size == (10, 12)
    rgb = np.asarray(img)
    assert rgb[0, 0, 0] == 0 and rgb[-1, -1, 0] == 255 and (rgb[..., 0] == rgb[..., 2]).all()


def test_rgba_is_composited_on_white_and_cmyk_gif_gray_1x1_work():
    rgba = Image.new("RGBA", (4, 3), (255, 0, 0, 0))
    rgba.putpixel((0, 0), (0, 0, 255, 255))
    out = np.asarray(load_image(_png(rgba)))
    assert tuple(out[1, 1]) == (255, 255, 255) and tuple(out[0, 0]) == (0, 0, 255)
    cmyk = io.BytesIO()
    PHOTO.convert("CMYK").save(cmyk, format="JPEG")
    assert load_image(cmyk.getvalue()).mode == "RGB"
    frames = [Image.new("P", (8, 8), i) for i in range(3)]
    gif = io.BytesIO()
    frames[0].save(gif, format="GIF", save_all=True, append_images=frames[1:])
    assert load_image(gif.getvalue()).size == (8, 8)
    assert load_image(_png(PHOTO.convert("L"))).mode == "RGB"
    assert load_image(_png(Image.new("RGB", (1, 1), (9, 9, 9)))).size == (1, 1)


def test_model_input_resizes_scales_and_normalises():
    batch, resized = model_input([_png(PHOTO), _png(PHOTO.convert("L"))], (16, 20), {"normalization": None})
    assert batch.shape == (2, 3, 16, 20) and resized[0].size == (20, 16)
    assert float(batch.min()) >= 0 and float(batch.max()) <= 1
    norm = to_tensor(PHOTO, normalization={"mean": [0.5, 0.5, 0.5], "std": [0.25, 0.25, 0.25]})
    torch.testing.assert_close(norm, (to_tensor(PHOTO) - 0.5) / 0.25)


def test_parse_size_reads_n_or_hxw_and_refuses_the_rest():
    assert parse_size("224") == (224, 224)
    assert parse_size("224x160") == parse_size("224×160") == parse_size("224X160") == (224, 160)
    for bad in ("", "abc", "0", "2x3x4", "16x-1"):
        with pytest.raises(argparse.ArgumentTypeError, match="is not N or HxW"):
            parse_size(bad)
