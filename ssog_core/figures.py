"""Headless figure export: the app's figures and raw numbers, written by a script.

    python -m ssog_core.figures --checkpoint checkpoints/ssog_layouts.safetensors --image assets/bird.jpg \\
        [--twin checkpoints/dot_layouts.safetensors] [--layer 3] [--alpha 0.5] [--query 4,7] --out-dir figures/
    python -m ssog_core.figures --session ssog_session.json --checkpoint-dir checkpoints --assets-dir assets \\
        --out-dir figures/

Each figure is written as PNG and SVG with its settings (checkpoint, image hash, layer, α, colour map) in
the file name and in the file's metadata; raw arrays go to ``.npz`` (with a ``settings`` entry) and CSV.
The ``*_files`` builders return ``{file name: content}`` and are what the app's download buttons call too,
so a downloaded figure and a scripted one are the same file.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from ssog_core import report, session, viz
from ssog_core.analysis import (
    DEFAULT_ALPHA,
    ExportMaps,
    LayerField,
    SteeringOffsets,
    attention_maps,
    compute_export_maps,
    head_fields,
    steering_offsets,
)
from ssog_core.checkpoint import CheckpointError, load_checkpoint
from ssog_core.controls import ControlMaps, differences
from ssog_core.files import atomic_write
from ssog_core.images import ImageError, list_images, load_image, model_input
from ssog_core.playground import DEFAULT_SPEC, HeadSpec, evaluate

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
    """The steering figure exactly as the app shows it."""
    lam = field.lam.numpy() if field is not None else None
    return viz.steering_figure(display, offsets, layer, mu_bound(field, max_offset), title, lam)


def app_export_maps_figure(
    models: Sequence[tuple[str, ExportMaps]],
    display: Image.Image,
    layer: int,
    image_name: str | None = None,
    query: tuple[int, int] | None = None,
):
    """The export-maps figure exactly as the app shows it: ``models`` are ``(checkpoint file name, maps)``,
    labelled without the suffix, and the image's name goes in the title (drawn by :func:`viz.export_maps_figure`)."""
    title = f"on {image_name}" if image_name else ""
    return viz.export_maps_figure(display, [(stem_of(n), m) for n, m in models], layer, title, query)


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
    control's maps and raw − control."""
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
    fig = app_export_maps_figure(models, display, layer, settings.get("image"), query)
    files = _figure_files(fig, stem, meta)
    if controls:
        meta["control"] = controls[0].control
        rows = [(stem_of(n), m, c) for (n, m), c in zip(models, controls, strict=True)]
        cfig = viz.control_figure(display, rows, f"on {settings['image']}" if settings.get("image") else "")
        files |= _figure_files(cfig, viz.safe_token(f"export_control_{controls[0].control}_{names}_{sha}"), meta)
    for k, (name, m) in enumerate(models):
        one = viz.safe_token(f"export_maps_{stem_of(name)}_{sha}_alpha{alpha:.2f}")
        arrays = report.export_arrays(m)
        if controls:
            c = controls[k]
            arrays |= {"accumulated_control": c.accumulated[0].numpy(), "rollout_control": c.rollout[0].numpy()}
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


def _write(out_dir: Path, files: Files) -> list[Path]:
    paths = []
    for name, content in files.items():
        data = content.encode("utf-8") if isinstance(content, str) else content
        paths.append(atomic_write(out_dir / name, lambda tmp, d=data: Path(tmp).write_bytes(d)))
    return paths


def _find_image(sha: str, folders: Sequence[Path]) -> Path | None:
    for folder in folders:
        if folder.is_dir():
            for p in list_images(folder):
                if hashlib.sha256(p.read_bytes()).hexdigest() == sha:
                    return p
    return None


def run(
    checkpoint: Path,
    out_dir: Path,
    image: Path | None = None,
    twin: Path | None = None,
    layer: int = 0,
    alpha: float = DEFAULT_ALPHA,
    query: tuple[int, int] | None = None,
    head: HeadSpec | None = None,
    underlay: bool = False,
) -> list[Path]:
    """Compute and write every figure that applies to ``checkpoint`` (and ``image``/``twin`` when given)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    model, meta = load_checkpoint(checkpoint)
    name = checkpoint.name
    written: list[Path] = []
    if model.config.attn == "ssog":
        fields = head_fields(model)
        written += _write(out_dir, geometry_files(name, fields, report.initial_gate_scale(model.config), name))
    pil = sha = None
    if image is not None:
        data = image.read_bytes()
        sha = hashlib.sha256(data).hexdigest()
        pil = load_image(data)
        settings = {"checkpoint": name, "image": image.name, "image_sha256": sha}
        x, _ = model_input([pil], model.config.img_size, meta)
        steered = attention_maps(model, x)
        layer = min(layer, len(steered.attn) - 1)
        display = viz.model_view(pil, model.config.img_size, DISPLAY_WIDTH)
        gh, gw = steered.grid
        q = query or ((gh - 1) // 2, (gw - 1) // 2)
        if not (0 <= q[0] < gh and 0 <= q[1] < gw):
            raise ValueError(f"query {q} lies outside the {gh}×{gw} patch grid")
        srow = query_rows(steered.attn, steered.grid, layer, q)
        if model.config.attn == "ssog":
            fixed = attention_maps(model, x, steered=False)
            files = steering_files(name, display, layer, settings, steering_offsets(model, x), fields[layer],
                                   model.config.max_offset, q, query_rows(fixed.attn, fixed.grid, layer, q), srow,
                                   name)  # fmt: skip
        else:
            files = steering_files(name, display, layer, settings, None, None, 0.0, q, None, srow, name)
        written += _write(out_dir, files)
        maps = [(name, compute_export_maps(model, x, alpha))]
        if twin is not None:
            tmodel, tmeta = load_checkpoint(twin)
            tx, _ = model_input([pil], tmodel.config.img_size, tmeta)
            maps.append((twin.name, compute_export_maps(tmodel, tx, alpha)))
        edisplay = viz.model_view(pil, model.config.img_size, EXPORT_WIDTH)
        written += _write(out_dir, export_files(maps, edisplay, layer, settings))
        if twin is not None:
            written += _write(out_dir, compare_files(maps[0], maps[1], edisplay, layer, settings))
    if head is not None:
        written += _write(out_dir, playground_files(head, pil if underlay else None, sha))
    return written


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", type=Path, help="an SSOG Lab .safetensors checkpoint")
    ap.add_argument("--image", type=Path, help="an image for steering and export maps")
    ap.add_argument("--twin", type=Path, help="a second checkpoint to show beside the first and compare")
    ap.add_argument("--layer", type=int, default=0, help="layer for the per-layer panels")
    ap.add_argument("--alpha", type=float, default=DEFAULT_ALPHA, help="residual mixing α in Â = αĀ + (1−α)I")
    ap.add_argument("--query", help="query patch 'row,col' for the query-field figure (default: the centre)")
    ap.add_argument("--session", type=Path, help="a session file saved by the app (restores all of the above)")
    ap.add_argument("--checkpoint-dir", type=Path, default=Path("checkpoints"), help="where session checkpoints live")
    ap.add_argument("--assets-dir", type=Path, default=Path("assets"), help="where to look for a session's image")
    ap.add_argument("--out-dir", type=Path, required=True)
    args = ap.parse_args(argv)
    try:
        ckpt, image, twin, layer, alpha, query = args.checkpoint, args.image, args.twin, args.layer, args.alpha, None
        head, underlay = None, False
        if args.query:
            query = tuple(int(v) for v in args.query.split(","))
            if len(query) != 2:
                raise ValueError("--query takes 'row,col'")
        if args.session:
            s = session.read(args.session)
            ckpt = ckpt or (args.checkpoint_dir / s.checkpoint if s.checkpoint else None)
            head, underlay = s.head, s.image_underlay
            sha = s.image_sha256
            if image is None and sha:
                image = _find_image(sha, [args.assets_dir, *([args.image.parent] if args.image else [])])
                if image is None:
                    print(f"note: the session's image (sha256 {sha[:12]}…) is not in {args.assets_dir}; "
                          "pass it with --image", file=sys.stderr)  # fmt: skip
            layer, alpha = s.export_layer, s.export_alpha
            if twin is None and s.twin:
                twin = args.checkpoint_dir / s.twin
            query = query or s.steering_query
        if ckpt is None:
            if head is None:
                head = DEFAULT_SPEC
            written = _write_only_head(args.out_dir, head)
        else:
            written = run(Path(ckpt), args.out_dir, image, twin, layer, alpha, query, head, underlay)
    except (CheckpointError, ImageError, ValueError, KeyError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for p in written:
        print(p)
    return 0


def _write_only_head(out_dir: Path, head: HeadSpec) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    return _write(out_dir, playground_files(head))


if __name__ == "__main__":
    sys.exit(main())
