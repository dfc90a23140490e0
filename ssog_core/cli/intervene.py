"""Apply interventions to a checkpoint and report what changes, with a noise floor.

    python -m ssog_core intervene --checkpoint checkpoints/ssog_layouts.safetensors --edits edits.json \\
        --image assets/layouts_val0003_vertical_pair.png --eval 500 --json out.json

``edits.json`` is a JSON list of edits (``ssog_core.interventions``; the ops are listed below), e.g.
``[{"op": "swap_axes", "layer": 5, "head": 0}, {"op": "close_gate", "layer": 2, "tap": "mu"}]``.
A ``patch_head`` source names an image file: a path, a file beside the edits file, or a bundled image in
``--assets`` (by name or SHA-256). ``--image`` gives the top-5 classes unedited and edited, the change in log p
of the unedited prediction and the accumulated export maps; ``--eval N`` the first N validation images of the
checkpoint's recorded data: accuracy and log p(true), unedited and edited, with paired bootstrap 95% intervals
and McNemar's test. A model that records no data (a timm or transformers folder) is measured on the first N
pictures of ``--pictures`` (default: ``--assets``) instead: they have no labels, so the unedited model's own
prediction is the reference, and the report gives agreement with the unedited model and log p(the unedited model's
class) in place of accuracy and log p(true). ``--json`` writes the same JSON as the app's ``/intervene`` endpoint.
``--cluster ADDRESS`` runs the request on a worker of that Dask scheduler (the checkpoint, the picture and the
patch sources are sent to it).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from ssog_core.checkpoint.files import atomic_write
from ssog_core.checkpoint.format import CheckpointError, load_checkpoint
from ssog_core.cli import CLUSTER_HELP, on_cluster
from ssog_core.data.images import ImageError, list_images, load_image
from ssog_core.data.sources import DataError
from ssog_core.interventions import heavy
from ssog_core.interventions.edit import EditError, ops_help
from ssog_core.interventions.result import InterventionRequest, intervene
from ssog_core.interventions.validation import MAX_EVAL_IMAGES, Pictures
from ssog_core.runtime.jobs import JobError

DEFAULT_ASSETS = Path("assets")  # the bundled images, from the repository root (as `python -m app` reads them)


def find_image(ref: str, folders: Sequence[Path]) -> Path:
    """An image named by a path, a file name inside one of ``folders``, or the SHA-256 of a file there."""
    p = Path(ref)
    if p.is_file():
        return p
    for folder in folders:
        if (folder / ref).is_file():
            return folder / ref
    if len(ref) == 64:
        for folder in folders:
            for f in list_images(folder) if folder.is_dir() else []:
                if hashlib.sha256(f.read_bytes()).hexdigest() == ref:
                    return f
    raise EditError(f"patch source image {ref!r} is not there (looked in {', '.join(map(str, folders))})")


def sources_for(edits: list[Any], folders: Sequence[Path]) -> dict[str, Path]:
    """The picture file of every patch source the edits name."""
    names = InterventionRequest(edits).source_names()
    return {n: find_image(n, folders) for n in names}


def carried(picture: str | Path) -> bytes:
    """A picture file's bytes, once it opens as a picture (else :class:`ImageError` naming it)."""
    load_image(picture)
    return Path(picture).read_bytes()


def run(
    checkpoint: str | Path,
    edits: list[Any],
    image: str | Path | None = None,
    eval_images: int = 0,
    assets: Path = DEFAULT_ASSETS,
    edits_dir: Path | None = None,
    progress: bool = True,
    cluster: str | None = None,
    pictures: Path | None = None,
) -> tuple[dict[str, Any], str]:
    """Apply ``edits`` (JSON list) to a checkpoint; returns the ``/intervene`` JSON and the text report. With
    ``cluster`` the request runs on a worker of that Dask scheduler. A model without a validation set is measured
    on ``pictures`` (default: ``assets``)."""
    folders = [f for f in (edits_dir, Path.cwd(), assets) if f is not None]
    request = InterventionRequest(edits, image, eval_images, Pictures(bundled=assets if pictures is None else pictures),
                                  sources_for(edits, folders))  # fmt: skip
    if cluster:  # the worker need not share this machine's files: its pictures travel as bytes
        request = replace(request, image=None if image is None else carried(image),
                          sources={n: carried(f) for n, f in request.sources.items()})  # fmt: skip
        result = on_cluster(cluster, heavy.intervene, checkpoint, request)
    else:
        model, meta = load_checkpoint(checkpoint)
        result = intervene(model, meta, request, progress=progress)
    return result.to_dict(), result.report()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__,
        epilog="ops and their fields:\n" + ops_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--checkpoint", required=True, help="an SSOG Lab .safetensors checkpoint or a ViT folder")
    ap.add_argument("--edits", required=True, help="a JSON file holding the list of edits")
    ap.add_argument("--image", help="an image file: its prediction and export maps, unedited and edited")
    ap.add_argument(
        "--eval",
        type=int,
        default=0,
        metavar="N",
        help=f"the first N validation images or pictures (max {MAX_EVAL_IMAGES})",
    )
    ap.add_argument("--json", help="write the result as JSON (the app's /intervene shape)")
    ap.add_argument("--assets", type=Path, default=DEFAULT_ASSETS, help="folder of bundled images (patch sources)")
    ap.add_argument(
        "--pictures", type=Path, help="pictures a model without a validation set is measured on (default: --assets)"
    )
    ap.add_argument("--cluster", metavar="ADDRESS", help=CLUSTER_HELP)
    args = ap.parse_args(argv)
    if args.image is None and not args.eval:
        ap.error("give --image IMG, --eval N, or both")
    try:
        edits = json.loads(Path(args.edits).read_text(encoding="utf-8"))
        result, text = run(args.checkpoint, edits, args.image, args.eval, args.assets, Path(args.edits).parent,
                           cluster=args.cluster, pictures=args.pictures)  # fmt: skip
    except (OSError, json.JSONDecodeError) as e:
        print(f"error: cannot read {args.edits}: {e}", file=sys.stderr)
        return 2
    except (CheckpointError, ImageError, DataError, JobError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(text)
    if args.json:
        atomic_write(args.json, lambda tmp: Path(tmp).write_text(json.dumps(result, indent=1), encoding="utf-8"))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
