"""Headless figure export: the app's figures and raw numbers, written by a script.

    python -m ssog_core figures --checkpoint checkpoints/ssog_layouts.safetensors --image assets/bird.jpg \\
        [--twin checkpoints/dot_layouts.safetensors] [--layer 3] [--alpha 0.5] [--query 4,7] --out-dir figures/
    python -m ssog_core figures --session ssog_session.json --checkpoint-dir checkpoints --assets-dir assets \\
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
from collections.abc import Sequence
from pathlib import Path

from ssog_core.analysis import report, session
from ssog_core.analysis.head_spec import DEFAULT_SPEC, HeadSpec
from ssog_core.analysis.measures import (
    DEFAULT_ALPHA,
    attention_maps,
    export_maps,
    layer_fields,
    steering_offsets,
)
from ssog_core.checkpoint.files import atomic_write
from ssog_core.checkpoint.format import CheckpointError, load_checkpoint
from ssog_core.data.images import ImageError, list_images, load_image, model_input
from ssog_core.field import centre_query
from ssog_core.viz import raster
from ssog_core.viz.files import (
    DISPLAY_WIDTH,
    EXPORT_WIDTH,
    Files,
    compare_files,
    export_files,
    geometry_files,
    playground_files,
    query_rows,
    steering_files,
)


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
        fields = layer_fields(model)
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
        display = raster.model_view(pil, model.config.img_size, DISPLAY_WIDTH)
        gh, gw = steered.grid
        q = query or centre_query((gh, gw))
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
        maps = [(name, export_maps(model, x, alpha))]
        if twin is not None:
            tmodel, tmeta = load_checkpoint(twin)
            tx, _ = model_input([pil], tmodel.config.img_size, tmeta)
            maps.append((twin.name, export_maps(tmodel, tx, alpha)))
        edisplay = raster.model_view(pil, model.config.img_size, EXPORT_WIDTH)
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
