"""The causal language model's training loop (:mod:`ssog_core.nn.lm`): one model per attention kind with the same
seed, initial weights and batches, and the loss curves side by side. The command line is
:mod:`ssog_core.cli.lm_train` (``python -m ssog_core lm-train``).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ssog_core.checkpoint.files import atomic_write
from ssog_core.nn.lm import CausalLM, LMConfig


@dataclass(frozen=True)
class TrainSettings:
    """Optimisation settings (the same for every attention kind in a comparison)."""

    steps: int = 1000
    batch_size: int = 32
    lr: float = 1e-3
    min_lr_ratio: float = 0.1  # cosine decay ends at lr · this
    warmup: int = 50  # linear warm-up steps
    weight_decay: float = 0.1  # on Linear and Embedding weight matrices only
    grad_clip: float = 1.0
    eval_every: int = 100
    eval_batches: int = 8
    val_fraction: float = 0.1  # the last part of the text is held out


def split_tokens(ids: Tensor, val_fraction: float) -> tuple[Tensor, Tensor]:
    """Train / validation token streams; each must hold at least one (input, target) pair."""
    n_val = int(len(ids) * val_fraction)
    train, val = ids[: len(ids) - n_val], ids[len(ids) - n_val :]
    if len(train) < 2 or len(val) < 2:
        raise ValueError(
            f"the text has {len(ids)} tokens: too short to hold out {val_fraction:.0%} for validation "
            "and still train (each part needs at least 2 tokens)"
        )
    return train, val


def sample_batch(stream: Tensor, batch: int, context: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """Random windows ``(B, T)`` and their next-token targets; ``T = min(context, len(stream) − 1)``."""
    t = min(context, len(stream) - 1)
    starts = torch.randint(0, len(stream) - t, (batch,), generator=generator)
    idx = torch.stack([stream[s : s + t] for s in starts.tolist()]).long()
    tgt = torch.stack([stream[s + 1 : s + 1 + t] for s in starts.tolist()]).long()
    return idx, tgt


def _optimizer(model: nn.Module, settings: TrainSettings) -> torch.optim.AdamW:
    decay = {id(m.weight) for m in model.modules() if isinstance(m, nn.Linear | nn.Embedding)}
    params = list(model.parameters())
    groups = [
        {"params": [p for p in params if id(p) in decay], "weight_decay": settings.weight_decay},
        {"params": [p for p in params if id(p) not in decay], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=settings.lr, betas=(0.9, 0.95))


def learning_rate(step: int, settings: TrainSettings) -> float:
    """Linear warm-up, then cosine decay to ``lr · min_lr_ratio`` at the last step."""
    if step < settings.warmup:
        return settings.lr * (step + 1) / settings.warmup
    progress = (step - settings.warmup) / max(1, settings.steps - settings.warmup)
    return settings.lr * (
        settings.min_lr_ratio + (1 - settings.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
    )


def train_lm(
    ids: Tensor,
    config: LMConfig,
    settings: TrainSettings,
    seed: int = 0,
    device: str | torch.device = "cpu",
    progress: bool = True,
) -> tuple[CausalLM, list[dict[str, Any]]]:
    """Train a model on token stream ``ids``; returns it (eval mode) and its loss history.

    The seed fixes the initial weights, the training batches and the validation batches, so two calls
    that differ only in ``config.attn`` see the same data in the same order.
    """
    from tqdm.auto import tqdm

    device = torch.device(device)
    train, val = split_tokens(ids, settings.val_fraction)
    torch.manual_seed(seed)
    model = CausalLM(config).to(device)
    opt = _optimizer(model, settings)
    data_gen = torch.Generator().manual_seed(seed)
    val_gen = torch.Generator().manual_seed(seed + 1)
    val_batches = [
        sample_batch(val, settings.batch_size, config.context, val_gen) for _ in range(settings.eval_batches)
    ]

    def amp() -> torch.autocast:  # bf16 matmuls on GPU; the loss is taken in fp32 either way
        return torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")

    def evaluate() -> float:
        model.eval()
        with torch.no_grad(), amp():
            losses = [float(model.loss(x.to(device), y.to(device))) for x, y in val_batches]
        model.train()
        return sum(losses) / len(losses)

    history = [
        {"attn": config.attn, "step": 0, "train_loss": None, "val_loss": evaluate(), "lr": 0.0, "elapsed_s": 0.0}
    ]
    start, running = time.perf_counter(), []
    bar = tqdm(range(1, settings.steps + 1), desc=f"train {config.attn}", disable=not progress, leave=False)
    model.train()
    for step in bar:
        lr = learning_rate(step - 1, settings)
        for group in opt.param_groups:
            group["lr"] = lr
        x, y = sample_batch(train, settings.batch_size, config.context, data_gen)
        with amp():
            loss = model.loss(x.to(device), y.to(device))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), settings.grad_clip)
        opt.step()
        running.append(float(loss.detach()))
        bar.set_postfix(loss=f"{running[-1]:.3f}")
        if step % settings.eval_every == 0 or step == settings.steps:
            history.append(
                {
                    "attn": config.attn,
                    "step": step,
                    "train_loss": sum(running) / len(running),
                    "val_loss": evaluate(),
                    "lr": lr,
                    "elapsed_s": time.perf_counter() - start,
                }
            )
            running = []
    return model.eval(), history


def loss_table(histories: dict[str, list[dict[str, Any]]]) -> str:
    """Side-by-side loss curves: one row per evaluation step, train / val columns per attention kind."""
    kinds = list(histories)
    head = f"{'step':>7} " + " ".join(f"{k + ' train':>11} {k + ' val':>9}" for k in kinds)
    rows = [head]
    for records in zip(*histories.values(), strict=True):
        cells = []
        for r in records:
            train = "-" if r["train_loss"] is None else f"{r['train_loss']:.4f}"
            cells.append(f"{train:>11} {r['val_loss']:>9.4f}")
        rows.append(f"{records[0]['step']:>7} " + " ".join(cells))
    return "\n".join(rows)


def plot_losses(histories: dict[str, list[dict[str, Any]]], path: str | Path, title: str = "") -> Path:
    """Train (dashed) and validation (solid) loss vs step for each attention kind, as a PNG."""
    from matplotlib.figure import Figure  # no pyplot: no global backend or figure state

    fig = Figure(figsize=(7, 4.2))
    ax = fig.subplots()
    for i, (kind, records) in enumerate(histories.items()):
        color = f"C{i}"
        trained = [r for r in records if r["train_loss"] is not None]
        ax.plot(
            [r["step"] for r in trained], [r["train_loss"] for r in trained], "--", color=color, label=f"{kind} train"
        )
        ax.plot(
            [r["step"] for r in records], [r["val_loss"] for r in records], "-o", ms=3, color=color, label=f"{kind} val"
        )
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats / token)")
    ax.set_title(title or "causal LM: dot vs RBF attention")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    return atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=120))


def write_jsonl(records: list[dict[str, Any]], path: str | Path) -> Path:
    def write(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8") as f:
            for r in records:
                f.write(json.dumps(r) + "\n")

    return atomic_write(path, write)
