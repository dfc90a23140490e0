"""The fused C kernels for steered factorized fields against the float64 definition: forward and every gradient,
on odd grids and head widths, plus the build, its fallback and the dispatcher's choice."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ssog_core.field import Field, base_field, positive
from ssog_core.nn.attention import SSOGAttention
from ssog_core.nn.vit import ViT
from ssog_core.ops import dispatch, ssog_cpu
from ssog_core.ops.dispatch import BackendUnavailable, choose_ssog_backend, ssog_apply
from ssog_core.ops.ssog_cpu import apply_cpu, apply_cpu_steering
from ssog_core.ops.ssog_torch import apply_torch
from ssog_core.testing.oracles import TAP_SUBSETS, TAPS, FieldLeaves, grads, oracle_apply
from tests.ops_checks import assert_backward_repeats, assert_close, check_against_definition, far_narrow_field

STEERING = [taps for taps in TAP_SUBSETS if taps]  # the C kernels take steered fields only

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(ssog_cpu.unavailable_reason() is not None, reason="no C compiler here")


def _cpu(v: torch.Tensor, field: Field, grid: tuple[int, int], mode: str) -> torch.Tensor:
    assert mode == "factorized"
    return apply_cpu(v, field, grid)


@pytest.mark.parametrize("taps", STEERING, ids=lambda t: "+".join(t))
def test_every_steering_tap_subset_matches_definition(taps: tuple[str, ...]) -> None:
    check_against_definition(
        _cpu, FieldLeaves(2, (7, 5), 3, 4, taps), "factorized", batch=2, head_dim=5, dtype=torch.float64, rtol=1e-10
    )


@pytest.mark.parametrize(
    ("grid", "heads", "atoms", "head_dim"),
    [
        ((1, 9), 1, 1, 3),
        ((9, 1), 3, 4, 4),
        ((5, 7), 1, 4, 8),
        ((4, 3), 3, 1, 9),
        ((6, 6), 2, 8, 16),
        ((3, 11), 2, 3, 33),
    ],  # fmt: skip
)
def test_shapes_and_head_widths_match_definition(grid: tuple[int, int], heads: int, atoms: int, head_dim: int) -> None:
    """Head widths below, at and between the vector widths (4 doubles, 8 floats), including ones that are padded."""
    leaves = FieldLeaves(2, grid, heads, atoms, TAPS)
    check_against_definition(_cpu, leaves, "factorized", batch=2, head_dim=head_dim, dtype=torch.float64, rtol=1e-10)


@pytest.mark.parametrize("head_dim", [5, 16, 24, 64, 80, 136])
def test_float32_matches_definition(head_dim: int) -> None:
    """fp32 with the polynomial exp2: every common width (8, 16, 32, 64 channels are unrolled), several channel
    blocks (136 = 64 + 64 + 8) and a padded one."""
    leaves = FieldLeaves(2, (7, 5), 2, 4, TAPS)
    check_against_definition(
        _cpu, leaves, "factorized", batch=2, head_dim=head_dim, dtype=torch.float32, rtol=2e-6, scalar_grad_rtol=1e-4
    )


@pytest.mark.slow
def test_gradcheck_in_float64() -> None:
    """Finite differences of every per-token field tensor and τ (the double build)."""
    b, grid, h, r = 2, (4, 3), 2, 2
    shape = (b, *grid, h, r)
    inputs = (
        torch.randn(b, 12, h, 3, dtype=torch.float64),
        torch.randn(*shape, 2, dtype=torch.float64) * 1.5,
        torch.rand(*shape, 2, dtype=torch.float64) + 0.4,
        torch.randn(*shape, dtype=torch.float64),
        torch.tensor(0.8, dtype=torch.float64),
    )
    inputs = tuple(t.requires_grad_() for t in inputs)
    assert torch.autograd.gradcheck(lambda v, *f: apply_cpu(v, Field(*f), grid), inputs)


def _steering_in_c(leaves: FieldLeaves, dtype: torch.dtype):
    """``apply(v, field, grid, mode)`` for :func:`check_against_definition` that steers in C from ``leaves``' probes
    (their raw outputs, the taps one after another per token as SSOGAttention's one GEMM lays them out) instead of
    taking the per-token field."""
    lv = {name: t.to(dtype) for name, t in leaves.leaves.items()}
    fixed = base_field(lv["mu"], lv["raw_sigma"], lv["log_lambda"], lv["raw_tau"], sigma_floor=0.25)
    b, gh, gw = lv[f"probe_{leaves.taps[0]}"].shape[:3]
    raw = torch.cat([lv[f"probe_{tap}"].reshape(b, gh * gw, -1) for tap in leaves.taps], dim=-1)
    widths = {tap: lv[f"probe_{tap}"][0, 0, 0].numel() for tap in leaves.taps}
    scales = {tap: positive(lv[f"gate_{tap}"]) for tap in leaves.taps}

    def apply(v: torch.Tensor, field: Field, grid: tuple[int, int], mode: str) -> torch.Tensor:
        assert mode == "factorized" and field.mu.dtype == dtype
        return apply_cpu_steering(v, fixed, raw, widths, scales, 4.0, grid)

    return apply


@pytest.mark.parametrize("taps", STEERING, ids=lambda t: "+".join(t))
@pytest.mark.parametrize(("dtype", "rtol"), [(torch.float64, 1e-11), (torch.float32, 2e-6)], ids=["fp64", "fp32"])
def test_steering_in_c_matches_definition(taps: tuple[str, ...], dtype: torch.dtype, rtol: float) -> None:
    """The steering computed in C (bound, steer and c from the raw probe outputs) against the float64 definition:
    the output and the gradient of v, every probe, gate, fixed-field leaf and τ, on a 7×5 grid with 3 atoms."""
    leaves = FieldLeaves(2, (7, 5), 2, 3, taps)
    field_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    check_against_definition(_steering_in_c(leaves, field_dtype), leaves, "factorized", batch=2, head_dim=5,
                             dtype=dtype, rtol=rtol, scalar_grad_rtol=1e-4)  # fmt: skip


def test_steering_in_c_gradcheck_in_float64() -> None:
    """Finite differences through the C steering and kernels: values, raw probes, the fixed field, τ and gates."""
    b, grid, h, r = 1, (3, 2), 2, 2
    widths = {"mu": h * r * 2, "sigma": h * r * 2, "lambda": h * r}
    inputs = (
        torch.randn(b, 6, h, 3, dtype=torch.float64),
        torch.randn(b, 6, sum(widths.values()), dtype=torch.float64),
        torch.randn(h, r, 2, dtype=torch.float64),
        torch.rand(h, r, 2, dtype=torch.float64) + 0.5,
        torch.randn(h, r, dtype=torch.float64),
        torch.tensor(0.8, dtype=torch.float64),
        torch.rand(3, dtype=torch.float64) + 0.2,
    )
    inputs = tuple(t.requires_grad_() for t in inputs)

    def run(v, raw, mu, sigma, log_lam, tau, gates):
        scales = dict(zip(widths, gates.unbind(), strict=True))
        return apply_cpu_steering(v, Field(mu, sigma, log_lam, tau), raw, widths, scales, 2.0, grid)

    assert torch.autograd.gradcheck(run, inputs)


def test_attention_steers_in_c_only_where_the_c_kernels_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """SSOGAttention hands the raw probes to the C steering on the CPU path, and its output and gradients equal the
    definition backend's (which builds the per-token field); elsewhere (forced backends, axial fields, bfloat16) the
    dispatcher keeps the per-token field."""
    monkeypatch.delenv("SSOG_BACKEND", raising=False)
    calls = []
    monkeypatch.setattr(
        "ssog_core.nn.attention.apply_cpu_steering", lambda *a: calls.append(1) or apply_cpu_steering(*a)
    )
    torch.manual_seed(0)
    attn = SSOGAttention(16, 2, 3, cold_init=False).double()
    with torch.no_grad():
        for layer in (attn.mu_delta, attn.sigma_delta, attn.lambda_gate):
            layer.weight.normal_(0, 0.5), layer.bias.normal_(0, 0.5)
    x = torch.randn(2, 35, 16, dtype=torch.float64, requires_grad=True)
    outs = []
    for backend in (None, "definition"):
        attn.backend = backend
        y = attn(x, (7, 5))
        outs.append([y, *torch.autograd.grad(y.square().sum(), [x, *attn.parameters()])])
    assert calls == [1]
    for got, want in zip(*outs, strict=True):
        assert_close(got, want, 1e-11, "steered in C vs the definition")
    fixed = attn.fixed_field()
    v = torch.randn(2, 35, 2, 8)
    assert dispatch.steers_in_c(v, fixed.to(torch.float32), (7, 5))
    assert not dispatch.steers_in_c(v, fixed.to(torch.float32), (7, 5), "axial")
    assert not dispatch.steers_in_c(v.bfloat16(), fixed.to(torch.float32), (7, 5))
    assert not dispatch.steers_in_c(v, fixed.to(torch.float32), (7, 5), backend="torch")


def test_far_and_narrow_atoms_stay_finite() -> None:
    """Every weight but the peak underflows: the analytic peak keeps Z ≥ 1 and the gradients finite."""
    grid = (5, 4)
    field = far_narrow_field(2, grid, 2)
    v = torch.randn(2, 20, 2, 8, dtype=torch.float64, requires_grad=True)
    expected = oracle_apply(v, field, grid, "factorized")
    for dtype in (torch.float64, torch.float32):
        out = apply_cpu(v.to(dtype), field.to(dtype), grid)
        assert_close(out, expected, 1e-10 if dtype == torch.float64 else 2e-6, f"output {dtype}")
        got = torch.autograd.grad(out.sum(), [v, field.mu, field.sigma, field.log_lam])
        assert all(torch.isfinite(g).all() for g in got)


def test_inference_path_equals_autograd_path_and_threads_do_not_matter() -> None:
    """Without autograd nothing is saved; the arithmetic is the same, bit for bit, on one thread or two."""
    leaves = FieldLeaves(3, (6, 5), 3, 4, TAPS, dtype=torch.float32)
    v = torch.randn(3, 30, 3, 16, requires_grad=True)
    with_grad = apply_cpu(v, leaves.field(), (6, 5))
    before = torch.get_num_threads()
    outs = []
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            with torch.inference_mode():
                outs.append(apply_cpu(v.detach(), leaves.field(), (6, 5)))
    finally:
        torch.set_num_threads(before)
    for out in outs:
        torch.testing.assert_close(out, with_grad.detach(), rtol=0, atol=0)


def test_backward_runs_twice_and_accepts_strided_inputs() -> None:
    leaves = FieldLeaves(2, (7, 5), 3, 4, TAPS, dtype=torch.float32)
    base = torch.randn(2, 35, 16, 3, requires_grad=True)
    v = base.transpose(2, 3)  # (B, N, H, D) with strides that are not contiguous
    out = apply_cpu(v, leaves.field(), (7, 5))
    assert_backward_repeats(out, [base, *leaves.tensors()])
    expected = oracle_apply(v.detach().double(), leaves.field(torch.float64), (7, 5), "factorized")
    assert_close(out, expected, 2e-6, "output")


def _assert_fp32_matches_definition(leaves: FieldLeaves, v: torch.Tensor, dy: torch.Tensor) -> None:
    """The fp32 C kernels on ``v`` rounded to fp32 against the float64 definition: output and every gradient."""
    inputs = [v, *leaves.tensors()]
    expected = oracle_apply(v.float().double(), leaves.field(), leaves.grid, "factorized")
    out = apply_cpu(v.float(), leaves.field(torch.float32), leaves.grid)
    assert_close(out, expected, 2e-6, "output")
    want = grads(expected, inputs, dy)
    for name, got, w in zip(["v", *leaves.names()], grads(out, inputs, dy), want, strict=True):
        assert_close(got, w, 1e-4, f"d/d{name}")


def test_vanishing_mixture_weights_stay_finite_in_fp32() -> None:
    """An atom whose λ underflows in fp32 (log λ 120 below the others): no division by λ anywhere."""
    leaves = FieldLeaves(2, (7, 5), 2, 3, TAPS)
    with torch.no_grad():
        leaves.leaves["log_lambda"][:, 0] -= 120.0
    v = torch.randn(2, 35, 2, 8, dtype=torch.float64, requires_grad=True)
    dy = torch.randn(2, 35, 2, 8, dtype=torch.float64)
    _assert_fp32_matches_definition(leaves, v, dy)


def test_a_sharp_field_with_small_values_matches_the_definition_in_fp32() -> None:
    """A trained field's case (σ at its floor, keys up to 8 cells away, values of 1e-3): most weights are the
    exponential's floor 2^-126 and their products denormal, which the float kernels flush to zero; the output and
    every gradient still match the float64 definition."""
    leaves = FieldLeaves(2, (9, 7), 2, 3, TAPS)
    with torch.no_grad():
        leaves.leaves["raw_sigma"] -= 6.0  # σ → the 0.25 floor: c ≈ 11.5 / τ per squared cell
    v = (1e-3 * torch.randn(2, 63, 2, 8, dtype=torch.float64)).requires_grad_()
    dy = torch.randn(2, 63, 2, 8, dtype=torch.float64)
    _assert_fp32_matches_definition(leaves, v, dy)


def test_the_kernels_leave_the_callers_denormals_alone() -> None:
    """The float kernels flush denormals only inside their call: on the calling thread (one OpenMP thread runs the
    region there) arithmetic afterwards still produces denormals."""
    tiny = torch.tensor([2.0**-130], dtype=torch.float32)  # a float32 denormal
    leaves = FieldLeaves(2, (7, 5), 2, 3, TAPS, dtype=torch.float32)
    v = torch.randn(2, 35, 2, 8, requires_grad=True)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert (tiny * 0.5).item() > 0
        apply_cpu(v, leaves.field(), (7, 5)).square().sum().backward()
        assert (tiny * 0.5).item() > 0 and tiny.item() > 0
    finally:
        torch.set_num_threads(before)


def test_model_trains_the_same_on_the_c_kernels_and_the_torch_path() -> None:
    """A whole ViT training step (loss and every parameter's gradient) through both CPU backends."""
    results = []
    for backend in ("cpu", "torch"):
        torch.manual_seed(3)
        model = ViT(img_size=14, patch_size=2, dim=32, depth=2, num_heads=2, num_classes=5, cold_init=False)
        for block in model.blocks:
            block.attn.backend = backend
            for probe in (block.attn.mu_delta, block.attn.sigma_delta, block.attn.lambda_gate):
                torch.nn.init.normal_(probe.weight, std=0.2)
        x, labels = torch.randn(3, 3, 14, 14), torch.tensor([0, 3, 4])
        loss = torch.nn.functional.cross_entropy(model(x), labels)
        loss.backward()
        results.append((loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
    (loss_c, grads_c), (loss_t, grads_t) = results
    torch.testing.assert_close(loss_c, loss_t, rtol=1e-5, atol=1e-6)
    for name, grad in grads_c.items():
        assert_close(grad, grads_t[name], 1e-4, name)


# ------------------------------------------------------------------------------------ build and dispatch


@pytest.fixture
def fresh_build(monkeypatch: pytest.MonkeyPatch, tmp_path):
    """An empty kernel cache and no remembered build, restored afterwards."""
    monkeypatch.setenv("SSOG_CACHE_DIR", str(tmp_path))
    ssog_cpu._libraries.cache_clear()
    yield tmp_path
    ssog_cpu._libraries.cache_clear()


@pytest.mark.slow
def test_build_is_cached_and_written_whole(fresh_build) -> None:
    assert ssog_cpu.unavailable_reason() is None
    built = sorted(fresh_build.glob("*.so"))
    assert [p.name.split("_")[2] for p in built] == ["double", "float"]  # nothing half-written is left
    stamps = [p.stat().st_mtime_ns for p in built]
    ssog_cpu._libraries.cache_clear()
    assert ssog_cpu.unavailable_reason() is None
    assert [p.stat().st_mtime_ns for p in sorted(fresh_build.glob("*.so"))] == stamps  # reused, not rebuilt
    assert sorted(fresh_build.iterdir()) == built


@pytest.mark.slow
def test_a_damaged_cached_library_is_built_again(fresh_build) -> None:
    """A cached library that no longer loads (truncated on a full disk, say) is replaced, not reported forever. Run
    in a fresh process: this one has the library mapped, and the loader would hand back the mapped copy."""
    assert ssog_cpu.unavailable_reason() is None
    damaged = sorted(fresh_build.glob("ssog_cpu_float_*.so"))[0]
    spare = damaged.with_suffix(".tmp")
    spare.write_bytes(b"not a shared library")
    os.replace(spare, damaged)  # a new file: the mapped one in this process stays intact
    code = (
        "import torch\n"
        "from ssog_core.ops import ssog_cpu\n"
        "from ssog_core.testing.oracles import TAPS, FieldLeaves, oracle_apply\n"
        "assert ssog_cpu.unavailable_reason() is None, ssog_cpu.unavailable_reason()\n"
        "leaves = FieldLeaves(1, (4, 3), 2, 3, TAPS, dtype=torch.float32)\n"
        "v = torch.randn(1, 12, 2, 8)\n"
        "out = ssog_cpu.apply_cpu(v, leaves.field(), (4, 3)).double()\n"
        "ref = oracle_apply(v.double(), leaves.field(torch.float64), (4, 3), 'factorized')\n"
        "assert (out - ref).abs().max() < 1e-5\n"
    )
    env = {**os.environ, "SSOG_CACHE_DIR": str(fresh_build), "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert damaged.read_bytes()[:4] == b"\x7fELF"


@pytest.mark.parametrize(
    ("compiler", "reason"), [("no-such-cc", "no C compiler found"), ("false", "failed to compile ssog_cpu.c")]
)
def test_without_a_working_compiler_the_torch_path_runs(
    monkeypatch: pytest.MonkeyPatch, fresh_build, caplog: pytest.LogCaptureFixture, compiler: str, reason: str
) -> None:
    monkeypatch.setenv("CC", compiler)
    monkeypatch.delenv("SSOG_BACKEND", raising=False)
    assert reason in ssog_cpu.unavailable_reason()
    leaves = FieldLeaves(2, (4, 3), 2, 3, TAPS, dtype=torch.float32)
    v = torch.randn(2, 12, 2, 8)
    with caplog.at_level(logging.DEBUG, logger="ssog_core.ops"):
        assert choose_ssog_backend(v, leaves.field(), (4, 3)) == "torch"
    assert reason in caplog.text
    torch.testing.assert_close(ssog_apply(v, leaves.field(), (4, 3)), apply_torch(v, leaves.field(), (4, 3)))
    with pytest.raises(BackendUnavailable, match=f"SSOG cpu backend cannot run this input: .*{reason}"):
        ssog_apply(v, leaves.field(), (4, 3), backend="cpu")
    assert not list(fresh_build.glob("*.so"))


def test_dispatcher_picks_the_c_kernels_for_what_they_cover(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SSOG_BACKEND", raising=False)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    steered = FieldLeaves(2, (4, 3), 2, 3, TAPS, dtype=torch.float32).field()
    fixed = FieldLeaves(2, (4, 3), 2, 3, (), dtype=torch.float32).field()
    v = torch.randn(2, 12, 2, 8)
    assert choose_ssog_backend(v, steered, (4, 3)) == "cpu"
    assert choose_ssog_backend(v.double(), steered, (4, 3)) == "cpu"
    assert choose_ssog_backend(v, fixed, (4, 3)) == "torch"
    assert choose_ssog_backend(v, steered, (4, 3), "axial") == "torch"
    assert choose_ssog_backend(v.bfloat16(), steered, (4, 3)) == "torch"
    assert dispatch.ssog_cpu_problem(v.bfloat16(), steered, "factorized").startswith("dtype torch.bfloat16")
    torch.testing.assert_close(
        ssog_apply(v, steered, (4, 3)), oracle_apply(v.double(), steered, (4, 3), "factorized").float()
    )
    with pytest.raises(BackendUnavailable, match="the field is fixed"):
        ssog_apply(v, fixed, (4, 3), backend="cpu")
    with pytest.raises(ValueError, match="tile the grid"):
        ssog_apply(v[:, :11], steered, (4, 3), backend="cpu")
