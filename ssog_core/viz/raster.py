"""Arrays → pictures: colour maps, densities over images, PNG bytes and data URLs, the patch grid over a picture.

Images are ``(H, W, 3)`` uint8; maps are ``(Gh, Gw)`` over patch cells."""

from __future__ import annotations

import base64
import io
from collections.abc import Sequence
from functools import lru_cache

import matplotlib
import numpy as np
from PIL import Image

FIELD_CMAP = "viridis"  # densities (the SSOG post's geometry figure)
NET_CMAP = "RdBu_r"  # net export: red = source (positive), blue = gatherer, centred on 0
PULL_IN_CMAP, PULL_OUT_CMAP = "Blues", "Reds"  # non-negative shares, 0 = white
OFFSET_CMAP = "magma"  # |μδ| in grid cells
OVERLAY_CMAP = "inferno"  # a density laid over a picture (opacity grows with the value)
# --------------------------------------------------------------------------------------- raster helpers


@lru_cache(maxsize=16)
def _lut(cmap: str) -> np.ndarray:
    """``(256, 3)`` uint8 lookup table of a matplotlib colormap."""
    return (matplotlib.colormaps[cmap](np.linspace(0.0, 1.0, 256))[:, :3] * 255.0 + 0.5).astype(np.uint8)


def colorize(a: np.ndarray, cmap: str = FIELD_CMAP, vmin: float | None = None, vmax: float | None = None) -> np.ndarray:
    """A 2D array as an RGB image; ``vmin``/``vmax`` default to the array's range."""
    a = np.asarray(a, dtype=np.float64)
    lo = float(np.nanmin(a)) if vmin is None else vmin
    hi = float(np.nanmax(a)) if vmax is None else vmax
    t = (a - lo) / (hi - lo) if hi > lo else np.zeros_like(a)
    idx = np.clip(np.nan_to_num(t) * 255.0 + 0.5, 0, 255).astype(np.uint8)
    return _lut(cmap)[idx]


def density_rgba(
    density: np.ndarray, cmap: str = OVERLAY_CMAP, gamma: float = 0.6, vmax: float | None = None
) -> np.ndarray:
    """A density as RGBA whose opacity grows with the value: to lay a field over a picture. Colours run from 0 to
    ``vmax`` (default: the density's own maximum; pass a shared one to compare several panels)."""
    d = np.asarray(density, dtype=np.float64)
    top = float(d.max()) if vmax is None else float(vmax)
    t = d / top if top > 0 else d
    rgb = colorize(t, cmap, 0.0, 1.0)
    alpha = (np.clip(t, 0, 1) ** gamma * 235.0).astype(np.uint8)
    return np.dstack([rgb, alpha])


def png_bytes(img: np.ndarray, compress_level: int = 1) -> bytes:
    """PNG of an RGB(A) uint8 array (fast compression: these are sent on every pointer move)."""
    buf = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(img)).save(buf, format="PNG", compress_level=compress_level)
    return buf.getvalue()


def data_url(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def model_view(img: Image.Image, img_size: Sequence[int], width: int) -> Image.Image:
    """The picture stretched to the model's input aspect (as :func:`~ssog_core.data.images.model_input` feeds it),
    ``width`` pixels wide: the backdrop of every map, so patch cells line up with what the model saw."""
    h, w = int(img_size[0]), int(img_size[1])
    return img.convert("RGB").resize((width, max(1, round(width * h / w))), Image.Resampling.BICUBIC)


def grid_overlay(img: Image.Image, grid: tuple[int, int], query: tuple[int, int] | None = None) -> np.ndarray:
    """The image with faint patch lines (and the query patch outlined): what a user clicks on."""
    a = np.asarray(img.convert("RGB")).copy()
    h, w = a.shape[:2]
    gh, gw = grid
    for i in range(1, gh):
        a[round(i * h / gh), :] = (a[round(i * h / gh), :] * 0.5 + 127).astype(np.uint8)
    for k in range(1, gw):
        a[:, round(k * w / gw)] = (a[:, round(k * w / gw)] * 0.5 + 127).astype(np.uint8)
    if query is not None:
        y0, y1 = round(query[0] * h / gh), round((query[0] + 1) * h / gh) - 1
        x0, x1 = round(query[1] * w / gw), round((query[1] + 1) * w / gw) - 1
        for t in range(max(1, min(h, w) // 150)):
            a[y0 + t, x0 : x1 + 1] = a[y1 - t, x0 : x1 + 1] = (255, 230, 0)
            a[y0 : y1 + 1, x0 + t] = a[y0 : y1 + 1, x1 - t] = (255, 230, 0)
    return a


def cell_at(xy: Sequence[float], image_size: tuple[int, int], grid: tuple[int, int]) -> tuple[int, int]:
    """The patch ``(row, col)`` under pixel ``(x, y)`` of an image of ``(width, height)``."""
    (x, y), (w, h), (gh, gw) = xy, image_size, grid
    return min(max(int(y * gh / h), 0), gh - 1), min(max(int(x * gw / w), 0), gw - 1)
