"""SuSiE: the code against a term-by-term oracle, its distance geometry, registers, and the module."""

from __future__ import annotations

import math

import pytest
import torch

from ssog_core.nn.susie import SuSiE, sinusoids
from tests.rbf_oracle import susie_code


@pytest.mark.parametrize("mode, grid, dim", [("1d", (1, 23), 10), ("2d", (7, 5), 12), ("1d", (3, 4), 6)])
def test_code_matches_term_by_term_oracle(mode, grid, dim):
    gh, gw = grid
    if mode == "1d":
        positions = [(float(t),) for t in range(gh * gw)]  # raster index
    else:
        positions = [(float(i), float(j)) for i in range(gh) for j in range(gw)]
    torch.testing.assert_close(sinusoids(grid, dim, mode), susie_code(positions, dim), rtol=0, atol=1e-12)


@pytest.mark.parametrize("mode, grid", [("1d", (1, 40)), ("2d", (6, 9))])
def test_code_distances_depend_only_on_displacement(mode, grid):
    """‖c(p) − c(p')‖² = Σ_pairs 4 sin²(ω·Δ/2): translation invariant, so position becomes a distance penalty."""
    c = sinusoids(grid, 16, mode)
    gh, gw = grid
    pos = torch.stack(torch.meshgrid(torch.arange(gh), torch.arange(gw), indexing="ij"), -1).reshape(-1, 2).double()
    if mode == "1d":
        pos = pos[:, 1:]
    d2 = torch.cdist(c, c).square()
    disp = pos[:, None, :] - pos[None, :, :]  # (N, N, axes)
    pairs = 8 // pos.shape[-1]
    w = 10000.0 ** (-torch.arange(pairs, dtype=torch.float64) / pairs)
    want = (4 * torch.sin(disp[..., :, None] * w / 2).square()).sum((-1, -2))
    torch.testing.assert_close(d2, want, rtol=1e-9, atol=1e-9)
    assert float(d2.diagonal().abs().max()) < 1e-12


def test_module_adds_weighted_code_on_the_subspace_and_skips_prefix_tokens():
    torch.manual_seed(0)
    s = SuSiE(num_heads=3, head_dim=10, dim=8, mode="2d")
    with torch.no_grad():
        s.weight.normal_()
    q, k = torch.randn(2, 3, 2 + 12, 10), torch.randn(2, 3, 2 + 12, 10)
    q2, k2 = s(q, k, (3, 4))
    code = susie_code([(float(i), float(j)) for i in range(3) for j in range(4)], 8).float()
    w = torch.cat([s.weight, s.weight], -1).detach()
    torch.testing.assert_close(q2[:, :, 2:, :8] - q[:, :, 2:, :8], (w[:, None] * code).expand(2, 3, 12, 8))
    torch.testing.assert_close(k2 - k, q2 - q)  # the same code on queries and keys
    assert torch.equal(q2[:, :, :2], q[:, :, :2]) and torch.equal(q2[..., 8:], q[..., 8:])
    (q2.sum() + k2.sum()).backward()
    assert s.weight.grad is not None and float(s.weight.grad.abs().sum()) > 0


def test_position_becomes_a_distance_penalty_in_rbf_attention():
    """With identical content everywhere, RBF + SuSiE attends by position alone: nearest tokens first."""
    from ssog_core.ops.rbf_torch import rbf_attention_torch

    s = SuSiE(num_heads=1, head_dim=8, mode="1d")
    with torch.no_grad():
        s.weight.fill_(2.0)
    x = torch.ones(1, 1, 15, 8, dtype=torch.float64)
    q, k = s(x, x, (1, 15))
    a = rbf_attention_torch(q, k, torch.eye(15, dtype=torch.float64)[None, None])[0, 0]
    assert torch.equal(a.argmax(-1), torch.arange(15))  # each token's largest weight is on itself
    # the weight decays with distance while every frequency is within half a period (|Δ| < π for ω = 1)
    mid = a[7].detach()
    assert bool((mid[7:11].diff() < 0).all()) and bool((mid[4:8].diff() > 0).all())


def test_bad_settings_get_clear_errors():
    with pytest.raises(ValueError, match="multiple of 4 for 2d"):
        SuSiE(2, 8, dim=6, mode="2d")
    with pytest.raises(ValueError, match="must be in"):
        SuSiE(2, 8, dim=10)
    with pytest.raises(ValueError, match="not one of"):
        SuSiE(2, 8, mode="3d")
    with pytest.raises(ValueError, match="cannot hold"):
        SuSiE(2, 8)(torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8), (2, 3))
    assert math.isclose(float(SuSiE(2, 8).weight.detach().mean()), 0.5)
