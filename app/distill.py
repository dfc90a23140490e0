"""The app's side of "distill into SSOG", the service the geometry tab and ``/distill`` share: an SSOG student of a
dot-attention model (docs/DESIGN.md §2.5) made as a heavy job (:func:`ssog_core.distill.job.distill` on
:func:`app.queues.engine`) on the page's chosen pictures, then written into the checkpoint folder, where every
picker offers it.

The student trains on the pictures *Every head as a field* measures with the same N (its field at step 0 is that
fit, for the same K) and is reported on up to N pictures after them. It is written only once the job is complete:
its report first (``STUDENT.report.json``, what the CLI writes beside a student), then the student, each atomically,
under a name made from the teacher's (``TEACHER_distilled.safetensors``, then ``_2``, ``_3``, …: an existing file
is never replaced, and the answer names those that were there). A stopped or failed job writes nothing.

A student opened later (its metadata names its teacher) brings its report back (:func:`opened`): the one reader,
:func:`ssog_core.distill.report.read_report`, checks that the report is one and is this very file's (by SHA-256), and
says in words what is wrong when it is not.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app import queues
from app.state import AppContext, AppError, LoadedModel
from ssog_core.checkpoint.files import atomic_write
from ssog_core.checkpoint.standard import HUB_PREFIX
from ssog_core.distill import job
from ssog_core.distill.loop import Recipe
from ssog_core.distill.report import read_report, report_path
from ssog_core.distill.student import check_teacher, teacher_licence
from ssog_core.field import TAPS
from ssog_core.interventions.validation import Pictures
from ssog_core.runtime.jobs import Cancelled

DEFAULT_STEPS = 300  # the CLI's default
MAX_STEPS = 10_000
STEER_CHOICES = ("mu", "mu,sigma,lambda")  # what the tab offers; the API takes any distinct taps
SUFFIX = "_distilled"
Stop = Any  # a stop callable (or None) as app.queues.ran takes it
_writing = threading.Lock()  # a name chosen and its files written by one job at a time


@dataclass(frozen=True)
class Student:
    """A student with its report: written into the checkpoint folder by :func:`keep` (``existed``: the names derived
    from the teacher's that were already there, kept as they were) or opened (:func:`opened`, ``existed`` None). Its
    picker ``name`` and its ``report`` (the CLI's JSON, with ``student`` and ``student_sha256``)."""

    name: str
    report: dict[str, Any]
    existed: list[str] | None = None

    @property
    def teacher(self) -> str:
        return str(self.report["teacher"])

    def to_dict(self) -> dict[str, Any]:
        """The ``/distill`` answer."""
        return {"student": self.name, "existed": self.existed, "report": self.report}


def request(
    ctx: AppContext, loaded: LoadedModel, n: int, atoms: int, steer: str, steps: int, pictures: Pictures
) -> job.DistillRequest:
    """The distillation of ``loaded`` asked for, checked before any heavy slot is taken: a model without dot heads,
    bad steps, taps, N or K are refused in words."""
    check_teacher(loaded.model, loaded.name)
    steps = _whole(steps, "steps")
    if not 1 <= steps <= MAX_STEPS:
        raise AppError(f"distil for 1 to {MAX_STEPS} steps, not {steps}")
    taps = tuple(t.strip() for t in str(steer or "").split(",") if t.strip())
    if not taps or len(set(taps)) != len(taps) or any(t not in TAPS for t in taps):
        raise AppError(f"steer takes distinct taps from {', '.join(TAPS)} (e.g. mu or mu,sigma,lambda), not {steer!r}")
    path = ctx.resolve(loaded.name)
    licence = teacher_licence(path) if path.is_dir() else None
    return job.DistillRequest(loaded.name, pictures, _whole(n, "N"), _whole(atoms, "K"), taps, Recipe(steps=steps),
                              licence)  # fmt: skip


def _whole(value: Any, what: str) -> int:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise AppError(f"{what} must be a whole number, not {value!r}") from None
    if number != int(number):
        raise AppError(f"{what} must be a whole number, not {value!r}")
    return int(number)


def run(ctx: AppContext, loaded: LoadedModel, asked: job.DistillRequest, stop: Stop = None,
        watch: queues.Watch | None = None) -> Student:  # fmt: skip
    """The distillation ``asked`` as a heavy job, its student written into the checkpoint folder once complete;
    ``stop`` ends it, also while it waits for a slot, and then nothing is written."""
    out = queues.ran(job.distill, loaded.key[0], asked, stop=stop, watch=watch)
    if stop is not None and stop():  # stopped as it ended: keep nothing, as the note says
        raise Cancelled("the distillation was stopped")
    return keep(ctx, loaded.name, out)


def stem(teacher: str) -> str:
    """A file-name stem from a picker name: ``dot_layouts.safetensors`` → ``dot_layouts``, ``hf-hub:ORG/NAME`` →
    ``NAME``, ``uploaded/x`` → ``x``."""
    name = Path(teacher.removeprefix(HUB_PREFIX).split("@", 1)[0].rstrip("/")).name.removesuffix(".safetensors")
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name).strip("._") or "model"


def keep(ctx: AppContext, teacher: str, out: job.Distilled) -> Student:
    """Write ``out`` into the checkpoint folder under a new name made from ``teacher``'s: the report, then the
    student, each atomically."""
    folder = ctx.checkpoint_dir
    base, existed = stem(teacher) + SUFFIX, []
    with _writing:
        try:
            folder.mkdir(parents=True, exist_ok=True)
            n, name = 1, f"{base}.safetensors"
            while (folder / name).exists() or report_path(folder / name).exists():
                existed.append(name)
                n += 1
                name = f"{base}_{n}.safetensors"
            report = {**out.report, "student": name}
            text = json.dumps(report, indent=1)
            atomic_write(report_path(folder / name), lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
            atomic_write(folder / name, lambda tmp: Path(tmp).write_bytes(out.student))
        except OSError as e:
            raise AppError(f"the student could not be written into {folder}: {e.strerror or e}") from None
    return Student(name, report, existed)


def opened(ctx: AppContext, loaded: LoadedModel) -> Student | None:
    """The report of a student opened from the pickers (read beside its file, checked by :func:`read_report`), None
    for a model that is no student; a student without a report of its own is an :class:`AppError` saying why."""
    teacher = loaded.teacher
    if teacher is None:
        return None
    path = ctx.resolve(loaded.name)
    if not path.is_file():
        raise AppError(f"{loaded.name} is not a student file: its report is read from beside a .safetensors file")
    cfg = loaded.config
    try:
        report = read_report(path, teacher, cfg.depth, cfg.num_heads)
    except ValueError as e:
        raise AppError(str(e)) from None
    return Student(loaded.name, report)
