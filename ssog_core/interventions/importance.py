"""Head importance: every head ablated, every head's attention replaced by its fit (how much the head needs content
to score) and every layer's gates closed, one at a time, on the validation images.

Each edit changes nothing below its layer, so the residual stream entering every block is computed once per batch
and each edited run starts at its own layer (about half the work of full forward passes on a 6-layer model).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from tqdm import tqdm

from ssog_core.analysis.head_as_field import FIT_ATOMS, MeanAttention
from ssog_core.field import TAPS
from ssog_core.interventions.edit import Edit
from ssog_core.interventions.effects import (
    Outcomes,
    bootstrap_ci,
    concat,
    device_dtype,
    outcomes_of,
    within_noise,
)
from ssog_core.interventions.ops import AblateHead, CloseGate, ReplaceWithField
from ssog_core.interventions.run import edited, mean_attention
from ssog_core.interventions.validation import BATCH, LABEL, EvalSet
from ssog_core.nn.attention import SSOGAttention
from ssog_core.nn.hook_points import evaluating
from ssog_core.runtime.jobs import Cancelled


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
    """Each head ablated (``ablate[layer][head]``), each head's attention replaced by its ``atoms``-atom fit
    (``replace[layer][head]``) and each layer's gates closed (``close_gate[tap][layer]``, ``None`` where the layer
    has no such gate; empty for models without a steered field)."""

    n: int
    mode: str
    unedited_accuracy: float
    ablate: list[list[Cell]]
    close_gate: dict[str, list[Cell | None]]
    replace: list[list[Cell]] = field(default_factory=list)
    atoms: int = FIT_ATOMS
    reference: str = LABEL  # what "accuracy" and "log p(true)" are measured against (validation.TERMS)
    images: dict[str, Any] = field(default_factory=dict)  # which images (EvalSet.describe)

    def to_dict(self) -> dict[str, Any]:
        return {
            "n": self.n,
            "reference": self.reference,
            "images": self.images,
            "unedited_accuracy": self.unedited_accuracy,
            "ablate_head": [[c.to_dict() for c in row] for row in self.ablate],
            "replace_with_fit": {"atoms": self.atoms, "cells": [[c.to_dict() for c in row] for row in self.replace]},
            "close_gate": {t: [None if c is None else c.to_dict() for c in row] for t, row in self.close_gate.items()},
        }


def importance_edits(model: nn.Module, mode: str = "zero") -> list[Edit]:
    """The sweep's single edits: every head ablated (``mode``), every head's attention replaced by its
    :data:`~ssog_core.analysis.head_as_field.FIT_ATOMS`-atom fit, then every layer's μ, σ and λ gates closed."""
    heads = [(i, h) for i, b in enumerate(model.blocks) for h in range(b.attn.num_heads)]
    out: list[Edit] = [AblateHead(i, h, mode) for i, h in heads]
    out += [ReplaceWithField(i, h, "fit", FIT_ATOMS) for i, h in heads]
    for tap in TAPS:
        out += [CloseGate(i, tap) for i, b in enumerate(model.blocks) if tap in getattr(b.attn, "taps", ())]
    return out


def _tail(model: nn.Module, x: Tensor, grid: tuple[int, int], start: int) -> Tensor:
    """Logits from the residual stream ``x`` entering block ``start`` (what ``ViT.forward`` does from there)."""
    for block in model.blocks[start:]:
        x = block(x, grid)
    return model.readout(x)


def head_importance(
    model: nn.Module,
    data: EvalSet,
    mode: str = "zero",
    head_means: Sequence[Tensor] | None = None,
    batch_size: int = BATCH,
    progress: bool = False,
    stop: Callable[[], bool] | None = None,
    attention: Sequence[MeanAttention] | None = None,
) -> HeadImportance:
    """Every single edit of :func:`importance_edits` on ``data``, with intervals (drops: unedited − edited).

    The fits replacing a head come from ``attention`` (:func:`~ssog_core.interventions.run.mean_attention`), or,
    when it is not given, from one pass over ``data`` first (with the default N these are the images
    :func:`~ssog_core.interventions.result.validation_attention` uses, so a cell equals that edit's effect). The
    residual stream entering each block is computed once per batch and every edited run starts at its own layer.
    ``stop`` is asked between batches of the sweep; when it returns true the sweep raises :class:`Cancelled`.
    """
    mode = AblateHead.params()["mode"].parse("mode", mode)  # refused in words before any work
    sweep = importance_edits(model, mode)
    dev, dtype = device_dtype(model)
    if attention is None:
        attention = mean_attention(
            model, (data.batch(s, s + batch_size, dev, dtype) for s in range(0, len(data), batch_size))
        )
    base: list[Outcomes] = []
    per_edit: list[list[Outcomes]] = [[] for _ in sweep]
    bar = tqdm(total=len(data) * (len(sweep) + 1), desc="head importance", unit="img", disable=not progress)
    try:
        with torch.inference_mode(), evaluating():
            for s in range(0, len(data), batch_size):
                if stop is not None and stop():
                    raise Cancelled("head importance stopped")
                img, labels = data.batch(s, min(s + batch_size, len(data)), dev, dtype), data.labels[s : s + batch_size]
                x, grid = model.embed(img)
                streams = []
                for block in model.blocks:
                    streams.append(x)
                    x = block(x, grid)
                base.append(outcomes_of(model.readout(x), labels))
                bar.update(len(labels))
                for i, e in enumerate(sweep):
                    with edited(model, [e], head_means=head_means, attention=attention):
                        per_edit[i].append(outcomes_of(_tail(model, streams[e.layer], grid, e.layer), labels))
                    bar.update(len(labels))
    finally:
        bar.close()
    unedited = concat(base)
    c0 = unedited.correct(data.labels).numpy().astype(np.float64)
    edited_runs = [concat(p) for p in per_edit]
    drops = np.stack([unedited.logp_true.numpy() - a.logp_true.numpy() for a in edited_runs])
    cis = bootstrap_ci(drops) if len(sweep) else np.zeros((0, 2))
    cells = [
        Cell(float(c0.mean() - a.correct(data.labels).numpy().mean()), float(d.mean()), (float(ci[0]), float(ci[1])))
        for a, d, ci in zip(edited_runs, drops, cis, strict=True)
    ]
    by_edit = dict(zip(sweep, cells, strict=True))
    ablate = [[by_edit[AblateHead(i, h, mode)] for h in range(b.attn.num_heads)] for i, b in enumerate(model.blocks)]
    replace = [
        [by_edit[ReplaceWithField(i, h, "fit", FIT_ATOMS)] for h in range(b.attn.num_heads)]
        for i, b in enumerate(model.blocks)
    ]
    ssog = [isinstance(b.attn, SSOGAttention) and b.attn.taps for b in model.blocks]
    gates = {t: [by_edit.get(CloseGate(i, t)) for i in range(len(model.blocks))] for t in TAPS} if any(ssog) else {}
    return HeadImportance(
        len(data), mode, float(c0.mean()), ablate, gates, replace, FIT_ATOMS, data.reference, data.describe()
    )
