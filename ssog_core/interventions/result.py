"""One run entry for the app, the CLI, the notebook and MCP: a model, an image and/or a number of validation images,
and edits → one :class:`InterventionResult` (probabilities, Δ log p, maps, validation effect), whose JSON form
(:meth:`InterventionResult.to_dict`) is the app's ``/intervene`` answer and the CLI's ``--json``."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from ssog_core.analysis.measures import AttentionMaps
from ssog_core.interventions.edit import Edit, describe, parse_edits
from ssog_core.interventions.effects import (
    ImageEffect,
    Outcomes,
    ValidationEffect,
    dataset_means,
    image_effect,
    validation_effect,
)
from ssog_core.interventions.validation import EvalSet, load_eval_set


def class_names(model: nn.Module, meta: Mapping[str, Any]) -> list[str]:
    """The checkpoint's class names, or ``class i`` where it records none."""
    return [str(n) for n in meta.get("class_names") or [f"class {i}" for i in range(model.config.num_classes)]]


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
            out["accumulated_export"] = {
                "unedited": self.image.accumulated_unedited.tolist(),
                "edited": self.image.accumulated_edited.tolist(),
            }
        if self.validation is not None:
            out["validation"] = self.validation.to_dict()
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
            noise = lambda c: " (within noise)" if c.within_noise else ""  # noqa: E731
            out.append(
                f"validation ({val.n} images): accuracy {a.unedited:.4f} → {a.edited:.4f}, change {a.change:+.4f} "
                f"[{a.ci95[0]:+.4f}, {a.ci95[1]:+.4f}]{noise(a)}; McNemar p = {val.mcnemar_p:.3g} "
                f"(mid-p {val.mcnemar_mid_p:.3g}; {val.lost} lost, {val.gained} gained)"
            )
            out.append(f"mean log p(true) change {lp.change:+.4f} [{lp.ci95[0]:+.4f}, {lp.ci95[1]:+.4f}]{noise(lp)}")
            for r in val.per_class:
                ci = r["logp_true"]["ci95"]
                mark = " (within noise)" if r["within_noise"] else ""
                out.append(
                    f"  {r['class']:<20} acc {r['accuracy']['unedited']:.3f} → {r['accuracy']['edited']:.3f}, "
                    f"log p(true) {r['logp_true']['change']:+.4f} [{ci[0]:+.4f}, {ci[1]:+.4f}]{mark}"
                )
        return "\n".join(out)


def run_intervention(
    model: nn.Module,
    meta: Mapping[str, Any],
    edits: Sequence[Edit],
    image: Tensor | None = None,
    eval_images: int = 0,
    *,
    sources: Mapping[str, Tensor] | None = None,
    head_means: Sequence[Tensor] | None = None,
    unedited_maps: AttentionMaps | None = None,
    eval_set: EvalSet | None = None,
    unedited_outcomes: Outcomes | None = None,
    progress: bool = False,
    stop: Callable[[], bool] | None = None,
) -> InterventionResult:
    """Apply ``edits`` to ``model`` for this call: on ``image`` (a model input ``(1, C, H, W)``) and/or on the first
    ``eval_images`` validation images of the checkpoint's data (:mod:`ssog_core.interventions.validation`).

    ``sources`` maps each patch source an edit names to its model input. The other keywords pass what a caller
    keeps between calls: the head means (computed here when an edit needs them and none are given), the image's
    unedited attention maps, the validation images and the unedited model's outcomes on them. ``stop`` is asked
    between batches of validation images (true: :class:`~ssog_core.interventions.effects.Cancelled`).
    """
    parsed = parse_edits(list(edits))
    if head_means is None and any(e.needs_means() for e in parsed):
        head_means = dataset_means(model, dict(meta))
    img = val = None
    with torch.inference_mode():
        if image is not None:
            img = image_effect(model, image, parsed, dict(sources or {}), head_means, unedited_maps)
        if eval_images:
            data = eval_set if eval_set is not None else load_eval_set(dict(meta), model.config.img_size, eval_images)
            val = validation_effect(
                model, data, parsed, dict(sources or {}), head_means, unedited_outcomes, progress=progress, stop=stop
            )
    return InterventionResult(parsed, class_names(model, meta), img, val)
