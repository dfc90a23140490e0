"""Accuracy of a model at one or more image sizes, and its zero-shot resolution-transfer curve.

The one implementation behind ``python -m ssog_core evaluate`` (a checkpoint file) and the transfer curve that
``python -m ssog_core.train`` measures at the end of a run (the model in memory). Only the position embedding is
resized for another size; the Gaussian fields are re-evaluated on the new grid.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Subset

from ssog_core.checkpoint.files import atomic_write
from ssog_core.checkpoint.format import load_checkpoint
from ssog_core.data.sources import DataError, ShardSampler, Transformed, fixed_subset, open_data, to_float

TRANSFER_FACTORS = (0.5, 0.75, 1.0, 1.5, 2.0)  # the default sizes of a transfer curve, relative to training


def autocast(device: torch.device, amp: bool) -> contextlib.AbstractContextManager:
    """bf16 autocast on CUDA when ``amp``; a no-op elsewhere."""
    if amp and device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def evaluate_loader(model: nn.Module, loader: DataLoader, device: torch.device, amp: bool = False) -> dict[str, float]:
    """Mean loss and accuracy over a loader; sums are reduced over processes when distributed."""
    was_training = model.training
    model.eval()
    sums = torch.zeros(3, dtype=torch.float64, device=device)  # loss·n, correct, n
    with torch.inference_mode():
        for x, y in loader:
            x, y = to_float(x.to(device, non_blocking=True)), y.to(device, non_blocking=True)
            with autocast(device, amp):
                logits = model(x)
            loss = F.cross_entropy(logits.float(), y, reduction="sum")
            sums += torch.stack(
                [
                    loss.double(),
                    (logits.argmax(-1) == y).sum().double(),
                    torch.tensor(len(y), device=device, dtype=torch.float64),
                ]
            )
    model.train(was_training)
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(sums)
    loss_sum, correct, n = sums.tolist()
    if n == 0:
        raise DataError("the evaluation split holds no images")
    return {"loss": loss_sum / n, "accuracy": correct / n, "n": int(n)}


def eval_loader(
    dataset: Any,
    size: tuple[int, int],
    batch_size: int,
    workers: int,
    rank: int = 0,
    world: int = 1,
    max_images: int | None = None,
) -> DataLoader:
    """Evaluation batches at ``size``; ``max_images`` keeps a fixed random subset (:func:`fixed_subset`)."""
    data: Any = Transformed(dataset, size)
    if max_images is not None and len(data) > max_images:
        data = Subset(data, fixed_subset(len(data), max_images))
    return DataLoader(data, batch_size=batch_size, sampler=ShardSampler(len(data), rank, world), num_workers=workers)


def transfer_sizes(
    train_size: tuple[int, int], patch: int, factors: tuple[float, ...] = TRANSFER_FACTORS
) -> list[tuple[int, int]]:
    """The training size scaled by ``factors``, each side rounded to a multiple of the patch (duplicates dropped)."""
    sizes: list[tuple[int, int]] = []
    for f in factors:
        size = tuple(max(patch, round(side * f / patch) * patch) for side in train_size)
        if size not in sizes:
            sizes.append(size)
    return sizes


def evaluate_model_sizes(
    model: nn.Module,
    spec: str,
    sizes: list[tuple[int, int]],
    class_names: list[str] | None = None,
    batch_size: int = 256,
    device: torch.device | str = "cpu",
    workers: int = 0,
    amp: bool = False,
    max_images: int | None = None,
    rank: int = 0,
    world: int = 1,
) -> list[dict[str, Any]]:
    """One row per size (``size``, ``grid``, ``trained``, ``accuracy``, ``loss``, ``n``) for a model in memory:
    the one implementation behind ``evaluate`` and the transfer curve that ``train`` stores at the end."""
    dev = torch.device(device)
    train_size = tuple(model.config.img_size)
    for s in sizes:
        model.grid_for(*s)  # refuse sizes that do not tile into patches before any work
    rows = []
    for size in sizes:
        source = open_data(spec, size)
        if class_names and list(class_names) != list(source.class_names):
            raise DataError(
                f"{spec} has {source.num_classes} classes ({', '.join(source.class_names[:4])}, ...) "
                f"but the checkpoint was trained on {len(class_names)} ({', '.join(class_names[:4])}, ...)"
            )
        if not class_names and source.num_classes != model.config.num_classes:
            raise DataError(f"{spec} has {source.num_classes} classes, the model {model.config.num_classes}")
        loader = eval_loader(source.val, size, batch_size, workers, rank, world, max_images)
        result = evaluate_loader(model, loader, dev, amp)
        rows.append({"size": list(size), "grid": list(model.grid_for(*size)), "trained": size == train_size, **result})
    return rows


def evaluate_sizes(
    checkpoint: str | Path,
    data: str | None = None,
    sizes: list[tuple[int, int]] | None = None,
    batch_size: int = 256,
    device: str = "cpu",
    workers: int = 0,
    amp: bool = False,
    max_images: int | None = None,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """:func:`evaluate_model_sizes` of a checkpoint file (default: its training size), and its metadata."""
    dev = torch.device(device)
    model, meta = load_checkpoint(checkpoint, dev)
    spec = data or meta.get("data")
    if not spec:
        raise DataError(f"{Path(checkpoint).name} does not say what data it was trained on: pass --data KIND:PATH")
    sizes = sizes or [tuple(model.config.img_size)]
    rows = evaluate_model_sizes(
        model, spec, sizes, meta.get("class_names"), batch_size, dev, workers, amp, max_images=max_images
    )
    return rows, meta


def transfer_curve(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows as stored under ``resolution_transfer`` and in ``--json`` files: img_size, tokens, accuracy."""
    return [
        {"img_size": list(r["size"]), "tokens": r["grid"][0] * r["grid"][1], "accuracy": r["accuracy"]} for r in rows
    ]


def format_transfer(rows: list[dict[str, Any]]) -> str:
    """The transfer table as text: size, token grid, accuracy, the training size marked."""
    lines = [f"{'size':>9} {'grid':>7} {'accuracy':>9}"]
    for r in rows:
        mark = "  (training size)" if r["trained"] else ""
        size, grid = "×".join(map(str, r["size"])), "×".join(map(str, r["grid"]))
        lines.append(f"{size:>9} {grid:>7} {r['accuracy']:>9.4f}{mark}")
    return "\n".join(lines)


def plot_transfer(rows: list[dict[str, Any]], path: str | Path, title: str) -> Path:
    """Accuracy vs resolution (PNG, matplotlib Agg)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(5.5, 3.6), dpi=120)
    ax = fig.add_subplot()
    xs = [r["size"][0] * r["size"][1] for r in rows]
    ax.plot(xs, [100 * r["accuracy"] for r in rows], marker="o")
    for x, r in zip(xs, rows, strict=True):
        if r["trained"]:
            ax.axvline(x, color="0.7", ls="--", lw=1, label="training size")
    ax.set_xscale("log")
    ax.set_xticks(xs, [f"{r['size'][0]}×{r['size'][1]}" for r in rows])
    ax.minorticks_off()
    ax.set_xlabel("evaluation resolution (no fine-tuning)")
    ax.set_ylabel("accuracy (%)")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    if any(r["trained"] for r in rows):
        ax.legend(fontsize=8)
    fig.tight_layout()
    return atomic_write(path, lambda tmp: fig.savefig(tmp, format="png"))
