"""Write pull-in / pull-out / net export maps of a checkpoint on images to an ``.npz`` file.

    python -m ssog_core export-maps --checkpoint C.safetensors --image bird.jpg --out maps.npz
    python -m ssog_core export-maps --checkpoint C.safetensors --image photos/ --out maps.npz
    python -m ssog_core export-maps --checkpoint C.safetensors --image bird.jpg --control blank --out maps.npz
    python -m ssog_core export-maps --checkpoint C.safetensors --per-class --control validation --out classes.npz

One image: arrays ``pull_in``, ``pull_out``, ``net`` of shape (layers, Gh, Gw), ``accumulated`` and
``rollout`` (Gh, Gw). A folder: the same with a leading image axis (batched), plus ``mean_*`` maps over
the images and ``names``. Images are resized to the model's size (or ``--img-size``), scaled to [0, 1]
and normalised as the checkpoint's metadata says.

``--control blank|validation`` (:mod:`ssog_core.analysis.controls`) adds ``accumulated_control``,
``rollout_control`` and the differences raw − control ``accumulated_difference``, ``rollout_difference`` (shaped
like ``accumulated``);
``validation`` averages ``--control-images`` images of the checkpoint's recorded validation data.
``--per-class`` (with or without ``--image``) adds the mean accumulated map per class over those validation
images: ``class_accumulated`` (classes, Gh, Gw), with a control ``class_accumulated_difference``, and
``class_counts``, ``class_names``.
``--cluster ADDRESS`` computes the maps on a worker of that Dask scheduler (the checkpoint and images are sent).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from ssog_core.analysis.controls import (
    CONTROLS,
    ValidationMaps,
    class_maps,
    control_maps,
    differences,
    validation_maps,
)
from ssog_core.analysis.measures import DEFAULT_ALPHA, DEFAULT_IMAGES, ExportMaps, export_maps
from ssog_core.checkpoint.files import atomic_write
from ssog_core.checkpoint.format import CheckpointError, load_checkpoint
from ssog_core.cli import CLUSTER_HELP, on_cluster
from ssog_core.data.images import ImageError, list_images, model_input, parse_size
from ssog_core.runtime.jobs import JobError

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
    image: str | Path | None,
    out: str | Path,
    img_size: tuple[int, int] | None = None,
    alpha: float = DEFAULT_ALPHA,
    batch_size: int = 8,
    control: str = "none",
    control_images: int = DEFAULT_IMAGES,
    per_class: bool = False,
    cluster: str | None = None,
) -> dict[str, np.ndarray]:
    """Compute and write the maps; returns the arrays written. With ``cluster`` they are computed on a worker of
    that Dask scheduler, the checkpoint and the images sent to it."""
    if image is None and not per_class:
        raise ValueError("give --image, --per-class, or both")
    settings = (img_size, alpha, batch_size, control, control_images, per_class)
    if cluster:
        arrays = on_cluster(cluster, maps_job, checkpoint, None if image is None else image_files(Path(image)),
                            Path(image).is_dir() if image else False, *settings)  # fmt: skip
    else:
        arrays = maps_of(load_checkpoint(checkpoint), None if image is None else Path(image), *settings)

    def write(tmp: str) -> None:
        with open(tmp, "wb") as f:  # a file object: np.savez would append ".npz" to a path
            np.savez_compressed(f, **arrays)

    atomic_write(out, write)
    return arrays


def image_files(image: Path) -> dict[str, bytes]:
    """The bytes of an image file, or of a folder's images, by file name (what a cluster's worker receives)."""
    if not image.exists():
        raise ImageError(f"{image} is not there")
    paths = list_images(image) if image.is_dir() else [image]
    return {p.name: p.read_bytes() for p in paths}


def maps_job(
    loaded: tuple[torch.nn.Module, dict],
    files: dict[str, bytes] | None,
    folder: bool,
    *settings: Any,
    progress: Callable[[int, int], None],
    stopped: Callable[[], bool],
) -> dict[str, np.ndarray]:
    """:func:`maps_of` as a job of :class:`ssog_core.runtime.jobs.Engine`: the images it received, as files again."""
    if files is None:
        return maps_of(loaded, None, *settings)
    with tempfile.TemporaryDirectory(prefix="ssog-maps-") as tmp:
        for name, data in files.items():
            (Path(tmp) / name).write_bytes(data)
        return maps_of(loaded, Path(tmp) if folder else Path(tmp) / next(iter(files)), *settings)


def maps_of(
    loaded: tuple[torch.nn.Module, dict],
    image: Path | None,
    img_size: tuple[int, int] | None,
    alpha: float,
    batch_size: int,
    control: str,
    control_images: int,
    per_class: bool,
) -> dict[str, np.ndarray]:
    """The arrays :func:`run` writes, of a loaded checkpoint."""
    model, meta = loaded
    size = img_size or tuple(model.config.img_size)
    model.grid_for(*size)  # refuse sizes that do not tile into patches before doing any work
    validation = None
    if control == "validation" or per_class:  # computed once: the control of every image and the class means
        validation = validation_maps(model, meta, alpha, control_images, size)
    arrays = _image_arrays(model, meta, Path(image), size, alpha, batch_size, control, validation) if image else {}
    if per_class:
        blank = validation_maps(model, meta, alpha, control_images, size, blank=True) if control == "blank" else None
        c = class_maps(validation, control, blank)
        arrays.update(
            class_accumulated=c.raw.numpy(), class_counts=c.counts.numpy(), class_names=np.array(c.class_names)
        )
        if c.difference is not None:
            arrays["class_accumulated_difference"] = c.difference.numpy()
    arrays.update(alpha=np.float64(alpha), grid=np.array(model.grid_for(*size)), prefix_tokens=np.array(PREFIX_NOTE))
    if control != "none":
        arrays["control"] = np.array(control)
    if validation is not None:
        arrays["control_images"] = np.array(len(validation.labels))
    return arrays


def _image_arrays(
    model: torch.nn.Module,
    meta: dict,
    image: Path,
    size: tuple[int, int],
    alpha: float,
    batch_size: int,
    control: str,
    validation: ValidationMaps | None,
) -> dict[str, np.ndarray]:
    """The maps of an image or a folder of images, with the control's maps and the differences."""
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
            x = torch.cat([x for _, x in good])
            maps = export_maps(model, x, alpha)
            arrays = _arrays(maps)
            c = control_maps(model, meta, x, maps, control, validation=validation)
            if c is not None:
                arrays.update(accumulated_control=c.accumulated.numpy(), rollout_control=c.rollout.numpy())
                if c.noise is not None:
                    arrays["accumulated_control_noise"] = c.noise.numpy()
                arrays.update({k: v.numpy() for k, v in differences(maps, c).items()})
            chunks.append(arrays)
            names += [p.name for p, _ in good]
    if not chunks:
        raise ImageError("no readable images: " + "; ".join(skipped))
    arrays = {k: np.concatenate([c[k] for c in chunks]) for k in chunks[0]}
    if folder:
        arrays.update({f"mean_{k}": v.mean(axis=0) for k, v in list(arrays.items())})
        arrays["names"] = np.array(names)
    else:
        arrays = {k: v[0] for k, v in arrays.items()}
    for s in skipped:
        print(f"skipped {s}", file=sys.stderr)
    return arrays


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", required=True, help="an SSOG Lab .safetensors checkpoint")
    ap.add_argument("--image", help="an image file, or a folder of images")
    ap.add_argument("--out", required=True, help="output .npz path")
    ap.add_argument("--img-size", type=parse_size, help="resize images to N or HxW (default: the model's size)")
    ap.add_argument("--alpha", type=float, default=DEFAULT_ALPHA, help="residual mixing α in Â = αĀ + (1−α)I")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--control", choices=CONTROLS, default="none",
                    help="also write the maps of a control and raw − control: a blank image of each image's mean "
                    "colour, or the mean over validation images of the checkpoint's recorded data")  # fmt: skip
    ap.add_argument("--control-images", type=int, default=DEFAULT_IMAGES,
                    help="validation images for the validation control and --per-class")  # fmt: skip
    ap.add_argument(
        "--per-class",
        action="store_true",
        help="mean accumulated map per class over the validation images (raw and against the control)",
    )
    ap.add_argument("--cluster", metavar="ADDRESS", help=CLUSTER_HELP)
    args = ap.parse_args(argv)
    try:
        arrays = run(args.checkpoint, args.image, args.out, args.img_size, args.alpha, args.batch_size,
                     args.control, args.control_images, args.per_class, args.cluster)  # fmt: skip
    except (CheckpointError, ImageError, JobError, ValueError) as e:  # DataError is a ValueError
        print(f"error: {e}", file=sys.stderr)
        return 2
    gh, gw = arrays["grid"]
    print(f"wrote {args.out}: maps on a {gh}×{gw} grid" + (f", control {args.control}" if "control" in arrays else ""))
    if "accumulated" in arrays:
        acc = arrays["accumulated"]
        print(f"{arrays['net'].shape[-3]} layers; accumulated range [{acc.min():.3f}, {acc.max():.3f}]; "
              f"net exporters {float((acc > 0).mean()):.1%}")  # fmt: skip
    if "accumulated_difference" in arrays:
        d = arrays["accumulated_difference"]
        print(f"accumulated − {args.control} control: range [{d.min():.3f}, {d.max():.3f}]")
    if "class_counts" in arrays:
        print(f"per class: {len(arrays['class_counts'])} classes over {arrays['class_counts'].sum()} validation images")
    return 0


if __name__ == "__main__":
    sys.exit(main())
