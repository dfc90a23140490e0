"""The playground head (:mod:`ssog_core.analysis.head_spec`): its field against an independent float64 numpy evaluation
of
the formula (docs/DESIGN.md §1) and against the effective attention matrix, on odd grids, so "the atom is drawn
where the head looks" is proven by the computation, not by convention; and its edits (grid, query, atoms), each a
new validated spec, on random heads.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import torch

from ssog_core.analysis.head_spec import (
    DEFAULT_SPEC,
    MAX_ATOMS,
    Atom,
    HeadSpec,
    evaluate,
    rescale_cell,
    spec_from_head,
)
from ssog_core.analysis.measures import head_stats, layer_fields, query_stats, steering_offsets
from ssog_core.field import attention_matrix, centre_query
from tests.app_fixtures import designed_ssog


def numpy_head(spec: HeadSpec) -> np.ndarray:
    """Independent float64 oracle: softmax over keys of ℓ(q − k; μ, σ)/τ per axis, then the λ mix (or, in
    axial mode, logsumexp of log λ + ℓ over atoms inside each axis)."""
    gh, gw = spec.grid
    qy, qx = spec.query
    w = np.array([a.w for a in spec.atoms])
    lam = w / w.sum()

    def ell(d, mu, s):
        return -0.5 * math.log(2 * math.pi) - np.log(s) - (d - mu) ** 2 / (2 * s**2)

    def softmax(z):
        z = z - z.max()
        return np.exp(z) / np.exp(z).sum()

    dy = qy - np.arange(gh)
    dx = qx - np.arange(gw)
    if spec.mode == "axial":
        ly = np.logaddexp.reduce(
            [np.log(l) + ell(dy, qy - a.y, a.sy) for a, l in zip(spec.atoms, lam, strict=True)], axis=0
        )
        lx = np.logaddexp.reduce(
            [np.log(l) + ell(dx, qx - a.x, a.sx) for a, l in zip(spec.atoms, lam, strict=True)], axis=0
        )
        return np.outer(softmax(ly / spec.tau), softmax(lx / spec.tau))
    out = np.zeros((gh, gw))
    for a, l in zip(spec.atoms, lam, strict=True):
        ay = softmax(ell(dy, qy - a.y, a.sy) / spec.tau)
        ax = softmax(ell(dx, qx - a.x, a.sx) / spec.tau)
        out += l * np.outer(ay, ax)
    return out


def random_spec(rng: np.random.Generator, grid=(7, 9), atoms=4, mode="factorized") -> HeadSpec:
    gh, gw = grid
    return HeadSpec(
        grid=grid,
        query=(int(rng.integers(gh)), int(rng.integers(gw))),
        tau=float(rng.uniform(0.5, 2.5)),
        atoms=tuple(
            Atom(
                rng.uniform(-1, gh), rng.uniform(-1, gw), rng.uniform(0.3, 3), rng.uniform(0.3, 3), rng.uniform(0.1, 2)
            )
            for _ in range(atoms)
        ),
        mode=mode,
    )


@pytest.mark.parametrize("mode", ["factorized", "axial"])
@pytest.mark.parametrize("grid", [(7, 9), (5, 3), (12, 12)], ids=lambda g: f"{g[0]}x{g[1]}")
def test_playground_matches_float64_oracle_and_attention_matrix(mode, grid):
    rng = np.random.default_rng(sum(grid) + len(mode))
    for _ in range(3):
        spec = random_spec(rng, grid, atoms=int(rng.integers(1, 9)), mode=mode)
        view = evaluate(spec)
        ref = numpy_head(spec)
        np.testing.assert_allclose(view.density.numpy(), ref, rtol=1e-10, atol=1e-13)
        # the same query's row of the exact attention matrix (identity basis through apply_field)
        qy, qx = spec.query
        row = attention_matrix(spec.field(), spec.grid, spec.mode)[0, 0, qy * grid[1] + qx].view(*grid)
        np.testing.assert_allclose(view.density.numpy(), row.numpy(), rtol=1e-10, atol=1e-13)
        np.testing.assert_allclose(view.row_marginal.numpy(), ref.sum(1), atol=1e-12)
        np.testing.assert_allclose(view.col_marginal.numpy(), ref.sum(0), atol=1e-12)
        assert torch.allclose(view.row.sum(-1), torch.ones(1, dtype=torch.float64))
        assert view.width.shape == (len(spec.atoms), 2)


def test_atom_is_drawn_where_the_head_looks():
    # one narrow atom placed at key (1, 6) for the query (4, 2): the field peaks there, so μ = query − key = (3, −4)
    spec = HeadSpec((7, 9), (4, 2), 0.5, (Atom(1.0, 6.0, 0.3, 0.3, 1.0),))
    view = evaluate(spec)
    assert np.unravel_index(int(view.density.argmax()), (7, 9)) == (1, 6)
    assert view.mu[0].tolist() == [3.0, -4.0]
    assert view.density.max() > 0.99 and view.radius == pytest.approx(5.0, abs=0.05)


def test_query_stats_against_an_oracle_and_head_stats():
    rng = np.random.default_rng(3)
    spec = random_spec(rng, (7, 5), atoms=3)
    a = attention_matrix(spec.field(), spec.grid)[0]  # (1, N, N)
    per_query = [query_stats(a[:, n].view(1, 7, 5), (n // 5, n % 5)) for n in range(35)]
    entropy = torch.stack([s["entropy"] for s in per_query]).mean(0)
    radius = torch.stack([s["radius"] for s in per_query]).mean(0)
    hs = head_stats(a, (7, 5))
    torch.testing.assert_close(entropy, hs["entropy"], rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(radius, hs["radius"], rtol=1e-10, atol=1e-12)
    row = a[0, 17].numpy()
    ys, xs = np.divmod(np.arange(35), 5)
    assert float(per_query[17]["entropy"][0]) == pytest.approx(-(row * np.log(row)).sum(), rel=1e-10)
    assert float(per_query[17]["radius"][0]) == pytest.approx(np.sqrt((row * ((ys - 3) ** 2 + (xs - 2) ** 2)).sum()))


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(atoms=()), "1 to 8 atoms"),
        (dict(atoms=(Atom(0, 0, 1, 1, 1),) * 9), "1 to 8 atoms"),
        (dict(grid=(2, 40)), "between 3 and 96"),
        (dict(query=(30, 1)), "outside"),
        (dict(tau=0.2), "τ="),
        (dict(atoms=(Atom(0, float("nan"), 1, 1, 1),)), "non-finite"),
        (dict(atoms=(Atom(0, 0, 0.0, 1, 1),)), "σ must be"),
        (dict(atoms=(Atom(0, 0, 1, 1, -1),)), "weight must be"),
        (dict(mode="diagonal"), "mode"),
    ],
)
def test_head_spec_refuses_bad_heads(change, message):
    d = dict(grid=(24, 24), query=(12, 12), tau=1.0, atoms=DEFAULT_SPEC.atoms)
    with pytest.raises(ValueError, match=message):
        HeadSpec(**{**d, **change})


def test_the_first_head_sits_at_the_centre_query_every_view_uses():
    assert DEFAULT_SPEC.query == centre_query(DEFAULT_SPEC.grid) == (11, 11)


def test_head_spec_json_round_trip_and_bad_json():
    assert HeadSpec.from_dict(DEFAULT_SPEC.to_dict()) == DEFAULT_SPEC
    for bad in (None, [], {"grid": [5, 5]}, {**DEFAULT_SPEC.to_dict(), "atoms": [{"y": 1}]}):
        with pytest.raises(ValueError):
            HeadSpec.from_dict(bad)


def test_spec_from_head_reproduces_the_learned_density_on_an_odd_grid():
    model = designed_ssog(img_size=28, patch=4, dim=16, depth=2, heads=4)  # 7×7 grid
    fields = layer_fields(model)
    for lf in fields:
        for h in range(4):
            spec = spec_from_head(lf, h)
            np.testing.assert_allclose(evaluate(spec).density.numpy(), lf.density[h].double().numpy(), atol=1e-6)


@pytest.mark.parametrize("gate", [0.0, 0.4, 1.0])
def test_steered_spec_carries_the_querys_own_atoms_at_every_gate(gate):
    """The playground's "content steers the head" view: its atoms are the ones the model's own field gives the
    query when every gate scale is turned down to ``gate``·s (checked by scaling the model's gate parameters
    themselves); at gate 0 its field is exactly the model's fixed-field attention row of the query."""
    from ssog_core.analysis.head_spec import steered_spec
    from ssog_core.analysis.measures import _layer_inputs, attention_maps, ssog_layers
    from ssog_core.field import EPS

    model = designed_ssog(depth=2)
    x = torch.rand(1, 3, 32, 32, generator=torch.Generator().manual_seed(3))
    layer, head, query = 1, 2, (2, 5)
    off = steering_offsets(model, x)
    lf = layer_fields(model)[layer]
    t = (0, query[0], query[1], head)
    spec = steered_spec(lf, head, model.config.grid, query, off.dmu[layer][t], off.sigma_ratio[layer][t],
                        off.dlam[layer][t], gate)  # fmt: skip
    attn = ssog_layers(model)[layer]
    scales = attn.gate_scales()
    with torch.no_grad():  # the model at gate scale g·s: every tap's scale parameter set to give it
        for tap, name in (("mu", "raw_mu_delta_scale"), ("sigma", "raw_sigma_delta_scale"),
                          ("lambda", "raw_lambda_gate_scale")):  # fmt: skip
            target = (gate * scales[tap] - EPS).clamp_min(1e-30)
            getattr(attn, name).copy_(torch.log(torch.expm1(target)).clamp_min(-80.0))
        inputs, grid, _ = _layer_inputs(model, x)
        field = attn.field_of(inputs[layer], grid)
    looks = torch.tensor([[query[0] - a.y, query[1] - a.x] for a in spec.atoms])  # μ = ★ − key
    atol = 1e-4 if gate else 1e-3  # gate 0 is reached up to the gate's positive floor
    torch.testing.assert_close(looks, field.mu[t].double(), atol=atol, rtol=1e-4, check_dtype=False)
    sig = torch.tensor([[a.sy, a.sx] for a in spec.atoms])
    torch.testing.assert_close(sig, field.sigma[t].double(), atol=atol, rtol=1e-4, check_dtype=False)
    lam = torch.tensor([a.w for a in spec.atoms])
    torch.testing.assert_close(lam / lam.sum(), field.lam()[t].double(), atol=atol, rtol=1e-4, check_dtype=False)
    if gate == 0:
        row = attention_maps(model, x, steered=False).attn[layer][0, head, query[0] * 8 + query[1]]
        np.testing.assert_allclose(evaluate(spec).density.numpy().ravel(), row.double().numpy(), atol=1e-5)
    with pytest.raises(ValueError, match="gate must be in"):
        steered_spec(lf, head, model.config.grid, query, off.dmu[layer][t], off.sigma_ratio[layer][t],
                     off.dlam[layer][t], 1.5)  # fmt: skip


ODD_GRIDS = [(7, 5), (5, 3), (9, 13), (3, 11)]


def random_specs(seed: int, n: int = 4) -> list[HeadSpec]:
    """Random heads on odd, non-square grids, 1 to 8 atoms, both field modes."""
    rng = np.random.default_rng(seed)
    grids = [ODD_GRIDS[int(i)] for i in rng.integers(len(ODD_GRIDS), size=n)]
    modes = ["factorized", "axial"]
    return [random_spec(rng, g, atoms=int(rng.integers(1, MAX_ATOMS + 1)), mode=modes[k % 2])
            for k, g in enumerate(grids)]  # fmt: skip


def offsets(spec: HeadSpec) -> np.ndarray:
    """μ = ★ − key of every atom, as the field computes it."""
    return evaluate(spec).mu.numpy()


@pytest.mark.parametrize("new_grid", [(7, 5), (14, 10), (3, 3), (5, 9), (96, 3)], ids=lambda g: f"{g[0]}x{g[1]}")
def test_with_grid_keeps_every_offset_and_the_querys_relative_place(new_grid):
    for spec in random_specs(sum(new_grid)):
        moved = spec.with_grid(new_grid)
        assert moved.grid == new_grid and (moved.tau, moved.mode) == (spec.tau, spec.mode)
        np.testing.assert_allclose(offsets(moved), offsets(spec), atol=1e-12)
        for axis in range(2):
            n0, n1, q0, q1 = spec.grid[axis], new_grid[axis], spec.query[axis], moved.query[axis]
            assert 0 <= q1 < n1 and q1 == rescale_cell(q0, n0, n1)
            assert abs((q1 + 0.5) / n1 - (q0 + 0.5) / n0) <= 0.5 / n1 + 1e-12  # within half a new cell
        assert [a.sy for a in moved.atoms] == [a.sy for a in spec.atoms] and spec.with_grid(spec.grid) == spec


def test_with_grid_on_a_seven_by_five_head():
    spec = HeadSpec((7, 5), (6, 0), 1.0, (Atom(2.0, 3.0, 1.0, 1.0, 1.0), Atom(6.0, 0.0, 0.5, 2.0, 0.5)))
    moved = spec.with_grid((21, 15))  # three times larger: the corner ★ stays in the corner
    assert moved.query == (19, 1) and moved.atoms[0] == Atom(15.0, 4.0, 1.0, 1.0, 1.0)
    assert spec.query == (6, 0) and spec.atoms[0].y == 2.0  # the spec itself never changes
    for bad in ((2, 5), (7, 97)):
        with pytest.raises(ValueError, match="between 3 and 96"):
            spec.with_grid(bad)


def test_move_query_carries_the_atoms():
    for spec in random_specs(11):
        gh, gw = spec.grid
        target = (gh - 1, 0)
        moved = spec.move_query(target)
        assert moved.query == target and moved.grid == spec.grid
        np.testing.assert_allclose(offsets(moved), offsets(spec), atol=1e-12)
        dy, dx = target[0] - spec.query[0], target[1] - spec.query[1]
        shift = [(a.y - b.y, a.x - b.x) for a, b in zip(moved.atoms, spec.atoms, strict=True)]
        np.testing.assert_allclose(shift, [(dy, dx)] * len(spec.atoms), atol=1e-12)
        with pytest.raises(ValueError, match="outside"):
            spec.move_query((gh, 0))
        with pytest.raises(ValueError, match="outside"):
            spec.move_query((0, -1))


def test_add_atom_appends_a_validated_atom_up_to_the_cap():
    rng = np.random.default_rng(5)
    spec = random_spec(rng, (7, 5), atoms=1)
    atom = Atom(1.5, 3.0, 0.7, 2.0, 0.3)
    for n in range(2, MAX_ATOMS + 1):
        grown = spec.add_atom(atom)
        assert grown.atoms == (*spec.atoms, atom) and len(spec.atoms) == n - 1
        np.testing.assert_allclose(offsets(grown)[:-1], offsets(spec), atol=1e-12)
        np.testing.assert_allclose(offsets(grown)[-1], [spec.query[0] - 1.5, spec.query[1] - 3.0])
        spec = grown
    with pytest.raises(ValueError, match=f"at most {MAX_ATOMS} atoms"):
        spec.add_atom(atom)
    with pytest.raises(ValueError, match="σ must be"):
        replace(spec, atoms=spec.atoms[:2]).add_atom(Atom(1.0, 1.0, 0.0, 1.0, 1.0))
    with pytest.raises(ValueError, match="non-finite"):
        replace(spec, atoms=spec.atoms[:2]).add_atom(Atom(float("inf"), 1.0, 1.0, 1.0, 1.0))


def test_remove_atom_drops_exactly_that_one():
    for spec in random_specs(21):
        if len(spec.atoms) == 1:
            with pytest.raises(ValueError, match="at least one atom"):
                spec.remove_atom(0)
            continue
        view = evaluate(spec)
        for i in range(len(spec.atoms)):
            smaller = spec.remove_atom(i)
            assert smaller.atoms == spec.atoms[:i] + spec.atoms[i + 1 :]
            keep = [k for k in range(len(spec.atoms)) if k != i]
            np.testing.assert_allclose(offsets(smaller), view.mu.numpy()[keep], atol=1e-12)
            lam = view.lam.numpy()[keep]
            np.testing.assert_allclose(evaluate(smaller).lam.numpy(), lam / lam.sum(), rtol=1e-12)
        for bad in (-1, len(spec.atoms), 1.0):
            with pytest.raises(ValueError, match="does not exist"):
                spec.remove_atom(bad)


def test_with_atom_changes_only_the_named_numbers():
    for spec in random_specs(31):
        i = len(spec.atoms) - 1
        changed = spec.with_atom(i, sy=0.4, w=2.5)
        a, b = spec.atoms[i], changed.atoms[i]
        assert (b.sy, b.w) == (0.4, 2.5) and (b.y, b.x, b.sx) == (a.y, a.x, a.sx)
        assert changed.atoms[:i] == spec.atoms[:i] and changed.grid == spec.grid
        np.testing.assert_allclose(evaluate(changed).width[i, 0], 0.4 * math.sqrt(spec.tau), rtol=1e-12)
        with pytest.raises(ValueError, match="weight must be"):
            spec.with_atom(i, w=-1.0)
        with pytest.raises(ValueError, match="not q"):
            spec.with_atom(i, q=1.0)
        with pytest.raises(ValueError, match="does not exist"):
            spec.with_atom(len(spec.atoms), sy=1.0)
