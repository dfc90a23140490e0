"""The app's side of interventions: names → images and models, handed whole to the one run entry
(:func:`ssog_core.interventions.result.run_intervention`) with the app's cache. What is expensive and shared
(validation images and the unedited model's outcomes on them, head means, unedited attention maps and logits, sweeps)
lives in ``ctx.cache.effects``, keyed by what each depends on (the model's file, the image, the edit list, N, the
mode); the core makes and keys it (:class:`~ssog_core.interventions.result.Memo`).

Work on the validation set (validation effects, head importance, a twin's accuracy) leaves the serving process: it
is a job of :mod:`ssog_core.interventions.heavy` on :func:`app.queues.engine` (worker processes, or a Dask
cluster), submitted under :data:`app.queues.heavy_gate`, so at most ``HEAVY_LIMIT`` run at once whichever queue
asked for them (:func:`app.queues.submitted`). A :class:`app.queues.Watch` hands the running job to the handler that
waits, for its progress line; only a complete result is cached (a stopped or failed job raises).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from torch import Tensor

from app import queues
from app.state import AppContext, LoadedModel
from ssog_core.interventions import heavy
from ssog_core.interventions.edit import Edit, edits_key, parse_edits
from ssog_core.interventions.importance import HeadImportance
from ssog_core.interventions.result import InterventionResult, Memo, patch_sources, run_intervention

Stop = Callable[[], bool] | None


def memo(ctx: AppContext, loaded: LoadedModel) -> Memo:
    """Where the core keeps this model's head means and unedited maps (one-image work, in this process)."""
    return Memo(ctx.cache.effects, loaded.key)


def run(
    ctx: AppContext,
    loaded: LoadedModel,
    sha: str | None,
    edits: Sequence[Edit | dict],
    n: int = 0,
    stop: Stop = None,
    maps: bool = True,
    watch: queues.Watch | None = None,
) -> InterventionResult:
    """The run entry with the app's caches and images: on image ``sha`` (if given, in this process: light work)
    and on ``n`` validation images (if > 0, a heavy job, its result kept per (checkpoint, image, edits, N)); a model
    without a validation set is measured on the bundled pictures instead, against its unedited predictions.
    ``stop`` cancels the validation work, also while it waits for a heavy slot; ``maps=False`` asks for the
    prediction only."""

    def source(name: str) -> Tensor:  # a patch source: bundled name or SHA-256, as everywhere in the app
        return loaded.input(ctx.find_image(name).image)

    edits = parse_edits(list(edits))
    x = source(sha) if sha else None
    if not n or x is not None:  # the picture's part (or nothing): here, in a light slot (queues.may_wait)
        with queues.light_slot():
            here = run_intervention(loaded.model, loaded.meta, edits, x, sources=source, memo=memo(ctx, loaded),
                                    image_key=sha, maps=maps, pictures=ctx.assets_dir)  # fmt: skip
        if not n:
            return here
    # the patch sources travel on the CPU (the server's device may be a GPU); a worker moves them to its own device
    sources = {k: v.cpu() for k, v in patch_sources(edits, source).items()}
    key = ("validation", loaded.key, edits_key(edits), int(n))
    val = queues.submitted(ctx.cache.effects, key, heavy.validation, loaded.key[0], edits, int(n), sources,
                           ctx.assets_dir, stop=stop, watch=watch)  # fmt: skip
    return val if x is None else InterventionResult(here.edits, here.class_names, here.image, val.validation)


def intervene(
    ctx: AppContext, checkpoint: str, image: str, edits: Any, eval_images: int = 0, stop: Stop = None,
    watch: queues.Watch | None = None,
) -> dict[str, Any]:  # fmt: skip
    """The ``/intervene`` result (:meth:`~ssog_core.interventions.result.InterventionResult.to_dict`)."""
    loaded = ctx.model(checkpoint)
    parsed = parse_edits(edits)
    return run(ctx, loaded, ctx.find_image(image).sha256, parsed, int(eval_images), stop, watch=watch).to_dict()


def importance(
    ctx: AppContext, loaded: LoadedModel, n: int, mode: str, stop: Stop = None, watch: queues.Watch | None = None
) -> HeadImportance:
    """The head-importance sweep as a heavy job, cached per (checkpoint, N, mode); ``stop`` stops it. A model
    without a validation set is swept on the bundled pictures, against its unedited predictions."""
    key = ("importance", loaded.key, int(n), mode)
    return queues.submitted(
        ctx.cache.effects, key, heavy.importance, loaded.key[0], int(n), mode, ctx.assets_dir, stop=stop, watch=watch
    )


def accuracy(
    ctx: AppContext, loaded: LoadedModel, n: int, stop: Stop = None, watch: queues.Watch | None = None
) -> float:
    """The unedited model's accuracy on the first ``n`` validation images, as a heavy job (cached per N)."""
    key = ("accuracy", loaded.key, int(n))
    return queues.submitted(ctx.cache.effects, key, heavy.accuracy, loaded.key[0], int(n), stop=stop, watch=watch)
