"""``train --tensorboard DIR``: the training history's scalars and the field grid, written as TensorBoard events.

For people who watch runs in TensorBoard, as timm and most training code report: the same numbers the
checkpoint's history keeps (:class:`~ssog_core.checkpoint.history.History`), written as they are recorded. Tags:
``train/loss`` and ``train/accuracy`` (means since the previous snapshot), ``gate/<tap>/layer<i>`` (gate scale
``s``), ``val/accuracy`` and ``val/loss`` at every evaluation, and at every evaluation the image ``fields``: every
SSOG layer's fixed field over relative position, heads as rows, layers as columns, each panel scaled to its own
peak (as the app's geometry grid). Steps count over all ``--init-from`` stages, as the history's do.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn

from ssog_core.checkpoint.history import History
from ssog_core.field import displacement_density
from ssog_core.nn.attention import SSOGAttention
from ssog_core.train.config import TrainError

PANEL_GAP = 1  # pixels of black between two panels of the field grid


class TensorBoardLog:
    """Events in ``log_dir``, one writer per run (the primary process only)."""

    def __init__(self, log_dir: str | Path):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as e:  # tensorboard is optional: the run must not start and then fail
            raise TrainError("--tensorboard needs the tensorboard package: pip install tensorboard") from e
        try:
            self.writer = SummaryWriter(str(log_dir))
        except OSError as e:  # a file in the way, no permission: said before training starts
            raise TrainError(f"--tensorboard {log_dir}: cannot write TensorBoard events there ({e.strerror})") from e

    def snapshot(self, history: History) -> None:
        """The latest snapshot's gate scales and the train loss / accuracy since the one before."""
        step = history.steps[-1]
        for tap, rows in history.gates.items():
            for layer, scale in enumerate(rows[-1]):
                self.writer.add_scalar(f"gate/{tap}/layer{layer}", scale, step)
        if history.train and history.train[-1][0] == step:
            _, loss, accuracy = history.train[-1]
            self.writer.add_scalar("train/loss", loss, step)
            self.writer.add_scalar("train/accuracy", accuracy, step)

    def validation(self, history: History, model: nn.Module, grid: tuple[int, int]) -> None:
        """The latest evaluation, and the field grid at that step (for SSOG models)."""
        step, accuracy, loss = history.val[-1]
        self.writer.add_scalar("val/accuracy", accuracy, int(step))
        self.writer.add_scalar("val/loss", loss, int(step))
        layers = [b.attn for b in model.blocks if isinstance(b.attn, SSOGAttention)]
        if layers:
            self.writer.add_image("fields", field_grid(layers, grid), int(step), dataformats="HW")
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


@torch.no_grad()
def field_grid(layers: list[SSOGAttention], grid: tuple[int, int]) -> np.ndarray:
    """Heads × layers panels of each head's fixed-field density over key offsets (−(G−1) … G−1 per axis), each
    scaled to [0, 1] by its own peak, with a black gap between panels."""
    extent = (grid[0] - 1, grid[1] - 1)
    columns = [displacement_density(a.fixed_field(), extent, a.mode).float().cpu().numpy() for a in layers]
    heads, ph, pw = columns[0].shape
    out = np.zeros((heads * (ph + PANEL_GAP) - PANEL_GAP, len(columns) * (pw + PANEL_GAP) - PANEL_GAP), np.float32)
    for c, density in enumerate(columns):
        for h in range(heads):
            panel = density[h] / max(float(density[h].max()), 1e-30)
            y, x = h * (ph + PANEL_GAP), c * (pw + PANEL_GAP)
            out[y : y + ph, x : x + pw] = panel
    return out
