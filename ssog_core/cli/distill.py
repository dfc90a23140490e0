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

``--cluster ADDRESS`` runs the whole distillation (fits, student, training, report) as one job on a worker of that
Dask scheduler (:func:`ssog_core.distill.job.trained`, the app's job): the teacher is sent as bytes (``hf-hub:`` as
its folder in this machine's cache), a folder's pictures too, and recorded validation images are opened there, so
the worker needs none of this machine's files. Progress lines come on stderr; the student, then its report and
chart, are written here when the job returns, each atomically: on a CPU worker the same tensors, metadata and report
as a local run with the same flags (the recorded command leaves ``--cluster`` out) and one torch thread, the job's
(a worker with a GPU computes on it: float32 rounding apart); Ctrl-C stops the job there and writes nothing. Such a
run saves nothing on the way, so ``--resume``, ``--stop-after``, ``--ckpt-every`` and ``--tensorboard`` (events
written on the worker) are refused with it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shlex
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ssog_core.analysis.head_as_field import FIT_ATOMS, MAX_FIT_ATOMS, AtomFit, check_atoms
from ssog_core.checkpoint.files import atomic_write
from ssog_core.checkpoint.format import CheckpointError, load_checkpoint
from ssog_core.checkpoint.portable import portable_argv
from ssog_core.checkpoint.standard import is_standard_source, resolve
from ssog_core.cli import CLUSTER_HELP, on_cluster
from ssog_core.data.images import ImageError, list_images
from ssog_core.data.sources import DataError
from ssog_core.distill.job import Distilled, final_report, fitted_student, setup_of, taps, trained
from ssog_core.distill.loop import Distiller, Recipe, load_state
from ssog_core.distill.report import report_path, stamped
from ssog_core.distill.student import DistillError, check_teacher, teacher_licence
from ssog_core.interventions.validation import MAX_EVAL_IMAGES, EvalSet, pictures_for
from ssog_core.runtime.jobs import Cancelled, JobError
from ssog_core.viz.figures import distill_figure, figure_bytes

RECIPE_FLAGS = {f.name for f in dataclasses.fields(Recipe)}
SETUP_FLAGS = ("teacher", "images", "eval_images", "atoms", "steer", "max_offset")
CKPT_EVERY = 50  # steps between saves of a local run
LOCAL_ONLY = ("resume", "stop_after", "ckpt_every", "tensorboard")  # flags a run on a cluster refuses


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


def picture_specs(images: str, eval_images: str) -> tuple[int | Path, int | Path]:
    """``--images`` and ``--eval-images`` as what they name (a count or a folder), refused in words where they
    name neither or the same folder."""
    train, held = _spec(images, "--images"), _spec(eval_images, "--eval-images")
    if isinstance(train, Path) and isinstance(held, Path) and os.path.realpath(held) == os.path.realpath(train):
        raise DistillError("--eval-images names the folder the student trains on: held-out pictures must differ")
    return train, held


def choose_pictures(
    teacher: torch.nn.Module, meta: dict[str, Any], images: str, eval_images: str
) -> tuple[EvalSet, EvalSet, dict[str, Any]]:
    """The pictures the fit and the training use (exactly those ``fields --images`` measures), the held-out ones,
    and both as the report and metadata record them."""
    train, held = picture_specs(images, eval_images)
    if isinstance(train, int):
        data = _recorded(teacher, meta, train, "--images")
    else:
        data = pictures_for(teacher, meta, MAX_EVAL_IMAGES, folder=train, up_to=True)
    if isinstance(held, Path):
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


def _fits(state: dict[str, Any]) -> list[AtomFit]:
    return [AtomFit(f["mu"], f["sigma"], f["lam"], f["loss"]) for f in state["fits"]]


def write_report(report: dict[str, Any], path: Path) -> None:
    """The report JSON at ``path`` and its chart beside it (PNG + SVG), each written atomically."""
    text = json.dumps(report, indent=1)
    atomic_write(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
    student, teacher = Path(str(report["student"])).name, Path(str(report["teacher"]).rstrip("/")).name
    fig = distill_figure(report, f"{student} from {teacher}")
    for fmt in ("png", "svg"):
        data = figure_bytes(fig, fmt, {"report": str(path), "figure": "distill"})
        atomic_write(path.with_suffix(f".{fmt}"), lambda tmp, b=data: Path(tmp).write_bytes(b))


def recorded_command(argv: list[str]) -> str:
    """The command line a student records: where it ran (``--cluster``) left out, since a worker computes the same
    student, and paths relative to the working directory (as every checkpoint's, so the worker's own folder never
    shows)."""
    kept, skip = [], False
    for arg in argv:
        if skip or arg == "--cluster" or arg.startswith("--cluster="):
            skip = arg == "--cluster"
            continue
        kept.append(arg)
    return "python -m ssog_core distill " + shlex.join(portable_argv(kept))


@dataclass(frozen=True)
class Sent:
    """A folder's pictures as bytes by file name (the first :data:`MAX_EVAL_IMAGES`, all a run reads), under the
    folder's name, which the pictures' records name: what a worker that shares no files with this machine receives."""

    name: str
    files: dict[str, bytes]

    @classmethod
    def of(cls, folder: Path) -> Sent:
        return cls(folder.name, {p.name: p.read_bytes() for p in list_images(folder)[:MAX_EVAL_IMAGES]})

    def written(self, into: Path) -> Path:
        """The folder again, inside ``into``."""
        folder = into / self.name
        folder.mkdir(parents=True)
        for name, data in self.files.items():
            (folder / Path(name).name).write_bytes(data)
        return folder


@dataclass(frozen=True)
class Asked:
    """A run of the command as a job (``--cluster``): the setup's first entries (teacher to max offset, as typed),
    the pictures (a count, or a folder's pictures sent), the teacher's licence, the recipe, the command line and the
    student's name, as the local run records them."""

    head: dict[str, Any]
    train: int | Sent
    held: int | Sent
    licence: str | None
    recipe: Recipe
    command: str
    student: str


def distill_job(
    loaded: tuple[torch.nn.Module, dict[str, Any]],
    asked: Asked,
    progress: Callable[..., None],
    stopped: Callable[[], bool],
) -> Distilled:
    """The command's run on a worker (:func:`ssog_core.distill.job.trained`): the pictures chosen as a local run
    chooses them (folders written again under their names), the student's bytes and report returned."""
    teacher, meta = loaded
    check_teacher(teacher, asked.head["teacher"])
    with tempfile.TemporaryDirectory(prefix="ssog-pictures-") as tmp:
        specs = [str(s.written(Path(tmp) / w) if isinstance(s, Sent) else s) for s, w in
                 ((asked.train, "train"), (asked.held, "held"))]  # fmt: skip
        data, held, words = choose_pictures(teacher, meta, *specs)
    setup = setup_of(asked.head, words, asked.licence, asked.recipe, asked.command)
    return trained(teacher, meta, data, held, setup, asked.recipe, progress, stopped, asked.student)


def _licence(teacher: str) -> str | None:
    return teacher_licence(resolve(teacher)) if is_standard_source(teacher) else None


def _told(out: Path, path: Path, report: dict[str, Any]) -> None:
    a0, a1 = report["step0"], report["final"]
    print(
        f"wrote {out} and {path}: agreement with the teacher {a0['agreement']:.3f} -> {a1['agreement']:.3f}, "
        f"KL {a0['kl']:.4f} -> {a1['kl']:.4f} on {report['held_out_images']} held-out pictures; still content-scored: "
        f"{report['content_scored']}"
    )


def fresh_setup(given: dict[str, Any]) -> dict[str, Any]:
    """The setup's first entries of a new run (:data:`SETUP_FLAGS`, defaults filled in), or a refusal naming the
    flags it lacks."""
    missing = [f"--{k.replace('_', '-')}" for k in ("teacher", "images", "eval_images") if k not in given]
    if missing:
        raise DistillError(f"a new distillation needs {', '.join(missing)}")
    return {
        "teacher": given["teacher"],
        "images": given["images"],
        "eval_images": given["eval_images"],
        "atoms": check_atoms(given.get("atoms", FIT_ATOMS)),
        "steer": given.get("steer", "mu,sigma,lambda"),
        "max_offset": float(given.get("max_offset", 4.0)),
    }


def run_on_cluster(args: argparse.Namespace, given: dict[str, Any], command: str) -> int:
    """The whole run as one job on a worker of ``--cluster`` (module doc); the student, then its report, written
    here once it returns."""
    out = Path(args.out)
    head = fresh_setup(given)
    recipe = Recipe(**{k: v for k, v in given.items() if k in RECIPE_FLAGS})
    train, held = picture_specs(head["images"], head["eval_images"])
    teacher = head["teacher"]
    asked = Asked(head, *(Sent.of(s) if isinstance(s, Path) else s for s in (train, held)), _licence(teacher),
                  recipe, command, str(out))  # fmt: skip
    path = Path(args.report) if args.report else report_path(out)
    for folder in {out.parent, path.parent}:  # a run's result is lost if it cannot be written: found out first
        folder.mkdir(parents=True, exist_ok=True)
        if not os.access(folder, os.W_OK):
            raise DistillError(f"cannot write into {folder}: the student and its report go there")
    got = on_cluster(args.cluster, distill_job, teacher, asked, unit="steps")
    atomic_write(out, lambda tmp: Path(tmp).write_bytes(got.student))
    write_report(got.report, path)
    _told(out, path, got.report)
    return 0


def run(args: argparse.Namespace, command: str) -> int:
    """The command (module doc); returns the exit code."""
    out = Path(args.out)
    if out.suffix != ".safetensors":
        raise DistillError(f"--out names the student's .safetensors file; got {out}")
    given = {k: getattr(args, k) for k in (*RECIPE_FLAGS, *SETUP_FLAGS) if getattr(args, k) is not None}
    if "steer" in given:
        given["steer"] = ",".join(taps(given["steer"]))
    if args.cluster:
        return run_on_cluster(args, given, command)
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
        recipe = Recipe(**{k: v for k, v in given.items() if k in RECIPE_FLAGS})
        setup = fresh_setup(given)
    teacher, teacher_meta = load_checkpoint(setup["teacher"])
    check_teacher(teacher, setup["teacher"])
    data, held_out, words = choose_pictures(teacher, teacher_meta, setup["images"], setup["eval_images"])
    if state is None:
        fits, student = fitted_student(teacher, data, setup["atoms"], taps(setup["steer"]), setup["max_offset"],
                                       lambda: False)  # fmt: skip
        setup = setup_of(setup, words, _licence(setup["teacher"]), recipe, command)
    else:
        student, fits = load_checkpoint(out)[0], _fits(state)
    distiller = Distiller(
        teacher, student, fits, data, held_out, recipe, out, {**setup, "teacher_meta": teacher_meta}, state,
        args.tensorboard, not args.no_progress, CKPT_EVERY if args.ckpt_every is None else args.ckpt_every,
    )  # fmt: skip
    code = distiller.run(args.stop_after)
    if code or distiller.step < recipe.steps:
        return code
    path = Path(args.report) if args.report else report_path(out)
    report = stamped(final_report(distiller, {**setup, "student": str(out)}), out.read_bytes())
    write_report(report, path)
    _told(out, path, report)
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
    ap.add_argument("--ckpt-every", type=int,
                    help=f"save the student and its state every N steps (default {CKPT_EVERY})")  # fmt: skip
    ap.add_argument("--tensorboard", help="write TensorBoard events (loss, agreement, gates) to this folder")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    ap.add_argument("--cluster", metavar="ADDRESS",
                    help=f"{CLUSTER_HELP}: the whole run as one job, the student and report written here at the end "
                    "(without --resume, --stop-after, --ckpt-every, --tensorboard)")  # fmt: skip
    args = ap.parse_args(argv)
    if args.cluster:
        local = [f"--{k.replace('_', '-')}" for k in LOCAL_ONLY if getattr(args, k) not in (None, False)]
        if local:
            ap.error(f"--cluster runs the whole distillation as one job and writes the student once, at the end: "
                     f"{', '.join(local)} need a local run")  # fmt: skip
    command = recorded_command(sys.argv[1:] if argv is None else argv)
    try:
        return run(args, command)
    except (CheckpointError, ImageError, DataError, JobError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except (Cancelled, KeyboardInterrupt):
        if not args.cluster:  # a local run saves and stops on the first Ctrl-C; a second one ends it at once
            raise
        print(f"stopped: the job on {args.cluster} was stopped; nothing was written", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
