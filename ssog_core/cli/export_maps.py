"""Write pull-in / pull-out / net export maps of a checkpoint on images to an ``.npz`` file.

    python -m ssog_core.export_maps --checkpoint C.safetensors --image bird.jpg --out maps.npz
    python -m ssog_core.export_maps --checkpoint C.safetensors --image photos/ --out maps.npz

One image: arrays ``pull_in``, ``pull_out``, ``net`` of shape (layers, Gh, Gw), ``accumulated`` and
``rollout`` (Gh, Gw). A folder: the same with a leading image axis (batched), plus ``mean_*`` maps over
the images and ``names``. Images are resized to the model's size (or ``--img-size``), scaled to [0, 1]
and normalised as the checkpoint's metadata says.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from ssog_core.analysis.measures import DEFAULT_ALPHA, ExportMaps, export_maps
from ssog_core.checkpoint.files import atomic_write
from ssog_core.checkpoint.format import CheckpointError, load_checkpoint
from ssog_core.data.images import ImageError, list_images, model_input, parse_size

PREFIX_NOTE = "prefix tokens removed from each attention matrix; patch rows renormalised (see prefix_share)"


def _arrays(maps: ExportMaps) -> dict[str, np.ndarray]:
    return {
        "pull_in": maps.pull_in.numpy(),
        "pull_out": maps.pull_out.numpy(),
        "net": maps.net.numpy(),
        "accumulated": maps.accumulated.numpy(),
        "rollout": maps.rollout.numpy(),
        "prefix_share": maps.prefix_share.numpy(),
    }


def run(
    checkpoint: str | Path,
    image: str | Path,
    out: str | Path,
    img_size: tuple[int, int] | None = None,
    alpha: float = DEFAULT_ALPHA,
    batch_size: int = 8,
) -> dict[str, np.ndarray]:
    """Compute and write the maps; returns the arrays written."""
    model, meta = load_checkpoint(checkpoint)
    size = img_size or tuple(model.config.img_size)
    model.grid_for(*size)  # refuse sizes that do not tile into patches before doing any work
    image = Path(image)
    folder = image.is_dir()
    paths = list_images(image) if folder else [image]
    if not paths:
        raise ImageError(f"{image} holds no images ({', '.join(('.png', '.jpg', '.jpeg'))}, ...)")
    chunks, names, skipped = [], [], []
    for start in tqdm(range(0, len(paths), batch_size), desc="export maps", unit="batch", disable=not folder):
        good = []
        for p in paths[start : start + batch_size]:
            try:
                good.append((p, model_input([p], size, meta)[0]))
            except ImageError as e:
                if not folder:
                    raise
                skipped.append(f"{p.name}: {e}")
        if good:
            chunks.append(_arrays(export_maps(model, torch.cat([x for _, x in good]), alpha)))
            names += [p.name for p, _ in good]
    if not chunks:
        raise ImageError("no readable images: " + "; ".join(skipped))
    arrays = {k: np.concatenate([c[k] for c in chunks]) for k in chunks[0]}
    if folder:
        arrays.update({f"mean_{k}": v.mean(axis=0) for k, v in list(arrays.items())})
        arrays["names"] = np.array(names)
    else:
        arrays = {k: v[0] for k, v in arrays.items()}
    arrays.update(alpha=np.float64(alpha), grid=np.array(model.grid_for(*size)), prefix_tokens=np.array(PREFIX_NOTE))
    for s in skipped:
        print(f"skipped {s}", file=sys.stderr)

    def write(tmp: str) -> None:
        with open(tmp, "wb") as f:  # a file object: np.savez would append ".npz" to a path
            np.savez_compressed(f, **arrays)

    atomic_write(out, write)
    return arrays


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", required=True, help="an SSOG Lab .safetensors checkpoint")
    ap.add_argument("--image", required=True, help="an image file, or a folder of images")
    ap.add_argument("--out", required=True, help="output .npz path")
    ap.add_argument("--img-size", type=parse_size, help="resize images to N or HxW (default: the model's size)")
    ap.add_argument("--alpha", type=float, default=DEFAULT_ALPHA, help="residual mixing α in Â = αĀ + (1−α)I")
    ap.add_argument("--batch-size", type=int, default=8)
    args = ap.parse_args(argv)
    try:
        arrays = run(args.checkpoint, args.image, args.out, args.img_size, args.alpha, args.batch_size)
    except (CheckpointError, ImageError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    acc = arrays["accumulated"]
    share = float((acc > 0).mean())
    print(f"wrote {args.out}: {arrays['net'].shape[-3]} layers on a {acc.shape[-2]}×{acc.shape[-1]} grid")
    print(f"accumulated range [{acc.min():.3f}, {acc.max():.3f}]; net exporters {share:.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
