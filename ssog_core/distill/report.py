"""What a student says about its teacher, on held-out pictures (docs/DESIGN.md §2.5): agreement (top-1) and the KL
divergence between their predictions, accuracy where the pictures have labels, and per head

* ``share_fit``: 1 − mean TV between the teacher's patch rows and its fitted field's (geometry alone);
* ``share_steered``: 1 − mean TV between the teacher's patch rows and the student's steered ones (geometry that
  content steers);
* ``share_uniform``: the uniform field's share, the baseline both are normalised against
  (:func:`~ssog_core.analysis.head_as_field.normalised`; a head within ``DIFFUSE_TV`` of uniform is *diffuse*);
* ``steering_reach``: how far content moves the head's atoms, the mean ``‖Δμ‖`` in grid cells over patch queries,
  atoms and pictures (:func:`~ssog_core.analysis.measures.steering_offsets`).

Rows are over patch keys, renormalised (as every head field's are); what remains content-scored (the prefix
queries) is said in words.

The report is written beside its student (:func:`report_path`) by ``python -m ssog_core distill`` and the app alike,
and names the student it belongs to by the SHA-256 of its file (``student_sha256``), so :func:`read_report` (the one
reader: the app's geometry tab when a student is opened) tells a report that is a replaced file's from its own.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ssog_core.analysis.head_as_field import (
    AtomFit,
    normalised,
    patch_attention,
    pattern_points,
    share_of,
    uniform_rows,
)
from ssog_core.analysis.measures import steering_offsets
from ssog_core.distill.student import DistillError, content_scored
from ssog_core.interventions.validation import EvalSet
from ssog_core.nn.hook_points import reading
from ssog_core.nn.vit import ViT
from ssog_core.runtime.jobs import file_sha256

REPORT_BATCH = 16  # held-out pictures per forward pass
MAX_REPORT_BYTES = 16 * 2**20  # a report of 12 × 16 heads is ~100 KB: anything far larger is not one
COMPARED = ("agreement", "kl")  # what step0 and final hold as numbers (accuracy too, or null, where labels exist)
HEAD_NUMBERS = ("share_fit", "share_steered", "share_uniform", "difference", "steering_reach")
HEAD_OPTIONAL = ("normalised_fit", "normalised_steered", "normalised_difference")  # null for a diffuse head


def kl_per_image(teacher_logits: Tensor, student_logits: Tensor, temperature: float = 1.0) -> Tensor:
    """``(B,)`` ``KL(p_teacher ‖ p_student)`` of the predictions at ``temperature``, in nats (float32 or wider)."""
    t = torch.log_softmax(teacher_logits.float() / temperature, -1)
    s = torch.log_softmax(student_logits.float() / temperature, -1)
    return (t.exp() * (t - s)).sum(-1)


@torch.no_grad()
@torch.no_grad()
def compare(teacher: ViT, student: ViT, data: EvalSet, batch_size: int = REPORT_BATCH) -> dict[str, float | None]:
    """``agreement`` (top-1, student with teacher), ``kl`` (mean ``KL(teacher ‖ student)``, nats) and, where the
    pictures have labels, ``accuracy`` of the student and ``teacher_accuracy`` (else ``None``)."""
    p = next(student.parameters())
    agree = kl = correct = teacher_correct = 0.0
    for start in range(0, len(data), batch_size):
        stop = min(start + batch_size, len(data))
        x = data.batch(start, stop, p.device, p.dtype)
        t, s = teacher(x), student(x)
        agree += float((t.argmax(-1) == s.argmax(-1)).sum())
        kl += float(kl_per_image(t, s).sum())
        if data.labels is not None:
            y = data.labels[start:stop].to(p.device)
            correct += float((s.argmax(-1) == y).sum())
            teacher_correct += float((t.argmax(-1) == y).sum())
    n = len(data)
    labelled = data.labels is not None
    return {
        "agreement": agree / n,
        "kl": kl / n,
        "accuracy": correct / n if labelled else None,
        "teacher_accuracy": teacher_correct / n if labelled else None,
    }


@dataclasses.dataclass
class HeadShares:
    """Per head ``(L, H)``, float64, over ``images`` held-out pictures (module doc)."""

    share_fit: Tensor
    share_steered: Tensor
    share_uniform: Tensor
    steering_reach: Tensor
    images: int

    @property
    def diffuse(self) -> Tensor:
        """Whether a head lies too close to uniform for a share to normalise (NaN in the normalised shares)."""
        return normalised(self.share_fit, self.share_uniform).isnan()

    @property
    def normalised_fit(self) -> Tensor:
        return normalised(self.share_fit, self.share_uniform)

    @property
    def normalised_steered(self) -> Tensor:
        return normalised(self.share_steered, self.share_uniform)


@torch.no_grad()
def head_shares(
    teacher: ViT, student: ViT, fits: list[AtomFit], data: EvalSet, batch_size: int = REPORT_BATCH
) -> HeadShares:
    """Every head's shares and steering reach on ``data`` (module doc)."""
    p = next(student.parameters())
    grid, prefix = student.grid_for(*data.images.shape[1:3]), student.num_prefix_tokens
    fit_rows = [f.rows(grid) for f in fits]
    flat = uniform_rows(grid)
    t_points = dict(enumerate(pattern_points(teacher)))
    s_points = dict(enumerate(pattern_points(student)))
    sums = torch.zeros(4, len(fits), fits[0].mu.shape[0], dtype=torch.float64)
    for start in range(0, len(data), batch_size):
        x = data.batch(start, min(start + batch_size, len(data)), p.device, p.dtype)
        with reading(t_points, replace=True) as taught:
            teacher(x)
        with reading(s_points, replace=True) as learnt:
            student(x)
        offsets = steering_offsets(student, x)
        for layer in range(len(fits)):
            t = patch_attention(taught[layer], grid, prefix)[0]
            s = patch_attention(learnt[layer], grid, prefix)[0]
            sums[0, layer] += share_of(t, fit_rows[layer].to(t.device)).cpu() * len(x)
            sums[1, layer] += share_of(t, s).cpu() * len(x)
            sums[2, layer] += share_of(t, flat.to(t.device)).cpu() * len(x)
            reach = offsets.dmu[layer].double().norm(dim=-1)  # (B, Gh, Gw, H, R)
            sums[3, layer] += reach.mean(dim=(1, 2, 4)).sum(0)
    sums /= len(data)
    return HeadShares(sums[0], sums[1], sums[2], sums[3], len(data))


def _number(value: Tensor) -> float | None:
    v = float(value)
    return None if math.isnan(v) else v


def report_json(
    shares: HeadShares,
    step0: dict[str, Any],
    final: dict[str, Any],
    student: ViT,
    setup: dict[str, Any],
    step: int,
) -> dict[str, Any]:
    """The report ``python -m ssog_core distill`` writes: ``setup`` (teacher, pictures, recipe), ``step``,
    ``step0`` and ``final`` (:func:`compare` on the held-out pictures), ``content_scored`` (in words), and
    ``heads``: per head ``layer``, ``head``, ``share_fit``, ``share_steered``, ``share_uniform``,
    ``normalised_fit``, ``normalised_steered`` (``null`` for a ``diffuse`` head), ``difference`` (share_steered −
    share_fit), ``normalised_difference`` and ``steering_reach`` (grid cells)."""
    heads = []
    nf, ns, diffuse = shares.normalised_fit, shares.normalised_steered, shares.diffuse
    for layer in range(shares.share_fit.shape[0]):
        for head in range(shares.share_fit.shape[1]):
            fit, steered = float(shares.share_fit[layer, head]), float(shares.share_steered[layer, head])
            d = bool(diffuse[layer, head])
            heads.append(
                {
                    "layer": layer,
                    "head": head,
                    "share_fit": fit,
                    "share_steered": steered,
                    "share_uniform": float(shares.share_uniform[layer, head]),
                    "normalised_fit": None if d else _number(nf[layer, head]),
                    "normalised_steered": None if d else _number(ns[layer, head]),
                    "difference": steered - fit,
                    "normalised_difference": None if d else float(ns[layer, head] - nf[layer, head]),
                    "diffuse": d,
                    "steering_reach": float(shares.steering_reach[layer, head]),
                }
            )
    return {
        **setup,
        "step": step,
        "held_out_images": shares.images,
        "step0": step0,
        "final": final,
        "content_scored": content_scored(student.config),
        "heads": heads,
    }


def report_path(student: str | Path) -> Path:
    """The report beside a student file: ``STUDENT.report.json`` (its chart: ``STUDENT.report.png`` / ``.svg``)."""
    path = Path(student)
    return path.with_name(path.name.removesuffix(".safetensors") + ".report.json")


def stamped(report: dict[str, Any], student: bytes) -> dict[str, Any]:
    """``report`` naming the student it belongs to by the SHA-256 of its file's bytes (``student_sha256``)."""
    return {**report, "student_sha256": hashlib.sha256(student).hexdigest()}


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _problems(report: Any, depth: int, heads: int) -> list[str]:
    """What keeps ``report`` from being a distillation report of a student of ``depth`` × ``heads`` heads."""
    if not isinstance(report, dict):
        return [f"it holds a JSON {type(report).__name__}, not an object"]
    out = [f"no {k!r}" for k in ("teacher", "content_scored") if not isinstance(report.get(k), str)]
    if not (isinstance(report.get("step"), int) and report["step"] >= 0):
        out.append("no whole 'step'")
    if not (isinstance(report.get("held_out_images"), int) and report["held_out_images"] >= 1):
        out.append("no 'held_out_images' count")
    for when in ("step0", "final"):
        part = report.get(when)
        if not (isinstance(part, dict) and all(_is_number(part.get(k)) for k in COMPARED)):
            out.append(f"no agreement and KL at {when!r}")
        elif not all(part.get(k) is None or _is_number(part.get(k)) for k in ("accuracy", "teacher_accuracy")):
            out.append(f"a non-number accuracy at {when!r}")
    rows = report.get("heads")
    if not isinstance(rows, list):
        return [*out, "no 'heads' list"]
    seen = set()
    for row in rows:
        ok = isinstance(row, dict) and all(_is_number(row.get(k)) for k in HEAD_NUMBERS)
        ok = ok and all(row.get(k) is None or _is_number(row.get(k)) for k in HEAD_OPTIONAL)
        ok = ok and isinstance(row.get("layer"), int) and isinstance(row.get("head"), int)
        ok = ok and isinstance(row.get("diffuse"), bool) and 0 <= row["layer"] < depth and 0 <= row["head"] < heads
        if not ok:
            return [*out, f"a head row that is not one of this student's {depth} layers × {heads} heads: {row!r:.120}"]
        seen.add((row["layer"], row["head"]))
    if len(seen) != len(rows) or len(rows) != depth * heads:
        out.append(f"{len(rows)} head rows for a student of {depth} layers × {heads} heads")
    return out


def read_report(student: str | Path, teacher: str, depth: int, heads: int) -> dict[str, Any]:
    """The report beside the student file ``student`` (:func:`report_path`), checked: JSON only (nothing is
    unpickled), a distillation report of a student of ``depth`` layers × ``heads`` heads whose metadata names
    ``teacher``, stamped with this very file's SHA-256. Anything else is a :class:`DistillError` naming what is
    wrong (missing, malformed, another student's)."""
    student = Path(student)
    path = report_path(student)
    if not path.is_file():
        raise DistillError(
            f"no report beside {student.name}: {path.name} is not there (the distillation writes it when it finishes; "
            "a run stopped early, or a student copied without it, has none)"
        )
    if path.stat().st_size > MAX_REPORT_BYTES:
        raise DistillError(f"{path.name} is not a distillation report: {path.stat().st_size:,} bytes is far too large")
    try:
        report = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise DistillError(f"{path.name} is not a readable distillation report (not JSON: {e})") from None
    problems = _problems(report, depth, heads)
    if problems:
        raise DistillError(f"{path.name} is not a distillation report of this student: {'; '.join(problems)}")
    if report["teacher"] != teacher:
        raise DistillError(
            f"{path.name} reports a student of {report['teacher']}, but {student.name} was distilled from {teacher}"
        )
    stamp, own = report.get("student_sha256"), file_sha256(student)
    if not isinstance(stamp, str):
        raise DistillError(f"{path.name} does not name the student it belongs to (no student_sha256)")
    if stamp != own:
        raise DistillError(
            f"{path.name} belongs to another student (SHA-256 {stamp[:12]}…, this file's is {own[:12]}…): "
            f"{student.name} was replaced after the report was written; distil it again for a report of its own"
        )
    return report
