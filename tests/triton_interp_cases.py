"""The fused Triton kernels on the CPU through Triton's interpreter, against the float64 definition.

Not collected directly: ``tests/test_ops_triton.py`` runs this file in a subprocess with ``TRITON_INTERPRET=1``
(the variable must be set before Triton decorates the kernels, and must not leak into other test modules).
Sizes are tiny because the interpreter executes every program in Python.
"""

from __future__ import annotations

import os

import pytest
import torch

if os.environ.get("TRITON_INTERPRET") != "1":  # pragma: no cover - guarded by the runner
    pytest.skip("run through tests/test_ops_triton.py (needs TRITON_INTERPRET=1)", allow_module_level=True)

from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

from ssog_core.field import Field  # noqa: E402
from ssog_core.nn.attention import SSOGAttention  # noqa: E402
from ssog_core.ops import ssog_triton, triton_tiles  # noqa: E402
from ssog_core.ops.dispatch import choose_ssog_backend, ssog_apply  # noqa: E402
from ssog_core.ops.ssog_triton import apply_triton, kernel_params  # noqa: E402
from ssog_core.testing.oracles import FieldLeaves, oracle_apply, oracle_matrix  # noqa: E402
from tests.ops_checks import (  # noqa: E402
    assert_close,
    assert_compiles_like_eager,
    check_against_definition,
    far_narrow_field,
    grads,
)

ALL = ("mu", "sigma", "lambda")
# a scalar leaf (gate, temperature) sums signed contributions of every token: fp32 cancellation, not the kernel
SCALAR_GRAD_RTOL = 2e-3

# (grid, heads, atoms, head_dim, taps, mode): odd grids, R 1–8, heads 1 and 3, each kind of tap subset
CASES = [
    ((7, 5), 3, 4, 8, ALL, "factorized"),
    ((7, 5), 1, 1, 5, ("mu",), "factorized"),
    ((7, 5), 3, 4, 8, (), "factorized"),
    ((5, 7), 1, 3, 16, ("sigma", "lambda"), "factorized"),
    ((1, 9), 1, 8, 4, ("lambda",), "factorized"),
    ((9, 1), 3, 2, 4, ("mu", "sigma"), "factorized"),
    ((7, 5), 3, 4, 8, ALL, "axial"),
    ((7, 5), 1, 2, 5, (), "axial"),
    ((3, 6), 3, 1, 4, ("mu",), "axial"),
]


def _ids(case) -> str:
    grid, h, r, d, taps, mode = case
    return f"{grid[0]}x{grid[1]}-H{h}-R{r}-d{d}-{'+'.join(taps) or 'fixed'}-{mode}"


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_forward_and_gradients_fp32(case) -> None:
    grid, heads, atoms, head_dim, taps, mode = case
    leaves = FieldLeaves(2, grid, heads, atoms, taps)
    check_against_definition(apply_triton, leaves, mode, 2, head_dim, torch.float32, 1e-5, SCALAR_GRAD_RTOL)


@pytest.mark.parametrize("mode", ["factorized", "axial"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_half_precision_values(mode: str, dtype: torch.dtype) -> None:
    check_against_definition(
        apply_triton, FieldLeaves(2, (5, 6), 3, 4, ALL), mode, 2, 16, dtype, 2e-2, SCALAR_GRAD_RTOL
    )


@pytest.mark.parametrize("mode", ["factorized", "axial"])
@pytest.mark.parametrize("grid", [(17, 2), (2, 17)], ids=["tall", "wide"])
def test_tiled_and_chunked_programs(monkeypatch: pytest.MonkeyPatch, grid: tuple[int, int], mode: str) -> None:
    """A small tile budget chunks key rows (axial) or takes fewer query rows per program (factorized) on a tall
    grid, splits query columns over programs and chunks them in the column backward kernel on a wide grid, and
    narrows that kernel's key-column tile."""
    monkeypatch.setattr(triton_tiles, "TILE_BUDGET", 2048)
    cfg = ssog_triton._config(*grid, 4, 2, mode == "axial", torch.float32)
    kt, ic, wc = triton_tiles.col_tiles(cfg, mode == "axial")
    if grid[0] > 16 and mode == "axial":
        assert cfg["JC"] < cfg["GHP"] and kt < 4
    elif grid[0] > 16:  # the factorized column pass takes every key row at once: fewer rows per program instead
        assert cfg["T"] < 8 and kt < 2 * ic
    else:
        assert cfg["WT"] < cfg["GWP"] and wc < cfg["GWP"]
    check_against_definition(
        apply_triton, FieldLeaves(1, grid, 1, 2, ALL), mode, 1, 4, torch.float32, 1e-5, SCALAR_GRAD_RTOL
    )


@pytest.mark.parametrize("half", [True, False], ids=["half-rows", "previous"])
def test_steered_forward_tiled_with_half_the_rows_or_the_previous_tiling(
    monkeypatch: pytest.MonkeyPatch, half: bool
) -> None:
    """The steered forward takes half the query rows per program at four or more atoms on grids up to 32 rows
    (triton_tiles.STEERED_HALF_ROWS; a 7-row grid then ends in a partial tile); with the flag off it keeps the
    fixed forward's rows. Either way the layer matches the definition."""
    monkeypatch.setattr(triton_tiles, "STEERED_HALF_ROWS", half)
    cfg = ssog_triton._config(7, 5, 8, 4, False, torch.float32)
    assert (cfg["TS"], cfg["T"]) == ((4, 8) if half else (8, 8))
    assert ssog_triton._config(7, 5, 8, 2, False, torch.float32)["TS"] == 8  # two atoms: not split
    assert ssog_triton._config(64, 64, 8, 4, False, torch.float32)["TS"] == 8  # 64 rows: not split
    check_against_definition(
        apply_triton, FieldLeaves(2, (7, 5), 3, 4, ALL), "factorized", 2, 8, torch.float32, 1e-5, SCALAR_GRAD_RTOL
    )


@pytest.mark.parametrize("taps", [ALL, ()], ids=["steered", "fixed"])
def test_kernels_tiled_with_four_warps(monkeypatch: pytest.MonkeyPatch, taps: tuple[str, ...]) -> None:
    """Where triton_tiles.FOUR_WARP_TILES names a tiling, every factorized field kernel launches with four warps
    and its row split follows (half as many warps share a (token, atom)'s key rows, down to one); fp32 values keep
    eight. The layer still matches the definition."""
    tiling = (16, 16, 16, 4)  # a 7×5 grid, d16, R4
    monkeypatch.setattr(triton_tiles, "FOUR_WARP_TILES", {k: {tiling} for k in triton_tiles.FOUR_WARP_TILES})
    for dtype, warps in ((torch.bfloat16, 4), (torch.float32, 8)):
        jobs = ssog_triton.problem_jobs((7, 5), 16, 4, "factorized", dtype)
        field = [launch for job in ("steered forward", "fixed forward", "steered backward") for launch in jobs[job]]
        assert [launch.num_warps for launch in field] == [warps] * 4
        if warps == 4:
            assert [launch.constexprs["JS"] for launch in field] == [2, 1, 1, 1]  # eight warps: 4, 2, 2, 1
    check_against_definition(
        apply_triton, FieldLeaves(2, (7, 5), 3, 4, taps), "factorized", 2, 16, torch.bfloat16, 2e-2, SCALAR_GRAD_RTOL
    )


@pytest.mark.parametrize("mode", ["factorized", "axial"])
def test_far_narrow_atoms_and_strided_values(mode: str) -> None:
    """Atoms far off the grid with tiny widths (all weights underflow but the peak), values read through strides."""
    b, (gh, gw), h, d = 2, (6, 5), 2, 8
    field = far_narrow_field(b, (gh, gw), h)
    wide = torch.randn(b, gh * gw, h, 3 * d, dtype=torch.float64)
    v = wide[..., d : 2 * d]  # not contiguous: like a slice of a fused projection
    expected = oracle_apply(v, field, (gh, gw), mode)
    out = apply_triton(v.float(), field.to(torch.float32), (gh, gw), mode)
    assert_close(out, expected, 1e-5, "output")
    g = torch.autograd.grad(out.sum(), [field.mu, field.sigma, field.log_lam])
    assert all(torch.isfinite(x).all() for x in g)


def _op_inputs(mode: str, steered: bool, small: bool = False):
    """Values and the field's op inputs: factorized ``(μ, σ, log λ, τ)``, axial the kernel parameters."""
    b, (gh, gw), h, r, d = (1, (3, 2), 1, 2, 4) if small else (2, (5, 4), 2, 3, 8)
    taps = ALL if steered else ()
    field = FieldLeaves(b, (gh, gw), h, r, taps, dtype=torch.float32).field()
    v = torch.randn(b, gh * gw, h, d)
    if mode == "factorized":
        lead = (b, gh, gw, h, r) if steered else (h, r)
        terms = [field.mu.expand(*lead, 2), field.sigma.expand(*lead, 2), field.log_lam.expand(lead), field.tau]
        return v, [t.detach().contiguous() for t in terms], field, (gh, gw)
    prm = kernel_params(field, (gh, gw)).detach()
    return v, [prm.expand(b, gh, gw, *prm.shape[-3:]).contiguous()], field, (gh, gw)


@pytest.mark.parametrize("mode", ["factorized", "axial"])
def test_opcheck_custom_ops(mode: str) -> None:
    v, terms, field, grid = _op_inputs(mode, steered=True, small=True)
    v.requires_grad_(True)
    for t in terms:
        t.requires_grad_(True)
    if mode == "factorized":
        torch.library.opcheck(torch.ops.ssog.fwd.default, (v, *terms, *grid))
        y, izx = torch.ops.ssog.fwd(v.detach(), *(t.detach() for t in terms), *grid)
        args = (torch.randn_like(y), v.detach(), *(t.detach() for t in terms), izx, *grid)
        torch.library.opcheck(torch.ops.ssog.bwd.default, args)
        _, shared, _, _ = _op_inputs(mode, steered=False, small=True)
        torch.library.opcheck(torch.ops.ssog.fwd.default, (v, *(t.requires_grad_(True) for t in shared), *grid))
        taby, tabx = ssog_triton.fixed_tables(field_of(shared), grid, mode, v.device)
        torch.library.opcheck(torch.ops.ssog.table_fwd.default, (v.detach(), taby, tabx))
        return
    (prm,) = terms
    torch.library.opcheck(torch.ops.ssog.axial_fwd.default, (v, prm))
    y, izx = torch.ops.ssog.axial_fwd(v.detach(), prm.detach())
    torch.library.opcheck(torch.ops.ssog.axial_bwd.default, (torch.randn_like(y), v.detach(), prm.detach(), izx))
    b, h, r = v.shape[0], v.shape[2], field.num_atoms
    fixed = FieldLeaves(b, grid, h, r, (), dtype=torch.float32).field()
    taby, tabx = (t.contiguous().detach() for t in ssog_triton.fixed_tables(fixed, grid, mode, v.device))
    fixed_prm = kernel_params(fixed, grid).detach()
    fixed_prm = fixed_prm.expand(b, *grid, *fixed_prm.shape[-3:]).contiguous().requires_grad_(True)
    torch.library.opcheck(torch.ops.ssog.axial_fixed_fwd.default, (v, fixed_prm, taby, tabx))
    torch.library.opcheck(torch.ops.ssog.axial_inv_zx.default, (fixed_prm[0, 0].detach(),))


def field_of(terms: list[torch.Tensor]) -> Field:
    """The field of the factorized op inputs ``(μ, σ, log λ, τ)``."""
    return Field(*(t.detach() for t in terms))


def _padded(t: torch.Tensor, pad: int) -> torch.Tensor:
    """``t``'s values in a buffer whose every stride but the last has ``pad`` unused elements per row (NaN), as a
    compiler may lay a tensor out."""
    strides = [1]
    for size in reversed(t.shape[1:]):
        strides.insert(0, strides[0] * (size + pad))
    buffer = torch.full((strides[0] * t.shape[0],), float("nan"), dtype=t.dtype)
    return buffer.as_strided(t.shape, strides).copy_(t)


@pytest.mark.parametrize("mode", ["factorized", "axial"])
def test_custom_ops_read_padded_strides_as_contiguous_ones(mode: str) -> None:
    """Every input of the steered forward and the backward laid out with padded strides (as Inductor may pass them):
    the same outputs and gradients, bit for bit, as from contiguous inputs."""
    v, terms, _, grid = _op_inputs(mode, steered=True)
    dy = torch.randn_like(v)
    fwd, bwd = (torch.ops.ssog.fwd, torch.ops.ssog.bwd) if mode == "factorized" else (
        torch.ops.ssog.axial_fwd, torch.ops.ssog.axial_bwd)  # fmt: skip
    extra = grid if mode == "factorized" else ()
    y, izx = fwd(v, *terms, *extra)
    want = bwd(dy, v, *terms, izx, *extra)
    for pad in (1, 3):
        vp = _padded(v, pad)
        tp = [_padded(t, pad) if t.dim() else t for t in terms]
        y_p, izx_p = fwd(vp, *tp, *extra)
        got = bwd(_padded(dy, pad), vp, *tp, _padded(izx, pad), *extra)
        for a, b in zip((y_p, izx_p, *got), (y, izx, *want), strict=True):
            assert torch.equal(a, b)


@pytest.mark.parametrize(("mode", "taps"), [("factorized", ALL), ("axial", ALL), ("factorized", ())])
def test_compile_fullgraph_forward_backward(monkeypatch: pytest.MonkeyPatch, mode: str, taps) -> None:
    """The automatic backend choice (Triton here) traces into one graph: no logging or other graph breaks."""
    monkeypatch.delenv("SSOG_BACKEND", raising=False)
    attn = SSOGAttention(16, 2, 3, field=mode, steer=taps, cold_init=False)
    if taps:
        torch.nn.init.normal_(attn.mu_delta.weight, std=0.3)
    assert_compiles_like_eager(attn, torch.randn(2, 20, 16), (5, 4))


def test_dispatch_picks_triton_and_matrix_parity(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under the interpreter CPU tensors run the kernels; A·V from the explicit analysis path equals them."""
    monkeypatch.delenv("SSOG_BACKEND", raising=False)
    for mode in ("factorized", "axial"):
        attn = SSOGAttention(12, 3, 4, field=mode, cold_init=False).eval()
        torch.nn.init.normal_(attn.mu_delta.weight, std=0.3)
        torch.nn.init.normal_(attn.lambda_gate.weight, std=0.3)
        x = torch.randn(2, 35, 12)
        with torch.no_grad():
            for steered in (True, False):
                field = attn.field_of(x, (7, 5), steered=steered)
                v = attn.v(x).view(2, 35, 3, 4)
                assert choose_ssog_backend(v, field, (7, 5), mode) == "triton"
                a = attn.attention_matrix(x, (7, 5), steered=steered)
                torch.testing.assert_close(
                    torch.einsum("bhnm,bmhd->bnhd", a, v), ssog_apply(v, field, (7, 5), mode), rtol=1e-5, atol=1e-6
                )
                ref = oracle_matrix(field, (7, 5), mode, batch=2)
                torch.testing.assert_close(a.double(), ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("mode", "steered"), [("factorized", True), ("factorized", False), ("axial", True)])
def test_flop_formulas_count_the_separable_cost(mode: str, steered: bool) -> None:
    v, _, field, (gh, gw) = _op_inputs(mode, steered)
    b, n, h, d = v.shape
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        apply_triton(v, field, (gh, gw), mode)
    ro = field.num_atoms if mode == "factorized" else 1
    assert counter.get_total_flops() == 2 * ro * b * n * (gh + gw) * h * d


def test_kernel_inputs_are_validated() -> None:
    v, (mu, sigma, log_lam, tau), _, grid = _op_inputs("factorized", steered=True)
    with pytest.raises(ValueError, match="do not match"):
        ssog_triton.field_fwd(v, mu[..., :1, :].contiguous(), sigma, log_lam, tau, *grid)
    with pytest.raises(ValueError, match="float32"):
        ssog_triton.field_fwd(v, mu.double(), sigma, log_lam, tau, *grid)
    v, (prm,), _, _ = _op_inputs("axial", steered=True)
    with pytest.raises(ValueError, match="do not match"):
        ssog_triton.axial_fwd(v, prm[..., :4].contiguous())


@pytest.mark.parametrize("taps", [ALL, ("sigma",), ("mu", "lambda")], ids=lambda t: "+".join(t))
def test_layer_steering_in_kernels(monkeypatch: pytest.MonkeyPatch, taps) -> None:
    """A steered layer on the Triton backend steers in ``ssog::steer`` (probe biases, bound, gates, the fixed
    field's raw parameters in the kernel, both ways): its output and the gradients of its input and of every
    parameter equal the float64 definition's (the same layer in float64 on the ``definition`` backend)."""
    import copy

    from tests.launch_count import count_launches

    monkeypatch.delenv("SSOG_BACKEND", raising=False)
    torch.manual_seed(3)
    attn = SSOGAttention(16, 2, 3, steer=taps, cold_init=False)
    for name, p in attn.named_parameters():
        if name.split(".")[0] in ("mu_delta", "sigma_delta", "lambda_gate"):
            torch.nn.init.normal_(p, std=0.3)
    ref = copy.deepcopy(attn).double()
    ref.backend = "definition"
    x = torch.randn(2, 35, 16, dtype=torch.float64, requires_grad=True)
    dy = torch.randn(2, 35, 16, dtype=torch.float64)
    with count_launches(run_kernels=True) as counts:
        out = attn(x.float(), (7, 5))
    assert counts["triton:steer"] == 1 and counts["triton:fwd-steered"] == 1, counts
    expected = ref(x, (7, 5))
    assert_close(out, expected, 1e-5, "output")
    got = grads(out, [x, *attn.parameters()], dy)
    want = grads(expected, [x, *ref.parameters()], dy)
    names = ["x", *(n for n, _ in attn.named_parameters())]
    for name, g, w in zip(names, got, want, strict=True):
        assert_close(g, w, 1e-4 if w.dim() else SCALAR_GRAD_RTOL, f"d/d{name}")
