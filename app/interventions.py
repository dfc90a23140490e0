"""The app's side of interventions: the app's names (a bundled image's name or a SHA-256, a pictures choice) become
one :class:`~ssog_core.interventions.result.InterventionRequest` (:func:`request`), handed whole to the core's one
entry (:func:`ssog_core.interventions.result.intervene`) with the app's cache. What is expensive and shared
(validation images and the unedited model's outcomes on them, head means, unedited attention maps and logits, sweeps)
lives in ``ctx.cache.effects``, keyed by what each depends on (the model's file, the request, N, the mode); the core
makes and keys it (:class:`~ssog_core.interventions.result.Memo`).

A request with images to evaluate (validation effects), head importance and a twin's accuracy leave the serving
process: each is a job of :mod:`ssog_core.interventions.heavy` on :func:`app.queues.engine` (worker processes on
their GPU if they have one, or a Dask cluster), submitted under :data:`app.queues.heavy_gate`, so at most
``HEAVY_LIMIT`` run at once whichever queue asked for them (:func:`app.queues.submitted`). A
:class:`app.queues.Watch` hands the running job to the handler that waits, for its progress line; only a complete
result is cached (a stopped or failed job raises).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from app import pictures as chooser
from app import queues
from app.state import AppContext, LoadedModel
from ssog_core.interventions import heavy
from ssog_core.interventions import result as core
from ssog_core.interventions.edit import Edit
from ssog_core.interventions.importance import HeadImportance
from ssog_core.interventions.result import InterventionRequest, InterventionResult, Memo
from ssog_core.interventions.validation import BATCH, Pictures

Stop = Callable[[], bool] | None
PREPARING = {"means": "each head's mean output", "attention": "each head's mean attention"}  # what prepare makes


def memo(ctx: AppContext, loaded: LoadedModel) -> Memo:
    """Where the core keeps this model's head means and unedited maps (one-image work, in this process)."""
    return Memo(ctx.cache.effects, loaded.key)


def request(
    ctx: AppContext,
    image: str | None,
    edits: Sequence[Edit | dict],
    n: int = 0,
    pictures: Pictures | None = None,
    maps: bool = True,
) -> InterventionRequest:
    """The request the app's names make: the picture ``image`` and every patch source the edits name, each a
    bundled image's name or a SHA-256 (:meth:`AppContext.find_image`: never a path), ``n`` images to evaluate of
    ``pictures`` (default: the model's recorded data, or the bundled pictures for a model that records none)."""
    stored = ctx.find_image(image) if image else None
    made = InterventionRequest(list(edits), None if stored is None else stored.image, int(n),
                               pictures or chooser.chosen(ctx, None), maps=maps,
                               image_key=None if stored is None else stored.sha256)  # fmt: skip
    return replace(made, sources={name: ctx.find_image(name).image for name in made.source_names()})


def run(
    ctx: AppContext,
    loaded: LoadedModel,
    asked: InterventionRequest,
    stop: Stop = None,
    watch: queues.Watch | None = None,
) -> InterventionResult:
    """The request on ``loaded``, in one call of the core's entry: here, in a light slot (:func:`queues.light_slot`),
    when it evaluates no images; else as one heavy job, its result kept per (checkpoint, request). ``stop`` cancels
    the heavy job, also while it waits for a slot."""
    if not asked.eval_images:
        with queues.light_slot():
            return core.intervene(loaded.model, loaded.meta, asked, memo=memo(ctx, loaded))
    key = ("intervene", loaded.key, asked.key())
    return queues.submitted(ctx.cache.effects, key, heavy.intervene, loaded.key[0], asked, stop=stop, watch=watch)


def preparing(ctx: AppContext, loaded: LoadedModel, asked: InterventionRequest) -> int:
    """How many images a one-image request must first pass over (head means, mean attention) that this server has
    not made yet for ``loaded`` and these pictures; 0 when it has them."""
    todo = core.preparing(asked.parsed(), memo(ctx, loaded), loaded.meta, asked.pictures)
    return len(core.fixed_set(loaded.model, loaded.meta, asked.pictures)) * len(todo) if todo else 0


def prepare(ctx: AppContext, loaded: LoadedModel, asked: InterventionRequest, meter: Meter, stop: Stop = None) -> None:
    """Make what :func:`preparing` counts, here (a light slot), ``meter`` counting batches; ``stop`` ends it."""

    def asked_once() -> bool:
        meter.tick()
        return stop is not None and stop()

    with queues.light_slot():
        core.prepare(loaded.model, loaded.meta, asked.parsed(), memo(ctx, loaded), asked.pictures, asked_once)


class Meter:
    """Progress through ``images`` images in batches of :data:`BATCH`, told once before each batch, and an
    estimate of the time left from the rate measured so far (no estimate before the first batch is done)."""

    def __init__(self, images: int, batch: int = BATCH) -> None:
        self.images, self.batch, self.asked, self.start = images, batch, 0, time.monotonic()

    def tick(self) -> None:
        self.asked += 1

    @property
    def done(self) -> int:
        return min(max(self.asked - 1, 0) * self.batch, self.images)

    def note(self) -> str:
        """ "240 of 1000 images, about 12 s left" (measured), or "0 of 1000 images" before a batch is done."""
        text = f"{self.done} of {self.images} images"
        if self.done:
            left = (time.monotonic() - self.start) / self.done * (self.images - self.done)
            text += f", about {left:.0f} s left"
        return text


def intervene(
    ctx: AppContext, checkpoint: str, image: str, edits: Any, eval_images: int = 0, stop: Stop = None,
    watch: queues.Watch | None = None, pictures: str = "",
) -> dict[str, Any]:  # fmt: skip
    """The ``/intervene`` result (:meth:`~ssog_core.interventions.result.InterventionResult.to_dict`)."""
    loaded = ctx.model(checkpoint)
    asked = request(ctx, image, edits, int(eval_images), chooser.chosen(ctx, pictures))
    return run(ctx, loaded, asked, stop, watch).to_dict()


def importance(
    ctx: AppContext, loaded: LoadedModel, n: int, mode: str, stop: Stop = None, watch: queues.Watch | None = None,
    pictures: Pictures | None = None,
) -> HeadImportance:  # fmt: skip
    """The head-importance sweep as a heavy job on ``n`` of ``pictures`` (default: the recorded data, or the bundled
    pictures for a model that records none, against its unedited predictions), cached per (checkpoint, N, mode,
    pictures); ``stop`` stops it."""
    pictures = pictures or chooser.chosen(ctx, None)
    key = ("importance", loaded.key, int(n), mode, pictures)
    return queues.submitted(
        ctx.cache.effects, key, heavy.importance, loaded.key[0], int(n), mode, pictures, stop=stop, watch=watch
    )


def accuracy(
    ctx: AppContext, loaded: LoadedModel, n: int, stop: Stop = None, watch: queues.Watch | None = None
) -> float:
    """The unedited model's accuracy on the first ``n`` validation images, as a heavy job (cached per N)."""
    key = ("accuracy", loaded.key, int(n))
    return queues.submitted(ctx.cache.effects, key, heavy.accuracy, loaded.key[0], int(n), stop=stop, watch=watch)
