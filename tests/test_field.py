"""SSOG attention against the independent dense float64 oracle, plus the field's invariants."""

from __future__ import annotations

import itertools

import pytest
import torch

from ssog_core.field import (
    Field,
    apply_field,
    attention_matrix,
    base_field,
    bound,
    displacement_density,
    query_field,
)
from ssog_core.nn.attention import SSOGAttention
from tests.dense_oracle import attention_layer

TAP_SETS = [(), ("mu",), ("sigma",), ("lambda",), ("mu", "sigma", "lambda")]


def make_attention(heads: int, atoms: int, mode: str, taps, dim_per_head: int = 4, seed: int = 0) -> SSOGAttention:
    """A float64 SSOG layer with every parameter random and non-zero, gates warm and probes active."""
    torch.manual_seed(seed)
    attn = SSOGAttention(heads * dim_per_head, heads, atoms, mode, taps, cold_init=False).double()
    with torch.no_grad():
        for name, p in attn.named_parameters():
            if name == "mu":
                p.normal_(0, 1.5)
            elif name.startswith("raw_") and name.endswith("_scale"):
                p.uniform_(-1.0, 0.0)
            else:
                p.normal_(0, 0.4)
    return attn


def layer_params(attn: SSOGAttention) -> dict[str, torch.Tensor]:
    return {k: v.detach() for k, v in attn.state_dict().items()}


CASES = [
    pytest.param(
        mode, taps, atoms, heads, grid, id=f"{mode}-{'+'.join(taps) or 'fixed'}-R{atoms}-H{heads}-{grid[0]}x{grid[1]}"
    )
    for mode, taps, atoms, heads, grid in [
        *[("factorized", t, 4, 3, (7, 5)) for t in TAP_SETS],
        *[("axial", t, 4, 3, (7, 5)) for t in TAP_SETS],
        ("factorized", ("mu", "sigma", "lambda"), 1, 1, (7, 5)),
        ("axial", ("mu", "sigma", "lambda"), 1, 2, (5, 7)),
        ("factorized", ("mu",), 8, 2, (1, 9)),
        ("factorized", (), 2, 1, (6, 6)),
    ]
]


@pytest.mark.parametrize("mode, taps, atoms, heads, grid", CASES)
def test_forward_matches_dense_oracle(mode, taps, atoms, heads, grid):
    attn = make_attention(heads, atoms, mode, taps)
    x = torch.randn(2, grid[0] * grid[1], attn.dim, dtype=torch.float64)
    cfg = {"attn": "ssog", "num_heads": heads, "num_atoms": atoms, "field": mode}
    want_y, want_a = attention_layer(x, layer_params(attn), cfg, grid)
    torch.testing.assert_close(attn(x, grid), want_y, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(attn.attention_matrix(x, grid), want_a, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("mode, taps, atoms, heads, grid", CASES)
def test_rows_sum_to_one(mode, taps, atoms, heads, grid):
    attn = make_attention(heads, atoms, mode, taps)
    x = torch.randn(2, grid[0] * grid[1], attn.dim, dtype=torch.float64)
    a = attn.attention_matrix(x, grid)
    assert (a >= 0).all()
    torch.testing.assert_close(a.sum(-1), torch.ones_like(a[..., 0]), rtol=0, atol=1e-12)


@pytest.mark.parametrize("mode", ["factorized", "axial"])
def test_gradients_match_dense_oracle(mode):
    """Autograd through the separable operator equals autograd through the dense oracle."""
    grid = (5, 3)
    attn = make_attention(2, 3, mode, ("mu", "sigma", "lambda"))
    x = torch.randn(2, 15, attn.dim, dtype=torch.float64, requires_grad=True)
    cfg = {"attn": "ssog", "num_heads": 2, "num_atoms": 3, "field": mode}
    w = torch.randn(2, 15, attn.dim, dtype=torch.float64)
    (attn(x, grid) * w).sum().backward()
    ours = {"x": x.grad.clone(), **{k: p.grad.clone() for k, p in attn.named_parameters()}}
    x.grad = None
    params = {k: p.detach().clone().requires_grad_(True) for k, p in attn.named_parameters()}
    y, _ = attention_layer(x, params, cfg, grid)
    (y * w).sum().backward()
    theirs = {"x": x.grad, **{k: p.grad for k, p in params.items()}}
    for name, g in ours.items():
        torch.testing.assert_close(g, theirs[name], rtol=1e-9, atol=1e-11, msg=f"gradient of {name}")


@pytest.mark.parametrize(
    "mode, taps", [("factorized", ("mu", "sigma", "lambda")), ("axial", ("mu",)), ("factorized", ())]
)
def test_gradcheck(mode, taps):
    grid = (3, 2)
    attn = make_attention(1, 2, mode, taps, dim_per_head=2)
    x = torch.randn(1, 6, attn.dim, dtype=torch.float64, requires_grad=True)
    params = [p for p in attn.parameters()]

    def f(x, *ps):
        with torch.nn.utils.stateless._reparametrize_module(
            attn, dict(zip([n for n, _ in attn.named_parameters()], ps, strict=True))
        ):
            return attn(x, grid)

    assert torch.autograd.gradcheck(f, (x, *[p.detach().requires_grad_(True) for p in params]))


def _single_atom_field(mu_y: float, mu_x: float, sigma: float = 0.3) -> Field:
    mu = torch.tensor([[[mu_y, mu_x]]], dtype=torch.float64)
    raw = torch.log(torch.expm1(torch.tensor(sigma - 0.25 - 1e-4, dtype=torch.float64)))  # softplus⁻¹
    return base_field(
        mu,
        raw.expand(1, 1, 2),
        torch.zeros(1, 1, dtype=torch.float64),
        torch.tensor(-5.0, dtype=torch.float64),
        sigma_floor=0.25,
    )


@pytest.mark.parametrize("mode", ["factorized", "axial"])
def test_query_minus_mu_convention(mode):
    """An atom at μy = +2 reads the key two rows above its query; μx = −1 reads one column to the right."""
    grid = (7, 5)
    a = attention_matrix(_single_atom_field(2.0, -1.0), grid, mode)[0, 0]  # (N, N)
    for i, w in itertools.product(range(2, 7), range(0, 4)):
        row = a[i * 5 + w].view(7, 5)
        j, k = divmod(int(row.argmax()), 5)
        assert (j, k) == (i - 2, w + 1)
        assert row[j, k] > 0.9
    # the same picture through the module: a layer whose only atom sits at μ = (2, −1)
    attn = make_attention(1, 1, mode, ())
    with torch.no_grad():
        attn.mu.copy_(torch.tensor([[[2.0, -1.0]]]))
        attn.raw_sigma.fill_(-6.0)
    x = torch.randn(1, 35, attn.dim, dtype=torch.float64)
    row = attn.attention_matrix(x, grid)[0, 0, 3 * 5 + 2].view(7, 5)
    assert divmod(int(row.argmax()), 5) == (1, 3)


def test_displacement_density_draws_atoms_at_minus_mu():
    field = _single_atom_field(2.0, -3.0)
    dens = displacement_density(field, (4, 4))[0]  # offsets key − query in [−4, 4]
    oy, ox = divmod(int(dens.argmax()), 9)
    assert (oy - 4, ox - 4) == (-2, 3)


@pytest.mark.parametrize("mode", ["factorized", "axial"])
def test_query_field_is_a_row_of_the_matrix(mode):
    torch.manual_seed(3)
    field = base_field(
        torch.randn(3, 4, 2, dtype=torch.float64),
        torch.randn(3, 4, 2, dtype=torch.float64),
        torch.randn(3, 4, dtype=torch.float64),
        torch.tensor(0.3, dtype=torch.float64),
        0.25,
    )
    grid = (6, 9)
    a = attention_matrix(field, grid, mode)[0]
    for q in [(0, 0), (2, 5), (5, 8)]:
        torch.testing.assert_close(query_field(field, grid, q, mode).reshape(3, -1), a[:, q[0] * 9 + q[1]])


def test_axial_with_one_atom_equals_factorized():
    attn = make_attention(2, 1, "factorized", ("mu", "sigma"))
    x = torch.randn(2, 35, attn.dim, dtype=torch.float64)
    y_f = attn(x, (7, 5))
    attn.mode = "axial"
    torch.testing.assert_close(attn(x, (7, 5)), y_f)


def test_operator_is_linear_in_values_and_matches_matrix():
    attn = make_attention(3, 4, "factorized", ("mu", "sigma", "lambda"))
    x = torch.randn(2, 35, attn.dim, dtype=torch.float64)
    field = attn.field_of(x, (7, 5))
    v = torch.randn(2, 35, 3, 5, dtype=torch.float64)
    a = attention_matrix(field, (7, 5))
    torch.testing.assert_close(apply_field(v, field, (7, 5)), torch.einsum("bhqk,bkhd->bqhd", a, v))


def test_wrong_token_count_is_a_clear_error():
    attn = make_attention(1, 2, "factorized", ("mu",))
    with pytest.raises(ValueError, match="tile the grid: got 34 tokens for a 7×5 grid"):
        attn(torch.randn(1, 34, attn.dim, dtype=torch.float64), (7, 5))


def test_cold_gates_start_near_zero_and_warm_gates_do_not():
    cold = SSOGAttention(8, 2, 4, cold_init=True)
    warm = SSOGAttention(8, 2, 4, cold_init=False)
    with torch.no_grad():
        assert all(3e-4 < float(s) < 5e-4 for s in cold.gate_scales().values())
        assert all(0.12 < float(s) < 0.14 for s in warm.gate_scales().values())
    # zero-initialised probes: a fresh steered layer applies exactly its fixed field
    x = torch.randn(2, 12, 8)
    torch.testing.assert_close(cold.attention_matrix(x, (3, 4)), cold.attention_matrix(x, (3, 4), steered=False))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_bound_is_tanh_with_its_gradient(dtype: torch.dtype) -> None:
    """``bound`` computes tanh as 2·sigmoid(2p) − 1: within 2e-7 of tanh in fp32 (far tails and ±inf included), its
    own backward ``g·(1 − y²)`` passes gradcheck, and the in-place form (``out=``) gives the same numbers."""
    p = torch.cat([torch.randn(500, dtype=dtype) * 3, torch.tensor([0.0, 1e-6, -40.0, 40.0, -torch.inf, torch.inf])])
    expected = torch.tanh(p.double())
    torch.testing.assert_close(bound(p).double(), expected, rtol=0, atol=2e-7 if dtype == torch.float32 else 1e-15)
    buffer = p.clone()
    assert bound(buffer, out=buffer) is buffer
    torch.testing.assert_close(buffer, bound(p), rtol=0, atol=0)
    leaf = torch.randn(40, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(bound, (leaf,))
    g = torch.randn(40, dtype=torch.float64)
    (got,) = torch.autograd.grad(bound(leaf), leaf, g)
    torch.testing.assert_close(got, g * (1 - torch.tanh(leaf.detach()) ** 2), rtol=1e-12, atol=1e-14)
