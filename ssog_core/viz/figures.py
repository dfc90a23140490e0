"""The matplotlib figures of the analysis quantities, one section per app tab (raster helpers:
:mod:`ssog_core.viz.raster`).

Shared by the app and the headless CLI (``python -m ssog_core figures``), so a figure downloaded from the
browser and one written by a script are the same drawing. Nothing here computes attention: every function
takes the outputs of :mod:`ssog_core.analysis.measures` / :mod:`ssog_core.analysis.head_spec` and only draws them.
Figures use matplotlib's object API (no pyplot state), so concurrent requests can draw at once.

Conventions: images are ``(H, W, 3)`` uint8; maps are ``(Gh, Gw)`` over patch cells and are drawn
over the image they belong to; a ★ marks a query; net export is red for sources, blue for gatherers.
"""

from __future__ import annotations

import io
import json
import math
import textwrap
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from matplotlib import patheffects
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.cm import ScalarMappable
from matplotlib.colors import Normalize
from matplotlib.figure import Figure
from matplotlib.patches import Ellipse, Rectangle
from PIL import Image

from ssog_core.analysis.controls import ClassMaps, ControlMaps, describe
from ssog_core.analysis.head_spec import HeadSpec, HeadView
from ssog_core.analysis.measures import ExportMaps, LayerField, SteeringOffsets
from ssog_core.viz.raster import (
    FIELD_CMAP,
    NET_CMAP,
    OFFSET_CMAP,
    OVERLAY_CMAP,
    PULL_IN_CMAP,
    PULL_OUT_CMAP,
    density_rgba,
)

TAP_LABELS = {"mu": "s(μδ)", "sigma": "s(σδ)", "lambda": "s(λ)"}

# --------------------------------------------------------------------------------------- figure helpers


def new_figure(width: float, height: float) -> Figure:
    fig = Figure(figsize=(width, height), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def figure_bytes(fig: Figure, fmt: str = "png", metadata: Mapping[str, Any] | None = None, dpi: int = 100) -> bytes:
    """The figure as PNG or SVG bytes, with ``metadata`` (the settings) stored in the file."""
    info = {"Title": fig.get_suptitle() or "SSOG Lab figure", "Description": json.dumps(dict(metadata or {}))}
    if fmt == "png":
        md = {"Title": info["Title"], "Description": info["Description"], "Software": "SSOG Lab"}
    elif fmt == "svg":
        md = {"Title": info["Title"], "Description": info["Description"], "Creator": "SSOG Lab"}
    else:
        raise ValueError(f"unknown figure format {fmt!r}; use png or svg")
    buf = io.BytesIO()
    fig.savefig(buf, format=fmt, dpi=dpi, metadata=md)
    return buf.getvalue()


def figure_rgb(fig: Figure, dpi: int = 100) -> np.ndarray:
    """The figure rendered to an RGB array (what the app shows)."""
    png = figure_bytes(fig, "png", dpi=dpi)
    return np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))


def panel_boxes(fig: Figure) -> list[tuple[float, float, float, float]]:
    """Where each of the figure's axes was drawn, as ``(x0, y0, x1, y1)`` fractions of the image with the origin
    at the top left (call after the figure was rendered): to map a click on the picture back to a panel."""
    boxes = []
    for ax in fig.axes:
        p = ax.get_position()
        boxes.append((float(p.x0), float(1 - p.y1), float(p.x1), float(1 - p.y0)))
    return boxes


def panel_at(
    png: bytes, boxes: list[tuple[float, float, float, float]], layers: int, xy: Sequence[float]
) -> tuple[int, int] | None:
    """The ``(layer, head)`` whose panel is under pixel ``(x, y)`` of a layers × heads figure drawn as ``png`` with
    its :func:`panel_boxes` (head rows × layer columns, row-major), or None outside every panel."""
    width, height = Image.open(io.BytesIO(png)).size
    x, y = float(xy[0]) / width, float(xy[1]) / height
    for k, (x0, y0, x1, y1) in enumerate(boxes):
        if x0 <= x <= x1 and y0 <= y <= y1:
            return k % layers, k // layers
    return None


def safe_token(text: str) -> str:
    """A string made safe for a file name (settings go into names)."""
    keep = "".join(c if c.isalnum() or c in "-_." else "-" for c in text)
    return keep.strip("-.") or "x"


def backdrop(image: Image.Image, px: int, dim: float = 1.0) -> np.ndarray:
    """The picture shrunk to about the size it is drawn at (matplotlib would resample it for every panel
    otherwise, which dominates drawing time), optionally darkened so an overlay stands out."""
    small = image.convert("RGB").copy()
    small.thumbnail((px, px), Image.Resampling.LANCZOS)
    a = np.asarray(small)
    return a if dim == 1.0 else (a * dim).astype(np.uint8)


def suptitle(fig: Figure, title: str, legend: str, fontsize: float = 9) -> None:
    """A figure title (kept as is) over a legend wrapped to the figure's width, so neither is clipped."""
    chars = max(30, int(fig.get_figwidth() * 72 / (0.6 * fontsize)))  # about 0.6 em per character
    lines = [line for part in legend.split("\n") for line in textwrap.wrap(part, chars)]
    fig.suptitle("\n".join([title, *lines] if title else lines), fontsize=fontsize)


def _no_ticks(ax) -> None:
    ax.set_xticks([])
    ax.set_yticks([])


def _colorbar(fig: Figure, im, ax, label: str) -> None:
    cb = fig.colorbar(im, ax=ax, shrink=0.85, pad=0.02)
    cb.set_label(label, fontsize=8)
    cb.ax.tick_params(labelsize=7)


def _scale_bar(fig: Figure, axes: list, cmap: str, vmin: float, vmax: float, label: str) -> None:
    """One colour bar for panels drawn without a mappable of their own (RGBA overlays, normalised fields)."""
    sm = ScalarMappable(Normalize(vmin, vmax), cmap)
    cb = fig.colorbar(sm, ax=axes, shrink=0.6, pad=0.02)
    cb.set_label(label, fontsize=8)
    cb.ax.tick_params(labelsize=7)


def _show_map(ax, image: np.ndarray | None, a: np.ndarray, cmap: str, vmin: float, vmax: float, alpha: float = 0.7):
    """``a`` (patch cells) over ``image``, cells drawn as sharp squares."""
    gh, gw = a.shape
    extent = (-0.5, gw - 0.5, gh - 0.5, -0.5)
    if image is not None:
        ax.imshow(image, extent=extent, interpolation="nearest")
    im = ax.imshow(
        a,
        cmap=cmap,
        vmin=vmin,
        vmax=vmax,
        extent=extent,
        interpolation="nearest",
        alpha=alpha if image is not None else 1.0,
    )
    ax.set_xlim(-0.5, gw - 0.5)
    ax.set_ylim(gh - 0.5, -0.5)
    _no_ticks(ax)
    return im


def _star(ax, y: float, x: float, size: float = 160, color: str = "white") -> None:
    ax.scatter([x], [y], marker="*", s=size, c=color, edgecolors="black", linewidths=0.9, zorder=5)


def symmetric_limit(*arrays: np.ndarray) -> float:
    """A zero-centred colour limit covering every array (at least a tiny positive number)."""
    return max(max(float(np.abs(a).max()) for a in arrays), 1e-12)


# --------------------------------------------------------------------------------------- learned geometry


def gate_text(lf: LayerField) -> str:
    """``s(μδ)=…`` lines for a column title, one tap per line (no overlap with the neighbours)."""
    lines = [f"{TAP_LABELS[t]}={lf.gates[t]:.2f}" for t in ("mu", "sigma", "lambda") if t in lf.gates]
    return "\n".join(lines) if lines else "fixed field"


def visible_extent(fields: Sequence[LayerField], floor: float = 0.02, pad: float = 1.5) -> tuple[float, float]:
    """Half-width (y, x) in cells that shows every head's field (values ≥ ``floor`` of its peak) and atom
    centre: the geometry panels zoom to it, so local heads are not specks in a mostly empty square."""
    density = np.stack([lf.density.numpy() for lf in fields])
    return support_extent(density, np.stack([lf.mu.numpy() for lf in fields]), floor, pad)


def support_extent(density: np.ndarray, mu: np.ndarray, floor: float = 0.02, pad: float = 1.5) -> tuple[float, float]:
    """:func:`visible_extent` of fields given as arrays: ``density`` ``(..., 2E_y+1, 2E_x+1)`` over key offset and
    their atom centres ``mu`` ``(..., 2)``. One window for many fields (every snapshot of a training run) keeps
    their panels comparable."""
    ey, ex = (n // 2 for n in density.shape[-2:])
    panels = density.reshape(-1, 2 * ey + 1, 2 * ex + 1)
    ys, xs = np.nonzero((panels >= floor * panels.max(axis=(-2, -1), keepdims=True)).any(axis=0))
    vy = max(3.0, float(np.abs(ys - ey).max()) + pad, float(np.abs(mu[..., 0]).max()) + pad)
    vx = max(3.0, float(np.abs(xs - ex).max()) + pad, float(np.abs(mu[..., 1]).max()) + pad)
    v = max(vy, vx)  # the same zoom on both axes keeps a round field round
    return min(v, ey + 0.5), min(v, ex + 0.5)


def geometry_figure(
    fields: Sequence[LayerField],
    title: str = "",
    layers: Sequence[int] | None = None,
    window: tuple[float, float] | None = None,
    panel_text: Sequence[Sequence[str]] | None = None,
    legend: str = "",
) -> Figure:
    """Layers × heads grid of each head's field over relative position (like the SSOG post's figure).

    Per panel: the λ-weighted density over key offsets (per-panel normalised), ``+`` atom centres at
    ``−μ`` with brightness λ, ★ the query, and the head's attention entropy H (nats) and effective
    radius r (cells). Column titles carry the layer's gate scales, one per line. ``window``: the panels'
    half-width (y, x) in cells (default: :func:`visible_extent` of the layers drawn). ``panel_text[layer][head]``
    and ``legend`` replace the H / r line and the legend's second sentence, and the column titles lose the gates:
    a head measured as a field has none.
    """
    layers = list(range(len(fields))) if layers is None else list(layers)
    heads = fields[layers[0]].density.shape[0]
    vy, vx = window or visible_extent([fields[l] for l in layers])
    fig = new_figure(1.9 * len(layers) + 0.8, 1.9 * heads + 1.6)
    axes = fig.subplots(heads, len(layers), squeeze=False)
    for c, layer in enumerate(layers):
        lf = fields[layer]
        ey, ex = lf.extent
        extent = (-ex - 0.5, ex + 0.5, ey + 0.5, -ey - 0.5)
        for h in range(heads):
            ax = axes[h, c]
            d = lf.density[h].numpy()
            ax.imshow(d / max(d.max(), 1e-30), cmap=FIELD_CMAP, extent=extent, interpolation="bilinear", vmin=0)
            look = -lf.mu[h].numpy()  # an atom with centre μ looks at offset −μ (query − key convention)
            lam = lf.lam[h].numpy()
            brightness = 0.25 + 0.75 * lam / max(lam.max(), 1e-12)
            ax.scatter(
                look[:, 1], look[:, 0], marker="+", s=60, linewidths=1.6, c=[(1, 1, 1, b) for b in brightness], zorder=4
            )
            _star(ax, 0, 0, size=90)
            ax.set_xlim(-vx, vx)
            ax.set_ylim(vy, -vy)
            _no_ticks(ax)
            ax.text(
                0.03,
                0.03,
                panel_text[layer][h] if panel_text else f"H={lf.entropy[h]:.2f} r={lf.radius[h]:.1f}",
                transform=ax.transAxes,
                fontsize=6.5,
                color="white",
                va="bottom",
                bbox=dict(boxstyle="round,pad=0.15", fc="black", alpha=0.45, lw=0),
            )
            if c == 0:
                ax.set_ylabel(f"head {h}", fontsize=9)
            if h == 0:
                column = f"layer {layer}" if panel_text else f"layer {layer}\n{gate_text(lf)}"
                ax.set_title(column, fontsize=8, linespacing=1.15)
    _scale_bar(fig, list(axes.ravel()), FIELD_CMAP, 0.0, 1.0, "weight ÷ the panel's peak")
    legend = (
        f"λ-weighted density over key offset, panels ±{vy:g} × ±{vx:g} cells (per panel normalised); "
        "+ atom centres (brightness = λ); ★ query. "
        + (
            legend
            or "H = attention entropy (nats), r = effective radius (cells); s(·) = gate scale of each content tap."
        )
    )
    suptitle(fig, title, legend)
    return fig


def gates_figure(fields: Sequence[LayerField], init: float, title: str = "") -> Figure:
    """Gate scale of each tap vs layer, with the initial value dashed."""
    fig = new_figure(6.0, 3.4)
    ax = fig.subplots()
    layers = np.arange(len(fields))
    for tap, marker in zip(("mu", "sigma", "lambda"), ("o", "s", "^"), strict=True):
        if all(tap in lf.gates for lf in fields) and len(fields):
            ax.plot(layers, [lf.gates[tap] for lf in fields], marker=marker, label=TAP_LABELS[tap])
    ax.axhline(init, ls="--", c="gray", lw=1, label=f"initial value ({init:.2g})")
    ax.set_xlabel("layer")
    ax.set_ylabel("gate scale s")
    ax.set_xticks(layers)
    ax.legend(fontsize=8, frameon=False)
    ax.grid(alpha=0.3)
    ax.set_title(title or "Learned gate scales (all start at the dashed value)", fontsize=10)
    return fig


# --------------------------------------------------------------------------------------- playground


def playground_figure(spec: HeadSpec, view: HeadView, image: Image.Image | None = None, title: str = "") -> Figure:
    """One head over a picture: the field, μ arrows from ★ to each atom, σ ellipses, λ labels."""
    gh, gw = spec.grid
    fig = new_figure(5.6, 5.6 * gh / gw + 0.7)
    ax = fig.subplots()
    extent = (-0.5, gw - 0.5, gh - 0.5, -0.5)
    d = view.density.numpy()
    if image is not None:
        ax.imshow(np.asarray(image.resize((gw * 16, gh * 16))), extent=extent)
        ax.imshow(density_rgba(d), extent=extent, interpolation="bilinear")
    else:
        ax.imshow(d, cmap=FIELD_CMAP, extent=extent, interpolation="nearest")
    qy, qx = spec.query
    for a, lam, wd in zip(spec.atoms, view.lam.numpy(), view.width.numpy(), strict=True):
        ax.annotate(
            "",
            xy=(a.x, a.y),
            xytext=(qx, qy),
            arrowprops=dict(arrowstyle="-|>", color="white", lw=1.6, shrinkA=6, shrinkB=2),
        )
        ax.add_patch(Ellipse((a.x, a.y), 2 * wd[1], 2 * wd[0], fill=False, ls="--", lw=1.3, ec="white"))
        ax.text(
            a.x + wd[1] * 0.75 + 0.3,
            a.y - wd[0] * 0.75,
            f"λ={lam:.2f}",
            color="white",
            fontsize=9,
            fontweight="bold",
            path_effects=_outline(),
        )
    _star(ax, qy, qx, size=260)
    ax.set_xlim(-0.5, gw - 0.5)
    ax.set_ylim(gh - 0.5, -0.5)
    _no_ticks(ax)
    ax.set_title(
        title
        or f"{len(spec.atoms)} atoms = {5 * len(spec.atoms)} numbers · τ={spec.tau:.2f} · "
        f"H={view.entropy:.2f} nats · r={view.radius:.1f} cells",
        fontsize=9,
    )
    return fig


def _outline():
    from matplotlib import patheffects

    return [patheffects.withStroke(linewidth=2.2, foreground="black")]


# --------------------------------------------------------------------------------------- steering


def offset_magnitude(offsets: SteeringOffsets, layer: int, image_index: int = 0) -> np.ndarray:
    """``(H, Gh, Gw)`` length of the λ-weighted shift of where each head looks, in grid cells."""
    return np.linalg.norm(offsets.shift[layer][image_index].permute(2, 0, 1, 3).numpy(), axis=-1)


def steering_summary(
    offsets: SteeringOffsets, layer: int, fixed_lam: np.ndarray | None = None, image_index: int = 0
) -> dict[str, np.ndarray]:
    """Per head ``(H, Gh, Gw)`` what content did at each query: ``mu`` = |λ-weighted shift| of where the head
    looks (cells); ``sigma`` = mean log₂ of the σ ratio over axes, λ-weighted over atoms when the fixed ``(H, R)``
    λ is given (+1 = twice as wide, −1 = half as wide); ``lambda`` = share of the head's weight moved between
    its atoms, ½·Σ_r |Δλ_r| (0 = none, 1 = all)."""
    dlam = offsets.dlam[layer][image_index].numpy()  # (Gh, Gw, H, R)
    log_ratio = np.log2(offsets.sigma_ratio[layer][image_index].numpy()).mean(-1)  # (Gh, Gw, H, R)
    if fixed_lam is None:
        widen = log_ratio.mean(-1)
    else:
        widen = (np.clip(np.asarray(fixed_lam) + dlam, 0, None) * log_ratio).sum(-1)
    return {
        "mu": offset_magnitude(offsets, layer, image_index),
        "sigma": widen.transpose(2, 0, 1),
        "lambda": 0.5 * np.abs(dlam).sum(-1).transpose(2, 0, 1),
    }


def steering_figure(
    image: Image.Image,
    offsets: SteeringOffsets,
    layer: int,
    bound: float | None,
    title: str = "",
    fixed_lam: np.ndarray | None = None,
    taps: Sequence[str] = ("mu", "sigma", "lambda"),
) -> Figure:
    """One layer, one column per head, one row per content tap the layer steers (``taps``): μδ (where the head looks
    moves; arrows scaled to stay inside a cell, with a key giving their length in cells), σδ (widen / tighten) and λ
    (re-weighting). Each row has one colour scale for all heads. ``bound`` is the layer's per-axis limit on an
    atom's μδ, ``s_μ·M`` (None when μ is not steered)."""
    summary = steering_summary(offsets, layer, fixed_lam)
    shift = offsets.shift[layer][0].numpy()  # (Gh, Gw, H, 2), key-space direction (dy, dx)
    heads, gh, gw = summary["mu"].shape
    shown = [t for t in ("mu", "sigma", "lambda") if t in taps]
    if not shown:
        raise ValueError("steering_figure needs at least one steered tap")
    fig = new_figure(2.6 * heads + 1.2, len(shown) * 2.4 * gh / gw + 1.5)
    fig.get_layout_engine().set(rect=(0, 0.04, 1, 0.96))  # a bottom margin for the arrow key
    axes = fig.subplots(len(shown), heads, squeeze=False)
    faded = backdrop(image, 260, 0.55)
    yy, xx = np.mgrid[0:gh, 0:gw]
    longest = max(float(summary["mu"].max()), 1e-9)
    scale = longest / 0.9  # the longest arrow spans 0.9 of a cell: arrows never cross their neighbours
    ref = float(f"{longest:.1g}")  # a round scale length for the key
    lim_sigma = symmetric_limit(summary["sigma"])
    rows = [
        ("mu", OFFSET_CMAP, 0.0, longest, "|μδ| (cells)"),
        ("sigma", "PuOr_r", -lim_sigma, lim_sigma, "σδ: log₂ σ ratio\n(+ wider, − tighter)"),
        ("lambda", "Greens", 0.0, max(float(summary["lambda"].max()), 1e-9), "λ moved between atoms (share)"),
    ]
    rows = [row for row in rows if row[0] in shown]
    for r, (key, cmap, lo, hi, label) in enumerate(rows):
        for h in range(heads):
            ax = axes[r, h]
            im = _show_map(ax, faded, summary[key][h], cmap, lo, hi, alpha=0.7)
            peak = float(np.abs(summary[key][h]).max())
            ax.set_title(f"head {h}: max {peak:.2f}", fontsize=8)
            if key == "mu":
                q = ax.quiver(xx, yy, shift[..., h, 1], shift[..., h, 0], color="white", angles="xy",
                              scale_units="xy", scale=scale, width=0.007, headwidth=4, alpha=0.95)  # fmt: skip
                if h == 0:  # in the figure's bottom margin: below a panel it covered the next row's title
                    ax.quiverkey(q, 0.02, 0.012, ref, f"arrow key: = {ref:g} cells", labelpos="E",
                                 coordinates="figure", color="black", fontproperties={"size": 7})  # fmt: skip
            if h == 0:
                ax.set_ylabel({"mu": "μδ: looks elsewhere", "sigma": "σδ: widen / tighten",
                               "lambda": "λ: re-weighting"}[key], fontsize=8)  # fmt: skip
        _colorbar(fig, im, list(axes[r]), label)
    bound_text = (
        f"μδ bound per atom: ±{bound:.2f} cells per axis (s_μ·M), so up to {bound * math.sqrt(2):.2f} cells diagonally"
        if bound is not None
        else "μ is not steered in this layer"
    )
    suptitle(
        fig,
        title,
        f"layer {layer}: what content changes at each query patch, per head (λ-weighted over atoms). "
        f"Arrows: where the head's gaze moves, scaled so the longest spans 0.9 cell (key at the bottom left). "
        f"{bound_text}.",
    )
    return fig


def query_field_figure(
    image: Image.Image,
    fixed: np.ndarray | None,
    steered: np.ndarray,
    query: tuple[int, int],
    layer: int,
    title: str = "",
) -> Figure:
    """One query's attention per head (``(H, Gh, Gw)`` each) over the image: the fixed field above the
    steered one, or only the content attention for models without a field (``fixed=None``); every panel is
    coloured from 0 to its own peak, which its title gives."""
    heads, gh, gw = steered.shape
    rows = [("attention", steered)] if fixed is None else [("fixed field", fixed), ("steered by content", steered)]
    fig = new_figure(2.6 * heads + 0.6, 2.5 * len(rows) * gh / gw + 0.9)
    axes = fig.subplots(len(rows), heads, squeeze=False)
    faded = backdrop(image, 260, 0.45)
    extent = (-0.5, gw - 0.5, gh - 0.5, -0.5)
    for r, (name, maps) in enumerate(rows):
        for h in range(heads):
            ax = axes[r, h]
            ax.imshow(faded, extent=extent, interpolation="nearest")
            # each panel on its own scale: on a shared one a fixed field's peak of 0.02 vanished beside 0.8
            ax.imshow(density_rgba(maps[h]), extent=extent, interpolation="nearest")
            _star(ax, query[0], query[1], size=120, color="cyan")
            ax.set_xlim(-0.5, gw - 0.5)
            ax.set_ylim(gh - 0.5, -0.5)
            _no_ticks(ax)
            ax.set_title(f"head {h} · {name}\npeak {maps[h].max():.2f}", fontsize=8)
    _scale_bar(fig, list(axes.ravel()), OVERLAY_CMAP, 0.0, 1.0, "weight / the panel's peak")
    suptitle(
        fig,
        title,
        f"layer {layer}: attention of query patch ★ {query} (row of the exact matrix); each panel on its own "
        "scale, 0 … its peak (in its title)",
    )
    return fig


def attention_grid_figure(image: Image.Image, rows: np.ndarray, query: tuple[int, int], title: str = "") -> Figure:
    """Layers × heads grid of one query's attention (``rows``: ``(L, H, Gh, Gw)``), for models without a field."""
    layers, heads, gh, gw = rows.shape
    fig = new_figure(1.9 * layers + 0.8, 1.9 * heads * gh / gw + 1.2)
    axes = fig.subplots(heads, layers, squeeze=False)
    faded = backdrop(image, 190, 0.45)
    extent = (-0.5, gw - 0.5, gh - 0.5, -0.5)
    for l in range(layers):
        for h in range(heads):
            ax = axes[h, l]
            ax.imshow(faded, extent=extent, interpolation="nearest")
            ax.imshow(density_rgba(rows[l, h]), extent=extent, interpolation="nearest")
            _star(ax, query[0], query[1], size=70, color="cyan")
            ax.set_xlim(-0.5, gw - 0.5)
            ax.set_ylim(gh - 0.5, -0.5)
            _no_ticks(ax)
            if h == 0:
                ax.set_title(f"layer {l}", fontsize=8)
            if l == 0:
                ax.set_ylabel(f"head {h}", fontsize=9)
    suptitle(fig, title, f"attention of query patch ★ {query} per layer × head")
    return fig


# --------------------------------------------------------------------------------------- export maps


def _mark_cell(ax, cell: tuple[int, int] | None, grid: tuple[int, int]) -> None:
    """A yellow square around ``cell`` (a query patch carried over from another view), when it is on ``grid``."""
    if cell is not None and 0 <= cell[0] < grid[0] and 0 <= cell[1] < grid[1]:
        ax.add_patch(Rectangle((cell[1] - 0.5, cell[0] - 0.5), 1, 1, fill=False, ec="#ffd400", lw=1.6, zorder=6))


def export_maps_figure(
    image: Image.Image,
    models: Sequence[tuple[str, ExportMaps]],
    layer: int,
    title: str = "",
    query: tuple[int, int] | None = None,
    narrow: bool = False,
) -> Figure:
    """Per model (a block of rows): the input, layer ``layer``'s pull-in / pull-out / net export, the accumulated
    net export with its range and exporter share, and attention rollout; below, net export of every layer on
    one shared colour scale (six panels per row). ``query`` (a patch picked in the Steering view) is outlined
    on every map. ``narrow`` (a phone's width): the six panels in three rows of two and no all-layer strip, so
    that each panel stays readable: one layer at a time."""
    depth = max(m.net.shape[1] for _, m in models)
    strip_rows = 0 if narrow else math.ceil(depth / 6)
    block_height = 3 * 2.6 if narrow else 2.7 + 2.35 * strip_rows
    fig = new_figure(6.4 if narrow else 15.0, block_height * len(models) + 0.8)
    blocks = np.atleast_1d(fig.subfigures(len(models), 1))
    img = backdrop(image, 230)
    for block, (label, m) in zip(blocks, models, strict=True):
        l = min(layer, m.net.shape[1] - 1)
        pin, pout, net = (x[0, l].numpy() for x in (m.pull_in, m.pull_out, m.net))
        acc, roll = m.accumulated[0].numpy(), m.rollout[0].numpy()
        s = m.summary()
        if narrow:
            top, bottom = block, None
            axes = top.subplots(3, 2).ravel()
        else:
            top, bottom = block.subfigures(2, 1, height_ratios=[2.7, 2.35 * strip_rows])
            axes = top.subplots(1, 6)
        axes[0].imshow(img, interpolation="nearest")
        _no_ticks(axes[0])
        axes[0].set_title(f"{label}\ninput", fontsize=8, fontweight="bold")
        acc_title = (
            f"accumulated net export\n[{s['acc_min']:.2f}, {s['acc_max']:.2f}] · {s['exporter_share']:.0%} export"
        )
        panels = [
            (pin, PULL_IN_CMAP, False, f"layer {l} pull-in\n(reads from others)", "share"),
            (pout, PULL_OUT_CMAP, False, f"layer {l} pull-out\n(read by others)", "share"),
            (net, NET_CMAP, True, f"layer {l} net export\nred source · blue gatherer", "net"),
            (acc, NET_CMAP, True, acc_title, "Σ net"),
            (roll, "viridis", False, "attention rollout\n(share of pooled output)", "share"),
        ]
        lim = symmetric_limit(m.net[0].numpy())  # one scale for every layer's net export, in both rows
        share = max(float(pin.max()), float(pout.max()), 1e-12)  # pull-in and pull-out: one quantity, one scale
        limits = [share, share, lim, symmetric_limit(acc), max(float(roll.max()), 1e-12)]
        for ax, (a, cmap, centred, name, unit), hi in zip(axes[1:], panels, limits, strict=True):
            im = _show_map(ax, img, a, cmap, -hi if centred else 0.0, hi)
            _mark_cell(ax, query, m.grid)
            ax.set_title(name, fontsize=8)
            _colorbar(top, im, ax, unit)
        if bottom is None:
            continue
        strip = np.atleast_1d(bottom.subplots(strip_rows, 6, squeeze=False)).ravel()
        for k, ax in enumerate(strip):
            if k >= m.net.shape[1]:
                ax.axis("off")
                continue
            im = _show_map(ax, img, m.net[0, k].numpy(), NET_CMAP, -lim, lim)
            _mark_cell(ax, query, m.grid)
            ax.set_title(f"{label}: net, layer {k}", fontsize=8)
        _colorbar(bottom, im, list(strip[: m.net.shape[1]]), "net export (shared scale)")
    suptitle(fig, title, f"Export maps with residual mixing Â = α·Ā + (1−α)·I, α = {models[0][1].alpha:.2f}", 10)
    return fig


def compare_figure(
    image: Image.Image, a: tuple[str, ExportMaps], b: tuple[str, ExportMaps], layer: int, title: str = ""
) -> Figure:
    """Two models on one image: net export of ``layer`` and accumulated, side by side (one colour scale per
    model and map), with A − B when both see the same patch grid; on different grids each map keeps its own."""
    (la, ma), (lb, mb) = a, b
    same = ma.grid == mb.grid
    cols = 3 if same else 2
    fig = new_figure(4.0 * cols, 6.4)
    axes = fig.subplots(2, cols)
    img = backdrop(image, 320)
    rows = [
        (
            f"layer {layer} net export",
            ma.net[0, min(layer, ma.net.shape[1] - 1)].numpy(),
            mb.net[0, min(layer, mb.net.shape[1] - 1)].numpy(),
        ),
        ("accumulated net export", ma.accumulated[0].numpy(), mb.accumulated[0].numpy()),
    ]
    for r, (name, xa, xb) in enumerate(rows):
        panels = [(xa, f"{la} ({ma.grid[0]}×{ma.grid[1]})", symmetric_limit(xa)),
                  (xb, f"{lb} ({mb.grid[0]}×{mb.grid[1]})", symmetric_limit(xb))]  # fmt: skip
        if same:
            diff = xa - xb
            panels.append((diff, f"A − B ({la} − {lb})", symmetric_limit(diff)))
        for c, (arr, lab, lim_c) in enumerate(panels):
            ax = axes[r, c]
            im = _show_map(ax, img, arr, NET_CMAP, -lim_c, lim_c)
            ax.set_title(f"{name}\n{lab}", fontsize=8)
            _colorbar(fig, im, ax, "difference" if c == 2 else "net export")
    # a shared scale let one model's extreme patch (a dot model's attention sink) grey out the other's map
    legend = "Two checkpoints on the same image, each map on its own colour scale (its bar beside it)"
    if not same:
        legend += "; no A − B map: the two see different patch grids, and a difference needs equal grids"
    suptitle(fig, title, legend, 10)
    return fig


def control_figure(
    image: Image.Image,
    models: Sequence[tuple[str, ExportMaps, ControlMaps]],
    title: str = "",
    pictures: str | None = None,
) -> Figure:
    """Per model a row: the accumulated net export raw, its control and raw − control, then the same for
    attention rollout. Raw and control share a colour scale, so they compare by eye; a difference has its own,
    centred on 0. The control panels are drawn without the picture: the control is not this image. ``pictures``:
    the validation control's images in words, where they were chosen in place of the validation set."""
    fig = new_figure(15.0, 2.9 * len(models) + 1.0)
    rows = np.atleast_2d(fig.subplots(len(models), 6))
    img = backdrop(image, 230)
    for axes, (label, m, c) in zip(rows, models, strict=True):
        acc, acc_c = m.accumulated[0].numpy(), c.accumulated[0].numpy()
        roll, roll_c = m.rollout[0].numpy(), c.rollout[0].numpy()
        lim, top = symmetric_limit(acc, acc_c), max(float(roll.max()), float(roll_c.max()), 1e-12)
        d_acc, d_roll = acc - acc_c, roll - roll_c
        panels = [
            (img, acc, NET_CMAP, -lim, lim, f"{label}\naccumulated net: raw", "Σ net"),
            (None, acc_c, NET_CMAP, -lim, lim, "accumulated net: control", "Σ net"),
            (img, d_acc, NET_CMAP, -symmetric_limit(d_acc), symmetric_limit(d_acc), "accumulated: raw − control",
             "difference"),
            (img, roll, "viridis", 0.0, top, "rollout: raw", "share"),
            (None, roll_c, "viridis", 0.0, top, "rollout: control", "share"),
            (img, d_roll, NET_CMAP, -symmetric_limit(d_roll), symmetric_limit(d_roll), "rollout: raw − control",
             "difference"),
        ]  # fmt: skip
        for k, (ax, (under, a, cmap, lo, hi, name, unit)) in enumerate(zip(axes, panels, strict=True)):
            im = _show_map(ax, under, a, cmap, lo, hi)
            ax.set_title(name, fontsize=8)
            if k % 3:  # one colour bar for raw and control (one scale), one for the difference
                _colorbar(fig, im, list(axes[k - 1 : k + 1]) if k % 3 == 1 else ax, unit)
        if c.noise is not None:  # cells whose difference the blank's own colour noise could make
            ys, xs = np.nonzero(np.abs(d_acc) <= c.noise[0].numpy())
            axes[2].scatter(xs, ys, marker="x", s=12, c="0.25", linewidths=0.7, zorder=4)
    c = models[0][2]
    legend = (
        f"Control: {describe(c.control, c.images, pictures)}, α = {models[0][1].alpha:.2f}. Raw and control share "
        "one colour scale; each difference (raw − control: what this image changes) has its own, centred on 0."
    )
    if c.noise is not None:
        legend += (
            " × marks cells of the accumulated difference within the blank's noise floor (the spread of its map over "
            "mean colours within ±1/255 per channel)."
        )
    suptitle(fig, title, legend, 10)
    return fig


def class_maps_figure(label: str, c: ClassMaps, title: str = "", pictures: str | None = None) -> Figure:
    """One column per class: the mean accumulated net export over its validation images, and below it the mean
    against the control. One colour scale per row, centred on 0. ``pictures``: the images in words, where they
    were chosen in place of the validation set."""
    rows = [("raw", c.raw.numpy())] + ([] if c.difference is None else [("raw − control", c.difference.numpy())])
    classes = len(c.class_names)
    fig = new_figure(1.55 * classes + 1.2, 1.9 * len(rows) + 1.1)
    axes = np.atleast_2d(fig.subplots(len(rows), classes, squeeze=False))
    for r, (what, maps) in enumerate(rows):
        lim = symmetric_limit(maps)
        for k, ax in enumerate(axes[r]):
            im = _show_map(ax, None, maps[k], NET_CMAP, -lim, lim)
            ax.set_title(f"{c.class_names[k]} (n={int(c.counts[k])})" if r == 0 else "", fontsize=7)
            if k == 0:
                ax.set_ylabel(what, fontsize=8)
        _colorbar(fig, im, list(axes[r]), "Σ net")
    n = int(c.counts.sum())
    legend = f"{label}: mean accumulated net export per class over {pictures or f'{n} validation images'}, "
    legend += f"α = {c.alpha:.2f}; control: {describe(c.control, n, pictures)}"
    suptitle(fig, title, legend, 9)
    return fig


# --------------------------------------------------------------------------------------- target share

# the pointed disc's outline: solid white on black, seen on every disc colour and background; the other two: dashed
POINTED = dict(color="white", lw=2.4, ls="solid", path_effects=[patheffects.withStroke(linewidth=4.4, foreground="k")])
OTHERS = dict(color="white", lw=1.3, ls="dashed")


def target_share_figure(
    image: np.ndarray,
    discs: np.ndarray,
    shares: Sequence[float],
    closed: Sequence[float] | None,
    label: str,
    chance: float,
    title: str = "",
) -> Figure:
    """A ``pointer`` scene (``(H, W, 3)``) with its three discs outlined where their coverage ``(3, H, W)`` is half
    (the pointed one first: highlighted, the others dashed) beside its target share per layer, and with every μ gate
    closed (``closed``, when the model steers μ) beside it; the dashed line is ``chance`` (not told apart)."""
    fig = new_figure(8.4, 3.8)
    pic, bars = fig.subplots(1, 2, width_ratios=[1, 1.35])
    h, w = image.shape[:2]
    pic.imshow(image, extent=(-0.5, w - 0.5, h - 0.5, -0.5), interpolation="nearest")
    for d in range(len(discs) - 1, -1, -1):  # the pointed disc's outline on top
        style = POINTED if d == 0 else OTHERS
        contour = pic.contour(discs[d], levels=[0.5], colors=[style["color"]], linewidths=style["lw"],
                              linestyles=style["ls"], zorder=4)  # fmt: skip
        contour.set(path_effects=style.get("path_effects", []))
    pic.plot([], [], **POINTED, label=f"pointed at ({label})")
    pic.plot([], [], **{**OTHERS, "color": "0.4"}, label="the other two")
    pic.legend(loc="upper center", bbox_to_anchor=(0.5, -0.02), ncol=2, fontsize=8, frameon=False)
    pic.set_xlim(-0.5, w - 0.5)
    pic.set_ylim(h - 0.5, -0.5)
    _no_ticks(pic)
    layers = np.arange(len(shares))
    rows = [("unedited", shares, "C0")] + ([] if closed is None else [("μ gates closed", closed, "0.6")])
    width = 0.8 / len(rows)
    for k, (name, values, colour) in enumerate(rows):
        x = layers + (k - (len(rows) - 1) / 2) * width
        drawn = bars.bar(x, values, width, color=colour, label=name)
        bars.bar_label(drawn, [f"{v:.2f}" for v in values], fontsize=7, padding=1)
    bars.axhline(chance, color="0.2", ls="--", lw=1, label=f"{chance:.2f}: not told apart")
    bars.set_xticks(layers, [f"layer {i}" for i in layers], fontsize=8)
    bars.set_ylim(0, 1.08)
    bars.set_ylabel("attention on the pointed disc / on all three", fontsize=8)
    bars.tick_params(axis="y", labelsize=7)
    bars.legend(fontsize=7, loc="upper left", frameon=False)
    bars.set_title("this image, per layer", fontsize=9)
    suptitle(fig, title, "the share of the attention patch queries put on the three discs that lands on the pointed "
             "one, every head pooled", 9)  # fmt: skip
    return fig


# --------------------------------------------------------------------------------------- distilled students

DISTILL_MARKS = (  # (report key, offset within a layer, style): geometry alone, then geometry that content steers
    ("fit", -0.15, {"color": "tab:orange", "marker": "o", "label": "fitted field (geometry)"}),
    ("steered", 0.15, {"color": "tab:green", "marker": "^", "label": "student (geometry + steering)"}),
)


def distill_figure(report: Mapping[str, Any], title: str) -> Figure:
    """A distillation report (``python -m ssog_core distill``'s JSON, :func:`ssog_core.distill.report.report_json`)
    per head against its layer: the share of the teacher's head its fitted field and the steered student explain,
    with the uniform field's share (the baseline), and both normalised against it (diffuse heads left out of the
    right panel); agreement and KL at step 0 and at the end in the title."""
    fig = new_figure(9.6, 4.0)
    raw, norm = fig.subplots(1, 2)
    heads = list(report["heads"])
    per_layer = max((h["head"] for h in heads), default=0) + 1
    layers = max((h["layer"] for h in heads), default=0) + 1

    def x(chosen: Sequence[Mapping[str, Any]], offset: float) -> list[float]:
        return [h["layer"] + offset + 0.2 * (h["head"] / max(per_layer - 1, 1) - 0.5) for h in chosen]

    shaped = [h for h in heads if not h["diffuse"]]
    for key, offset, style in DISTILL_MARKS:
        raw.scatter(x(heads, offset), [h[f"share_{key}"] for h in heads], s=16, **style)
        norm.scatter(x(shaped, offset), [h[f"normalised_{key}"] for h in shaped], s=16, **style)
    raw.scatter(x(heads, 0.0), [h["share_uniform"] for h in heads], s=14, color="0.45", marker="_",
                label="uniform field (baseline)")  # fmt: skip
    norm.axhline(0.0, color="0.45", lw=0.8, label="uniform field (baseline)")
    diffuse = len(heads) - len(shaped)
    for ax, label, what in (
        (raw, "share of the teacher's head (1 − mean TV)", "shares"),
        (norm, "normalised share (0: uniform, 1: the head)", f"normalised ({diffuse} diffuse left out)"),
    ):
        ax.set_xlabel("layer (0-based)")
        ax.set_ylabel(label, fontsize=8)
        ax.set_xticks(range(layers))
        ax.grid(alpha=0.3)
        ax.set_title(what, fontsize=9)
        ax.legend(loc="lower left", fontsize=7)
    a0, a1 = report["step0"], report["final"]
    fig.suptitle(
        f"{title}\nagreement {a0['agreement']:.3f} → {a1['agreement']:.3f}, KL {a0['kl']:.4f} → {a1['kl']:.4f} "
        f"(step 0 → {report['step']}, {report['held_out_images']} held-out pictures)",
        fontsize=9,
    )
    return fig
