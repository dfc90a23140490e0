"""The app's side of interventions: names → images and models, and caches around the one run entry
(:func:`ssog_core.interventions.result.run_intervention`). What is expensive and shared (validation images and the
unedited model's outcomes on them, head means, unedited attention maps, sweeps) lives in ``ctx.cache.effects``,
keyed by what each depends on (the model's file, the image, the edit list, N, the mode).

Work on the validation set (validation effects, head importance) runs under :data:`app.queues.heavy_gate`, so at
most ``HEAVY_LIMIT`` such computations run at once, whichever queue asked for them (:mod:`app.queues`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from torch import Tensor

from app.queues import heavy_gate
from app.state import AppContext, LoadedModel
from ssog_core.analysis.measures import attention_maps
from ssog_core.interventions.edit import Edit, edits_key, parse_edits
from ssog_core.interventions.effects import Outcomes, dataset_means, outcomes
from ssog_core.interventions.importance import HeadImportance, head_importance
from ssog_core.interventions.ops import AblateHead
from ssog_core.interventions.result import InterventionResult, run_intervention
from ssog_core.interventions.validation import EvalSet, load_eval_set


def sources(ctx: AppContext, loaded: LoadedModel, edits: Sequence[Edit]) -> dict[str, Tensor]:
    """Model inputs of the patch source images the edits name (bundled name or SHA-256, as everywhere in the app)."""
    names = sorted({name for e in edits for name in e.sources()})
    return {n: loaded.input(ctx.find_image(n).image) for n in names}


def head_means(ctx: AppContext, loaded: LoadedModel) -> list[Tensor]:
    """The per-position head means ``dataset_mean`` ablation needs (once per checkpoint)."""
    return ctx.cache.effects.get(("means", loaded.key), lambda: dataset_means(loaded.model, loaded.meta))


def eval_set(
    ctx: AppContext, loaded: LoadedModel, n: int, stop: Callable[[], bool] | None = None
) -> tuple[EvalSet, Outcomes]:
    """The validation images and the unedited model's outcomes on them (once per checkpoint and N; ``stop``
    cancels the first computation between batches)."""

    def make() -> tuple[EvalSet, Outcomes]:
        data = load_eval_set(loaded.meta, loaded.config.img_size, n)
        return data, outcomes(loaded.model, data, stop=stop)

    return ctx.cache.effects.get(("eval", loaded.key, int(n)), make)


def run(
    ctx: AppContext,
    loaded: LoadedModel,
    sha: str | None,
    edits: Sequence[Edit],
    n: int = 0,
    stop: Callable[[], bool] | None = None,
) -> InterventionResult:
    """The run entry with the app's caches: on image ``sha`` (if given) and on ``n`` validation images (if > 0);
    a result with validation images is kept per (checkpoint, image, edits, N). ``stop`` cancels the validation
    work between batches, also while it waits for a heavy slot."""

    def make() -> InterventionResult:
        x = maps = data = unedited = None
        if sha:
            x = loaded.input(ctx.find_image(sha).image)
            maps = ctx.cache.effects.get(("maps", loaded.key, sha), lambda: attention_maps(loaded.model, x))
        if n:
            data, unedited = eval_set(ctx, loaded, n, stop)
        means = head_means(ctx, loaded) if any(e.needs_means() for e in edits) else None
        src = sources(ctx, loaded, edits)
        return run_intervention(loaded.model, loaded.meta, edits, x, int(n), sources=src, head_means=means,
                                unedited_maps=maps, eval_set=data, unedited_outcomes=unedited, stop=stop)  # fmt: skip

    if not n:
        return make()

    def gated() -> InterventionResult:
        with heavy_gate:  # validation work: at most HEAVY_LIMIT at once, whichever queue asked for it
            return make()

    return ctx.cache.effects.get(("result", loaded.key, sha, edits_key(edits), int(n)), gated)


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
            means = head_means(ctx, loaded) if AblateHead(0, 0, mode).needs_means() else None
            return head_importance(loaded.model, data, mode, means, progress=True, stop=stop)

    return ctx.cache.effects.get(("importance", loaded.key, int(n), mode), make)
