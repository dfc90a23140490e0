"""Safe image loading and model preprocessing, shared by the CLIs, training data and the app.

Anything a user might upload is either turned into an RGB image or refused with a clear message:
size and pixel caps are checked before decoding (decompression bombs never expand), 16-bit and
float images are rescaled, transparency is composited on white, CMYK and palettes are converted,
animations give their first frame.
"""

from __future__ import annotations

import argparse
import io
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image, ImageOps, UnidentifiedImageError
from torch import Tensor

MAX_PIXELS = 40_000_000  # 40 MP: larger than any camera photo a user is likely to upload, small enough to decode
MAX_BYTES = 50 * 1024**2
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff")


class ImageError(ValueError):
    """An input that is not a usable image, with a message meant for a person."""


def _open(source: str | Path | bytes) -> tuple[Image.Image, str]:
    if isinstance(source, bytes):
        data, name = source, "image"
    else:
        path = Path(source)
        name = path.name
        if not path.is_file():
            raise ImageError(f"{name}: no such file")
        if path.stat().st_size > MAX_BYTES:
            raise ImageError(f"{name} is {path.stat().st_size / 1e6:.0f} MB, over the {MAX_BYTES // 1024**2} MB limit")
        data = path.read_bytes()
    if not data:
        raise ImageError(f"{name} is empty (0 bytes)")
    if len(data) > MAX_BYTES:
        raise ImageError(f"{name} is {len(data) / 1e6:.0f} MB, over the {MAX_BYTES // 1024**2} MB limit")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            img = Image.open(io.BytesIO(data))
    except UnidentifiedImageError:
        raise ImageError(f"{name} is not an image Pillow can read (wrong file type or corrupt)") from None
    except (Image.DecompressionBombWarning, Image.DecompressionBombError) as e:
        raise ImageError(f"{name} is too large to decode safely ({e})") from None
    except (OSError, SyntaxError, ValueError) as e:
        raise ImageError(f"{name} could not be decoded (truncated or corrupt?): {e}") from None
    return img, name


def _to_rgb(img: Image.Image) -> Image.Image:
    """Any Pillow mode → 8-bit RGB (16-bit / float rescaled to their range, alpha on white)."""
    if img.mode in ("I;16", "I;16B", "I;16L", "I", "F"):
        a = np.asarray(img, dtype=np.float64)
        lo, hi = (0.0, 65535.0) if img.mode.startswith("I;16") else (float(a.min()), float(a.max()))
        a = (a - lo) / max(hi - lo, 1e-12) * 255.0
        img = Image.fromarray(np.clip(a + 0.5, 0, 255).astype(np.uint8), mode="L")
    if img.mode == "P":
        img = img.convert("RGBA" if "transparency" in img.info else "RGB")
    if img.mode in ("RGBA", "LA", "La", "RGBa"):
        rgba = img.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return img.convert("RGB")


def load_image(source: str | Path | bytes | Image.Image | np.ndarray, max_pixels: int = MAX_PIXELS) -> Image.Image:
    """Open, check and decode an image as RGB; raises :class:`ImageError` with the reason."""
    if isinstance(source, np.ndarray):
        if source.ndim not in (2, 3) or source.size == 0:
            raise ImageError(f"array of shape {source.shape} is not an image")
        source = Image.fromarray(source.astype(np.uint8) if source.dtype != np.uint8 else source)
    if isinstance(source, Image.Image):
        img, name = source, "image"
    else:
        img, name = _open(source)
    w, h = img.size
    if w < 1 or h < 1:
        raise ImageError(f"{name} has no pixels ({w}×{h})")
    if w * h > max_pixels:
        raise ImageError(f"{name} is {w}×{h} = {w * h / 1e6:.0f} MP, over the {max_pixels / 1e6:.0f} MP limit")
    try:
        if getattr(img, "is_animated", False):
            img.seek(0)
        img = ImageOps.exif_transpose(img)
        img.load()
        return _to_rgb(img)
    except (OSError, SyntaxError, ValueError) as e:
        raise ImageError(f"{name} could not be decoded (truncated or corrupt?): {e}") from None


def to_tensor(
    img: Image.Image, size: Sequence[int] | None = None, normalization: Mapping[str, Sequence[float]] | None = None
) -> Tensor:
    """RGB image → ``(3, H, W)`` float tensor in [0, 1], resized to ``size = (H, W)`` and normalised
    with ``{"mean": [...], "std": [...]}`` when given (as a checkpoint's metadata says)."""
    if size is not None:
        h, w = int(size[0]), int(size[1])
        if (img.height, img.width) != (h, w):
            img = img.resize((w, h), Image.Resampling.BICUBIC)
    x = torch.from_numpy(np.asarray(img, dtype=np.float32).copy()).permute(2, 0, 1) / 255.0
    if normalization:
        mean = torch.tensor(normalization["mean"], dtype=torch.float32).view(-1, 1, 1)
        std = torch.tensor(normalization["std"], dtype=torch.float32).view(-1, 1, 1)
        x = (x - mean) / std
    return x


def parse_size(text: str) -> tuple[int, int]:
    """``"224"`` or ``"224x160"`` (height × width) → ``(H, W)``: the ``--img-size`` type of every command line
    (an ``ArgumentTypeError``, so argparse shows the message as it is)."""
    parts = text.lower().replace("×", "x").split("x")
    try:
        size = tuple(int(p) for p in parts)
    except ValueError:
        raise argparse.ArgumentTypeError(f"image size {text!r} is not N or HxW") from None
    if len(size) == 1:
        size = (size[0], size[0])
    if len(size) != 2 or min(size) < 1:
        raise argparse.ArgumentTypeError(f"image size {text!r} is not N or HxW")
    return size


def model_input(
    sources: Sequence[Any], img_size: Sequence[int], meta: Mapping[str, Any] | None = None
) -> tuple[Tensor, list[Image.Image]]:
    """A batch ``(B, 3, H, W)`` for a model from image sources, plus the resized RGB images (for overlays)."""
    normalization = (meta or {}).get("normalization")
    images = [load_image(s) for s in sources]
    resized = [im.resize((int(img_size[1]), int(img_size[0])), Image.Resampling.BICUBIC) for im in images]
    batch = torch.stack([to_tensor(im, normalization=normalization) for im in resized])
    return batch, resized


def list_images(folder: str | Path) -> list[Path]:
    """Image files directly inside ``folder``, sorted by name."""
    return sorted(p for p in Path(folder).iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
