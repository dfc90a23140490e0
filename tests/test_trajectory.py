"""Geometry over training steps, rebuilt from a checkpoint's history: it must end at the final model's geometry."""

from __future__ import annotations

import pytest
import torch

from ssog_core.analysis import layer_fields
from ssog_core.analysis.trajectory import geometry_trajectory, snapshot_densities, snapshot_fields
from ssog_core.checkpoint.format import load_checkpoint, read_history
from ssog_core.checkpoint.history import History
from ssog_core.cli import train
from ssog_core.field import attention_matrix

RUN = [
    *("--data", "shapes:size=28,train=32,val=8,classes=2", "--img-size", "28x20", "--transfer-sizes", "none"),
    *("--dim", "16", "--depth", "2", "--heads", "2", "--atoms", "3", "--batch-size", "8", "--epochs", "2"),
    *("--lr", "0.05", "--field-lr-mult", "10", "--no-progress"),
]  # a 7×5 token grid, fields that move visibly in 8 steps


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("traj")
    assert train.main([*RUN, "--out", str(out)]) == 0
    model, _ = load_checkpoint(out / "last.safetensors")
    return model, read_history(out / "last.safetensors")


@pytest.mark.slow
def test_the_last_snapshot_is_the_final_model_exactly(trained):
    model, history = trained
    assert model.config.grid == (7, 5)
    final = layer_fields(model)
    traj = geometry_trajectory(history, model.config.grid, model.config.field)
    assert traj.reach.shape == (len(history.steps), 2, 2) and traj.spread.shape == (len(history.steps), 2, 2, 2)
    torch.testing.assert_close(traj.reach[-1], torch.stack([lf.reach for lf in final]), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(traj.spread[-1], torch.stack([lf.spread for lf in final]), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(traj.elongation[-1], torch.stack([lf.elongation for lf in final]), atol=1e-4, rtol=1e-4)
    dens = snapshot_densities(history, len(history.steps) - 1, model.config.grid, model.config.field)
    torch.testing.assert_close(dens.float(), torch.stack([lf.density for lf in final]), atol=1e-6, rtol=1e-5)
    assert not torch.equal(traj.reach[0], traj.reach[-1])  # the geometry moved


def test_snapshot_density_is_the_centre_row_of_the_definition(trained):
    """Against the operator itself: the density at offset (oy, ox) is the attention from the centre query of a
    (2Gh−1)×(2Gw−1) grid to the key at that offset, taken from the exact attention matrix."""
    model, history = trained
    index = len(history.steps) // 2
    dens = snapshot_densities(history, index, (7, 5), model.config.field)
    ny, nx = 13, 9
    for layer, field in enumerate(snapshot_fields(history, index)):
        a = attention_matrix(field, (ny, nx), model.config.field)[0]  # (H, N, N), float64
        centre = (ny // 2) * nx + nx // 2
        torch.testing.assert_close(dens[layer], a[:, centre].reshape(-1, ny, nx), atol=1e-12, rtol=1e-9)


def test_a_history_without_fields_is_refused():
    with pytest.raises(ValueError, match="no fields"):
        snapshot_fields(History(steps=[0]), 0)
