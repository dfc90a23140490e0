"""Every attention head of a model as a field over displacement (query − key): how far it looks, how much of it a
content-blind field explains, and the K Gaussian atoms that come closest to it
(:mod:`ssog_core.analysis.head_as_field`).

    python -m ssog_core fields --checkpoint C.safetensors --images 64 --atoms 4 --json fields.json
    python -m ssog_core fields --checkpoint hf-hub:timm/vit_small_patch16_224.augreg_in21k_ft_in1k \\
        --images photos/ --atoms 4 --json fields.json --out-dir figures/

``--images N`` takes the first N validation images of the checkpoint's recorded data, ``--images FOLDER`` the
pictures in a folder (:func:`~ssog_core.interventions.validation.pictures_for`). The JSON
(:func:`~ssog_core.analysis.report.fields_json`, the app's ``/head_fields`` answer too) says which images
(``images``, ``measured_on``), the ``grid``, ``patch_px``, ``num_prefix_tokens`` and ``atoms_per_head``, and holds
``heads``: per head its 0-based ``layer`` and ``head``, ``mean_distance_px``,
``share_fit``, ``share_field``, the uniform field's ``share_uniform`` (the baseline), ``normalised_fit`` and
``normalised_field`` (the part of the head's departure from uniform each explains; ``null`` for a ``diffuse``
head), ``entropy`` (nats, against the JSON's ``max_entropy``), ``prefix_share`` and ``atoms`` (``mu_y``, ``mu_x``,
``sigma_y``, ``sigma_x``,
``weight``; grid cells, μ as query − key). Two charts (PNG + SVG) go to ``--out-dir`` (default: beside the JSON): mean
attention distance per head against layer, as in the ViT paper, and the shares per head against layer. The model
needs the hook point ``blocks.{l}.attn.pattern`` in every layer.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

import torch
from matplotlib.figure import Figure
from torch import Tensor

from ssog_core.analysis.head_as_field import FIELD_BATCH, FIT_ATOMS, MAX_FIT_ATOMS, HeadFieldStats, check_atoms
from ssog_core.analysis.report import fields_json
from ssog_core.checkpoint.files import atomic_write
from ssog_core.checkpoint.format import CheckpointError, load_checkpoint
from ssog_core.data.images import ImageError, parse_size
from ssog_core.data.sources import DataError
from ssog_core.interventions.heavy import fields_on
from ssog_core.interventions.validation import MAX_EVAL_IMAGES, pictures_for
from ssog_core.viz.figures import figure_bytes, new_figure, safe_token


def _per_layer(ax, values: Tensor, offset: float, **style: Any) -> None:
    """A dot per head at its layer (nudged by ``offset``), heads spread a little so equal values stay visible."""
    layers, heads = values.shape
    spread = torch.linspace(-0.12, 0.12, heads) if heads > 1 else torch.zeros(1)
    x = torch.arange(layers)[:, None] + offset + spread[None]
    ax.scatter(x.flatten().numpy(), values.flatten().numpy(), s=14, **style)


def distance_figure(stats: HeadFieldStats, title: str) -> Figure:
    """Mean attention distance (pixels) of every head against its layer: the ViT paper's figure."""
    fig = new_figure(6.4, 4.0)
    ax = fig.add_subplot()
    _per_layer(ax, stats.mean_distance_px, 0.0, color="tab:blue", alpha=0.8)
    ax.set_xlabel("layer (0-based)")
    ax.set_ylabel("mean attention distance (pixels)")
    ax.set_xticks(range(stats.mean_distance_px.shape[0]))
    ax.set_ylim(0, 1.08 * float(stats.mean_distance_px.max()))
    ax.grid(alpha=0.3)
    fig.suptitle(title, fontsize=9)
    return fig


def share_figure(stats: HeadFieldStats, title: str) -> Figure:
    """Share of every head the fitted atoms and the positional field explain, against its layer, beside the uniform
    field's share (the baseline: a field with no geometry)."""
    fig = new_figure(6.4, 4.0)
    ax = fig.add_subplot()
    k = stats.fits[0].mu.shape[1]
    _per_layer(ax, stats.share_field, -0.18, color="tab:gray", marker="s", label="positional field")
    _per_layer(ax, stats.share_fit, 0.18, color="tab:orange", marker="o", label=f"{k} fitted atom{'s' * (k > 1)}")
    _per_layer(ax, stats.share_uniform, 0.0, color="k", marker="_", label="uniform field (baseline)")
    ax.set_xlabel("layer (0-based)")
    ax.set_ylabel("share explained (1 − mean TV)")
    ax.set_xticks(range(stats.share_fit.shape[0]))
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower left", fontsize=8)
    fig.suptitle(title, fontsize=9)
    return fig


def run(
    checkpoint: str,
    images: str,
    atoms: int,
    json_out: str | Path,
    out_dir: str | Path | None = None,
    img_size: tuple[int, int] | None = None,
    batch_size: int = FIELD_BATCH,
) -> dict[str, Any]:
    """Measure every head, write the JSON (:func:`~ssog_core.analysis.report.fields_json`) and the two charts;
    returns what the JSON holds."""
    atoms = check_atoms(atoms)
    if batch_size < 1:
        raise ValueError(f"--batch-size must be at least 1, got {batch_size}")
    if re.fullmatch(r"\d+", images):
        n, folder = int(images), None
    elif Path(images).is_dir():
        n, folder = MAX_EVAL_IMAGES, Path(images)
    else:
        raise ImageError(f"--images takes a number of validation images or a folder of pictures; {images} is neither")
    model, meta = load_checkpoint(checkpoint)
    data = pictures_for(model, meta, n, folder=folder, size=img_size, up_to=folder is not None)
    stats = fields_on(model, data, atoms, batch_size=batch_size)
    result = fields_json(stats, checkpoint)
    text = json.dumps(result, indent=1)
    atomic_write(json_out, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
    out_dir = Path(out_dir) if out_dir is not None else Path(json_out).parent
    name = Path(str(checkpoint).rstrip("/")).name.removesuffix(".safetensors")
    settings = {"checkpoint": str(checkpoint), "images": result["images"], "atoms": atoms}
    title = f"{name}: {stats.measured_on.replace('`', '')}, {stats.grid[0]}×{stats.grid[1]} patches"
    for kind, fig in (("distance", distance_figure(stats, title)), ("share", share_figure(stats, title))):
        for fmt in ("png", "svg"):
            data = figure_bytes(fig, fmt, {**settings, "figure": kind})
            path = out_dir / f"{safe_token(f'fields_{kind}_{name}')}.{fmt}"
            atomic_write(path, lambda tmp, d=data: Path(tmp).write_bytes(d))
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--checkpoint", required=True, help="an SSOG Lab checkpoint, a timm or transformers folder, or hf-hub:ORG/NAME"
    )
    ap.add_argument("--images", required=True, help="N (the first N validation images) or a folder of pictures")
    ap.add_argument("--atoms", type=int, default=FIT_ATOMS,
                    help=f"Gaussian atoms fitted per head (1 to {MAX_FIT_ATOMS})")  # fmt: skip
    ap.add_argument("--json", required=True, help="output JSON path")
    ap.add_argument("--out-dir", help="folder for the two charts (PNG + SVG; default: the JSON's folder)")
    ap.add_argument("--img-size", type=parse_size, help="resize images to N or HxW (default: the model's size)")
    ap.add_argument("--batch-size", type=int, default=FIELD_BATCH,
                    help=f"images per forward pass (default {FIELD_BATCH}, the app's and distill's: the same atoms bit "
                    "for bit; another batch size changes them by float rounding)")  # fmt: skip
    args = ap.parse_args(argv)
    try:
        result = run(args.checkpoint, args.images, args.atoms, args.json, args.out_dir, args.img_size, args.batch_size)
    except (CheckpointError, ImageError, DataError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    heads = result["heads"]
    keys = ("mean_distance_px", "share_fit", "share_field", "share_uniform")
    mean = {k: sum(h[k] for h in heads) / len(heads) for k in keys}
    shaped = [h["normalised_fit"] for h in heads if not h["diffuse"]]
    normalised = f"{sum(shaped) / len(shaped):.3f} over {len(shaped)} heads" if shaped else "none (every head diffuse)"
    print(f"wrote {args.json}: {len(heads)} heads on {result['images']['measured']} images; mean distance "
          f"{mean['mean_distance_px']:.1f} px, share explained by {args.atoms} atoms {mean['share_fit']:.3f}, "
          f"by the positional field {mean['share_field']:.3f}, by the uniform field {mean['share_uniform']:.3f}; "
          f"the fit's normalised share {normalised}, {len(heads) - len(shaped)} diffuse")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
