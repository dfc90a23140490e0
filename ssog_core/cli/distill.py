"""An SSOG model from any dot-attention ViT: each head's patch-to-patch attention becomes its fitted field (the atoms
``fields`` reports for the same teacher, pictures and K), content learns to steer it by matching the teacher's logits
on unlabelled pictures, and a report says per head how much of the teacher geometry alone and geometry with steering
explain (docs/DESIGN.md §2.5).

    python -m ssog_core distill --teacher hf-hub:facebook/deit-small-patch16-224 --images photos/ \\
        --eval-images held_out/ --atoms 4 --steer mu,sigma,lambda --steps 300 --out deit_ssog.safetensors
    python -m ssog_core distill --teacher checkpoints/dot.safetensors --images 256 --eval-images 128 \\
        --steps 500 --out student.safetensors --tensorboard runs/tb

``--images N`` takes the first N validation images of the teacher's recorded data, ``--images FOLDER`` the pictures
of a folder; ``--eval-images M`` the M validation images after those (or the first M when training on a folder), or
the pictures of another folder. The student (``--out``) is an ordinary lab checkpoint whose metadata names the
teacher (and the licence its folder states), the pictures and the recipe; ``--out`` is rewritten every
``--ckpt-every`` steps beside ``STUDENT.state.pt`` (``--resume`` continues from it, bit for bit; the first
Ctrl-C saves and stops). At the end the report (``--report``, default ``STUDENT.report.json``, the file the app
reads when it opens the student) and its chart (PNG + SVG beside it) are written, naming the student by its file's
SHA-256: agreement with the teacher (top-1), KL and accuracy (where the pictures have labels) on
the held-out pictures at step 0 and at the end, and per head ``share_fit``, ``share_steered``, both normalised
against the uniform field, their difference and the steering reach
(:func:`~ssog_core.distill.report.report_json`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shlex
import sys
from pathlib import Path
from typing import Any

import torch

from ssog_core.analysis.head_as_field import (
    FIELD_BATCH,
    FIT_ATOMS,
    MAX_FIT_ATOMS,
    AtomFit,
    check_atoms,
    fit_layers,
    mean_attention,
)
from ssog_core.checkpoint.files import atomic_write
from ssog_core.checkpoint.format import CheckpointError, load_checkpoint
from ssog_core.checkpoint.standard import is_standard_source, resolve
from ssog_core.data.images import ImageError
from ssog_core.data.sources import DataError
from ssog_core.distill.job import final_report
from ssog_core.distill.loop import Distiller, Recipe, load_state
from ssog_core.distill.report import report_path, stamped
from ssog_core.distill.student import DistillError, build_student, check_teacher, teacher_licence
from ssog_core.interventions.validation import MAX_EVAL_IMAGES, EvalSet, pictures_for
from ssog_core.viz.figures import distill_figure, figure_bytes

RECIPE_FLAGS = {f.name for f in dataclasses.fields(Recipe)}
SETUP_FLAGS = ("teacher", "images", "eval_images", "atoms", "steer", "max_offset")


def _spec(text: str, flag: str) -> int | Path:
    """``N`` or a folder, as ``--images`` and ``--eval-images`` take them."""
    if re.fullmatch(r"\d+", text) and int(text) >= 1:
        return int(text)
    if Path(text).is_dir():
        return Path(text)
    raise ImageError(
        f"{flag} takes a number of validation images (at least 1) or a folder of pictures; {text} is neither"
    )


def _recorded(teacher: torch.nn.Module, meta: dict[str, Any], n: int, flag: str) -> EvalSet:
    """The first ``n`` validation images of the teacher's recorded data, or a refusal in words."""
    if not meta.get("data"):
        raise DistillError(
            f"{flag} {n} takes the teacher's recorded validation images, but the teacher records no data: "
            "give a folder of pictures instead"
        )
    return pictures_for(teacher, meta, n)


def choose_pictures(
    teacher: torch.nn.Module, meta: dict[str, Any], images: str, eval_images: str
) -> tuple[EvalSet, EvalSet, dict[str, Any]]:
    """The pictures the fit and the training use (exactly those ``fields --images`` measures), the held-out ones,
    and both as the report and metadata record them."""
    train, held = _spec(images, "--images"), _spec(eval_images, "--eval-images")
    if isinstance(train, int):
        data = _recorded(teacher, meta, train, "--images")
    else:
        data = pictures_for(teacher, meta, MAX_EVAL_IMAGES, folder=train, up_to=True)
    if isinstance(held, Path):
        if isinstance(train, Path) and os.path.realpath(held) == os.path.realpath(train):
            raise DistillError("--eval-images names the folder the student trains on: held-out pictures must differ")
        out = pictures_for(teacher, meta, MAX_EVAL_IMAGES, folder=held, up_to=True)
        held_words = out.describe()
    elif isinstance(train, int):  # the validation images after the training ones
        both = _recorded(teacher, meta, train + held, "--eval-images")
        labels = None if both.labels is None else both.labels[train:]
        out = dataclasses.replace(both, images=both.images[train:], labels=labels)
        held_words = {"data": both.spec, "split": "validation", "after": train, "count": len(out)}
    else:
        out = _recorded(teacher, meta, held, "--eval-images")
        held_words = out.describe()
    return data, out, {"pictures": data.describe(), "held_out": held_words}


def _steer(text: str) -> tuple[str, ...]:
    return tuple(t.strip() for t in text.split(",") if t.strip())


def _fits(state: dict[str, Any]) -> list[AtomFit]:
    return [AtomFit(f["mu"], f["sigma"], f["lam"], f["loss"]) for f in state["fits"]]


def write_report(distiller: Distiller, path: Path) -> dict[str, Any]:
    """The report JSON at ``path`` (stamped with the student file's SHA-256) and its chart beside it (PNG + SVG),
    from the held-out pictures."""
    d = distiller
    setup = {k: v for k, v in d.setup.items() if k != "teacher_meta"}
    report = stamped(final_report(d, {**setup, "student": str(d.out)}), d.out.read_bytes())
    text = json.dumps(report, indent=1)
    atomic_write(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
    fig = distill_figure(report, f"{d.out.name} from {Path(str(setup['teacher']).rstrip('/')).name}")
    for fmt in ("png", "svg"):
        data = figure_bytes(fig, fmt, {"report": str(path), "figure": "distill"})
        atomic_write(path.with_suffix(f".{fmt}"), lambda tmp, b=data: Path(tmp).write_bytes(b))
    return report


def run(args: argparse.Namespace, command: str) -> int:
    """The command (module doc); returns the exit code."""
    out = Path(args.out)
    if out.suffix != ".safetensors":
        raise DistillError(f"--out names the student's .safetensors file; got {out}")
    given = {k: getattr(args, k) for k in (*RECIPE_FLAGS, *SETUP_FLAGS) if getattr(args, k) is not None}
    state = load_state(out) if args.resume else None
    if state is not None:
        saved = {**state["recipe"], **{k: state["setup"][k] for k in SETUP_FLAGS}}
        changed = [f"--{k.replace('_', '-')} {saved[k]!r} -> {v!r}" for k, v in given.items() if saved[k] != v]
        if changed:
            raise DistillError(
                "a resumed run must keep its recipe; these differ from the saved run: " + "; ".join(changed)
            )
        recipe, setup = Recipe(**state["recipe"]), dict(state["setup"])
    else:
        missing = [f"--{k.replace('_', '-')}" for k in ("teacher", "images", "eval_images") if k not in given]
        if missing:
            raise DistillError(f"a new distillation needs {', '.join(missing)}")
        recipe = Recipe(**{k: v for k, v in given.items() if k in RECIPE_FLAGS})
        setup = {
            "teacher": given["teacher"],
            "images": given["images"],
            "eval_images": given["eval_images"],
            "atoms": check_atoms(given.get("atoms", FIT_ATOMS)),
            "steer": given.get("steer", "mu,sigma,lambda"),
            "max_offset": float(given.get("max_offset", 4.0)),
        }
    teacher, teacher_meta = load_checkpoint(setup["teacher"])
    check_teacher(teacher, setup["teacher"])
    data, held_out, words = choose_pictures(teacher, teacher_meta, setup["images"], setup["eval_images"])
    if state is None:
        attention = mean_attention(teacher, data.batches(teacher, FIELD_BATCH))
        fits = fit_layers(attention, setup["atoms"])
        student = build_student(teacher, attention, fits, _steer(setup["steer"]), setup["max_offset"])
        licence = teacher_licence(resolve(setup["teacher"])) if is_standard_source(setup["teacher"]) else None
        setup = {**setup, **words, "teacher_licence": licence, "recipe": recipe.to_dict(), "command": command}
    else:
        student, fits = load_checkpoint(out)[0], _fits(state)
    distiller = Distiller(
        teacher, student, fits, data, held_out, recipe, out, {**setup, "teacher_meta": teacher_meta}, state,
        args.tensorboard, not args.no_progress, args.ckpt_every,
    )  # fmt: skip
    code = distiller.run(args.stop_after)
    if code or distiller.step < recipe.steps:
        return code
    path = Path(args.report) if args.report else report_path(out)
    report = write_report(distiller, path)
    a0, a1 = report["step0"], report["final"]
    print(
        f"wrote {out} and {path}: agreement with the teacher {a0['agreement']:.3f} -> {a1['agreement']:.3f}, "
        f"KL {a0['kl']:.4f} -> {a1['kl']:.4f} on {report['held_out_images']} held-out pictures; still content-scored: "
        f"{report['content_scored']}"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    d = Recipe()
    ap.add_argument(
        "--teacher", help="a dot-attention ViT: a lab checkpoint, a timm or transformers folder, hf-hub:ORG/NAME"
    )
    ap.add_argument(
        "--images", help="N (the first N validation images) or a folder of pictures: the fit and the training"
    )
    ap.add_argument("--eval-images", help="M (the M validation images after the training ones) or another folder")
    ap.add_argument("--atoms", type=int, help=f"Gaussian atoms per head (1 to {MAX_FIT_ATOMS}; default {FIT_ATOMS})")
    ap.add_argument("--steer", help="the taps content steers: mu or mu,sigma,lambda (the default)")
    ap.add_argument("--max-offset", type=float, help="how far content may move an atom, in grid cells (default 4)")
    ap.add_argument("--steps", type=int, help=f"optimizer steps (default {d.steps})")
    ap.add_argument("--batch-size", type=int, help=f"pictures per step (default {d.batch_size})")
    ap.add_argument("--lr", type=float, help=f"peak learning rate (default {d.lr})")
    ap.add_argument("--gate-lr-mult", type=float, help=f"the gates' learning rate over --lr (default {d.gate_lr_mult})")
    ap.add_argument("--max-gate", type=float,
                    help=f"the most a gate scale may grow to, so content moves an atom at most that × --max-offset "
                    f"cells (default {d.max_gate})")  # fmt: skip
    ap.add_argument("--weight-decay", type=float, help=f"AdamW's (default {d.weight_decay})")
    ap.add_argument("--temperature", type=float, help=f"of the KL to the teacher's logits (default {d.temperature})")
    ap.add_argument("--rows-weight", type=float,
                    help=f"weight of the per-head patch-row term (default {d.rows_weight}; 0: off)")  # fmt: skip
    ap.add_argument("--train", choices=("steering", "fields", "all"),
                    help="steering (probes, gates: the default); fields: also atoms, prefix mass; all")  # fmt: skip
    ap.add_argument("--seed", type=int, help=f"the pictures each step draws (default {d.seed})")
    ap.add_argument("--out", required=True, help="the student, STUDENT.safetensors")
    ap.add_argument("--report", help="the report JSON (default: STUDENT.report.json)")
    ap.add_argument("--resume", action="store_true", help="continue the run saved at --out")
    ap.add_argument("--stop-after", type=int, help="save and stop after this many steps (continue with --resume)")
    ap.add_argument("--ckpt-every", type=int, default=50, help="save the student and its state every N steps")
    ap.add_argument("--tensorboard", help="write TensorBoard events (loss, agreement, gates) to this folder")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = ap.parse_args(argv)
    command = "python -m ssog_core distill " + shlex.join(sys.argv[1:] if argv is None else argv)
    try:
        return run(args, command)
    except (CheckpointError, ImageError, DataError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
