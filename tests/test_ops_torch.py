"""The fast PyTorch SSOG path against the float64 definition: forward and every gradient."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from ssog_core.ops import ssog_torch
from ssog_core.ops.ssog_torch import apply_torch
from ssog_core.testing.oracles import TAP_SUBSETS, FieldLeaves, grads, oracle_apply
from tests.ops_checks import assert_backward_repeats, assert_close, check_against_definition, far_narrow_field

MODES = ("factorized", "axial")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("taps", TAP_SUBSETS, ids=lambda t: "+".join(t) or "fixed")
def test_every_tap_subset_matches_definition(taps: tuple[str, ...], mode: str) -> None:
    check_against_definition(
        apply_torch, FieldLeaves(2, (7, 5), 3, 4, taps), mode, batch=2, head_dim=5, dtype=torch.float64, rtol=1e-10
    )


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    ("grid", "heads", "atoms"),
    [((1, 9), 1, 1), ((9, 1), 3, 4), ((5, 7), 1, 4), ((4, 3), 3, 1), ((6, 6), 2, 8), ((3, 11), 1, 3)],
)
def test_shapes_match_definition(grid: tuple[int, int], heads: int, atoms: int, mode: str) -> None:
    for taps in ((), ("mu", "sigma", "lambda")):
        leaves = FieldLeaves(2, grid, heads, atoms, taps)
        check_against_definition(apply_torch, leaves, mode, batch=2, head_dim=3, dtype=torch.float64, rtol=1e-10)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("taps", [(), ("mu", "sigma", "lambda")], ids=["fixed", "steered"])
@pytest.mark.parametrize(("dtype", "rtol"), [(torch.float32, 2e-6), (torch.bfloat16, 2e-2)], ids=["fp32", "bf16"])
def test_low_precision_inputs(taps: tuple[str, ...], mode: str, dtype: torch.dtype, rtol: float) -> None:
    """τ's gradient sums signed fp32 contributions of every token: 2e-5 relative either way, seed to seed."""
    check_against_definition(
        apply_torch, FieldLeaves(2, (7, 5), 3, 4, taps), mode, batch=2, head_dim=16, dtype=dtype, rtol=rtol,
        scalar_grad_rtol=1e-4,
    )  # fmt: skip


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("taps", [(), ("mu", "sigma", "lambda")], ids=["fixed", "steered"])
def test_chunked_over_rows_and_batch(monkeypatch: pytest.MonkeyPatch, taps: tuple[str, ...], mode: str) -> None:
    monkeypatch.setattr(ssog_torch, "CHUNK_ELEMENTS", 64)  # forces one row and one image per chunk
    check_against_definition(
        apply_torch, FieldLeaves(3, (5, 4), 2, 3, taps), mode, batch=3, head_dim=4, dtype=torch.float64, rtol=1e-10
    )


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("taps", [(), ("mu", "sigma", "lambda")], ids=["fixed", "steered"])
def test_inference_path_equals_autograd_path(taps: tuple[str, ...], mode: str) -> None:
    """Without autograd the kernels are built in place; the result must not change."""
    leaves = FieldLeaves(2, (6, 5), 3, 4, taps, dtype=torch.float32)
    v = torch.randn(2, 30, 3, 8, requires_grad=True)
    with_grad = apply_torch(v, leaves.field(), (6, 5), mode)
    with torch.inference_mode():
        without = apply_torch(v.detach(), leaves.field(), (6, 5), mode)
    torch.testing.assert_close(without, with_grad.detach(), rtol=1e-5, atol=1e-6)  # same math, op order may differ


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("one_bmm", [1, 1 << 30], ids=["one-bmm", "per-image"])
@pytest.mark.parametrize("chunk", [64, 1 << 21], ids=["chunked", "whole"])
def test_inference_path_matches_definition(
    monkeypatch: pytest.MonkeyPatch, mode: str, one_bmm: int, chunk: int
) -> None:
    """Without autograd the steered kernels are built with the keys outermost, in either row-pass layout (one bmm,
    or one per image and head), whole or chunked over rows and images: the float64 definition, and far, narrow
    atoms stay finite."""
    monkeypatch.setattr(ssog_torch, "ONE_BMM_ROW_PASS", one_bmm)
    monkeypatch.setattr(ssog_torch, "CHUNK_ELEMENTS", chunk)
    b, grid, h = 3, (5, 4), 2
    fields = (FieldLeaves(b, grid, h, 3, ("mu", "sigma", "lambda")).field(), far_narrow_field(b, grid, h))
    v = torch.randn(b, grid[0] * grid[1], h, 4, dtype=torch.float64)
    with torch.no_grad():
        for field in fields:
            assert_close(apply_torch(v, field, grid, mode), oracle_apply(v, field, grid, mode), 1e-10, "output")


@pytest.mark.parametrize("mode", MODES)
def test_far_and_narrow_atoms_stay_finite(mode: str) -> None:
    """Atoms far outside the grid with tiny widths: every weight underflows but the analytic max does not."""
    b, (gh, gw), h = 2, (6, 7), 2
    field = far_narrow_field(b, (gh, gw), h)
    v = torch.randn(b, gh * gw, h, 4, dtype=torch.float64)
    out = apply_torch(v, field, (gh, gw), mode)
    assert_close(out, oracle_apply(v, field, (gh, gw), mode), 1e-10, "output")
    g = torch.autograd.grad(out.sum(), [field.mu, field.sigma, field.log_lam])
    assert all(torch.isfinite(x).all() for x in g)


class _LargestIntermediate(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


@pytest.mark.parametrize("mode", MODES)
def test_per_query_kernels_are_never_built_for_all_atoms_at_once(monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    """With a small chunk budget no intermediate comes near the B·N·H·R·(Gh + Gw) per-query kernels of the einsums; the
    largest tensors left are per-token parameters (a few numbers per atom), not per query × key."""
    b, (gh, gw), h, r, d = 2, (24, 24), 2, 4, 8
    monkeypatch.setattr(ssog_torch, "CHUNK_ELEMENTS", 4096)
    field = FieldLeaves(b, (gh, gw), h, r, ("mu", "sigma", "lambda"), dtype=torch.float32).field()
    v = torch.randn(b, gh * gw, h, d)
    all_kernels = b * gh * gw * h * r * (gh + gw)  # what the SSOG post's einsums materialise
    per_token = b * gh * gw * h * r * 6  # (x, c, shift) per axis
    with torch.no_grad(), _LargestIntermediate() as probe:
        apply_torch(v, field, (gh, gw), mode)
    assert probe.largest <= per_token <= all_kernels // 8, (probe.largest, per_token, all_kernels)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(("mode", "taps"), [("factorized", ()), ("factorized", ("mu",)), ("axial", ("sigma",))])
def test_flops_are_the_separable_attention_cost(mode: str, taps: tuple[str, ...], threads: int) -> None:
    """The FLOP counter sees exactly 2·R·N·(Gh + Gw)·D per image (R = 1 for axial): no hidden dense work, with
    either row-pass strategy."""
    b, (gh, gw), h, r, d = 2, (6, 5), 3, 4, 8
    field = FieldLeaves(b, (gh, gw), h, r, taps, dtype=torch.float32).field()
    v = torch.randn(b, gh * gw, h, d)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            apply_torch(v, field, (gh, gw), mode)
    finally:
        torch.set_num_threads(before)
    ro = r if mode == "factorized" else 1
    assert counter.get_total_flops() == 2 * ro * b * gh * gw * (gh + gw) * h * d


@pytest.mark.parametrize("inplace", [True, False])
def test_both_row_pass_strategies_agree(inplace: bool) -> None:
    """The single-bmm row pass (y1 as (B, H, Gw, I, R, D)) and the strided one that reads y1 (B, H, Gw, R, I, D) in
    place, each with U contiguous and stored keys outermost as the factorized kernels are."""
    u, y1 = torch.randn(2, 3, 5, 7, 4, 7), torch.randn(2, 3, 7, 4, 5, 8)  # (B, H, I, Gw, R, Gw), (B, H, Gw, R, I, D)
    expected = torch.einsum("bhiwrk,bhkrid->bhiwd", u, y1)
    y1_ir = y1.transpose(3, 4).contiguous()
    for stored in (u, u.permute(5, 4, 0, 1, 2, 3).contiguous().permute(2, 3, 4, 5, 1, 0)):
        torch.testing.assert_close(ssog_torch._row_pass(stored, y1_ir, inplace, single=True), expected)
        torch.testing.assert_close(ssog_torch._row_pass(stored, y1, inplace, single=False), expected)


@pytest.mark.parametrize("threads", [1, 2])
def test_thread_count_does_not_change_results(threads: int) -> None:
    leaves = FieldLeaves(2, (6, 5), 3, 4, ("mu", "sigma", "lambda"), dtype=torch.float32)
    v = torch.randn(2, 30, 3, 8)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        with torch.inference_mode():
            out = apply_torch(v, leaves.field(), (6, 5))
    finally:
        torch.set_num_threads(before)
    torch.testing.assert_close(out.double(), oracle_apply(v, leaves.field(), (6, 5), "factorized").detach(),
                               rtol=2e-6, atol=2e-6)  # fmt: skip


def test_bad_inputs_raise_clearly() -> None:
    field = FieldLeaves(1, (4, 4), 2, 2, ()).field()
    with pytest.raises(ValueError, match="tile the grid"):
        apply_torch(torch.randn(1, 15, 2, 4, dtype=torch.float64), field, (4, 4))
    with pytest.raises(ValueError, match="unknown field mode"):
        apply_torch(torch.randn(1, 16, 2, 4, dtype=torch.float64), field, (4, 4), "diagonal")


def test_training_path_is_one_autograd_node() -> None:
    """A steered factorized field trains through one node with an analytic backward, not a graph of broadcast ops
    (the per-layer overhead that made small models 2× slower than their dot twin)."""
    leaves = FieldLeaves(2, (7, 5), 3, 4, ("mu", "sigma", "lambda"), dtype=torch.float32)
    v = torch.randn(2, 35, 3, 8, requires_grad=True)
    out = apply_torch(v, leaves.field(), (7, 5))
    assert type(out.grad_fn).__name__ == "_SteeredFactorizedBackward"


def test_backward_runs_twice_with_the_same_result() -> None:
    """The backward pass overwrites only its own buffers, never a saved tensor: ``retain_graph`` stays exact."""
    leaves = FieldLeaves(2, (7, 5), 3, 4, ("mu", "sigma", "lambda"), dtype=torch.float32)
    v = torch.randn(2, 35, 3, 8, requires_grad=True)
    assert_backward_repeats(apply_torch(v, leaves.field(), (7, 5)), [v, *leaves.tensors()])


def test_vanishing_mixture_weights_stay_finite_in_fp32() -> None:
    """Atoms whose λ underflows to exactly 0 in fp32 (log λ 120 below the others): the λ-scaled row kernel's backward
    divides by λ, guarded, and still matches the float64 definition."""
    leaves = FieldLeaves(2, (7, 5), 2, 3, ("mu", "sigma", "lambda"))
    with torch.no_grad():
        leaves.leaves["log_lambda"][:, 0] -= 120.0
    v = torch.randn(2, 35, 2, 4, dtype=torch.float64, requires_grad=True)
    dy = torch.randn(2, 35, 2, 4, dtype=torch.float64)
    inputs = [v, *leaves.tensors()]
    field32 = leaves.field(torch.float32)
    assert (torch.softmax(field32.log_lam, -1)[..., 0] == 0).any()
    expected = oracle_apply(v.float().double(), leaves.field(), leaves.grid, "factorized")
    out = apply_torch(v.float(), field32, leaves.grid)
    assert_close(out, expected, 2e-6, "output")
    want = grads(expected, inputs, dy)
    for name, got, w in zip(["v", *leaves.names()], grads(out, inputs, dy), want, strict=True):
        assert_close(got, w, 1e-4, f"d/d{name}")
