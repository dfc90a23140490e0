"""How a model's geometry moved during training, read from the history its checkpoint stores (docs/DESIGN.md §3.6).

Every snapshot of a :class:`~ssog_core.checkpoint.history.History` holds each layer's fixed field (μ, σ, λ, τ); these
functions rebuild it as a :class:`~ssog_core.field.Field` and measure it exactly as :func:`layer_fields` measures a
model's own layers (the same density over key displacement, the same moments), so a curve over steps ends at the
number the geometry tab shows for the final model.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from ssog_core.analysis.measures import LayerField, density_moments, field_geometry
from ssog_core.checkpoint.history import History
from ssog_core.field import Field, FieldMode, displacement_density


def snapshot_fields(history: History, index: int) -> list[Field]:
    """The fixed field of every layer at snapshot ``index`` (float64, CPU)."""
    if not history.fields["mu"]:
        raise ValueError("this history holds no fields (a model without SSOG layers)")
    f = {k: torch.from_numpy(np.asarray(history.fields[k][index], dtype=np.float64)) for k in history.fields}
    return [
        Field(f["mu"][layer], f["sigma"][layer], torch.log(f["lambda"][layer]), f["tau"][layer])
        for layer in range(f["mu"].shape[0])
    ]


def snapshot_layer_fields(
    history: History, index: int, grid: tuple[int, int], mode: FieldMode = "factorized"
) -> list[LayerField]:
    """Every layer's geometry at snapshot ``index``, with the gate scales of that step, measured as
    :func:`~ssog_core.analysis.measures.layer_fields` measures a model's layers (in float32, the history's and the
    layers' own precision): the figures of a model's geometry draw a step of its training alike (the last snapshot
    is the trained model)."""
    gates = {tap: rows[index] for tap, rows in history.gates.items()}
    return [
        field_geometry(f.to(torch.float32), grid, mode, {tap: float(g[layer]) for tap, g in gates.items()})
        for layer, f in enumerate(snapshot_fields(history, index))
    ]


def snapshot_densities(history: History, index: int, grid: tuple[int, int], mode: FieldMode = "factorized") -> Tensor:
    """``(L, H, 2Gh−1, 2Gw−1)`` each head's field over key displacement on ``grid`` at snapshot ``index``."""
    extent = (grid[0] - 1, grid[1] - 1)
    return torch.stack([displacement_density(f, extent, mode) for f in snapshot_fields(history, index)])


@dataclass
class GeometryTrajectory:
    """Per snapshot, layer and head: spread ``(S, L, H, 2)`` (std along y, x) and reach ``(S, L, H)`` (RMS key
    distance), in grid cells, on the model's grid."""

    steps: list[int]
    spread: Tensor
    reach: Tensor

    @property
    def elongation(self) -> Tensor:
        """``(S, L, H)`` the larger spread over the smaller."""
        return self.spread.max(-1).values / self.spread.min(-1).values.clamp_min(1e-6)


def geometry_trajectory(history: History, grid: tuple[int, int], mode: FieldMode = "factorized") -> GeometryTrajectory:
    """Spread and reach of every head at every snapshot."""
    spreads, reaches = [], []
    for index in range(len(history.steps)):
        spread, reach = density_moments(snapshot_densities(history, index, grid, mode))
        spreads.append(spread)
        reaches.append(reach)
    return GeometryTrajectory(list(history.steps), torch.stack(spreads).float(), torch.stack(reaches).float())
