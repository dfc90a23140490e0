"""The interventions' heavy work as jobs for :class:`ssog_core.runtime.jobs.Engine`: a whole intervention request, head
importance, a model's validation accuracy, every head as a field (the geometry tab's) and the target share on
``pointer``, each
``fn(loaded, ..., progress, stopped)`` at module level, so a worker process (local or on a Dask cluster) imports it
by name and receives the model as ``(model, meta)``.

A worker keeps the values every such job of a model shares (the validation images' unedited outcomes, the head
means) between jobs, keyed by the model object it keeps per content hash. Progress is counted in validation images:
the passes over them ask ``stop`` once before each batch (of :data:`~ssog_core.interventions.validation.BATCH`
images; the head fields' of :data:`~ssog_core.analysis.head_as_field.FIELD_BATCH`, the fit's), and :class:`Batches`
turns those asks into "120 of 500 images"."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from torch import Tensor, nn

from ssog_core.analysis.controls import ValidationMaps, maps_over, validation_maps
from ssog_core.analysis.head_as_field import FIELD_BATCH, HeadFieldStats, measure_head_fields
from ssog_core.interventions import result
from ssog_core.interventions.importance import HeadImportance, head_importance
from ssog_core.interventions.ops import AblateHead
from ssog_core.interventions.result import InterventionResult, Memo
from ssog_core.interventions.target_share import BATCH as SHARE_BATCH
from ssog_core.interventions.target_share import close_mu, pointer_scenes, target_share_report
from ssog_core.interventions.validation import BATCH, EvalSet, Pictures, eval_images, pictures_for
from ssog_core.runtime.jobs import Cancelled
from ssog_core.runtime.lru import LRU

KEPT = 16  # values a worker keeps between jobs (outcomes per model and N, head means per model)
Loaded = tuple[nn.Module, dict[str, Any]]
Progress = Callable[[int, int], None]
Stopped = Callable[[], bool]


class Batches:
    """A ``stop`` callable for passes over ``images`` validation images that also reports progress: the k-th ask
    (one before each batch) means the batches before it are done; ``passes`` passes in a row count as one total."""

    def __init__(self, images: int, passes: int, progress: Progress, stopped: Stopped, batch: int = BATCH) -> None:
        self._sizes = [min(batch, images - s) for s in range(0, images, batch)] * passes
        self.total = images * passes
        self._asked = 0
        self._progress, self._stopped = progress, stopped

    def __call__(self) -> bool:
        self._progress(sum(self._sizes[: self._asked]), self.total)
        self._asked += 1
        return self._stopped()

    def finished(self) -> None:
        self._progress(self.total, self.total)


_kept: LRU[Any] = LRU(KEPT)  # this worker's shared values between jobs (result.Cache), the oldest dropped


def _memo(model: nn.Module) -> Memo:
    """This worker's memo for ``model``: keyed by the object itself (held by the key, so its id is never reused
    for another model while the values live)."""
    return Memo(_kept, model)


def warm(progress: Progress, stopped: Stopped) -> int:
    """Nothing but this worker's process id: a worker that ran it has started and imported what the heavy jobs
    need."""
    return os.getpid()


def intervene(
    loaded: Loaded, request: result.InterventionRequest, progress: Progress, stopped: Stopped
) -> InterventionResult:
    """The whole ``request`` (:func:`~ssog_core.interventions.result.intervene`) on a worker, with this worker's
    memo: progress counts the passes over its ``eval_images`` images (the unedited ones the first time for a model,
    N and pictures; then the edited one)."""
    model, meta = loaded
    memo = _memo(model)
    n, pictures = int(request.eval_images), request.pictures
    kept = ("eval", model, n, result.pictures_key(meta, pictures)) in _kept  # kept per model, N and pictures
    passes = 0
    if n:
        data = pictures.eval_set(model, meta, n)
        unedited = 1 if data.labels is not None else 2  # unlabelled pictures: their reference pass, then outcomes
        passes = 1 + (0 if kept else unedited)
    batches = Batches(n, passes, progress, stopped)
    out = result.intervene(model, meta, request, memo=memo, stop=batches)
    batches.finished()
    return out


def importance(
    loaded: Loaded, n: int, mode: str, pictures: Pictures | Path | None, progress: Progress, stopped: Stopped
) -> HeadImportance:
    """Head importance (:func:`~ssog_core.interventions.importance.head_importance`) on the first ``n`` validation
    images, or on ``pictures`` (chosen, or for a model without them: :class:`~ssog_core.interventions.validation.
    Pictures`) labelled by the unedited model's predictions."""
    model, meta = loaded
    data = Pictures.of(pictures).eval_set(model, meta, n)
    means = result.head_means(model, meta, _memo(model), pictures) if AblateHead(0, 0, mode).needs_means() else None
    batches = Batches(len(data), 1 + (data.labels is None), progress, stopped)
    if data.labels is None:  # unlabelled pictures: the unedited model's predictions are the reference
        data = result.labelled_by(data, model, batches)
    out = head_importance(model, data, mode, means, stop=batches)
    batches.finished()
    return out


def fields_on(
    model: nn.Module, data: EvalSet, atoms: int, stop: Stopped | None = None, batch_size: int = FIELD_BATCH
) -> HeadFieldStats:
    """Every head of ``model`` as a field (:func:`~ssog_core.analysis.head_as_field.measure_head_fields`, ``atoms``
    per head) on ``data`` in batches of ``batch_size`` (the fit's batches by default), the result naming those
    images; ``stop`` is asked before each batch of both passes."""

    def each() -> Iterator[Tensor]:
        for x in data.batches(model, batch_size):
            if stop is not None and stop():
                raise Cancelled("the head fields were stopped")
            yield x

    stats = measure_head_fields(model, each, atoms)
    return replace(stats, pictures=data.describe(), measured_on=data.words())


def head_fields(
    loaded: Loaded, n: int, pictures: Pictures | Path | None, atoms: int, progress: Progress, stopped: Stopped
) -> HeadFieldStats:
    """Every head as a field (:func:`fields_on`) on the first ``n`` validation images, or up to ``n`` of
    ``pictures`` (chosen, or for a model without them: :class:`~ssog_core.interventions.validation.Pictures`).
    Progress counts the images of both passes."""
    model, meta = loaded
    data = Pictures.of(pictures).eval_set(model, meta, n, up_to=True)
    batches = Batches(len(data), 2, progress, stopped, FIELD_BATCH)
    out = fields_on(model, data, atoms, batches)
    batches.finished()
    return out


def accuracy(loaded: Loaded, n: int, progress: Progress, stopped: Stopped) -> float:
    """The unedited model's accuracy on the first ``n`` validation images."""
    model, meta = loaded
    memo = _memo(model)
    images = len(pictures_for(model, meta, n))
    batches = Batches(images, 0 if ("eval", model, int(n), None) in _kept else 1, progress, stopped)
    data, outcomes = result.eval_outcomes(model, meta, n, memo, stop=batches)
    batches.finished()
    return float(outcomes.correct(data.labels).double().mean())


def export_maps(
    loaded: Loaded,
    alpha: float,
    n: int,
    blank: bool,
    pictures: Pictures | Path | None,
    progress: Progress,
    stopped: Stopped,
) -> ValidationMaps:
    """The export maps of the first ``n`` validation images (``blank``: of their blank images), for the validation
    control and the per-class view (:func:`~ssog_core.analysis.controls.validation_maps`); of up to ``n`` of
    ``pictures`` when chosen or for a model without them, each labelled by the unedited model's prediction."""
    model, meta = loaded
    if result.pictures_key(meta, pictures) is None:
        progress(0, n)
        out = validation_maps(model, meta, alpha, n, blank=blank)
        progress(n, n)
        return out
    data = Pictures.of(pictures).eval_set(model, meta, n, up_to=True)
    batches = Batches(len(data), 2, progress, stopped)
    data = result.labelled_by(data, model, batches)

    def each() -> Iterator[Tensor]:
        for x in data.batches(model):
            if batches():
                raise Cancelled("the export maps were stopped")
            yield x

    out = maps_over(model, each(), data.labels, data.class_names, alpha, blank)
    batches.finished()
    return out


def target_share(loaded: Loaded, n: int, progress: Progress, stopped: Stopped) -> dict[str, Any]:
    """The target-share readout on the first ``n`` validation images of a ``pointer`` model's data, as the CLI
    writes it (:func:`~ssog_core.interventions.target_share.target_share_report`): one pass over them, two for a
    model that steers μ (its μ gates closed)."""
    model, meta = loaded
    images = eval_images(n, len(pointer_scenes(meta, model.config.img_size)))
    batches = Batches(images, 1 + bool(close_mu(model)), progress, stopped, SHARE_BATCH)
    out = target_share_report(model, meta, images, stop=batches)
    batches.finished()
    return out
