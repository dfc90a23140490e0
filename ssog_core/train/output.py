"""The run folder: checked writable and roomy before training, cleared of interrupted saves, metrics and curves."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from ssog_core.checkpoint.files import atomic_write
from ssog_core.train.config import TrainError


def check_writable(out: Path) -> None:
    """Fail before anything else if ``out`` cannot be created and written."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=out, prefix=".write-test.")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise TrainError(f"cannot write to --out {out}: {e.strerror or e}") from None


def remove_unfinished(out: Path) -> list[Path]:
    """Delete the temporary files of saves that a kill interrupted (``atomic_write`` names them ``.NAME.*.tmp``):
    the complete files they would have replaced are still there, so they hold nothing of value."""
    names = (
        "last.safetensors",
        "model.safetensors",
        "train_state.pt",
        "metrics.jsonl",
        "curves.png",
        "model.transfer.json",
    )
    stale = [p for name in names for p in out.glob(f".{name}.*.tmp") if p.is_file()]
    stale += [p for p in out.glob(".write-test.*") if p.is_file()]  # check_writable's probe, killed mid-check
    # a library's own temporary file (".tmp" and six characters), left by a kill mid-write
    stale += [p for p in out.glob(".tmp??????") if p.is_file()]
    for p in stale:
        p.unlink(missing_ok=True)
    return stale


RUN_FILES = ("train_state.pt", "metrics.jsonl", "curves.png", "model.transfer.json")


def remove_run_files(out: Path) -> list[Path]:
    """Delete what a run killed before its first checkpoint left behind, so a new run in ``out`` starts clean."""
    found = [out / name for name in RUN_FILES if (out / name).is_file()]
    for p in found:
        p.unlink(missing_ok=True)
    return found


def check_space(out: Path, need_bytes: int) -> None:
    """Fail before training if the disk of ``out`` lacks room for the checkpoints and their temporary copies."""
    free = shutil.disk_usage(out).free
    if free < need_bytes:
        raise TrainError(
            f"--out {out} has {free / 1e6:.1f} MB free, but the checkpoints need about {need_bytes / 1e6:.1f} MB: "
            "free some space or choose another --out"
        )


def write_json_lines(path: Path, rows: list[dict[str, Any]]) -> None:
    """``rows`` as JSON lines, written atomically."""
    atomic_write(path, lambda tmp: Path(tmp).write_text("".join(json.dumps(r) + "\n" for r in rows)))


def plot_curves(rows: list[dict[str, Any]], path: Path, title: str) -> None:
    """Train/val loss and accuracy per epoch (PNG, matplotlib Agg)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9, 3.4), dpi=110)
    ep = [r["epoch"] for r in rows]
    for i, (key, label) in enumerate((("loss", "loss"), ("acc", "accuracy"))):
        ax = fig.add_subplot(1, 2, i + 1)
        ax.plot(ep, [r[f"train_{key}"] for r in rows], marker=".", label="train")
        ax.plot(ep, [r[f"val_{key}"] for r in rows], marker=".", label="val")
        ax.set_xlabel("epoch")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png"))
