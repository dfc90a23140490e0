"""Backend choice for the SSOG operator, the explicit analysis path, and keeping Triton out of imports."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ssog_core.field import Field, apply_field
from ssog_core.nn.attention import SSOGAttention
from ssog_core.nn.cost import count_flops
from ssog_core.nn.vit import ViT
from ssog_core.ops import dispatch, ssog_cpu
from ssog_core.ops.dispatch import BackendUnavailable, can_run_triton_ssog, choose_ssog_backend, ssog_apply
from ssog_core.ops.ssog_torch import apply_torch
from ssog_core.ops.triton_tiles import shared_memory_estimate
from tests.ops_checks import FieldLeaves, assert_compiles_like_eager, oracle_matrix

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SSOG_BACKEND", raising=False)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)


def _inputs(steered: bool = True, head_dim: int = 4):
    field = FieldLeaves(2, (4, 3), 2, 3, ("mu", "sigma", "lambda") if steered else (), dtype=torch.float32).field()
    return torch.randn(2, 12, 2, head_dim), field, (4, 3)


def test_cpu_tensors_use_the_c_kernels_or_the_fast_torch_path(caplog: pytest.LogCaptureFixture) -> None:
    """Steered factorized fields run on the fused C kernels where they build; everything else on the torch path."""
    v, field, grid = _inputs()
    c_kernels = ssog_cpu.unavailable_reason() is None
    with caplog.at_level(logging.DEBUG, logger="ssog_core.ops"):
        assert choose_ssog_backend(v, field, grid) == ("cpu" if c_kernels else "torch")
    assert "CUDA" in caplog.text  # the reason Triton was skipped
    fast = ssog_cpu.apply_cpu if c_kernels else apply_torch
    torch.testing.assert_close(ssog_apply(v, field, grid), fast(v, field, grid), rtol=0, atol=0)
    caplog.clear()
    _, fixed, _ = _inputs(steered=False)
    with caplog.at_level(logging.DEBUG, logger="ssog_core.ops"):
        assert choose_ssog_backend(v, fixed, grid) == "torch"
    assert "SSOG backend torch" in caplog.text
    torch.testing.assert_close(ssog_apply(v, fixed, grid), apply_torch(v, fixed, grid), rtol=0, atol=0)


@pytest.mark.parametrize(("backend", "impl"), [("torch", apply_torch), ("definition", apply_field)])
def test_environment_forces_a_backend(monkeypatch: pytest.MonkeyPatch, backend: str, impl) -> None:
    monkeypatch.setenv("SSOG_BACKEND", backend.upper())
    v, field, grid = _inputs()
    assert choose_ssog_backend(v, field, grid) == backend
    torch.testing.assert_close(ssog_apply(v, field, grid), impl(v, field, grid), rtol=0, atol=0)


@pytest.mark.parametrize(("backend", "impl"), [("torch", apply_torch), ("definition", apply_field)])
def test_argument_picks_a_backend_per_call(monkeypatch: pytest.MonkeyPatch, backend: str, impl) -> None:
    monkeypatch.setenv("SSOG_BACKEND", "triton")  # the argument wins over the environment
    v, field, grid = _inputs()
    assert choose_ssog_backend(v, field, grid, backend=backend) == backend
    torch.testing.assert_close(ssog_apply(v, field, grid, backend=backend), impl(v, field, grid), rtol=0, atol=0)
    attn = SSOGAttention(8, 2, 3, backend=backend)
    x = torch.randn(2, 12, 8)
    with torch.no_grad():
        expected = attn.out(impl(attn.v(x).view(2, 12, 2, 4), attn.field_of(x, grid), grid).reshape(2, 12, 8))
        torch.testing.assert_close(attn(x, grid), expected, rtol=0, atol=0)
    with pytest.raises(BackendUnavailable, match="backend='cuda' is not one of triton, cpu, torch, definition"):
        ssog_apply(v, field, grid, backend="cuda")


def test_forced_triton_that_cannot_run_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SSOG_BACKEND", "triton")
    v, field, grid = _inputs()
    with pytest.raises(BackendUnavailable, match="SSOG triton backend cannot run this input: .*(CUDA|not installed)"):
        ssog_apply(v, field, grid)


def test_unknown_backend_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SSOG_BACKEND", "cuda-magic")
    v, field, grid = _inputs()
    with pytest.raises(BackendUnavailable, match="triton, cpu, torch, definition"):
        ssog_apply(v, field, grid)


@pytest.mark.parametrize(
    ("change", "reason"),
    [("head_dim", "head_dim 200 exceeds 128"), ("dtype", "dtype torch.float64 is not supported")],
)
def test_triton_predicate_reasons(monkeypatch: pytest.MonkeyPatch, change: str, reason: str) -> None:
    monkeypatch.setattr(dispatch, "interpreting", lambda: True)  # pretend the device is fine
    monkeypatch.setattr(dispatch, "triton_installed", lambda: True)
    v, field, grid = _inputs(head_dim=200 if change == "head_dim" else 4)
    if change == "dtype":
        v = v.double()
    assert dispatch.ssog_triton_problem(v, field, grid, "factorized").startswith(reason)
    assert not can_run_triton_ssog(v, field, grid)
    with pytest.raises(BackendUnavailable, match=reason):
        can_run_triton_ssog(v, field, grid, raise_error=True)


def test_triton_grid_limits_follow_each_kernel_layout(monkeypatch: pytest.MonkeyPatch) -> None:
    """Factorized kernels put heads and images on grid axes 1 and 2; axial ones put batch·heads on axis 1."""
    monkeypatch.setattr(dispatch, "interpreting", lambda: True)
    monkeypatch.setattr(dispatch, "triton_installed", lambda: True)
    _, field, grid = _inputs()
    v = torch.empty(300, 12, 300, 4, device="meta")  # 90,000 (image, head) pairs: over one axis, under two
    assert dispatch.ssog_triton_problem(v, field, grid, "factorized") == (
        "the field lives on ['cpu'], the values on meta"
    )
    field = Field(*(t.to("meta") for t in (field.mu, field.sigma, field.log_lam)), field.tau)  # CPU scalar τ: fine
    assert dispatch.ssog_triton_problem(v, field, grid, "factorized") is None
    assert dispatch.ssog_triton_problem(v, field, grid, "axial") == (
        "batch × heads = 90000 exceeds the CUDA grid limit 65535"
    )
    many = torch.empty(70000, 12, 2, 4, device="meta")
    assert dispatch.ssog_triton_problem(many, field, grid, "factorized") == (
        "batch = 70000 exceeds the CUDA grid limit 65535"
    )


SM90_SHARED = 232448  # bytes of shared memory an sm_90 program may use


def test_axial_backward_shared_memory_per_atom_is_refused_before_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    """The axial column backward needs 24 KiB more shared memory per atom at 14×14, d64, bf16 (116,736 bytes with
    one atom, 190,464 with four, 239,616 with six on sm_90 compiles: docs/KERNELS.md §7): on an sm_90 GPU four
    atoms run, six and eight are refused with the reason; factorized fields, which have no per-atom scratch, run
    with eight."""
    monkeypatch.setattr(dispatch, "interpreting", lambda: True)
    monkeypatch.setattr(dispatch, "triton_installed", lambda: True)
    monkeypatch.setattr(dispatch, "shared_memory_limit", lambda device: SM90_SHARED)
    for mode, atoms, ok in (("axial", 4, True), ("axial", 6, False), ("axial", 8, False), ("factorized", 8, True)):
        field = FieldLeaves(1, (14, 14), 2, atoms, ("mu",), dtype=torch.float32).field()
        v = torch.empty(1, 196, 2, 64, dtype=torch.bfloat16)
        problem = dispatch.ssog_triton_problem(v, field, (14, 14), mode)
        assert (problem is None) == ok, (mode, atoms, problem)
        if not ok:
            assert f"{atoms} atoms" in problem and "shared memory" in problem and str(SM90_SHARED) in problem
    assert dispatch.shared_memory_problem((14, 14), 64, 6, "axial", torch.bfloat16, SM90_SHARED) is not None
    assert dispatch.shared_memory_problem((14, 14), 64, 6, "axial", torch.bfloat16, 300_000) is None


@pytest.mark.slow
def test_importing_and_running_on_cpu_never_imports_triton() -> None:
    code = (
        "import sys, torch, ssog_core, ssog_core.ops, ssog_core.analysis.measures\n"
        "from ssog_core.nn.vit import ViT\n"
        "m = ViT(img_size=16, patch_size=4, dim=32, depth=1, num_heads=2, num_classes=3).eval()\n"
        "m(torch.rand(1, 3, 16, 16))\n"
        "bad = sorted(k for k in sys.modules if k == 'triton' or k.startswith('triton.'))\n"
        "assert not bad, bad\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("SSOG_BACKEND", "TRITON_INTERPRET")}
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.mark.parametrize("mode", ["factorized", "axial"])
@pytest.mark.parametrize("steered", [True, False], ids=["steered", "fixed"])
def test_attention_matrix_times_values_equals_dispatched_output(mode: str, steered: bool) -> None:
    """The analysis path materialises A with the definition operator; A·V must equal the fast path's output."""
    attn = SSOGAttention(12, 3, 4, field=mode, cold_init=False).eval()
    for probe in (attn.mu_delta, attn.sigma_delta, attn.lambda_gate):
        torch.nn.init.normal_(probe.weight, std=0.3)
    x = torch.randn(2, 35, 12)
    with torch.no_grad():
        field = attn.field_of(x, (7, 5), steered=steered)
        v = attn.v(x).view(2, 35, 3, 4)
        a = attn.attention_matrix(x, (7, 5), steered=steered)
        torch.testing.assert_close(
            torch.einsum("bhnm,bmhd->bnhd", a, v), ssog_apply(v, field, (7, 5), mode), rtol=1e-5, atol=1e-6
        )
        torch.testing.assert_close(a.double(), oracle_matrix(field, (7, 5), mode, batch=2), rtol=1e-5, atol=1e-6)
        if steered:  # bit for bit, unless forward steers in C from the raw probes (the same field up to rounding)
            y = attn.out(ssog_apply(v, field, (7, 5), mode).reshape(2, 35, 12))
            tol = 1e-6 if dispatch.steers_in_c(v, attn.fixed_field(), (7, 5), mode) else 0.0
            torch.testing.assert_close(attn(x, (7, 5)), y, rtol=10 * tol, atol=tol)


def test_attention_matrix_does_not_go_through_dispatch(monkeypatch: pytest.MonkeyPatch) -> None:
    attn = SSOGAttention(8, 2, 2).eval()
    monkeypatch.setattr("ssog_core.nn.attention.ssog_apply", lambda *a, **k: pytest.fail("analysis used ssog_apply"))
    with torch.no_grad():
        attn.attention_matrix(torch.randn(1, 12, 8), (4, 3))


@pytest.mark.slow
@pytest.mark.parametrize("taps", [("mu", "sigma", "lambda"), ()], ids=["steered", "fixed"])
def test_compile_fullgraph_on_cpu(taps: tuple[str, ...]) -> None:
    """CPU training under torch.compile(fullgraph=True): dispatch and the fast path trace into one graph."""
    assert_compiles_like_eager(SSOGAttention(16, 2, 3, steer=taps, cold_init=False), torch.randn(2, 20, 16), (5, 4))


def test_model_flops_do_not_depend_on_the_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    model = ViT(img_size=(32, 24), patch_size=4, dim=48, depth=2, num_heads=3, num_classes=5)
    fast = count_flops(model)
    monkeypatch.setenv("SSOG_BACKEND", "definition")
    assert count_flops(model) == fast


def test_the_old_backend_name_still_works_with_a_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    """``reference`` was the definition backend's name; it now means only the float64 oracles."""
    v, field, grid = _inputs()
    with pytest.warns(FutureWarning, match="now called 'definition'"):
        assert choose_ssog_backend(v, field, grid, backend="reference") == "definition"
    monkeypatch.setenv("SSOG_BACKEND", "reference")
    with pytest.warns(FutureWarning, match="SSOG_BACKEND='reference' is now called 'definition'"):
        torch.testing.assert_close(ssog_apply(v, field, grid), apply_field(v, field, grid), rtol=0, atol=0)


def test_whether_triton_is_installed_is_known_without_a_lookup_at_call_time(monkeypatch):
    """Dynamo refuses to trace importlib's ``find_spec`` (torch 2.11 on a GPU): the dispatch, which torch.compile
    traces, must not look the package up per call."""
    import importlib.util

    from ssog_core.ops import env

    found = importlib.util.find_spec("triton") is not None

    def no_lookup(*args, **kwargs):
        raise AssertionError("find_spec called at dispatch time")

    monkeypatch.setattr(importlib.util, "find_spec", no_lookup)
    assert env.triton_installed() is found


@pytest.mark.parametrize(
    ("grid", "atoms", "compiled"),
    [((32, 32), 6, 247808), ((32, 32), 8, 296960), ((64, 64), 6, 164864), ((64, 64), 8, 189440)],
)
def test_axial_shared_memory_estimate_bounds_the_compiled_column_backward(grid, atoms, compiled) -> None:
    """The axial column backward's shared memory as sm_90 compiles it (d64, bf16; `python -m
    ssog_core.ops.triton_compile --mode axial --grid 32 32 --grid 64 64 --atoms 6 8`, triton 3.9): the estimate
    is never below it, so the dispatcher refuses exactly the shapes that would fail at launch (32×32 with six or
    eight atoms) and runs the others."""
    need = shared_memory_estimate(*grid, 64, atoms, True, 2)
    assert compiled <= need
    problem = dispatch.shared_memory_problem(grid, 64, atoms, "axial", torch.bfloat16, SM90_SHARED)
    assert (problem is None) == (compiled <= SM90_SHARED), problem
