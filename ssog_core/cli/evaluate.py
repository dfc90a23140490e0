"""Accuracy of a checkpoint, and its zero-shot resolution transfer.

    python -m ssog_core evaluate --checkpoint C.safetensors --data cifar100:./cifar-100-python
    python -m ssog_core evaluate --checkpoint C.safetensors --data shapes --img-size 48 64 96 128

With one size it prints ``accuracy: 0.xxxx`` on the test/val split. With several it evaluates the same
weights at each size without any fine-tuning (only the position embedding is resized, the Gaussian
fields are re-evaluated on the new grid), prints the table, and writes a PNG plot of accuracy vs
resolution. ``--transfer`` picks the standard sizes (0.5×–2× the training size, as ``train`` measures at the
end of a run); ``--json`` writes ``[{"img_size": [H, W], "tokens": N, "accuracy": A}, ...]`` and ``--store``
puts the same list in the checkpoint's header (``resolution_transfer``). ``--data`` defaults to the data the
checkpoint was trained on (from its metadata); procedural sets render natively at each size; CIFAR images and
files of another size are resized (ImageFolder: resize + centre crop), images of the model's size are used as is.
``--cluster ADDRESS`` evaluates on a worker of that Dask scheduler, on its GPU if it has one (the checkpoint is
sent to it; data read from files must be at the same path there).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ssog_core.checkpoint.files import atomic_write
from ssog_core.checkpoint.format import TRANSFER_KEY, CheckpointError, read_checkpoint, update_metadata
from ssog_core.cli import CLUSTER_HELP, on_cluster
from ssog_core.data.images import ImageError, parse_size
from ssog_core.data.sources import DataError
from ssog_core.runtime.jobs import JobError
from ssog_core.train.accuracy import (
    evaluate_model_sizes,
    evaluate_sizes,
    format_transfer,
    plot_transfer,
    transfer_curve,
    transfer_sizes,
)


def evaluate_job(
    loaded: tuple[torch.nn.Module, dict[str, Any]],
    data: str | None,
    sizes: list[tuple[int, int]] | None,
    batch_size: int,
    max_images: int | None,
    progress: Callable[[int, int], None],
    stopped: Callable[[], bool],
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """:func:`~ssog_core.train.accuracy.evaluate_sizes` as a job of :class:`ssog_core.runtime.jobs.Engine`: the model it
    received, on the worker's CPU."""
    model, meta = loaded
    spec = data or meta.get("data")
    if not spec:
        raise DataError("the checkpoint does not say what data it was trained on: pass --data KIND:PATH")
    sizes = sizes or [tuple(model.config.img_size)]
    return evaluate_model_sizes(model, spec, sizes, meta.get("class_names"), batch_size, "cpu", 0, False,
                                max_images=max_images), meta  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", required=True, help="an SSOG Lab .safetensors checkpoint")
    ap.add_argument("--data", help="KIND:PATH (default: the data named in the checkpoint's metadata)")
    sizes = ap.add_mutually_exclusive_group()
    sizes.add_argument(
        "--img-size", type=parse_size, nargs="+", help="one or more sizes, N or HxW (default: the training size)"
    )
    sizes.add_argument(
        "--transfer",
        action="store_true",
        help="the standard transfer curve: 0.5×, 0.75×, 1×, 1.5×, 2× the training size (multiples of the patch)",
    )
    ap.add_argument(
        "--max-images", type=int, help="evaluate at most this many val images per size (a fixed random subset)"
    )
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument(
        "--amp", action=argparse.BooleanOptionalAction, default=None, help="bf16 autocast (default: on CUDA)"
    )
    ap.add_argument("--plot", default="resolution_transfer.png", help="PNG written when several sizes are given")
    ap.add_argument(
        "--json", help="also write [{img_size, tokens, accuracy}, ...] here (the app reads <stem>.transfer.json)"
    )
    ap.add_argument("--cluster", metavar="ADDRESS", help=CLUSTER_HELP)
    ap.add_argument(
        "--store", action="store_true", help=f"also store that list in the checkpoint's header ({TRANSFER_KEY})"
    )
    args = ap.parse_args(argv)
    if args.batch_size < 1 or args.workers < 0 or (args.max_images is not None and args.max_images < 1):
        ap.error("--batch-size and --max-images must be >= 1 and --workers >= 0")
    try:
        device = torch.device(args.device)
    except RuntimeError as e:
        ap.error(f"--device: {e}")
    amp = device.type == "cuda" if args.amp is None else args.amp
    try:
        requested = args.img_size
        if args.transfer:
            config = read_checkpoint(args.checkpoint)[0]
            requested = transfer_sizes(config.img_size, config.patch_size)
        if args.cluster:
            rows, meta = on_cluster(args.cluster, evaluate_job, args.checkpoint, args.data, requested,
                                    args.batch_size, args.max_images)  # fmt: skip
        else:
            rows, meta = evaluate_sizes(
                args.checkpoint, args.data, requested, args.batch_size, args.device, args.workers, amp, args.max_images
            )
    except (CheckpointError, DataError, ImageError, JobError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if len(rows) == 1:
        print(f"accuracy: {rows[0]['accuracy']:.4f}")
    else:
        print(f"zero-shot resolution transfer of {Path(args.checkpoint).name} (no fine-tuning)")
        print(format_transfer(rows))
        cfg = meta["config"]
        title = f"{Path(args.checkpoint).name}: {cfg['attn']}, trained at {cfg['img_size'][0]}×{cfg['img_size'][1]}"
        print(f"wrote {plot_transfer(rows, args.plot, title)}")
    curve = transfer_curve(rows)
    if args.json:
        atomic_write(args.json, lambda tmp: Path(tmp).write_text(json.dumps(curve, indent=1)))
    if args.store:
        update_metadata(args.checkpoint, {TRANSFER_KEY: json.dumps(curve)})
        print(f"stored {len(curve)} sizes under {TRANSFER_KEY} in {args.checkpoint}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
