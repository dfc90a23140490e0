"""One run entry for the app, the CLI, the notebook and MCP: a model, an image and/or a number of validation images,
and edits → one :class:`InterventionResult` (probabilities, Δ log p, maps, validation effect), whose JSON form
(:meth:`InterventionResult.to_dict`) is the app's ``/intervene`` answer and the CLI's ``--json``.

The entry takes the request whole and gathers what it needs itself: the patch sources (from a mapping or a
callback), the head means, the validation images and the unedited model's outcomes on them, and the image's
unedited maps. A caller that keeps these between calls (the app) hands over a :class:`Memo`; every such value is
made by the functions here, so the app's sweeps and views share them."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol, TypeVar

import torch
from torch import Tensor, nn

from ssog_core.analysis.head_as_field import MeanAttention
from ssog_core.analysis.measures import attention_maps
from ssog_core.interventions.edit import Edit, check_edits, describe, parse_edits
from ssog_core.interventions.effects import (
    ImageEffect,
    Outcomes,
    ValidationEffect,
    dataset_means,
    image_effect,
    logits_of,
    validation_effect,
)
from ssog_core.interventions.effects import outcomes as outcomes_on
from ssog_core.interventions.run import mean_attention
from ssog_core.interventions.validation import LABEL, TERMS, EvalSet, class_names, pictures_for, reference_of
from ssog_core.runtime.jobs import Cancelled

T = TypeVar("T")
Sources = Mapping[str, Tensor] | Callable[[str], Tensor]  # patch source name → its model input (1, C, H, W)


class Cache(Protocol):
    """What a caller keeps values in: ``get(key, make)`` returns the kept value or makes and keeps it."""

    def get(self, key: Hashable, make: Callable[[], T]) -> T: ...


@dataclass(frozen=True)
class Memo:
    """Where a caller keeps a model's expensive values between calls: its ``cache`` and the model's identity in the
    keys (``(what, model_key, ...)``: ``("eval", key, n, pictures)``, ``("means", key, pictures)``,
    ``("attention", key, pictures)``, ``("maps", key, image_key)``, ``("logits", key, image_key)``). ``Memo()``
    keeps nothing: everything is made for this call."""

    cache: Cache | None = None
    model_key: Hashable = None

    def get(self, what: str, *part: Hashable, make: Callable[[], T]) -> T:
        return make() if self.cache is None else self.cache.get((what, self.model_key, *part), make)


def eval_outcomes(
    model: nn.Module,
    meta: Mapping[str, Any],
    n: int,
    memo: Memo = Memo(),
    progress: bool = False,
    stop: Callable[[], bool] | None = None,
    pictures: Path | None = None,
) -> tuple[EvalSet, Outcomes]:
    """What the model is measured on (:func:`~ssog_core.interventions.validation.pictures_for`: the first ``n``
    validation images, or ``pictures`` labelled by the unedited model's predictions) and the unedited model's
    outcomes on them (kept per model, ``n`` and pictures; ``stop`` cancels the first computation between batches)."""

    def make() -> tuple[EvalSet, Outcomes]:
        data = pictures_for(model, meta, n, bundled=pictures)
        if data.labels is None:
            data = labelled_by(data, model, stop)
        return data, outcomes_on(model, data, progress=progress, stop=stop)

    return memo.get("eval", int(n), pictures_key(meta, pictures), make=make)


def labelled_by(data: EvalSet, model: nn.Module, stop: Callable[[], bool] | None = None) -> EvalSet:
    """Unlabelled pictures labelled with the unedited ``model``'s top-1 predictions, their reference (``stop`` is
    asked before each batch, as in every pass over images)."""
    preds = []
    for x in data.batches(model):
        if stop is not None and stop():
            raise Cancelled("the pass over the pictures was stopped")
        preds.append(logits_of(model, x).argmax(-1).cpu())
    return replace(data, labels=torch.cat(preds))


def pictures_key(meta: Mapping[str, Any], pictures: Path | None) -> str | None:
    """The pictures folder in a memo key, where the model is measured on it (``None``: its validation set)."""
    return None if reference_of(dict(meta), pictures) == LABEL else str(pictures)


def head_means(
    model: nn.Module, meta: Mapping[str, Any], memo: Memo = Memo(), pictures: Path | None = None
) -> list[Tensor]:
    """The per-position head means ``dataset_mean`` ablation needs, over the first
    :data:`~ssog_core.interventions.validation.DEFAULT_EVAL_IMAGES` validation images, or as many of ``pictures`` for
    a model without them (kept per model and pictures)."""
    make = lambda: dataset_means(model, dict(meta), pictures_for(model, meta, bundled=pictures))  # noqa: E731
    return memo.get("means", pictures_key(meta, pictures), make=make)


def validation_attention(
    model: nn.Module, meta: Mapping[str, Any], memo: Memo = Memo(), pictures: Path | None = None
) -> list[MeanAttention]:
    """The mean patch attention ``replace_with_field`` reads, over the head means' images (the first
    :data:`~ssog_core.interventions.validation.DEFAULT_EVAL_IMAGES` validation images, or as many of ``pictures``
    for a model without them: a fixed set, so the fields do not depend on N); kept per model, with the fits made
    from it."""

    def make() -> list[MeanAttention]:
        return mean_attention(model, pictures_for(model, meta, bundled=pictures).batches(model))

    return memo.get("attention", pictures_key(meta, pictures), make=make)


def patch_sources(edits: Sequence[Edit], sources: Sources | None) -> dict[str, Tensor]:
    """The model inputs of the patch sources the edits name (a name a mapping lacks is left to the edits' checks,
    which refuse it in words; a callback raises its own error)."""
    names = sorted({name for e in edits for name in e.sources()})
    if sources is None or isinstance(sources, Mapping):
        given = sources or {}
        return {n: given[n] for n in names if n in given}
    return {n: sources(n) for n in names}


def reference(effect: ValidationEffect) -> str:
    """What ``effect``'s outcomes were measured against: the labels, or the unedited model's predictions."""
    return (effect.images or {}).get("reference", LABEL)


@dataclass
class InterventionResult:
    """What an edit list changes: on one image (``image``) and/or on the validation images (``validation``)."""

    edits: list[Edit]
    class_names: list[str]
    image: ImageEffect | None
    validation: ValidationEffect | None

    def to_dict(self) -> dict[str, Any]:
        """The ``/intervene`` JSON: probabilities in the checkpoint's class order, ``validation`` only when
        evaluated (it names the images it was measured on under ``images``)."""
        out: dict[str, Any] = {}
        if self.image is not None:
            for side, p in (("unedited", self.image.probs_unedited), ("edited", self.image.probs_edited)):
                out[side] = {"probs": p.tolist(), "label": self.class_names[int(p.argmax())]}
            if self.image.accumulated_unedited is not None:  # absent when only the prediction was asked for
                out["accumulated_export"] = {
                    "unedited": self.image.accumulated_unedited.tolist(),
                    "edited": self.image.accumulated_edited.tolist(),
                }
        if self.validation is not None:
            out["validation"] = {**self.validation.to_dict(), "reference": reference(self.validation)}
        return out

    def report(self) -> str:
        """The result as text for a terminal."""
        out = ["edits:", *(f"  {i + 1}. {line}" for i, line in enumerate(describe(self.edits)))]
        img, val = self.image, self.validation
        if img is not None:
            for name, side in (("unedited", False), ("edited", True)):
                top = ", ".join(f"{c} {p:.3f}" for c, p in img.top(self.class_names, side))
                out.append(f"{name:>9}: {top}")
            out.append(f"Δ log p of the unedited prediction: {img.dlogp:+.4f}")
        if val is not None:
            a, lp = val.accuracy, val.logp_true
            acc, logp, images = TERMS[reference(val)]
            noise = lambda c: " (within noise)" if c.within_noise else ""  # noqa: E731
            out.append(
                f"{images} ({val.n}): {acc} {a.unedited:.4f} → {a.edited:.4f}, change {a.change:+.4f} "
                f"[{a.ci95[0]:+.4f}, {a.ci95[1]:+.4f}]{noise(a)}; McNemar p = {val.mcnemar_p:.3g} "
                f"(mid-p {val.mcnemar_mid_p:.3g}; {val.lost} lost, {val.gained} gained)"
            )
            out.append(f"mean {logp} change {lp.change:+.4f} [{lp.ci95[0]:+.4f}, {lp.ci95[1]:+.4f}]{noise(lp)}")
            for r in val.per_class:
                ci = r["logp_true"]["ci95"]
                mark = " (within noise)" if r["within_noise"] else ""
                out.append(
                    f"  {r['class']:<20} {acc} {r['accuracy']['unedited']:.3f} → {r['accuracy']['edited']:.3f}, "
                    f"{logp} {r['logp_true']['change']:+.4f} [{ci[0]:+.4f}, {ci[1]:+.4f}]{mark}"
                )
        return "\n".join(out)


def run_intervention(
    model: nn.Module,
    meta: Mapping[str, Any],
    edits: Sequence[Edit | dict],
    image: Tensor | None = None,
    eval_images: int = 0,
    *,
    sources: Sources | None = None,
    memo: Memo = Memo(),
    image_key: Hashable = None,
    maps: bool = True,
    progress: bool = False,
    stop: Callable[[], bool] | None = None,
    pictures: Path | None = None,
) -> InterventionResult:
    """Apply ``edits`` to ``model`` for this call: on ``image`` (a model input ``(1, C, H, W)``) and/or on the first
    ``eval_images`` validation images of the checkpoint's data (:mod:`ssog_core.interventions.validation`).

    ``sources`` gives each patch source an edit names its model input (a mapping, or a callback from the name).
    ``memo`` keeps the validation images and their unedited outcomes, the head means and (with ``image_key`` naming
    the image) the image's unedited maps or logits between calls. ``maps=False`` asks for the image's prediction
    only (no maps: one forward pass each side). ``stop`` is asked between batches of validation images (true:
    :class:`~ssog_core.runtime.jobs.Cancelled`). ``pictures``: a folder of pictures a model without a
    validation set is measured on instead, against its unedited predictions
    (:func:`~ssog_core.interventions.validation.pictures_for`).
    """
    parsed = parse_edits(list(edits))
    src = patch_sources(parsed, sources)
    check_edits(model, parsed, src, has_means=True, has_attention=True)  # refused before any work (both made below)
    means = head_means(model, meta, memo, pictures) if any(e.needs_means() for e in parsed) else None
    attention = validation_attention(model, meta, memo, pictures) if any(e.needs_attention() for e in parsed) else None
    img = val = None
    if image is not None:
        what, unedited = ("maps", attention_maps) if maps else ("logits", logits_of)
        base = (
            unedited(model, image)
            if image_key is None
            else memo.get(what, image_key, make=lambda: unedited(model, image))
        )
        img = image_effect(model, image, parsed, src, means, base, maps=maps, attention=attention)
    if eval_images:
        data, unedited_outcomes = eval_outcomes(model, meta, eval_images, memo, progress, stop, pictures)
        with torch.inference_mode():
            val = validation_effect(
                model, data, parsed, src, means, unedited_outcomes, progress=progress, stop=stop, attention=attention
            )
    return InterventionResult(parsed, class_names(model, meta), img, val)
