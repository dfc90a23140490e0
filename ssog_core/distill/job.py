"""A distillation as a heavy job (:class:`ssog_core.runtime.jobs.Engine`): the app's "Distill into SSOG" and
``/distill`` (:func:`distill`), and ``python -m ssog_core distill --cluster`` (the command's pictures, the same
:func:`trained`). The worker fits every head of the teacher on the chosen pictures, builds the student, trains it
(:class:`~ssog_core.distill.loop.Distiller`, in a folder of its own that goes with the job) and returns the student
file's bytes with its report; whoever submitted the job writes them where it keeps checkpoints, so a worker needs no
access to that folder and a stopped job leaves nothing behind.

The app's pictures are what *Every head as a field* measures
(:meth:`~ssog_core.interventions.validation.Pictures.eval_set` with ``up_to``): the student trains on up to N of
them, so its field at step 0 is the fields' fit for the same N and K, and the report is made on up to N more held
out after them (the validation images after the first N, or a folder's pictures after its first N).
"""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import Tensor, nn

from ssog_core.analysis.head_as_field import FIELD_BATCH, AtomFit, check_atoms, fit_layers, mean_attention
from ssog_core.distill.loop import Distiller, Recipe
from ssog_core.distill.report import compare, head_shares, report_json, stamped
from ssog_core.distill.student import DistillError, build_student, check_teacher
from ssog_core.interventions.validation import MAX_EVAL_IMAGES, EvalSet, Pictures
from ssog_core.nn.vit import ViT
from ssog_core.runtime.jobs import Cancelled

MAX_IMAGES = MAX_EVAL_IMAGES // 2  # pictures to train on: as many again may be held out
Loaded = tuple[nn.Module, dict[str, Any]]
Progress = Callable[..., None]  # progress(done, total[, detail])
Stopped = Callable[[], bool]


@dataclass(frozen=True)
class DistillRequest:
    """One distillation: the ``teacher`` by the name its caller knows it by (recorded in the student), up to
    ``images`` of ``pictures`` to train on (as many again held out), ``atoms`` per head, the taps content steers,
    the recipe, and the teacher's licence where its folder states one."""

    teacher: str
    pictures: Pictures
    images: int
    atoms: int
    steer: tuple[str, ...]
    recipe: Recipe
    licence: str | None = None
    max_offset: float = 4.0

    def __post_init__(self) -> None:
        if not (isinstance(self.images, int) and 1 <= self.images <= MAX_IMAGES):
            raise DistillError(f"train on 1 to {MAX_IMAGES} pictures (as many again are held out), not {self.images}")
        check_atoms(self.atoms)


@dataclass(frozen=True)
class Distilled:
    """What the job returns: the student's ``.safetensors`` bytes (an ordinary lab checkpoint) and its report
    (:func:`report_json`, stamped with those bytes' SHA-256; ``student``, its name, only where the caller gave it:
    the command's)."""

    student: bytes
    report: dict[str, Any]


def split_pictures(
    teacher: nn.Module, meta: dict[str, Any], pictures: Pictures, n: int
) -> tuple[EvalSet, EvalSet, dict[str, Any]]:
    """Up to ``n`` of ``pictures`` to train on (those *Every head as a field* measures with N = ``n``), up to ``n``
    after them held out, and both as the student's metadata and its report record them; none left to hold out is
    refused in words."""
    data = pictures.eval_set(teacher, meta, n, up_to=True)
    both = pictures.eval_set(teacher, meta, 2 * len(data), up_to=True)
    held = dataclasses.replace(
        both, images=both.images[len(data) :], labels=None if both.labels is None else both.labels[len(data) :]
    )
    if not len(held):
        raise DistillError(
            f"{data.words()} leave none to hold out: the student trains on the first N and is reported on the ones "
            f"after them; set N below {len(data)} or choose more pictures"
        )
    kept = {k: v for k, v in data.describe().items() if k != "first"}
    return data, held, {"pictures": data.describe(), "held_out": {**kept, "after": len(data), "count": len(held)}}


def final_report(d: Distiller, setup: dict[str, Any]) -> dict[str, Any]:
    """The report of a finished run on its held-out pictures (:func:`report_json`), ``setup`` recorded in it."""
    shares = head_shares(d.teacher, d.student, d.fits, d.held_out)
    return report_json(shares, d.step0, compare(d.teacher, d.student, d.held_out), d.student, setup, d.step)


def taps(text: str) -> tuple[str, ...]:
    """The taps a ``steer`` text names (``mu,sigma``; spaces ignored)."""
    return tuple(t.strip() for t in text.split(",") if t.strip())


def setup_of(
    head: dict[str, Any], words: dict[str, Any], licence: str | None, recipe: Recipe, command: str
) -> dict[str, Any]:
    """What the student's metadata and its report record of a run, in this order (the command's and the app's
    alike): ``head`` (teacher, what pictures were asked for, K, taps, max offset), the pictures as chosen
    (``words``), the teacher's licence, the recipe and the command that asked for it."""
    return {**head, **words, "teacher_licence": licence, "recipe": recipe.to_dict(), "command": command}


def fitted_student(
    teacher: nn.Module, data: EvalSet, atoms: int, steer: tuple[str, ...], max_offset: float, stopped: Stopped
) -> tuple[list[AtomFit], ViT]:
    """Every head's fit on ``data`` (the fields' batches: the same mean attention, the same atoms as ``fields``)
    and the student built on them; a stop ends it at the next batch (:class:`Cancelled`)."""

    def batches() -> Iterator[Tensor]:
        for x in data.batches(teacher, FIELD_BATCH):
            if stopped():
                raise Cancelled("the distillation was stopped")
            yield x

    attention = mean_attention(teacher, batches())
    fits = fit_layers(attention, atoms)
    return fits, build_student(teacher, attention, fits, steer, max_offset)


def trained(
    teacher: nn.Module,
    meta: dict[str, Any],
    data: EvalSet,
    held: EvalSet,
    setup: dict[str, Any],
    recipe: Recipe,
    progress: Progress,
    stopped: Stopped,
    student: str | None = None,
) -> Distilled:
    """A run of ``setup`` (:func:`setup_of`) on a worker, from the fits to the report: the student trained in a folder
    of its own, its bytes and report returned (``student``: its name, recorded in the report as the command records
    it). Progress counts optimizer steps, each with its loss and the batch's agreement with the teacher; a stop ends
    it at the next batch or step (:class:`Cancelled`), and nothing it made survives it."""
    steps = recipe.steps
    progress(0, steps, f"fitting {setup['atoms']} atoms to every head on {data.words()}")
    fits, model = fitted_student(teacher, data, setup["atoms"], taps(setup["steer"]), setup["max_offset"], stopped)
    progress(0, steps, f"the student at step 0 on {len(held)} held-out pictures")

    def on_step(step: int, loss: float, agreement: float) -> None:
        progress(step, steps, f"loss {loss:.4g}, agreement with the teacher {agreement:.2f} on the batch")
        if stopped():
            raise Cancelled("the distillation was stopped")

    with tempfile.TemporaryDirectory(prefix="ssog-distill-") as tmp:
        out = Path(tmp) / "student.safetensors"
        d = Distiller(teacher, model, fits, data, held, recipe, out, {**setup, "teacher_meta": meta},
                      progress=False, ckpt_every=0)  # fmt: skip
        if d.run(on_step=on_step) != 0:  # a signal to the worker: stopped as a Stop would
            raise Cancelled("the distillation was interrupted")
        progress(steps, steps, f"the report on {len(held)} held-out pictures")
        blob = out.read_bytes()
        named = setup if student is None else {**setup, "student": student}
        return Distilled(blob, stamped(final_report(d, named), blob))


def distill(loaded: Loaded, request: DistillRequest, progress: Progress, stopped: Stopped) -> Distilled:
    """The app's distillation of ``request`` on a worker (module doc): :func:`trained` on its pictures."""
    teacher, meta = loaded
    check_teacher(teacher, request.teacher)
    data, held, words = split_pictures(teacher, meta, request.pictures, request.images)
    steer = ",".join(request.steer)
    head = {"teacher": request.teacher, "images": request.images, "atoms": request.atoms, "steer": steer,
            "max_offset": request.max_offset}  # fmt: skip
    command = (f"SSOG Lab app: distill {request.teacher} into SSOG on {data.words()}, K = {request.atoms}, "
               f"steer {steer}, {request.recipe.steps} steps")  # fmt: skip
    setup = setup_of(head, words, request.licence, request.recipe, command)
    return trained(teacher, meta, data, held, setup, request.recipe, progress, stopped)
