"""Choose the implementation of the SSOG operator for a given input.

Backends (all compute :func:`ssog_core.field.apply_field` exactly, up to rounding):

* ``triton`` — fused GPU kernels (:mod:`ssog_core.ops.triton_ssog`): CUDA tensors, or CPU tensors under
  ``TRITON_INTERPRET=1`` (how the tests run them without a GPU);
* ``torch`` — the fast PyTorch path (:mod:`ssog_core.ops.torch_ssog`): any device;
* ``reference`` — :func:`ssog_core.field.apply_field` itself.

Automatic choice: ``triton`` where :func:`can_run_triton` says yes, else ``torch``; it is logged at debug level
(logger ``ssog_core.ops``). The environment variable ``SSOG_BACKEND=triton|torch|reference`` forces a backend;
a forced backend that cannot run this input raises :class:`BackendUnavailable` with the reason.
Importing this module never imports Triton.
"""

from __future__ import annotations

import importlib.util
import logging
import os

import torch
from torch import Tensor

from ssog_core.field import Field, FieldMode, apply_field
from ssog_core.ops.torch_ssog import apply_torch
from ssog_core.ops.triton_tiles import shared_memory_estimate

BACKENDS = ("triton", "torch", "reference")
ENV_VAR = "SSOG_BACKEND"
MAX_HEAD_DIM = 128  # the fused kernels keep a (rows, Gw, head_dim) fp32 accumulator on chip
MAX_ATOMS = 8
TRITON_DTYPES = (torch.float32, torch.bfloat16, torch.float16)

logger = logging.getLogger("ssog_core.ops")


class BackendUnavailable(RuntimeError):
    """A backend forced through ``SSOG_BACKEND`` cannot run the given input."""


def _triton_installed() -> bool:
    return importlib.util.find_spec("triton") is not None


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def _shared_memory_limit(device: torch.device) -> int | None:
    """Shared memory a program may use on this device (bytes), ``None`` off CUDA (the interpreter has no limit)."""
    return torch.cuda.get_device_properties(device).shared_memory_per_block_optin if device.type == "cuda" else None


def triton_problem(v: Tensor, field: Field, grid: tuple[int, int], mode: FieldMode) -> str | None:
    """Why the Triton kernels cannot run this input, or ``None`` if they can."""
    if not _triton_installed():
        return "triton is not installed"
    if not (v.is_cuda or _interpreting()):
        return f"the values are on {v.device}; the kernels need CUDA tensors (or TRITON_INTERPRET=1 on the CPU)"
    if v.dtype not in TRITON_DTYPES:
        return f"dtype {v.dtype} is not supported (float32, bfloat16, float16)"
    if v.shape[-1] > MAX_HEAD_DIM:
        return f"head_dim {v.shape[-1]} exceeds {MAX_HEAD_DIM}"
    if field.num_atoms > MAX_ATOMS:
        return f"{field.num_atoms} atoms exceed {MAX_ATOMS}"
    if mode not in ("factorized", "axial"):
        return f"unknown field mode {mode!r}"
    if v.shape[0] * v.shape[2] > 65535:  # batch·heads is the second launch-grid axis
        return f"batch × heads = {v.shape[0] * v.shape[2]} exceeds the CUDA grid limit 65535"
    limit = _shared_memory_limit(v.device)
    if limit is not None:
        dot_bytes = 4 if v.dtype == torch.float32 else 2
        need = shared_memory_estimate(*grid, v.shape[-1], field.num_atoms, mode == "axial", dot_bytes)
        if need > limit:
            return (
                f"a {grid[0]}×{grid[1]} grid with head_dim {v.shape[-1]}, {field.num_atoms} atoms and {v.dtype} "
                f"needs up to {need} bytes of shared memory per program; this GPU allows {limit}"
            )
    devices = {t.device for t in (field.mu, field.sigma, field.log_lam, field.tau)} - {v.device}
    if devices and not (len(devices) == 1 and field.tau.dim() == 0 and field.tau.device.type == "cpu"):
        return f"the field lives on {sorted(map(str, devices))}, the values on {v.device}"
    return None


def can_run_triton(
    v: Tensor, field: Field, grid: tuple[int, int], mode: FieldMode = "factorized", raise_error: bool = False
) -> bool:
    """Whether the fused Triton kernels can run this input (with the reason logged, or raised if asked)."""
    problem = triton_problem(v, field, grid, mode)
    if problem is None:
        return True
    if raise_error:
        raise BackendUnavailable(f"{ENV_VAR}=triton cannot run this input: {problem}")
    if not torch.compiler.is_compiling():  # logging is not traceable: torch.compile(fullgraph=True) must work
        logger.debug("SSOG triton backend skipped: %s", problem)
    return False


def choose_backend(v: Tensor, field: Field, grid: tuple[int, int], mode: FieldMode = "factorized") -> str:
    """The backend :func:`ssog_apply` will use for this input."""
    forced = os.environ.get(ENV_VAR, "").strip().lower()
    if forced:
        if forced not in BACKENDS:
            raise BackendUnavailable(f"{ENV_VAR}={forced!r} is not one of {', '.join(BACKENDS)}")
        if forced == "triton":
            can_run_triton(v, field, grid, mode, raise_error=True)
        return forced
    backend = "triton" if can_run_triton(v, field, grid, mode) else "torch"
    if not torch.compiler.is_compiling() and logger.isEnabledFor(logging.DEBUG):
        logger.debug(
            "SSOG backend %s for %s values %s on %s, %s field",
            backend,
            v.dtype,
            tuple(v.shape),
            v.device,
            "steered" if field.per_token else "fixed",
        )
    return backend


def ssog_apply(v: Tensor, field: Field, grid: tuple[int, int], mode: FieldMode = "factorized") -> Tensor:
    """Apply an SSOG field to values ``v`` of shape ``(B, N, H, D)``; returns ``(B, N, H, D)``."""
    backend = choose_backend(v, field, grid, mode)
    if backend == "triton":
        from ssog_core.ops.triton_ssog import apply_triton

        return apply_triton(v, field, grid, mode)
    if backend == "torch":
        return apply_torch(v, field, grid, mode)
    return apply_field(v, field, grid, mode)
