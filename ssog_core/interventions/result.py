"""One run entry for the app, the CLI, the heavy jobs, the notebook and MCP: a model and one
:class:`InterventionRequest` (edits, an image and/or a number of images to evaluate, what they are, the patch
sources' pictures) → one :class:`InterventionResult` (probabilities, Δ log p, maps, validation effect), whose JSON
form (:meth:`InterventionResult.to_dict`) is the app's ``/intervene`` answer and the CLI's ``--json``.

:func:`intervene` takes the request whole and gathers what it needs itself: the model inputs of its pictures, the
head means, the validation images (or chosen pictures) and the unedited model's outcomes on them, and the image's
unedited maps; :func:`run_intervention` is the same on model inputs already made. A caller that keeps these between
calls (the app, a worker) hands over a :class:`Memo`; every such value is made by the functions here, so the app's
sweeps and views share them. :func:`prepare` makes the head means and mean attention an edit list needs ahead of
the call, for a caller that shows the progress of that pass over hundreds of images."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol, TypeVar

import torch
from PIL import Image
from torch import Tensor, nn

from ssog_core.analysis.head_as_field import MeanAttention
from ssog_core.analysis.measures import attention_maps
from ssog_core.data.images import model_input
from ssog_core.interventions.edit import Edit, EditError, check_edits, describe, edits_key, parse_edits
from ssog_core.interventions.effects import (
    ImageEffect,
    Outcomes,
    ValidationEffect,
    image_effect,
    logits_of,
    validation_effect,
)
from ssog_core.interventions.effects import outcomes as outcomes_on
from ssog_core.interventions.run import mean_attention, mean_head_outputs
from ssog_core.interventions.validation import LABEL, TERMS, EvalSet, Pictures, class_names
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
    pictures: Pictures | Path | None = None,
) -> tuple[EvalSet, Outcomes]:
    """What the model is measured on (:class:`~ssog_core.interventions.validation.Pictures`: a chosen folder, the
    first ``n`` validation images, or the bundled pictures; pictures are labelled by the unedited model's
    predictions) and the unedited model's outcomes on them (kept per model, ``n`` and pictures; ``stop`` cancels the
    first computation between batches)."""
    chosen = Pictures.of(pictures)

    def make() -> tuple[EvalSet, Outcomes]:
        data = chosen.eval_set(model, meta, n)
        if data.labels is None:
            data = labelled_by(data, model, stop)
        return data, outcomes_on(model, data, progress=progress, stop=stop)

    return memo.get("eval", int(n), chosen.key(meta), make=make)


def labelled_by(data: EvalSet, model: nn.Module, stop: Callable[[], bool] | None = None) -> EvalSet:
    """Unlabelled pictures labelled with the unedited ``model``'s top-1 predictions, their reference (``stop`` is
    asked before each batch, as in every pass over images)."""
    preds = []
    for x in asking(data.batches(model), stop):
        preds.append(logits_of(model, x).argmax(-1).cpu())
    return replace(data, labels=torch.cat(preds))


def asking(batches: Iterable[Tensor], stop: Callable[[], bool] | None) -> Iterator[Tensor]:
    """``batches``, ``stop`` asked before each (true: :class:`~ssog_core.runtime.jobs.Cancelled`)."""
    for x in batches:
        if stop is not None and stop():
            raise Cancelled("the pass over the pictures was stopped")
        yield x


def pictures_key(meta: Mapping[str, Any], pictures: Pictures | Path | None) -> str | None:
    """The pictures in a memo key, where the model is measured on pictures (``None``: its validation set)."""
    return Pictures.of(pictures).key(meta)


def fixed_set(model: nn.Module, meta: Mapping[str, Any], pictures: Pictures | Path | None) -> EvalSet:
    """The images head means and mean attention are made from: the first
    :data:`~ssog_core.interventions.validation.DEFAULT_EVAL_IMAGES` of what the model is measured on (a fixed set,
    so they do not depend on N)."""
    return Pictures.of(pictures).eval_set(model, meta)


def head_means(
    model: nn.Module,
    meta: Mapping[str, Any],
    memo: Memo = Memo(),
    pictures: Pictures | Path | None = None,
    stop: Callable[[], bool] | None = None,
) -> list[Tensor]:
    """The per-position head means ``dataset_mean`` ablation needs, over :func:`fixed_set` (kept per model and
    pictures; ``stop`` is asked before each batch)."""

    def make() -> list[Tensor]:
        return mean_head_outputs(model, asking(fixed_set(model, meta, pictures).batches(model), stop))

    return memo.get("means", pictures_key(meta, pictures), make=make)


def validation_attention(
    model: nn.Module,
    meta: Mapping[str, Any],
    memo: Memo = Memo(),
    pictures: Pictures | Path | None = None,
    stop: Callable[[], bool] | None = None,
) -> list[MeanAttention]:
    """The mean patch attention ``replace_with_field`` reads, over :func:`fixed_set` (so the fields do not depend
    on N); kept per model and pictures, with the fits made from it; ``stop`` is asked before each batch."""

    def make() -> list[MeanAttention]:
        return mean_attention(model, asking(fixed_set(model, meta, pictures).batches(model), stop))

    return memo.get("attention", pictures_key(meta, pictures), make=make)


def kept(memo: Memo, what: str, meta: Mapping[str, Any], pictures: Pictures | Path | None) -> bool:
    """Whether ``memo`` already holds the head means (``what`` "means") or mean attention ("attention") for these
    pictures."""
    return memo.cache is not None and (what, memo.model_key, pictures_key(meta, pictures)) in memo.cache


def preparing(
    edits: Sequence[Edit], memo: Memo, meta: Mapping[str, Any], pictures: Pictures | Path | None
) -> list[str]:
    """What a call with ``edits`` must make before its first image, in passes over :func:`fixed_set`: "means"
    and/or "attention", those ``memo`` does not hold yet (each is one pass, made once per model and pictures)."""
    need = [("means", any(e.needs_means() for e in edits)), ("attention", any(e.needs_attention() for e in edits))]
    return [what for what, needed in need if needed and not kept(memo, what, meta, pictures)]


def prepare(
    model: nn.Module,
    meta: Mapping[str, Any],
    edits: Sequence[Edit | dict],
    memo: Memo,
    pictures: Pictures | Path | None = None,
    stop: Callable[[], bool] | None = None,
) -> None:
    """Make, into ``memo``, the head means and mean attention ``edits`` need (:func:`preparing`), ``stop`` asked
    before each batch of every pass: a caller that reports progress runs this first, counting batches."""
    parsed = parse_edits(list(edits))
    for what in preparing(parsed, memo, meta, pictures):
        (head_means if what == "means" else validation_attention)(model, meta, memo, pictures, stop)


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
    pictures: Pictures | Path | None = None,
) -> InterventionResult:
    """Apply ``edits`` to ``model`` for this call: on ``image`` (a model input ``(1, C, H, W)``) and/or on the first
    ``eval_images`` validation images of the checkpoint's data (:mod:`ssog_core.interventions.validation`).

    ``sources`` gives each patch source an edit names its model input (a mapping, or a callback from the name).
    ``memo`` keeps the validation images and their unedited outcomes, the head means and (with ``image_key`` naming
    the image) the image's unedited maps or logits between calls. ``maps=False`` asks for the image's prediction
    only (no maps: one forward pass each side). ``stop`` is asked between batches of validation images (true:
    :class:`~ssog_core.runtime.jobs.Cancelled`). ``pictures``: what the model is measured on instead of
    its validation set (:class:`~ssog_core.interventions.validation.Pictures`: a chosen folder, or a folder for a
    model without a validation set), against its unedited predictions.
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


ImageLike = str | Path | bytes | Image.Image  # a picture as a request carries it: a file, its bytes, or decoded


@dataclass(frozen=True)
class InterventionRequest:
    """One intervention request, whole: what the app's ``/intervene``, the Intervene tab, the intervene command and
    the heavy job hand to :func:`intervene` (picklable, so a worker receives it as it is).

    ``edits``: the edit list as JSON (or :class:`Edit` objects); ``image``: the picture whose prediction and maps
    change (or ``None``); ``eval_images``: how many images the validation effect is measured on (0: none);
    ``pictures``: what they are (:class:`~ssog_core.interventions.validation.Pictures`); ``sources``: every patch
    source the edits name → its picture; ``maps=False`` asks for the image's prediction only; ``image_key`` names
    the image in a :class:`Memo` (the app's SHA-256)."""

    edits: Sequence[Edit | dict]
    image: ImageLike | None = None
    eval_images: int = 0
    pictures: Pictures = Pictures()
    sources: Mapping[str, ImageLike] = field(default_factory=dict)
    maps: bool = True
    image_key: Hashable = None

    def parsed(self) -> list[Edit]:
        return parse_edits(list(self.edits))

    def source_names(self) -> list[str]:
        """The patch sources the edits name, for a caller that finds their pictures."""
        return sorted({name for e in self.parsed() for name in e.sources()})

    def key(self) -> tuple[Hashable, ...]:
        """What the result depends on besides the model, for a cache key (the image by ``image_key``)."""
        return ("image" if self.image is not None else None, self.image_key, edits_key(self.parsed()),
                int(self.eval_images), self.pictures, self.maps)  # fmt: skip


def intervene(
    model: nn.Module,
    meta: Mapping[str, Any],
    request: InterventionRequest,
    *,
    memo: Memo = Memo(),
    progress: bool = False,
    stop: Callable[[], bool] | None = None,
) -> InterventionResult:
    """The one entry for an :class:`InterventionRequest`: its pictures made the model's inputs (at the model's size,
    on its device), then :func:`run_intervention`. ``memo``, ``progress`` and ``stop`` as there."""
    if request.image is None and not request.eval_images:
        raise EditError("give an image, a number of images to evaluate, or both")
    p = next(model.parameters())
    size = tuple(model.config.img_size)

    def as_input(picture: ImageLike) -> Tensor:
        return model_input([picture], size, meta)[0].to(p.device)

    x = None if request.image is None else as_input(request.image)
    sources = {name: as_input(picture) for name, picture in request.sources.items()}
    return run_intervention(model, meta, request.parsed(), x, int(request.eval_images), sources=sources, memo=memo,
                            image_key=request.image_key, maps=request.maps, progress=progress, stop=stop,
                            pictures=request.pictures)  # fmt: skip
