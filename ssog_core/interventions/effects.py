"""What an intervention changes, with a noise floor: one image and the validation images.

* :func:`image_effect` — one image: class probabilities unedited and edited, the change in log p of the unedited
  prediction (:func:`~ssog_core.analysis.predictions.prediction_change`), accumulated export maps unedited / edited /
  difference, and the first edited layer's attention.
* :func:`validation_effect` — the validation images (:mod:`ssog_core.interventions.validation`): accuracy and
  mean log p(true class), unedited and edited, each change with a paired bootstrap 95% interval (the same images
  are resampled for both sides), McNemar's exact and mid-p tests for the accuracy change, and the same per class.
  Near 100% accuracy a change moves a handful of images while log p(true) still moves measurably, so both are
  reported; an interval that contains 0 is *within noise*.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from tqdm import tqdm

from ssog_core.analysis.head_as_field import MeanAttention
from ssog_core.analysis.measures import AttentionMaps, attention_maps, export_maps_of
from ssog_core.analysis.predictions import PredictionChange, prediction_change
from ssog_core.interventions.edit import Edit, parse_edits
from ssog_core.interventions.run import edited, mean_head_outputs
from ssog_core.interventions.validation import BATCH, EvalSet, load_eval_set
from ssog_core.nn.hook_points import evaluating
from ssog_core.runtime.jobs import Cancelled

BOOTSTRAP = 2000  # resamples: the 2.5% and 97.5% quantiles move by < 0.1 of an interval's width between seeds
TOP_K = 5


# ------------------------------------------------------------------------------------------------ statistics


def bootstrap_ci(diff: np.ndarray, n_boot: int = BOOTSTRAP, seed: int = 0) -> tuple[float, float]:
    """Percentile 95% interval of the mean of paired differences ``diff`` (``(n,)``, one per image), or of each row
    of ``(k, n)`` (then ``(k, 2)``): images are resampled with replacement, the same draws for every row."""
    d = np.atleast_2d(np.asarray(diff, dtype=np.float64))
    n = d.shape[-1]
    if n == 0:
        raise ValueError("an interval needs at least one image")
    idx = np.random.default_rng(seed).integers(0, n, size=(n_boot, n))
    means = np.stack([row[idx].mean(-1) for row in d])  # (k, n_boot)
    ci = np.quantile(means, [0.025, 0.975], axis=-1).T
    return (float(ci[0, 0]), float(ci[0, 1])) if np.ndim(diff) == 1 else ci


def mcnemar(lost: int, gained: int) -> tuple[float, float]:
    """McNemar's exact two-sided p and its mid-p for ``lost`` images the edit made wrong and ``gained`` it made
    right (the discordant pairs; under no effect each is a fair coin)."""
    n, k = lost + gained, min(lost, gained)
    if n == 0:
        return 1.0, 1.0
    pmf = [math.comb(n, i) for i in range(k + 1)]
    total = 2**n
    exact = min(1.0, 2 * sum(pmf) / total)
    mid = min(1.0, exact - pmf[k] / total)
    return exact, mid


def within_noise(ci: Sequence[float]) -> bool:
    return ci[0] <= 0.0 <= ci[1]


# ---------------------------------------------------------------------------------------------------- one image


@dataclass
class ImageEffect:
    """One image, unedited and edited (CPU tensors).

    Attributes:
        change: the class log-probabilities unedited and edited (:mod:`ssog_core.analysis.predictions`), which
            give ``probs_unedited``, ``probs_edited`` ``(classes,)`` and ``dlogp``.
        accumulated_unedited, accumulated_edited: ``(Gh, Gw)`` accumulated export maps (difference: property);
            ``None`` when only the prediction was asked for.
        layer: the first edited layer (``None`` without edits); ``attention_unedited`` / ``attention_edited``
            its ``(H, N, N)`` matrices and ``removed`` the heads the edit took out of its head mean.
    """

    change: PredictionChange
    accumulated_unedited: Tensor | None
    accumulated_edited: Tensor | None
    layer: int | None
    attention_unedited: Tensor | None
    attention_edited: Tensor | None
    removed: frozenset[int]

    @property
    def probs_unedited(self) -> Tensor:
        return self.change.unedited

    @property
    def probs_edited(self) -> Tensor:
        return self.change.edited

    @property
    def dlogp(self) -> float:
        """Edited − unedited log p of the class the unedited model predicts."""
        return self.change.dlogp

    @property
    def difference(self) -> Tensor:
        return self.accumulated_edited - self.accumulated_unedited

    def top(self, class_names: Sequence[str], edited_side: bool, k: int = TOP_K) -> list[tuple[str, float]]:
        p = self.probs_edited if edited_side else self.probs_unedited
        values, idx = p.topk(min(k, p.numel()))
        return [(class_names[i], float(v)) for v, i in zip(values, idx, strict=True)]


def logits_of(model: nn.Module, x: Tensor) -> Tensor:
    """``model(x)`` with eval semantics, recording nothing for autograd (under any active edit)."""
    with torch.inference_mode(), evaluating():
        return model(x)


def image_effect(
    model: nn.Module,
    img: Tensor,
    edits: Sequence[Edit | dict],
    sources: dict[str, Tensor] | None = None,
    head_means: Sequence[Tensor] | None = None,
    unedited: AttentionMaps | Tensor | None = None,
    maps: bool = True,
    attention: Sequence[MeanAttention] | None = None,
) -> ImageEffect:
    """The effect of ``edits`` on one image ``(1, C, H, W)``. ``unedited`` may pass the image's unedited
    :class:`~ssog_core.analysis.AttentionMaps` (a caller that caches them saves half the work). ``maps=False``: the
    prediction only (one forward pass each side, for a caller that asks often); ``unedited`` is then the unedited
    logits, if known. ``attention``: the mean patch attention ``replace_with_field`` reads."""
    parsed = parse_edits(list(edits))
    layer = min((e.layer for e in parsed), default=None)
    if not maps:
        logits0 = unedited if unedited is not None else logits_of(model, img)
        with edited(model, parsed, sources, head_means, attention):
            logits1 = logits_of(model, img)
        return ImageEffect(prediction_change(logits0, logits1), None, None, layer, None, None, frozenset())
    maps0 = unedited if unedited is not None else attention_maps(model, img)
    with edited(model, parsed, sources, head_means, attention):
        maps1 = attention_maps(model, img)
    return ImageEffect(
        change=prediction_change(maps0.logits, maps1.logits),
        accumulated_unedited=export_maps_of(maps0).accumulated[0],
        accumulated_edited=export_maps_of(maps1).accumulated[0],
        layer=layer,
        attention_unedited=None if layer is None else maps0.attn[layer][0].cpu(),
        attention_edited=None if layer is None else maps1.attn[layer][0].cpu(),
        removed=frozenset() if layer is None else maps1.removed[layer],
    )


# ------------------------------------------------------------------------------------------ the validation set


def dataset_means(model: nn.Module, meta: dict[str, Any], data: EvalSet | None = None) -> list[Tensor]:
    """Each head's mean output per position over ``data``, by default the first :data:`DEFAULT_EVAL_IMAGES`
    validation images (fewer if the split is smaller), for ``dataset_mean`` ablation: a fixed set, so the mean does
    not depend on N (a model without a validation set passes its pictures,
    :func:`~ssog_core.interventions.result.head_means`)."""
    data = load_eval_set(meta, model.config.img_size) if data is None else data
    return mean_head_outputs(model, data.batches(model))


@dataclass
class Outcomes:
    """Per image: the prediction, whether it is right, and log p(true class) (CPU)."""

    pred: Tensor
    logp_true: Tensor

    def correct(self, labels: Tensor) -> Tensor:
        return self.pred == labels


def outcomes_of(logits: Tensor, labels: Tensor) -> Outcomes:
    logp = torch.log_softmax(logits.double(), -1).cpu()
    return Outcomes(logp.argmax(-1), logp.gather(-1, labels.view(-1, 1)).squeeze(-1))


def concat(parts: list[Outcomes]) -> Outcomes:
    return Outcomes(torch.cat([p.pred for p in parts]), torch.cat([p.logp_true for p in parts]))


def device_dtype(model: nn.Module) -> tuple[torch.device, torch.dtype]:
    p = next(model.parameters())
    return p.device, p.dtype


def outcomes(
    model: nn.Module,
    data: EvalSet,
    edits: Sequence[Edit | dict] = (),
    sources: dict[str, Tensor] | None = None,
    head_means: Sequence[Tensor] | None = None,
    batch_size: int = BATCH,
    progress: bool = False,
    stop: Callable[[], bool] | None = None,
    attention: Sequence[MeanAttention] | None = None,
) -> Outcomes:
    """The model's outcomes on ``data``, with ``edits`` applied; ``stop`` is asked before every batch (true: raise
    :class:`Cancelled`)."""
    parts, (dev, dtype) = [], device_dtype(model)
    with torch.inference_mode(), evaluating(), edited(model, edits, sources, head_means, attention):
        starts = range(0, len(data), batch_size)
        for s in tqdm(starts, desc="images", unit="batch", disable=not progress, leave=False):
            if stop is not None and stop():
                raise Cancelled("the pass over validation images was stopped")
            end = min(s + batch_size, len(data))
            parts.append(outcomes_of(model(data.batch(s, end, dev, dtype)), data.labels[s:end]))
    return concat(parts)


@dataclass
class Change:
    """An unedited → edited change of a mean over images, with the paired bootstrap 95% interval of the change."""

    unedited: float
    edited: float
    ci95: tuple[float, float]

    @property
    def change(self) -> float:
        return self.edited - self.unedited

    @property
    def within_noise(self) -> bool:
        return within_noise(self.ci95)


@dataclass
class ValidationEffect:
    """Accuracy and log p(true) on the validation images, unedited and edited, overall and per class."""

    n: int
    accuracy: Change
    logp_true: Change
    mcnemar_p: float
    mcnemar_mid_p: float
    lost: int  # right unedited, wrong edited
    gained: int
    per_class: list[dict[str, Any]]
    images: dict[str, Any] | None = None  # which images (EvalSet.describe), when known

    def to_dict(self) -> dict[str, Any]:
        """The API's JSON shape (the intervals are for edited − unedited)."""
        out = {
            "n": self.n,
            "accuracy": {
                "unedited": self.accuracy.unedited,
                "edited": self.accuracy.edited,
                "ci95": list(self.accuracy.ci95),
                "mcnemar_p": self.mcnemar_p,
            },
            "logp_true": {"change": self.logp_true.change, "ci95": list(self.logp_true.ci95)},
            "per_class": self.per_class,
        }
        return out if self.images is None else {**out, "images": self.images}


def _change(v0: np.ndarray, v1: np.ndarray, seed: int) -> Change:
    """Unedited values ``v0`` → edited ``v1`` of the same images."""
    return Change(float(v0.mean()), float(v1.mean()), bootstrap_ci(v1 - v0, seed=seed))


def compare(
    unedited: Outcomes, edited_: Outcomes, labels: Tensor, class_names: Sequence[str], seed: int = 0
) -> ValidationEffect:
    """Paired comparison of two runs over the same images (see the module docstring)."""
    y = labels.numpy()
    c0, c1 = (o.correct(labels).numpy().astype(np.float64) for o in (unedited, edited_))
    l0, l1 = unedited.logp_true.numpy(), edited_.logp_true.numpy()
    lost, gained = int(((c0 == 1) & (c1 == 0)).sum()), int(((c0 == 0) & (c1 == 1)).sum())
    exact, mid = mcnemar(lost, gained)
    per_class = []
    for k, name in enumerate(class_names):
        m = y == k
        if not m.any():
            continue
        acc, lp = _change(c0[m], c1[m], seed), _change(l0[m], l1[m], seed)
        per_class.append(
            {
                "class": name,
                "n": int(m.sum()),
                "accuracy": {"unedited": acc.unedited, "edited": acc.edited, "ci95": list(acc.ci95)},
                "logp_true": {"change": lp.change, "ci95": list(lp.ci95)},
                "within_noise": lp.within_noise and acc.within_noise,
            }
        )
    return ValidationEffect(len(y), _change(c0, c1, seed), _change(l0, l1, seed), exact, mid, lost, gained, per_class)


def validation_effect(
    model: nn.Module,
    data: EvalSet,
    edits: Sequence[Edit | dict],
    sources: dict[str, Tensor] | None = None,
    head_means: Sequence[Tensor] | None = None,
    unedited: Outcomes | None = None,
    progress: bool = False,
    stop: Callable[[], bool] | None = None,
    attention: Sequence[MeanAttention] | None = None,
) -> ValidationEffect:
    """:func:`compare` of the unedited model (or the cached ``unedited`` outcomes) with the edited one on ``data``;
    ``stop`` cancels between batches (:func:`outcomes`)."""
    o0 = unedited if unedited is not None else outcomes(model, data, progress=progress, stop=stop)
    o1 = outcomes(model, data, edits, sources, head_means, progress=progress, stop=stop, attention=attention)
    effect = compare(o0, o1, data.labels, data.class_names)
    effect.images = data.describe()
    return effect
