"""What an intervention changes, with a noise floor: one image, the validation set, and head importance.

* :func:`image_effect` — one image: class probabilities unedited and edited, the change in log p of the unedited
  prediction, accumulated export maps unedited / edited / difference, and the first edited layer's attention.
* :func:`validation_effect` — the first N validation images of the checkpoint's recorded data: accuracy and mean
  log p(true class), unedited and edited, each change with a paired bootstrap 95% interval (the same images are
  resampled for both sides), McNemar's exact and mid-p tests for the accuracy change, and the same per class.
  Near 100% accuracy a change moves a handful of images while log p(true) still moves measurably, so both are
  reported; an interval that contains 0 is *within noise*.
* :func:`head_importance` — every head ablated and every layer's gates closed, one at a time. Each edit changes
  nothing below its layer, so the residual stream entering every block is computed once per batch and each
  edited run starts at its own layer (about half the work of full forward passes on a 6-layer model).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from tqdm import tqdm

from ssog_core.analysis.interventions import AblateHead, CloseGate, Edit, edited, mean_head_outputs, parse_edits
from ssog_core.analysis.measures import AttentionMaps, attention_maps, export_maps_of
from ssog_core.data.sources import DataError, Transformed, open_data
from ssog_core.field import TAPS
from ssog_core.nn.attention import SSOGAttention

DEFAULT_EVAL_IMAGES = 500
MAX_EVAL_IMAGES = 2000
BOOTSTRAP = 2000  # resamples: the 2.5% and 97.5% quantiles move by < 0.1 of an interval's width between seeds
BATCH = 100
TOP_K = 5


class Cancelled(RuntimeError):
    """A sweep was stopped by its caller (``stop()`` returned true)."""


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
        probs_unedited, probs_edited: ``(classes,)`` in the checkpoint's class order.
        dlogp: edited − unedited log p of the class the unedited model predicts.
        accumulated_unedited, accumulated_edited: ``(Gh, Gw)`` accumulated export maps (difference: property).
        layer: the first edited layer (``None`` without edits); ``attention_unedited`` / ``attention_edited``
            its ``(H, N, N)`` matrices and ``removed`` the heads the edit took out of its head mean.
    """

    probs_unedited: Tensor
    probs_edited: Tensor
    dlogp: float
    accumulated_unedited: Tensor
    accumulated_edited: Tensor
    layer: int | None
    attention_unedited: Tensor | None
    attention_edited: Tensor | None
    removed: frozenset[int]

    @property
    def difference(self) -> Tensor:
        return self.accumulated_edited - self.accumulated_unedited

    def top(self, class_names: Sequence[str], edited_side: bool, k: int = TOP_K) -> list[tuple[str, float]]:
        p = self.probs_edited if edited_side else self.probs_unedited
        values, idx = p.topk(min(k, p.numel()))
        return [(class_names[i], float(v)) for v, i in zip(values, idx, strict=True)]


def image_effect(
    model: nn.Module,
    img: Tensor,
    edits: Sequence[Edit | dict],
    sources: dict[str, Tensor] | None = None,
    head_means: Sequence[Tensor] | None = None,
    unedited: AttentionMaps | None = None,
) -> ImageEffect:
    """The effect of ``edits`` on one image ``(1, C, H, W)``. ``unedited`` may pass the image's unedited
    :class:`~ssog_core.analysis.AttentionMaps` (a caller that caches them saves half the work)."""
    parsed = parse_edits(list(edits))
    before = unedited if unedited is not None else attention_maps(model, img)
    with edited(model, parsed, sources, head_means):
        after = attention_maps(model, img)
    acc0, acc1 = export_maps_of(before).accumulated[0], export_maps_of(after).accumulated[0]
    p0, p1 = (torch.softmax(m.logits[0].double(), -1).cpu() for m in (before, after))
    top = int(p0.argmax())
    layer = min((e.layer for e in parsed), default=None)
    return ImageEffect(
        probs_unedited=p0,
        probs_edited=p1,
        dlogp=float(torch.log(p1[top].clamp_min(1e-300)) - torch.log(p0[top].clamp_min(1e-300))),
        accumulated_unedited=acc0,
        accumulated_edited=acc1,
        layer=layer,
        attention_unedited=None if layer is None else before.attn[layer][0].cpu(),
        attention_edited=None if layer is None else after.attn[layer][0].cpu(),
        removed=frozenset() if layer is None else after.removed[layer],
    )


# ------------------------------------------------------------------------------------------ the validation set


@dataclass
class EvalSet:
    """The first ``n`` validation images of a checkpoint's data, as the model takes them (uint8, NHWC)."""

    images: Tensor
    labels: Tensor
    class_names: list[str]
    spec: str
    normalization: dict[str, list[float]] | None = None

    def __len__(self) -> int:
        return len(self.labels)

    def batch(
        self, start: int, stop: int, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32
    ) -> Tensor:
        """Images ``start:stop`` as a model input ``(B, C, H, W)`` in [0, 1] (normalised if the checkpoint is)."""
        x = self.images[start:stop].to(device).permute(0, 3, 1, 2).to(dtype).div_(255.0)
        if self.normalization:
            mean = torch.tensor(self.normalization["mean"], device=x.device, dtype=dtype).view(1, -1, 1, 1)
            std = torch.tensor(self.normalization["std"], device=x.device, dtype=dtype).view(1, -1, 1, 1)
            x = (x - mean) / std
        return x

    def batches(self, model: nn.Module, batch_size: int = BATCH) -> Iterator[Tensor]:
        """The images in batches, on the model's device and in its dtype."""
        p = next(model.parameters())
        for s in range(0, len(self), batch_size):
            yield self.batch(s, min(s + batch_size, len(self)), p.device, p.dtype)


def eval_images(n: int | None, split: int) -> int:
    """``n`` (default :data:`DEFAULT_EVAL_IMAGES`) checked against the split and the cap, in words."""
    cap = min(split, MAX_EVAL_IMAGES)
    n = min(DEFAULT_EVAL_IMAGES, cap) if n is None else int(n)
    if not 1 <= n <= cap:
        raise ValueError(f"evaluate 1 to {cap} images (the split holds {split}, at most {MAX_EVAL_IMAGES}), got {n}")
    return n


def load_eval_set(meta: dict[str, Any], img_size: Sequence[int], n: int | None = None) -> EvalSet:
    """The first ``n`` validation images of ``meta["data"]`` (the checkpoint's recorded data) at ``img_size``.

    The first images, not a random subset: the procedural data sets label image ``i`` as class ``i mod K``, so a
    prefix is balanced, and every caller (CLI, app, notebook) gets the same images for the same ``n``.
    """
    spec = meta.get("data")
    if not spec:
        raise DataError("this checkpoint does not record its data (meta['data']): there is no validation set to use")
    size = (int(img_size[0]), int(img_size[1]))
    source = open_data(spec, size)
    names = meta.get("class_names")
    if names and list(names) != list(source.class_names):
        raise DataError(f"{spec} has other classes than the checkpoint ({', '.join(source.class_names[:3])}, ...)")
    n = eval_images(n, len(source.val))
    data = Transformed(source.val, size)
    items = [data[i] for i in range(n)]
    return EvalSet(
        images=torch.from_numpy(np.stack([a for a, _ in items])),
        labels=torch.tensor([int(y) for _, y in items]),
        class_names=list(source.class_names),
        spec=spec,
        normalization=meta.get("normalization"),
    )


def dataset_means(model: nn.Module, meta: dict[str, Any]) -> list[Tensor]:
    """Each head's mean output per position over the first :data:`DEFAULT_EVAL_IMAGES` validation images (fewer if
    the split is smaller), for ``dataset_mean`` ablation: a fixed set, so the mean does not depend on N."""
    data = load_eval_set(meta, model.config.img_size)
    return mean_head_outputs(model, data.batches(model))


@dataclass
class Outcomes:
    """Per image: the prediction, whether it is right, and log p(true class) (CPU)."""

    pred: Tensor
    logp_true: Tensor

    def correct(self, labels: Tensor) -> Tensor:
        return self.pred == labels


def _outcome(logits: Tensor, labels: Tensor) -> Outcomes:
    logp = torch.log_softmax(logits.double(), -1).cpu()
    return Outcomes(logp.argmax(-1), logp.gather(-1, labels.view(-1, 1)).squeeze(-1))


def _cat(parts: list[Outcomes]) -> Outcomes:
    return Outcomes(torch.cat([p.pred for p in parts]), torch.cat([p.logp_true for p in parts]))


def _where(model: nn.Module) -> tuple[torch.device, torch.dtype]:
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
) -> Outcomes:
    """The model's outcomes on ``data``, with ``edits`` applied."""
    parts, (dev, dtype) = [], _where(model)
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode(), edited(model, edits, sources, head_means):
            starts = range(0, len(data), batch_size)
            for s in tqdm(starts, desc="images", unit="batch", disable=not progress, leave=False):
                stop = min(s + batch_size, len(data))
                parts.append(_outcome(model(data.batch(s, stop, dev, dtype)), data.labels[s:stop]))
    finally:
        model.train(was_training)
    return _cat(parts)


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
    lost: int  # right before, wrong after
    gained: int
    per_class: list[dict[str, Any]]

    def to_dict(self) -> dict[str, Any]:
        """The API's JSON shape (the intervals are for edited − unedited)."""
        return {
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


def _change(before: np.ndarray, after: np.ndarray, seed: int) -> Change:
    return Change(float(before.mean()), float(after.mean()), bootstrap_ci(after - before, seed=seed))


def compare(
    before: Outcomes, after: Outcomes, labels: Tensor, class_names: Sequence[str], seed: int = 0
) -> ValidationEffect:
    """Paired comparison of two runs over the same images (see the module docstring)."""
    y = labels.numpy()
    c0, c1 = before.correct(labels).numpy().astype(np.float64), after.correct(labels).numpy().astype(np.float64)
    l0, l1 = before.logp_true.numpy(), after.logp_true.numpy()
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
) -> ValidationEffect:
    """:func:`compare` of the unedited model (or the cached ``unedited`` outcomes) with the edited one on ``data``."""
    before = unedited if unedited is not None else outcomes(model, data, progress=progress)
    after = outcomes(model, data, edits, sources, head_means, progress=progress)
    return compare(before, after, data.labels, data.class_names)


# ------------------------------------------------------------------------------------------------ head importance


@dataclass
class Cell:
    """One single-edit effect: drops as unedited − edited; ``ci95`` is the interval of ``logp_drop``."""

    accuracy_drop: float
    logp_drop: float
    ci95: tuple[float, float]

    @property
    def within_noise(self) -> bool:
        return within_noise(self.ci95)

    def to_dict(self) -> dict[str, Any]:
        return {
            "accuracy_drop": self.accuracy_drop,
            "logp_drop": self.logp_drop,
            "ci95": list(self.ci95),
            "within_noise": self.within_noise,
        }


@dataclass
class HeadImportance:
    """Each head ablated (``ablate[layer][head]``) and each layer's gates closed (``close_gate[tap][layer]``,
    ``None`` where the layer has no such gate; empty for models without a steered field)."""

    n: int
    mode: str
    unedited_accuracy: float
    ablate: list[list[Cell]]
    close_gate: dict[str, list[Cell | None]]

    def to_dict(self) -> dict[str, Any]:
        return {
            "n": self.n,
            "unedited_accuracy": self.unedited_accuracy,
            "ablate_head": [[c.to_dict() for c in row] for row in self.ablate],
            "close_gate": {t: [None if c is None else c.to_dict() for c in row] for t, row in self.close_gate.items()},
        }


def importance_edits(model: nn.Module, mode: str = "zero") -> list[Edit]:
    """The sweep's single edits: every head ablated (``mode``), then every layer's μ, σ and λ gates closed."""
    out: list[Edit] = [AblateHead(i, h, mode) for i, b in enumerate(model.blocks) for h in range(b.attn.num_heads)]
    for tap in TAPS:
        out += [CloseGate(i, tap) for i, b in enumerate(model.blocks) if tap in getattr(b.attn, "taps", ())]
    return out


def _tail(model: nn.Module, x: Tensor, grid: tuple[int, int], start: int) -> Tensor:
    """Logits from the residual stream ``x`` entering block ``start`` (what ``ViT.forward`` does from there)."""
    for block in model.blocks[start:]:
        x = block(x, grid)
    return model.head(model.norm(x[:, model.num_prefix_tokens :]).mean(dim=1))


def head_importance(
    model: nn.Module,
    data: EvalSet,
    mode: str = "zero",
    head_means: Sequence[Tensor] | None = None,
    batch_size: int = BATCH,
    progress: bool = False,
    stop: Callable[[], bool] | None = None,
) -> HeadImportance:
    """Every single edit of :func:`importance_edits` on ``data``, with intervals (drops: unedited − edited).

    The residual stream entering each block is computed once per batch and every edited run starts at its own
    layer. ``stop`` is asked between batches; when it returns true the sweep raises :class:`Cancelled`.
    """
    sweep = importance_edits(model, mode)
    dev, dtype = _where(model)
    base: list[Outcomes] = []
    per_edit: list[list[Outcomes]] = [[] for _ in sweep]
    was_training = model.training
    model.eval()
    bar = tqdm(total=len(data) * (len(sweep) + 1), desc="head importance", unit="img", disable=not progress)
    try:
        with torch.inference_mode():
            for s in range(0, len(data), batch_size):
                if stop is not None and stop():
                    raise Cancelled("head importance stopped")
                img, labels = data.batch(s, min(s + batch_size, len(data)), dev, dtype), data.labels[s : s + batch_size]
                x, grid = model.embed(img)
                streams = []
                for block in model.blocks:
                    streams.append(x)
                    x = block(x, grid)
                base.append(_outcome(model.head(model.norm(x[:, model.num_prefix_tokens :]).mean(dim=1)), labels))
                bar.update(len(labels))
                for i, e in enumerate(sweep):
                    with edited(model, [e], head_means=head_means):
                        per_edit[i].append(_outcome(_tail(model, streams[e.layer], grid, e.layer), labels))
                    bar.update(len(labels))
    finally:
        bar.close()
        model.train(was_training)
    before = _cat(base)
    c0 = before.correct(data.labels).numpy().astype(np.float64)
    afters = [_cat(p) for p in per_edit]
    drops = np.stack([before.logp_true.numpy() - a.logp_true.numpy() for a in afters])
    cis = bootstrap_ci(drops) if len(sweep) else np.zeros((0, 2))
    cells = [
        Cell(float(c0.mean() - a.correct(data.labels).numpy().mean()), float(d.mean()), (float(ci[0]), float(ci[1])))
        for a, d, ci in zip(afters, drops, cis, strict=True)
    ]
    by_edit = dict(zip(sweep, cells, strict=True))
    ablate = [[by_edit[AblateHead(i, h, mode)] for h in range(b.attn.num_heads)] for i, b in enumerate(model.blocks)]
    ssog = [isinstance(b.attn, SSOGAttention) and b.attn.taps for b in model.blocks]
    gates = {t: [by_edit.get(CloseGate(i, t)) for i in range(len(model.blocks))] for t in TAPS} if any(ssog) else {}
    return HeadImportance(len(data), mode, float(c0.mean()), ablate, gates)
