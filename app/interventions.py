"""The app's side of interventions: names → images and models, caches, and the ``/intervene`` and
``/head_importance`` results. The numbers come from :mod:`ssog_core.analysis.effects`; this module only finds the inputs
and keeps what is expensive (validation images, their unedited outcomes, head means, sweeps) in
``ctx.cache.effects``, keyed by what each depends on (the model's file, the edit list, N, the mode).

Work on the validation set (validation effects, head importance) runs under :data:`app.queues.heavy_gate`, so at
most ``HEAVY_LIMIT`` such computations run at once, whichever queue asked for them (:mod:`app.queues`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from torch import Tensor

from app.queues import heavy_gate
from app.state import AppContext, LoadedModel
from ssog_core.analysis.effects import (
    EvalSet,
    HeadImportance,
    ImageEffect,
    Outcomes,
    ValidationEffect,
    dataset_means,
    head_importance,
    image_effect,
    load_eval_set,
    outcomes,
    validation_effect,
)
from ssog_core.analysis.interventions import AblateHead, Edit, PatchHead, edits_key, parse_edits
from ssog_core.analysis.measures import attention_maps
from ssog_core.cli.intervene import result_dict


def sources(ctx: AppContext, loaded: LoadedModel, edits: Sequence[Edit]) -> dict[str, Tensor]:
    """Model inputs of the images ``patch_head`` edits name (bundled name or SHA-256, as everywhere in the app)."""
    names = sorted({e.source for e in edits if isinstance(e, PatchHead)})
    return {n: loaded.input(ctx.find_image(n).image) for n in names}


def head_means(ctx: AppContext, loaded: LoadedModel, edits: Sequence[Edit]) -> list[Tensor] | None:
    """The per-position head means ``dataset_mean`` ablation needs (once per checkpoint), else ``None``."""
    if not any(isinstance(e, AblateHead) and e.mode == "dataset_mean" for e in edits):
        return None
    return ctx.cache.effects.get(("means", loaded.key), lambda: dataset_means(loaded.model, loaded.meta))


def eval_set(ctx: AppContext, loaded: LoadedModel, n: int) -> tuple[EvalSet, Outcomes]:
    """The first ``n`` validation images and the unedited model's outcomes on them (once per checkpoint and N)."""

    def make() -> tuple[EvalSet, Outcomes]:
        data = load_eval_set(loaded.meta, loaded.config.img_size, n)
        return data, outcomes(loaded.model, data)

    return ctx.cache.effects.get(("eval", loaded.key, int(n)), make)


def one_image(ctx: AppContext, loaded: LoadedModel, sha: str, edits: Sequence[Edit]) -> ImageEffect:
    """The one-image effect (unedited attention maps cached per model and image)."""
    x = loaded.input(ctx.find_image(sha).image)
    before = ctx.cache.effects.get(("maps", loaded.key, sha), lambda: attention_maps(loaded.model, x))
    return image_effect(loaded.model, x, edits, sources(ctx, loaded, edits), head_means(ctx, loaded, edits), before)


def on_validation(ctx: AppContext, loaded: LoadedModel, edits: Sequence[Edit], n: int) -> ValidationEffect:
    """The validation-set effect, cached per (checkpoint, edits, N)."""

    def make() -> ValidationEffect:
        with heavy_gate:
            data, before = eval_set(ctx, loaded, n)
            src, means = sources(ctx, loaded, edits), head_means(ctx, loaded, edits)
            return validation_effect(loaded.model, data, edits, src, means, unedited=before)

    return ctx.cache.effects.get(("validation", loaded.key, edits_key(edits), int(n)), make)


def intervene(ctx: AppContext, checkpoint: str, image: str, edits: Any, eval_images: int = 0) -> dict[str, Any]:
    """The ``/intervene`` result (see :func:`ssog_core.intervene.result_dict`)."""
    loaded = ctx.model(checkpoint)
    parsed = parse_edits(edits)
    sha = ctx.find_image(image).sha256
    img = one_image(ctx, loaded, sha, parsed)
    val = on_validation(ctx, loaded, parsed, int(eval_images)) if int(eval_images) > 0 else None
    return result_dict(loaded.class_names, img, val)


def importance(
    ctx: AppContext, loaded: LoadedModel, n: int, mode: str, stop: Callable[[], bool] | None = None
) -> HeadImportance:
    """The head-importance sweep, cached per (checkpoint, N, mode); ``stop`` cancels it between batches."""
    if mode not in ("zero", "dataset_mean"):
        raise ValueError(f"unknown ablation mode {mode!r}; expected zero or dataset_mean")

    def make() -> HeadImportance:
        with heavy_gate:
            data, _ = eval_set(ctx, loaded, n)
            means = head_means(ctx, loaded, [AblateHead(0, 0, mode)])
            return head_importance(loaded.model, data, mode, means, progress=True, stop=stop)

    return ctx.cache.effects.get(("importance", loaded.key, int(n), mode), make)
