"""The optimiser and the learning-rate schedule of the matched recipe."""

from __future__ import annotations

import math

import torch
from torch import nn

from ssog_core.train.config import TrainConfig


def lr_factor(step: int, warmup: int, total: int) -> float:
    """Linear warm-up over ``warmup`` steps, then cosine to 0 at ``total`` (step = optimizer steps done)."""
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


FIELD_PARAMETERS = ("mu", "raw_sigma", "log_lambda", "raw_temperature")  # the fixed field of an SSOG layer


def make_optimizer(model: nn.Module, config: TrainConfig) -> torch.optim.AdamW:
    """AdamW with weight decay on every parameter (the upstream implementation's recipe).

    The steering gates and the fixed field's parameters (μ, σ, λ, τ) get their own learning-rate multipliers:
    under Adam a parameter moves about one learning rate per step, so a short run cannot open a cold gate or
    move an atom by several grid cells without them. The fused implementation updates every parameter in one
    kernel (an SSOG layer has 15 parameter tensors, a dot layer 2), not one tensor after another.
    """
    field_mult = config.field_lr_mult
    gates, field, rest = [], [], []
    for name, p in model.named_parameters():
        leaf = name.rsplit(".", 1)[-1]
        is_field = leaf in FIELD_PARAMETERS and field_mult != 1.0  # no extra group by default: old runs resume
        (gates if leaf.endswith("_scale") else field if is_field else rest).append(p)
    groups = [{"params": rest, "lr": config.lr}]
    for params, mult in ((gates, config.gate_lr_mult), (field, field_mult)):
        if params:
            groups.append({"params": params, "lr": config.lr * mult})
    return torch.optim.AdamW(groups, lr=config.lr, weight_decay=config.weight_decay, fused=True)
