"""Where a ``pointer`` model's attention goes: per layer, the share of the attention patch queries put on the three
discs that lands on the disc the cue points at (1/3 when the discs are not told apart), on the first N validation
images of the checkpoint's recorded data with 95% intervals; for a model that steers μ also with every μ gate closed,
and the paired change.

    python -m ssog_core target-share --checkpoint checkpoints/matched_ssog_pointer14.safetensors --eval 500
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from ssog_core.checkpoint.files import atomic_write
from ssog_core.checkpoint.format import CheckpointError, load_checkpoint
from ssog_core.data.sources import DataError
from ssog_core.interventions.target_share import report_text, target_share_report
from ssog_core.interventions.validation import DEFAULT_EVAL_IMAGES, MAX_EVAL_IMAGES


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", required=True, help="a checkpoint trained on pointer")
    limits = f"default {DEFAULT_EVAL_IMAGES}, max {MAX_EVAL_IMAGES}"
    ap.add_argument("--eval", type=int, default=DEFAULT_EVAL_IMAGES, metavar="N", help=f"the first N images ({limits})")
    ap.add_argument("--json", help="write the readout as JSON (the app's /target_share shape)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    try:
        model, meta = load_checkpoint(args.checkpoint)
        report = target_share_report(model, meta, args.eval)
    except (CheckpointError, DataError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(report_text(report))
    if args.json:
        atomic_write(args.json, lambda tmp: Path(tmp).write_text(json.dumps(report, indent=1), encoding="utf-8"))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
