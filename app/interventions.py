"""The app's side of interventions: names → images and models, handed whole to the one run entry
(:func:`ssog_core.interventions.result.run_intervention`) with the app's cache. What is expensive and shared
(validation images and the unedited model's outcomes on them, head means, unedited attention maps and logits, sweeps)
lives in ``ctx.cache.effects``, keyed by what each depends on (the model's file, the image, the edit list, N, the
mode); the core makes and keys it (:class:`~ssog_core.interventions.result.Memo`).

Work on the validation set (validation effects, head importance) runs under :data:`app.queues.heavy_gate`, so at
most ``HEAVY_LIMIT`` such computations run at once, whichever queue asked for them (:mod:`app.queues`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from torch import Tensor

from app.queues import heavy_gate
from app.state import AppContext, LoadedModel
from ssog_core.interventions import result
from ssog_core.interventions.edit import Edit, edits_key, parse_edits
from ssog_core.interventions.effects import Outcomes
from ssog_core.interventions.importance import HeadImportance, head_importance
from ssog_core.interventions.ops import AblateHead
from ssog_core.interventions.result import InterventionResult, Memo, run_intervention
from ssog_core.interventions.validation import EvalSet


def memo(ctx: AppContext, loaded: LoadedModel) -> Memo:
    """Where the core keeps this model's validation images, outcomes, head means and unedited maps."""
    return Memo(ctx.cache.effects, loaded.key)


def eval_set(
    ctx: AppContext, loaded: LoadedModel, n: int, stop: Callable[[], bool] | None = None
) -> tuple[EvalSet, Outcomes]:
    """The validation images and the unedited model's outcomes on them (once per checkpoint and N; ``stop``
    cancels the first computation between batches)."""
    return result.eval_outcomes(loaded.model, loaded.meta, n, memo(ctx, loaded), stop=stop)


def run(
    ctx: AppContext,
    loaded: LoadedModel,
    sha: str | None,
    edits: Sequence[Edit],
    n: int = 0,
    stop: Callable[[], bool] | None = None,
    maps: bool = True,
) -> InterventionResult:
    """The run entry with the app's caches and images: on image ``sha`` (if given) and on ``n`` validation images
    (if > 0); a result with validation images is kept per (checkpoint, image, edits, N). ``stop`` cancels the
    validation work between batches, also while it waits for a heavy slot; ``maps=False`` asks for the prediction
    only."""

    def source(name: str) -> Tensor:  # a patch source: bundled name or SHA-256, as everywhere in the app
        return loaded.input(ctx.find_image(name).image)

    def make() -> InterventionResult:
        x = source(sha) if sha else None
        return run_intervention(loaded.model, loaded.meta, edits, x, int(n), sources=source,
                                memo=memo(ctx, loaded), image_key=sha, maps=maps, stop=stop)  # fmt: skip

    if not n:
        return make()

    def gated() -> InterventionResult:
        with heavy_gate:  # validation work: at most HEAVY_LIMIT at once, whichever queue asked for it
            return make()

    return ctx.cache.effects.get(("result", loaded.key, sha, edits_key(edits), int(n), maps), gated)


def intervene(
    ctx: AppContext,
    checkpoint: str,
    image: str,
    edits: Any,
    eval_images: int = 0,
    stop: Callable[[], bool] | None = None,
) -> dict[str, Any]:
    """The ``/intervene`` result (:meth:`~ssog_core.interventions.result.InterventionResult.to_dict`)."""
    loaded = ctx.model(checkpoint)
    parsed = parse_edits(edits)
    return run(ctx, loaded, ctx.find_image(image).sha256, parsed, int(eval_images), stop).to_dict()


def importance(
    ctx: AppContext, loaded: LoadedModel, n: int, mode: str, stop: Callable[[], bool] | None = None
) -> HeadImportance:
    """The head-importance sweep, cached per (checkpoint, N, mode); ``stop`` cancels it between batches."""

    def make() -> HeadImportance:
        with heavy_gate:
            data, _ = eval_set(ctx, loaded, n)
            means = (
                result.head_means(loaded.model, loaded.meta, memo(ctx, loaded))
                if AblateHead(0, 0, mode).needs_means()
                else None
            )
            return head_importance(loaded.model, data, mode, means, progress=True, stop=stop)

    return ctx.cache.effects.get(("importance", loaded.key, int(n), mode), make)
