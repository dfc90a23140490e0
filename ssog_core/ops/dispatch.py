"""Choose the implementation of each attention operator: SSOG and RBF, in one vocabulary.

Backends (each computes its operator exactly, up to rounding):

* SSOG (:func:`ssog_apply`, the definition is :func:`ssog_core.field.apply_field`): ``triton`` — the fused kernels
  of :mod:`ssog_core.ops.ssog_triton`; ``cpu`` — the fused C kernels of :mod:`ssog_core.ops.ssog_cpu` (steered
  factorized fields on CPU tensors); ``torch`` — the fast PyTorch path (:mod:`ssog_core.ops.ssog_torch`, any
  device); ``definition`` — :func:`~ssog_core.field.apply_field` itself, the definition evaluated as written
  (``reference``, its old name, is still accepted with a warning).
* RBF (:func:`rbf_attention`, defined in :mod:`ssog_core.ops.rbf_torch`): ``triton`` — the fused flash-style kernels
  of :mod:`ssog_core.ops.rbf_triton`; ``torch`` — SDPA on augmented vectors
  (:func:`~ssog_core.ops.rbf_torch.rbf_attention_torch`).

Both operators choose the same way, per call: the ``backend=`` argument, else the environment variable
(``SSOG_BACKEND`` / ``RBF_BACKEND``), else ``triton`` where :func:`can_run_triton_ssog` /
:func:`can_run_triton_rbf` say it can run, for SSOG then ``cpu`` where :func:`can_run_cpu_ssog` says it can, and
``torch`` otherwise (the choice and the reason are logged at debug level, logger ``ssog_core.ops``). The Triton
kernels run on CUDA tensors, or on CPU tensors under ``TRITON_INTERPRET=1`` (how the tests run them without a
GPU). A backend that was asked for but cannot run this input raises :class:`BackendUnavailable` with the reason.
The environment checks are :mod:`ssog_core.ops.env`; importing this module never imports Triton.
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Callable

import torch
from torch import Tensor

from ssog_core.field import MAX_ATOMS, Field, FieldMode, apply_field, check_grid
from ssog_core.ops import ssog_cpu
from ssog_core.ops.env import interpreting, triton_installed  # here too: the tests patch them on this module
from ssog_core.ops.rbf_torch import check_rbf_inputs, rbf_attention_torch
from ssog_core.ops.ssog_torch import apply_torch
from ssog_core.ops.triton_tiles import shared_memory_estimate

SSOG_BACKENDS = ("triton", "cpu", "torch", "definition")
# Old names still accepted (a warning says the new one): "reference" now means only the float64 oracles.
BACKEND_ALIASES = {"reference": "definition"}
RBF_BACKENDS = ("triton", "torch")
SSOG_ENV_VAR, RBF_ENV_VAR = "SSOG_BACKEND", "RBF_BACKEND"
MAX_HEAD_DIM = 128  # both kernels keep a (rows, head_dim) fp32 accumulator on chip
TRITON_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
MAX_GRID_Y = 65535  # CUDA's limit on launch-grid axes 1 and 2 (images and heads live there)

logger = logging.getLogger("ssog_core.ops")


class BackendUnavailable(RuntimeError):
    """A backend that was asked for (argument or environment variable) cannot run the given input."""


# ------------------------------------------------------------------------------------------- the environment


def shared_memory_limit(device: torch.device) -> int | None:
    """Shared memory a program may use on this device (bytes), ``None`` off CUDA (the interpreter has no limit)."""
    return torch.cuda.get_device_properties(device).shared_memory_per_block_optin if device.type == "cuda" else None


def _triton_common_problem(t: Tensor, head_dim: int, grid_axes: dict[str, int]) -> str | None:
    """Why neither operator's kernels can run on ``t`` (installation, device, dtype, sizes), or ``None``;
    ``grid_axes``: what each kernel puts on launch-grid axes 1 and 2, by name."""
    if not triton_installed():
        return "triton is not installed"
    if not (t.is_cuda or interpreting()):
        return f"the tensors are on {t.device}; the kernels need CUDA tensors (or TRITON_INTERPRET=1 on the CPU)"
    if t.dtype not in TRITON_DTYPES:
        return f"dtype {t.dtype} is not supported (float32, bfloat16, float16)"
    if t.is_cuda and t.dtype == torch.bfloat16 and not torch.cuda.is_bf16_supported():
        return "this GPU has no bfloat16 support"
    if head_dim > MAX_HEAD_DIM:
        return f"head_dim {head_dim} exceeds {MAX_HEAD_DIM}"
    for name, extent in grid_axes.items():
        if extent > MAX_GRID_Y:
            return f"{name} = {extent} exceeds the CUDA grid limit {MAX_GRID_Y}"
    return None


def _verdict(op: str, problem: str | None, raise_error: bool, backend: str = "triton") -> bool:
    """``can_run_*``'s answer: True, or False with the reason logged (or raised when asked)."""
    if problem is None:
        return True
    if raise_error:
        raise BackendUnavailable(f"the {op} {backend} backend cannot run this input: {problem}")
    if not torch.compiler.is_compiling():  # logging is not traceable: torch.compile(fullgraph=True) must work
        logger.debug("%s %s backend skipped: %s", op, backend, problem)
    return False


def _choose(op: str, backend: str | None, env_var: str, choices: tuple[str, ...], checks: dict[str, Callable]) -> str:
    """The backend asked for (argument, else environment; checked), else the first of ``checks`` (backend → its
    ``can_run(raise_error)``) that can run, else ``torch``."""
    requested = (backend or os.environ.get(env_var, "")).strip().lower()
    if requested in BACKEND_ALIASES and BACKEND_ALIASES[requested] in choices:
        source = "backend" if backend else env_var
        warnings.warn(
            f"{source}={requested!r} is now called {BACKEND_ALIASES[requested]!r}", FutureWarning, stacklevel=3
        )
        requested = BACKEND_ALIASES[requested]
    if requested:
        if requested not in choices:
            source = "backend" if backend else env_var
            raise BackendUnavailable(f"{source}={requested!r} is not one of {', '.join(choices)}")
        if requested in checks:
            checks[requested](raise_error=True)
        return requested
    return next((name for name, can_run in checks.items() if can_run(raise_error=False)), "torch")


# ------------------------------------------------------------------------------------------------------ SSOG


def shared_memory_problem(
    grid: tuple[int, int], head_dim: int, atoms: int, mode: FieldMode, dtype: torch.dtype, limit: int
) -> str | None:
    """Why the SSOG kernels' largest program would not fit ``limit`` bytes of shared memory, or ``None`` (the
    estimate of :func:`~ssog_core.ops.triton_tiles.shared_memory_estimate`; the compile report asks the same)."""
    dot_bytes = 4 if dtype == torch.float32 else 2
    need = shared_memory_estimate(*grid, head_dim, atoms, mode == "axial", dot_bytes)
    if need <= limit:
        return None
    return (
        f"a {grid[0]}×{grid[1]} grid with head_dim {head_dim}, {atoms} atoms and {dtype} needs up to {need} bytes "
        f"of shared memory per program; this GPU allows {limit}"
    )


def ssog_triton_problem(v: Tensor, field: Field, grid: tuple[int, int], mode: FieldMode) -> str | None:
    """Why the SSOG kernels cannot run this input, or ``None`` if they can."""
    b, h = v.shape[0], v.shape[2]
    axes = {"batch × heads": b * h} if mode == "axial" else {"batch": b, "heads": h}  # factorized: axes 2 and 1
    problem = _triton_common_problem(v, v.shape[-1], axes)
    if problem is not None:
        return problem
    if field.num_atoms > MAX_ATOMS:
        return f"{field.num_atoms} atoms exceed {MAX_ATOMS}"
    if mode not in ("factorized", "axial"):
        return f"unknown field mode {mode!r}"
    limit = shared_memory_limit(v.device)
    if limit is not None:
        problem = shared_memory_problem(grid, v.shape[-1], field.num_atoms, mode, v.dtype, limit)
        if problem is not None:
            return problem
    devices = {t.device for t in (field.mu, field.sigma, field.log_lam)}
    if not (field.tau.dim() == 0 and field.tau.device.type == "cpu"):  # a CPU scalar τ is fine anywhere
        devices.add(field.tau.device)
    if devices - {v.device}:
        return f"the field lives on {sorted(map(str, devices))}, the values on {v.device}"
    return None


def can_run_triton_ssog(
    v: Tensor, field: Field, grid: tuple[int, int], mode: FieldMode = "factorized", raise_error: bool = False
) -> bool:
    """Whether the fused SSOG kernels can run this input (the reason logged, or raised if ``raise_error``)."""
    return _verdict("SSOG", ssog_triton_problem(v, field, grid, mode), raise_error)


CPU_DTYPES = (torch.float32, torch.float64)


def ssog_cpu_problem(v: Tensor, field: Field, mode: FieldMode) -> str | None:
    """Why the fused C kernels cannot run this input, or ``None`` if they can. They cover what the PyTorch path
    is slowest at: steered factorized fields (a fixed field is two plain GEMMs there)."""
    if v.device.type != "cpu":
        return f"the values are on {v.device}; the C kernels run on CPU tensors"
    if mode != "factorized":
        return f"the C kernels compute factorized fields, not {mode!r}"
    if not field.per_token:
        return "the field is fixed (not steered by content): the PyTorch path's GEMMs are faster"
    if v.dtype not in CPU_DTYPES:
        return f"dtype {v.dtype} is not supported (float32, float64)"
    devices = {t.device.type for t in (field.mu, field.sigma, field.log_lam, field.tau)}
    if devices != {"cpu"}:
        return f"the field lives on {sorted(devices)}"
    if torch.compiler.is_compiling():
        return "inside torch.compile the PyTorch path is traced instead"
    return ssog_cpu.unavailable_reason()


def can_run_cpu_ssog(v: Tensor, field: Field, mode: FieldMode = "factorized", raise_error: bool = False) -> bool:
    """Whether the fused C kernels can run this input (the reason logged, or raised if ``raise_error``)."""
    return _verdict("SSOG", ssog_cpu_problem(v, field, mode), raise_error, "cpu")


def choose_ssog_backend(
    v: Tensor, field: Field, grid: tuple[int, int], mode: FieldMode = "factorized", backend: str | None = None
) -> str:
    """The backend :func:`ssog_apply` will use for this input (module docstring: how it is chosen)."""

    def triton_ok(raise_error: bool) -> bool:
        return can_run_triton_ssog(v, field, grid, mode, raise_error)

    def cpu_ok(raise_error: bool) -> bool:
        return can_run_cpu_ssog(v, field, mode, raise_error)

    chosen = _choose("SSOG", backend, SSOG_ENV_VAR, SSOG_BACKENDS, {"triton": triton_ok, "cpu": cpu_ok})
    if not torch.compiler.is_compiling() and logger.isEnabledFor(logging.DEBUG):
        kind = "steered" if field.per_token else "fixed"
        shape = tuple(v.shape)
        logger.debug("SSOG backend %s for %s values %s on %s, %s field", chosen, v.dtype, shape, v.device, kind)
    return chosen


def steering_backend(
    v: Tensor, fixed: Field, grid: tuple[int, int], mode: FieldMode = "factorized", backend: str | None = None
) -> str:
    """The backend a field steered from ``fixed`` would run on for values ``v``, decided as
    :func:`choose_ssog_backend` decides it on the fixed field broadcast to every token (no copy; only the field's
    shapes, dtypes and devices matter, so ``fixed`` may hold raw parameters). On ``cpu``
    :func:`ssog_core.ops.ssog_cpu.apply_cpu_steering`, on ``triton`` (factorized)
    :func:`ssog_core.ops.ssog_triton.apply_triton_steering` take the probes' raw outputs instead of the per-token
    field."""
    lead = (v.shape[0], *grid)
    h, r = fixed.num_heads, fixed.num_atoms
    mu, sigma = fixed.mu.expand(*lead, h, r, 2), fixed.sigma.expand(*lead, h, r, 2)
    per_token = Field(mu, sigma, fixed.log_lam.expand(*lead, h, r), fixed.tau)
    return choose_ssog_backend(v, per_token, grid, mode, backend)


def steers_in_c(
    v: Tensor, fixed: Field, grid: tuple[int, int], mode: FieldMode = "factorized", backend: str | None = None
) -> bool:
    """Whether a field steered from ``fixed`` would run on the ``cpu`` backend (:func:`steering_backend`)."""
    return steering_backend(v, fixed, grid, mode, backend) == "cpu"


def ssog_apply(
    v: Tensor, field: Field, grid: tuple[int, int], mode: FieldMode = "factorized", backend: str | None = None
) -> Tensor:
    """Apply an SSOG field to values ``v`` of shape ``(B, N, H, D)``; returns ``(B, N, H, D)``."""
    chosen = choose_ssog_backend(v, field, grid, mode, backend)
    if chosen == "triton":
        from ssog_core.ops.ssog_triton import apply_triton

        return apply_triton(v, field, grid, mode)
    if chosen == "cpu":
        check_grid(v.shape[1], grid)
        return ssog_cpu.apply_cpu(v, field, grid)
    if chosen == "torch":
        return apply_torch(v, field, grid, mode)
    return apply_field(v, field, grid, mode)


# ------------------------------------------------------------------------------------------------------- RBF


def rbf_triton_problem(q: Tensor, k: Tensor, v: Tensor) -> str | None:
    """Why the RBF kernels cannot run these inputs, or ``None`` if they can."""
    if v.shape[-1] != q.shape[-1]:
        return f"value width {v.shape[-1]} differs from the head dim {q.shape[-1]}"
    return _triton_common_problem(q, q.shape[-1], {"batch × heads": q.shape[0] * q.shape[1]})


def can_run_triton_rbf(q: Tensor, k: Tensor, v: Tensor, raise_error: bool = False) -> bool:
    """Whether the fused RBF kernels can run these inputs (the reason logged, or raised if ``raise_error``)."""
    return _verdict("RBF", rbf_triton_problem(q, k, v), raise_error)


def choose_rbf_backend(q: Tensor, k: Tensor, v: Tensor, backend: str | None = None) -> str:
    """The backend :func:`rbf_attention` will use for these inputs (module docstring: how it is chosen)."""

    def triton_ok(raise_error: bool) -> bool:
        return can_run_triton_rbf(q, k, v, raise_error)

    return _choose("RBF", backend, RBF_ENV_VAR, RBF_BACKENDS, {"triton": triton_ok})


def rbf_attention(q: Tensor, k: Tensor, v: Tensor, causal: bool = False, backend: str | None = None) -> Tensor:
    """``softmax(−γ‖q − k‖²) v`` for ``q, k`` of shape ``(B, H, N, D)`` and ``v`` of ``(B, H, N, Dv)``."""
    check_rbf_inputs(q, k, v)
    if choose_rbf_backend(q, k, v, backend) == "triton":
        from ssog_core.ops.rbf_triton import rbf_attention_triton

        return rbf_attention_triton(q, k, v, causal)
    return rbf_attention_torch(q, k, v, causal)
