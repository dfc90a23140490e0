"""``torch.compile`` of the SSOG layer: what keeps it safe, and its gradients against eager's.

* No ``torch.autograd.Function`` of the package mutates a tensor in its ``forward``: under ``torch.compile`` an
  in-place operation there can route a gradient to the wrong output (pytorch/pytorch#180642, torch 2.11: the
  pre-mutation alias of a returned tensor becomes an extra output of the traced forward). Every subclass defined in
  ``ssog_core`` is found by walking the package, and its forward runs under a dispatch mode that records every
  operation whose schema writes to an argument (``x.mul_()``, ``out=``).
* Inductor on the CPU: compiled and eager gradients of a steered layer agree within the tolerance the float64 check
  holds each dtype to (``benchmarks/gpu_check.py``'s :func:`check_compile`, the check a GPU run makes).
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import ssog_core
from ssog_core.field import exp2_rate
from ssog_core.testing.oracles import FieldLeaves

ROOT = Path(__file__).resolve().parents[1]


def package_functions() -> dict[str, type[torch.autograd.Function]]:
    """Every ``torch.autograd.Function`` subclass defined in ``ssog_core``, by qualified name (each module imported;
    ``__main__`` modules, which run a command, are skipped)."""
    for info in pkgutil.walk_packages(ssog_core.__path__, "ssog_core."):
        if not info.name.endswith("__main__"):
            importlib.import_module(info.name)
    found, todo = {}, [torch.autograd.Function]
    while todo:
        for sub in todo.pop().__subclasses__():
            todo.append(sub)
            if sub.__module__.startswith("ssog_core."):
                found[f"{sub.__module__}.{sub.__qualname__}"] = sub
    return found


class _Mutations(TorchDispatchMode):
    """Records every dispatched operation whose schema writes to one of its arguments."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func._schema.is_mutable:
            self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def forward_mutations(fn: type[torch.autograd.Function], args: tuple) -> list[str]:
    """The mutating operations ``fn.forward`` dispatches when applied to ``args`` (built outside the mode)."""
    with _Mutations() as seen:
        fn.apply(*args)
    return seen.ops


def _steered(b: int = 2, grid: tuple[int, int] = (5, 4), h: int = 2, r: int = 3, d: int = 6):
    field = FieldLeaves(b, grid, h, r, ("mu", "sigma", "lambda"), dtype=torch.float32).field()
    v = torch.randn(b, grid[0] * grid[1], h, d, requires_grad=True)
    return v, field, grid


def _steered_factorized() -> tuple:
    v, f, grid = _steered()
    return v, f.mu, f.sigma, f.log_lam, f.tau, grid


def _fused_steered() -> tuple:
    from ssog_core.ops import ssog_cpu

    v, f, grid = _steered()
    return v, *ssog_cpu.kernel_terms(f, v.shape[0], grid, v.dtype), grid


def _steering_terms() -> tuple:
    h, r = 2, 3
    mu0, ll0 = torch.randn(h, r, 2, requires_grad=True), torch.randn(h, r, requires_grad=True)
    c0 = exp2_rate(torch.rand(h, r, 2) + 0.5)
    raw = torch.randn(2, 20, 5 * h * r, requires_grad=True)
    return raw, mu0, c0, ll0, torch.rand(3, requires_grad=True), (0, 2 * h * r, 4 * h * r)


def _cross_entropy() -> tuple:
    m, k = 3, 4
    a, b = torch.rand(m, 25, k, requires_grad=True), torch.rand(m, k, 16, requires_grad=True)
    return a, b, torch.rand(m, 25, 16)


# qualified name → its forward's arguments (a new autograd.Function fails below until it has an entry here)
INPUTS: dict[str, Callable[[], tuple]] = {
    "ssog_core.field._Bound": lambda: (torch.randn(2, 7, 12, requires_grad=True),),
    "ssog_core.ops.ssog_torch._SteeredFactorized": _steered_factorized,
    "ssog_core.ops.ssog_cpu._FusedSteered": _fused_steered,
    "ssog_core.ops.ssog_cpu._SteeringTerms": _steering_terms,
    "ssog_core.analysis.head_as_field._CrossEntropy": _cross_entropy,
    "ssog_core.distill.loop.RowCross": lambda: (*_cross_entropy()[:2], torch.rand(3, 25, 16)),
}
FUNCTIONS = package_functions()
C_KERNELS = {"ssog_core.ops.ssog_cpu._FusedSteered", "ssog_core.ops.ssog_cpu._SteeringTerms"}


def test_every_autograd_function_of_the_package_has_inputs() -> None:
    assert set(FUNCTIONS) == set(INPUTS), "found by walking ssog_core, without inputs here (or gone from it)"


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_no_autograd_function_mutates_in_its_forward(name: str) -> None:
    if name in C_KERNELS:
        from ssog_core.ops import ssog_cpu

        if ssog_cpu.unavailable_reason():
            pytest.skip(f"the C kernels are not built here: {ssog_cpu.unavailable_reason()}")
    ops = forward_mutations(FUNCTIONS[name], INPUTS[name]())
    assert not ops, f"{name}.forward runs in-place operations (pytorch/pytorch#180642 under torch.compile): {ops}"


def test_the_mutation_check_can_fail() -> None:
    """A forward that mutates what it creates, returns or saves is caught, an out-of-place one is not."""

    class InPlace(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            y = x * 2
            ctx.save_for_backward(y)
            return y.sigmoid_()

        @staticmethod
        def backward(ctx, g):
            return g

    class OutArgument(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return torch.mul(x, 2, out=torch.empty_like(x))

        @staticmethod
        def backward(ctx, g):
            return g

    class Clean(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return (x * 2).sigmoid()

        @staticmethod
        def backward(ctx, g):
            return g

    x = torch.randn(3, requires_grad=True)
    assert forward_mutations(InPlace, (x,)) == ["aten.sigmoid_.default"]
    assert forward_mutations(OutArgument, (x,)) == ["aten.mul.out"]
    assert forward_mutations(Clean, (x,)) == []


def _gpu_check():
    script = ROOT / "benchmarks" / "gpu_check.py"
    sys.path.insert(0, str(script.parent))  # the script imports ``common`` from beside it
    try:
        spec = importlib.util.spec_from_file_location("gpu_check", script)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(script.parent))
    return module


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_inductor_gradients_of_a_steered_layer_equal_eager(dtype: torch.dtype) -> None:
    """Inductor on the CPU (C++ code generation; the layer on the PyTorch path, which is what compiles on a CPU):
    every parameter's gradient, the steering projections included, within the float64 check's tolerance of
    eager's and of float64's. About a minute and a half per dtype on two cores (most of it Inductor's compile)."""
    gc = _gpu_check()
    problem = gc.check_compile(torch.device("cpu"), "inductor", dtype, gc.COMPILE_LAYERS[:1])
    assert problem is None, problem


@pytest.mark.slow
def test_the_compile_check_can_fail(monkeypatch: pytest.MonkeyPatch) -> None:
    """With no tolerance the check reports every difference by name (eager and compiled off float64)."""
    gc = _gpu_check()
    monkeypatch.setitem(gc.COMPILE_TOLERANCE, torch.float32, (0.0, 0.0, 0.0))
    problem = gc.check_compile(torch.device("cpu"), "aot_eager", torch.float32, gc.COMPILE_LAYERS[:1])
    assert "eager grad of mu_delta.weight off float64" in problem and "compiled grad of lambda_gate.bias" in problem
