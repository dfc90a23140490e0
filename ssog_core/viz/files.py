"""Figure files: the app's figures and raw numbers as ``{file name: content}`` (PNG and SVG with their settings
in the file name and the file's metadata, raw arrays as ``.npz`` with a ``settings`` entry and CSV).

The app's download buttons and the headless CLI (:mod:`ssog_core.cli.figures`) both call these builders, so a
downloaded figure and a scripted one are the same file.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from ssog_core.analysis import report
from ssog_core.analysis.controls import ControlMaps, differences
from ssog_core.analysis.head_spec import HeadSpec, evaluate
from ssog_core.analysis.measures import (
    ExportMaps,
    LayerField,
    SteeringOffsets,
)
from ssog_core.viz import figures as viz

Files = dict[str, bytes | str]
DISPLAY_WIDTH = 448  # px of the picture behind steering maps
EXPORT_WIDTH = 320  # px of the picture behind export maps (many small panels)


def stem_of(checkpoint: str) -> str:
    return Path(checkpoint).name.removesuffix(".safetensors")


def _figure_files(fig, stem: str, settings: Mapping[str, Any]) -> Files:
    return {
        f"{stem}.png": viz.figure_bytes(fig, "png", settings),
        f"{stem}.svg": viz.figure_bytes(fig, "svg", settings),
    }


def geometry_files(checkpoint: str, fields: Sequence[LayerField], init_gate: float, title: str = "") -> Files:
    """Layers × heads geometry and gate scales (PNG + SVG) and the atom table (CSV)."""
    settings = {"figure": "geometry", "checkpoint": checkpoint, "colormap": viz.FIELD_CMAP}
    stem = viz.safe_token(f"geometry_{stem_of(checkpoint)}")
    files = _figure_files(viz.geometry_figure(fields, title or checkpoint), stem, settings)
    gates = viz.gates_figure(fields, init_gate, f"Gate scales of {title or checkpoint}")
    files |= _figure_files(gates, f"{stem}_gates", {**settings, "figure": "gates"})
    files[f"{stem}_atoms.csv"] = report.atoms_csv(fields, settings)
    return files


def query_rows(attn: Sequence, grid: tuple[int, int], layer: int, query: tuple[int, int]) -> np.ndarray:
    """``(H, Gh, Gw)`` row of one query in layer ``layer`` of per-layer ``(1, H, N, N)`` attention matrices."""
    gh, gw = grid
    return attn[layer][0, :, query[0] * gw + query[1]].reshape(-1, gh, gw).numpy()


def steering_files(
    checkpoint: str,
    display: Image.Image,
    layer: int,
    settings: Mapping[str, Any],
    offsets: SteeringOffsets | None = None,
    field: LayerField | None = None,
    max_offset: float = 4.0,
    query: tuple[int, int] | None = None,
    fixed_row: np.ndarray | None = None,
    steered_row: np.ndarray | None = None,
    title: str = "",
) -> Files:
    """μδ / σδ / λ steering maps (SSOG only; ``field`` = the layer's learned field, for its gate bound and λ)
    and one query's field, fixed vs steered (PNG + SVG + .npz)."""
    sha = str(settings.get("image_sha256", ""))[:8]
    stem = viz.safe_token(f"steering_{stem_of(checkpoint)}_{sha}_L{layer}")
    files: Files = {}
    if offsets is not None:
        meta = {**settings, "figure": "steering", "layer": layer, "colormap": viz.OFFSET_CMAP}
        files |= _figure_files(steering_figure(display, offsets, layer, field, max_offset, title), stem, meta)
        files[f"{stem}_offsets.npz"] = report.npz_bytes(report.steering_arrays(offsets), meta)
    if query is not None and steered_row is not None:
        meta = {**settings, "figure": "query field", "layer": layer, "query": list(query)}
        qstem = f"{stem}_q{query[0]}-{query[1]}"
        fig = viz.query_field_figure(display, fixed_row, steered_row, query, layer, title)
        files |= _figure_files(fig, qstem, meta)
        arrays = {"steered": steered_row} if fixed_row is None else {"fixed": fixed_row, "steered": steered_row}
        files[f"{qstem}.npz"] = report.npz_bytes(arrays, meta)
    return files


def mu_bound(field: LayerField | None, max_offset: float) -> float | None:
    """The layer's per-axis limit on an atom's μδ, ``s_μ·M`` (None when content does not steer μ)."""
    return field.gates["mu"] * max_offset if field is not None and "mu" in field.gates else None


def steering_figure(
    display: Image.Image,
    offsets: SteeringOffsets,
    layer: int,
    field: LayerField | None,
    max_offset: float,
    title: str = "",
):
    """The steering figure exactly as the app shows it: a row for each tap the layer steers."""
    lam = field.lam.numpy() if field is not None else None
    taps = tuple(field.gates) if field is not None and field.gates else ("mu", "sigma", "lambda")
    return viz.steering_figure(display, offsets, layer, mu_bound(field, max_offset), title, lam, taps)


def named_export_maps_figure(
    models: Sequence[tuple[str, ExportMaps]],
    display: Image.Image,
    layer: int,
    image_name: str | None = None,
    query: tuple[int, int] | None = None,
    narrow: bool = False,
):
    """The export-maps figure exactly as the app shows it: ``models`` are ``(checkpoint file name, maps)``,
    labelled without the suffix, and the image's name goes in the title (drawn by :func:`viz.export_maps_figure`)."""
    title = f"on {image_name}" if image_name else ""
    return viz.export_maps_figure(display, [(stem_of(n), m) for n, m in models], layer, title, query, narrow)


def compare_figure(
    a: tuple[str, ExportMaps],
    b: tuple[str, ExportMaps],
    display: Image.Image,
    layer: int,
    image_name: str | None = None,
):
    """The comparison figure exactly as the app shows it (A − B only when both see the same patch grid)."""
    (na, ma), (nb, mb) = a, b
    title = f"on {image_name}" if image_name else ""
    return viz.compare_figure(display, (f"A: {stem_of(na)}", ma), (f"B: {stem_of(nb)}", mb), layer, title)


def export_files(
    models: Sequence[tuple[str, ExportMaps]],
    display: Image.Image,
    layer: int,
    settings: Mapping[str, Any],
    query: tuple[int, int] | None = None,
    controls: Sequence[ControlMaps] | None = None,
) -> Files:
    """The export-maps figure of one or more checkpoints (PNG + SVG, ``query`` outlined) and each one's raw maps
    (.npz + CSV); with ``controls`` (one per model) also the figure against the control, and in each .npz the
    control's maps and raw − control; ``settings["control_pictures"]``, where given, names the validation control's
    chosen pictures in its figure."""
    alpha = models[0][1].alpha
    sha = str(settings.get("image_sha256", ""))[:8]
    names = "+".join(stem_of(n) for n, _ in models)
    depth = max(m.net.shape[1] for _, m in models)
    layer = min(layer, depth - 1)
    meta = {**settings, "figure": "export maps", "checkpoints": [n for n, _ in models], "alpha": alpha,
            "layer": layer, "colormap": viz.NET_CMAP}  # fmt: skip
    stem = viz.safe_token(f"export_{names}_{sha}_L{layer}_alpha{alpha:.2f}_{viz.NET_CMAP}")
    if query is not None:
        meta["query"] = list(query)
    fig = named_export_maps_figure(models, display, layer, settings.get("image"), query)
    files = _figure_files(fig, stem, meta)
    if controls:
        meta["control"] = controls[0].control
        rows = [(stem_of(n), m, c) for (n, m), c in zip(models, controls, strict=True)]
        title = f"on {settings['image']}" if settings.get("image") else ""
        cfig = viz.control_figure(display, rows, title, settings.get("control_pictures"))
        files |= _figure_files(cfig, viz.safe_token(f"export_control_{controls[0].control}_{names}_{sha}"), meta)
    for k, (name, m) in enumerate(models):
        one = viz.safe_token(f"export_maps_{stem_of(name)}_{sha}_alpha{alpha:.2f}")
        arrays = report.export_arrays(m)
        if controls:
            c = controls[k]
            arrays |= {"accumulated_control": c.accumulated[0].numpy(), "rollout_control": c.rollout[0].numpy()}
            if c.noise is not None:
                arrays["accumulated_control_noise"] = c.noise[0].numpy()
            arrays |= {key: v[0].numpy() for key, v in differences(m, c).items()}
        files[f"{one}.npz"] = report.npz_bytes(arrays, {**meta, "checkpoint": name})
        files[f"{one}.csv"] = report.maps_csv(m, {**meta, "checkpoint": name})
    return files


def compare_files(
    a: tuple[str, ExportMaps], b: tuple[str, ExportMaps], display: Image.Image, layer: int, settings: Mapping[str, Any]
) -> Files:
    """Two checkpoints' net export (one layer and accumulated) with A − B on a shared grid (PNG + SVG + .npz)."""
    (na, ma), (nb, mb) = a, b
    fig = compare_figure(a, b, display, layer, settings.get("image"))
    depth = min(ma.net.shape[1], mb.net.shape[1])
    layer = min(layer, depth - 1)
    sha = str(settings.get("image_sha256", ""))[:8]
    meta = {**settings, "figure": "compare", "A": na, "B": nb, "alpha": ma.alpha, "layer": layer,
            "colormap": viz.NET_CMAP}  # fmt: skip
    stem = viz.safe_token(f"compare_{stem_of(na)}_vs_{stem_of(nb)}_{sha}_L{layer}_alpha{ma.alpha:.2f}_{viz.NET_CMAP}")
    files = _figure_files(fig, stem, meta)
    arrays = {"A_" + k: v for k, v in report.export_arrays(ma).items()}
    arrays |= {"B_" + k: v for k, v in report.export_arrays(mb).items()}
    if ma.grid == mb.grid:  # a difference is defined cell by cell only on one grid
        arrays["net_difference"] = ma.net[0, :depth].numpy() - mb.net[0, :depth].numpy()
        arrays["accumulated_difference"] = ma.accumulated[0].numpy() - mb.accumulated[0].numpy()
    files[f"{stem}.npz"] = report.npz_bytes(arrays, meta)
    return files


def playground_files(spec: HeadSpec, image: Image.Image | None = None, image_sha: str | None = None) -> Files:
    """One hand-made head (over a picture when given), PNG + SVG, the head itself in the metadata."""
    view = evaluate(spec)
    if image is not None:
        gh, gw = spec.grid
        from PIL import ImageOps

        image = ImageOps.fit(image.convert("RGB"), (gw * 32, gh * 32), Image.Resampling.LANCZOS)
    settings = {"figure": "playground", "head": spec.to_dict(), "image_sha256": image_sha if image else None}
    stem = f"playground_{len(spec.atoms)}atoms_tau{spec.tau:.2f}_grid{spec.grid[0]}x{spec.grid[1]}_{spec.mode}"
    return _figure_files(viz.playground_figure(spec, view, image), stem, settings)


# --------------------------------------------------------------------------------------------- CLI
