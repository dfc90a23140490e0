"""Interventions on the bundled model: one image with 8 edits, the playground's "apply to the model", and head
importance on the validation images (reusing the residual stream below each edit, against full edited passes).

    python benchmarks/interventions.py --threads 2 [--images 500] [--full-images 100] [--rounds 5]
    python benchmarks/interventions.py --threads 1 --clock cpu --tag cpu_1thread_cputime   # on a loaded machine

Writes ``results/interventions_<tag>.md``. Targets (2 cores): one image ≤ 150 ms, apply → prediction ≤ 200 ms,
head importance on 500 images (24 heads + 18 gates) ≤ 30 s. Full edited passes are timed on ``--full-images``
and scaled to ``--images`` (the time is linear in the images; timing all 500 twice would take minutes).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from ssog_core.analysis.head_spec import spec_from_head
from ssog_core.analysis.measures import attention_maps, layer_field
from ssog_core.checkpoint.files import atomic_write
from ssog_core.checkpoint.format import load_checkpoint
from ssog_core.interventions.effects import image_effect, outcomes
from ssog_core.interventions.importance import head_importance, importance_edits
from ssog_core.interventions.ops import SetHead
from ssog_core.interventions.run import edited
from ssog_core.interventions.validation import load_eval_set

from common import add_run_flags, apply_run_flags, provenance

CHECKPOINT = Path(__file__).resolve().parent.parent / "checkpoints" / "ssog_layouts.safetensors"
EIGHT_EDITS = [
    {"op": "close_gate", "layer": 1, "tap": "mu"},
    {"op": "close_gate", "layer": 2, "tap": "all", "head": 1},
    {"op": "ablate_head", "layer": 3, "head": 2},
    {"op": "drop_atom", "layer": 4, "head": 0, "atom": 1},
    {"op": "swap_axes", "layer": 5, "head": 0},
    {"op": "swap_axes", "layer": 5, "head": 3},
    {"op": "patch_head", "layer": 2, "head": 0, "source": "other", "what": "steering"},
    {"op": "patch_head", "layer": 4, "head": 2, "source": "other", "what": "output"},
]


CLOCK = time.perf_counter  # --clock cpu: the thread's CPU time (one thread; robust to other processes' load)


def timed(fn, rounds: int) -> list[float]:
    out = []
    for _ in range(rounds):
        t = CLOCK()
        fn()
        out.append(CLOCK() - t)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", type=Path, default=CHECKPOINT)
    ap.add_argument("--images", type=int, default=500)
    ap.add_argument("--full-images", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=5)
    add_run_flags(ap)
    args = ap.parse_args(argv)
    apply_run_flags(ap, args, torch.device("cpu"))
    global CLOCK
    CLOCK = time.thread_time if args.clock == "cpu" else time.perf_counter
    model, meta = load_checkpoint(args.checkpoint)
    data = load_eval_set(meta, model.config.img_size, args.images)
    img, other = data.batch(0, 1), data.batch(1, 2)
    load0 = os.getloadavg()[0]
    rows = []

    with torch.inference_mode():
        base = attention_maps(model, img)
        t = timed(lambda: image_effect(model, img, EIGHT_EDITS, {"other": other}, unedited=base), args.rounds)
        rows.append(("one image, 8 edits (unedited maps cached, as the app keeps them)", statistics.median(t), 0.150))
        t = timed(lambda: image_effect(model, img, EIGHT_EDITS, {"other": other}), args.rounds)
        rows.append(("one image, 8 edits, nothing cached", statistics.median(t), None))
        spec = spec_from_head(layer_field(model.blocks[5].attn, model.config.grid), 0, grid=model.config.grid)
        moved = spec.with_atom(0, y=spec.atoms[0].y + 1)

        def apply() -> None:
            with edited(model, [SetHead(5, 0, moved)]):
                model(img)

        t = timed(apply, args.rounds)
        rows.append(("playground apply → prediction (set_head)", statistics.median(t), 0.200))

    t0 = CLOCK()
    head_importance(model, data)
    reuse = CLOCK() - t0
    sweep = importance_edits(model)
    rows.append((f"head importance, {args.images} images, {len(sweep)} edits, reusing lower layers", reuse, 30.0))
    part = load_eval_set(meta, model.config.img_size, min(args.full_images, args.images))
    t0 = CLOCK()
    outcomes(model, part)
    for e in sweep:
        outcomes(model, part, [e])
    full = (CLOCK() - t0) * args.images / len(part)
    rows.append((f"head importance, full edited passes (timed on {len(part)} images, scaled)", full, None))
    load1 = os.getloadavg()[0]

    command, stamp = provenance(argv)
    lines = [
        f"Interventions on {args.checkpoint.name} (d{model.config.dim}, {len(model.blocks)} layers, "
        f"{model.config.grid[0] * model.config.grid[1]} tokens), {torch.get_num_threads()} threads, "
        f"{'CPU time of the one thread' if args.clock == 'cpu' else 'wall clock'}, "
        f"median of {args.rounds} rounds for the one-image rows. {stamp}, `{command}`. Load average "
        f"{load0:.2f}→{load1:.2f}.",
        "",
        "| what | seconds | target |",
        "|---|---:|---:|",
    ]
    for name, secs, target in rows:
        mark = "" if target is None else f"≤ {target:g} {'✓' if secs <= target else '✗'}"
        lines.append(f"| {name} | {secs:.3f} | {mark} |")
    lines.append("")
    lines.append(f"Reusing the residual stream below each edit saves {1 - reuse / full:.0%} of the sweep's time.")
    text = "\n".join(lines) + "\n"
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"interventions_{args.tag or 'cpu'}.md"
    atomic_write(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
