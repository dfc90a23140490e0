"""Fused CPU kernels for steered factorized SSOG fields (the ``cpu`` backend of :mod:`ssog_core.ops.dispatch`).

The PyTorch path (:mod:`ssog_core.ops.ssog_torch`) spends most of a small model's SSOG layer on ~30 operations
that each stream a full-size intermediate through memory: per-query kernels, the per-atom column-pass output and
its transpose. ``ssog_cpu.c`` does both filter passes for one (image, head) pair at a time instead, building
the pair's 1D kernels in per-thread scratch that stays in cache and using them at once; only the column pass's
output is kept (per pair, or for the whole batch when training needs it for the backward pass). The C code takes
the per-token kernel terms (μ, ``c``, log λ) and returns ``∂L/∂v``, ``∂L/∂μ``, ``∂L/∂c`` and ``∂L/∂log λ``
(docs/KERNELS.md §6). :func:`apply_cpu` takes them from a per-token :class:`~ssog_core.field.Field` (PyTorch ops,
so autograd carries their gradients back through σ, τ and the steering); :func:`apply_cpu_steering`, what
:class:`~ssog_core.nn.attention.SSOGAttention` calls on this backend, computes them in C from the probes' raw
outputs and the fixed field (bound, steer and ``c`` in one pass over the tokens, and one pass back), which in a
small model's training step cost more than the kernels' own forward pass as some twenty PyTorch operations.

The C source is compiled on first use with the system C compiler (``$CC``, else ``cc``/``gcc``/``clang``),
``-O3 -march=native``, into ``$SSOG_CACHE_DIR`` (default ``~/.cache/ssog_lab``), once per source, flags, compiler
and CPU; a float and a double build (the double one for gradcheck). Without a compiler the dispatcher falls back
to the PyTorch path and says why. The (image, head) pairs are split over ``torch.get_num_threads()`` OpenMP
threads of PyTorch's own runtime (:func:`openmp_runtime`).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable

from ssog_core.field import Field, exp2_rate

SOURCE = Path(__file__).with_name("ssog_cpu.c")
# no -ffast-math: linked into a shared library it would switch the whole process to flush-to-zero
FLAGS = ("-O3", "-march=native", "-fno-math-errno", "-fno-trapping-math", "-ffp-contract=fast", "-fPIC", "-shared")
REALS = {torch.float32: "float", torch.float64: "double"}
VECTOR_BYTES = 32  # the C code's vector width: head widths are padded to a multiple of it


class BuildError(RuntimeError):
    """The C kernels could not be compiled or loaded here."""


def compiler() -> str | None:
    """The C compiler to use: ``$CC``, else the first of ``cc``, ``gcc``, ``clang`` on the PATH."""
    if os.environ.get("CC"):
        return shutil.which(os.environ["CC"])
    return next((path for name in ("cc", "gcc", "clang") if (path := shutil.which(name))), None)


def cache_dir() -> Path:
    """Where compiled kernels live: ``$SSOG_CACHE_DIR``, else ``$XDG_CACHE_HOME/ssog_lab`` (``~/.cache/ssog_lab``)."""
    if os.environ.get("SSOG_CACHE_DIR"):
        return Path(os.environ["SSOG_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ssog_lab"


def openmp_runtime() -> Path | None:
    """The OpenMP runtime PyTorch's wheel bundles (``torch/lib/libgomp*``), if any: the kernels link against it so that
    their parallel regions run on PyTorch's own thread pool (a second runtime's threads would spin against it)."""
    return next(iter(sorted((Path(torch.__file__).parent / "lib").glob("libgomp*.so*"))), None)


def _cpu_identity() -> str:
    """What ``-march=native`` compiled for: the CPU's feature flags (Linux), else its name. A home directory shared
    by machines with different CPUs then keeps one build per CPU instead of loading one that may not run."""
    try:
        with open("/proc/cpuinfo") as info:
            return next((line for line in info if line.startswith(("flags", "Features"))), platform.processor())
    except OSError:
        return platform.processor()


def _build(cc: str, real: str, openmp: list[str], toolchain: str) -> Path:
    """Compile the kernels for ``real`` (``float``/``double``) unless a build with this source, compiler, flags and
    CPU (``toolchain``) is cached; the library is written under a temporary name and renamed, so concurrent builds
    are safe. Without OpenMP support the kernels are built single-threaded."""
    defines = [f"-DREAL={real}"] + (["-DREAL_IS_DOUBLE"] if real == "double" else [])
    key = "\n".join([toolchain, *defines])
    target = cache_dir() / f"ssog_cpu_{real}_{hashlib.sha256(key.encode()).hexdigest()[:16]}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        for extra in (openmp, []):
            command = [cc, *FLAGS, *defines, str(SOURCE), *extra, "-o", tmp, "-lm"]
            done = subprocess.run(command, capture_output=True, text=True, check=False)
            if done.returncode == 0:
                break
        else:
            detail = done.stderr.strip()[-2000:] or f"exit status {done.returncode}"
            raise BuildError(f"{cc} failed to compile {SOURCE.name}: {detail}")
        os.replace(tmp, target)
    finally:
        Path(tmp).unlink(missing_ok=True)
    return target


def _bind(path: Path) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(path))
    ptr, i64 = ctypes.c_void_p, ctypes.c_int64
    lib.ssog_forward.argtypes = [ptr] * 6 + [i64] * 6 + [ctypes.c_int]
    lib.ssog_backward.argtypes = [ptr] * 10 + [i64] * 6 + [ctypes.c_int]
    lib.ssog_terms_forward.argtypes = [ptr] * 8 + [i64] * 7 + [ctypes.c_int]
    lib.ssog_terms_backward.argtypes = [ptr] * 10 + [i64] * 8 + [ctypes.c_int]
    for fn in (lib.ssog_forward, lib.ssog_backward, lib.ssog_terms_forward, lib.ssog_terms_backward):
        fn.restype = ctypes.c_int
    return lib


@functools.cache
def _libraries() -> dict[torch.dtype, ctypes.CDLL] | str:
    """The loaded float and double kernels, or why they are unavailable (asked once per process). A cached library
    that does not load (a file damaged on disk, say) is deleted and built again, once."""
    cc = compiler()
    if cc is None:
        return "no C compiler found (set $CC or install gcc)"
    runtime = openmp_runtime()
    openmp = ["-fopenmp", *([str(runtime)] if runtime else [])]
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, check=False).stdout
    toolchain = "\n".join([SOURCE.read_text(), cc, version, platform.machine(), _cpu_identity(), *FLAGS, *openmp])
    libs = {}
    try:
        for dtype, real in REALS.items():
            path = _build(cc, real, openmp, toolchain)
            try:
                libs[dtype] = _bind(path)
            except OSError:
                path.unlink(missing_ok=True)
                libs[dtype] = _bind(_build(cc, real, openmp, toolchain))
    except (BuildError, OSError) as err:
        return str(err)
    return libs


def unavailable_reason() -> str | None:
    """Why the kernels cannot be used in this process (no compiler, a failed build), or ``None``."""
    libs = _libraries()
    return libs if isinstance(libs, str) else None


def _run(fn, tensors: list[Tensor | None], sizes: tuple[int, ...]) -> None:
    """Call ``fn(*pointers, *sizes, threads)`` with ``torch.get_num_threads()`` threads."""
    pointers = [None if t is None else t.data_ptr() for t in tensors]
    if fn(*pointers, *sizes, torch.get_num_threads()):
        raise MemoryError("the SSOG CPU kernels could not allocate their scratch memory")


def _forward(v: Tensor, mu: Tensor, c: Tensor, log_lam: Tensor, grid: tuple[int, int], save: bool):
    b, n, h, d = v.shape
    r = log_lam.shape[-1]
    y = torch.empty_like(v)
    y1 = torch.empty(b, h, n, r, d, dtype=v.dtype) if save else None
    _run(_libraries()[v.dtype].ssog_forward, [v, mu, c, log_lam, y, y1], (b, *grid, h, r, d))
    return y, y1


class _FusedSteered(torch.autograd.Function):
    """``(v, μ, c, log λ)`` → ``y`` through the C kernels; the backward pass is the C kernels' too."""

    @staticmethod
    def forward(ctx, v: Tensor, mu: Tensor, c: Tensor, log_lam: Tensor, grid: tuple[int, int]) -> Tensor:
        y, y1 = _forward(v, mu, c, log_lam, grid, save=True)
        ctx.grid = grid
        ctx.save_for_backward(v, mu, c, log_lam, y1)
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, dy: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, None]:
        v, mu, c, log_lam, y1 = ctx.saved_tensors
        b, n, h, d = v.shape
        r = log_lam.shape[-1]
        dv, dmu, dc, dlog = torch.empty_like(v), torch.empty_like(mu), torch.empty_like(c), torch.empty_like(log_lam)
        tensors = [v, mu, c, log_lam, y1, dy.to(v.dtype).contiguous(), dv, dmu, dc, dlog]
        _run(_libraries()[v.dtype].ssog_backward, tensors, (b, *ctx.grid, h, r, d))
        return dv, dmu, dc, dlog, None


def kernel_terms(field: Field, b: int, grid: tuple[int, int], dtype: torch.dtype) -> tuple[Tensor, Tensor, Tensor]:
    """The C kernels' per-token terms of a steered field, contiguous in ``dtype`` (differentiable): μ and
    ``c = log2(e)/(2σ²τ)`` as ``(B, N, H, R, 2)``, and log λ as ``(B, N, H, R)``. The C code forms ``x = query − μ``
    itself and normalises λ over the atoms (as :meth:`~ssog_core.field.Field.lam`): on the CPU, PyTorch's
    broadcast subtraction from the query grid and its softmax over a last axis of a few atoms each cost a
    sizeable part of the whole C forward pass."""
    gh, gw = grid
    h, r = field.num_heads, field.num_atoms

    def per_token(t: Tensor, *axis: int) -> Tensor:  # (B, Gh, Gw, H, R[, 2]), maybe broadcast → (B, N, H, R[, 2])
        return t.to(dtype).expand(b, gh, gw, h, r, *axis).reshape(b, gh * gw, h, r, *axis).contiguous()

    return per_token(field.mu, 2), per_token(exp2_rate(field.sigma, field.tau), 2), per_token(field.log_lam)


def apply_cpu(v: Tensor, field: Field, grid: tuple[int, int]) -> Tensor:
    """``apply_field`` semantics for a steered factorized field on CPU tensors: ``(B, N, H, D)`` → ``(B, N, H, D)``
    (float32 or float64; the dispatcher checks the input, :func:`unavailable_reason` the build)."""
    return _apply_terms(v, *kernel_terms(field, v.shape[0], grid, v.dtype), grid)


def _apply_terms(v: Tensor, mu: Tensor, c: Tensor, log_lam: Tensor, grid: tuple[int, int]) -> Tensor:
    d = v.shape[-1]
    lanes = VECTOR_BYTES // v.element_size()
    pad = -d % lanes
    v = F.pad(v, (0, pad)) if pad else v.contiguous()
    if torch.is_grad_enabled() and any(t.requires_grad for t in (v, mu, c, log_lam)):
        y = _FusedSteered.apply(v, mu, c, log_lam, grid)
    else:
        y = _forward(v, mu, c, log_lam, grid, save=False)[0]
    return y[..., :d] if pad else y


class _SteeringTerms(torch.autograd.Function):
    """The probes' raw outputs → the C kernels' per-token terms ``(μ, c, log λ)``, in C both ways
    (``ssog_terms_forward`` / ``_backward``): :func:`~ssog_core.field.bound`, :func:`~ssog_core.field.steer` and
    ``c = log2(e)/(2σ²τ)`` as one pass over the tokens instead of some twenty PyTorch operations and their autograd
    buffers. Inputs: raw ``(B, N, P)``, the fixed field's μ0, c0 ``(H, R, 2)`` and log λ0 ``(H, R)``, the gates
    ``(a = s_μ·M, s_σ, s_λ)``, and the taps' offsets in ``P`` (−1: off)."""

    @staticmethod
    def forward(ctx, raw: Tensor, mu0: Tensor, c0: Tensor, ll0: Tensor, gates: Tensor, offsets: tuple[int, int, int]):
        b, n, p = raw.shape
        h, r = ll0.shape
        mu, c = raw.new_empty(b, n, h, r, 2), raw.new_empty(b, n, h, r, 2)
        log_lam = raw.new_empty(b, n, h, r)
        tensors = [raw, mu0, c0, ll0, gates, mu, c, log_lam]
        _run(_libraries()[raw.dtype].ssog_terms_forward, tensors, (b * n, p, *offsets, h, r))
        ctx.offsets = offsets
        ctx.save_for_backward(raw, c0, gates, c)
        return mu, c, log_lam

    @staticmethod
    @once_differentiable
    def backward(ctx, dmu: Tensor | None, dc: Tensor | None, dll: Tensor | None):
        raw, c0, gates, c = ctx.saved_tensors
        b, n, p = raw.shape
        h, r = c0.shape[:2]
        dmu, dc = [torch.zeros_like(c) if g is None else g.contiguous() for g in (dmu, dc)]
        dll = c.new_zeros(c.shape[:-1]) if dll is None else dll.contiguous()
        draw, partial, work = torch.empty_like(raw), raw.new_empty(b, 5 * h * r + 3), raw.new_empty(b, 5 * h * r)
        tensors = [raw, c0, gates, c, dmu, dc, dll, draw, partial, work]
        _run(_libraries()[raw.dtype].ssog_terms_backward, tensors, (b, n, p, *ctx.offsets, h, r))
        total = partial.sum(0)
        hr = h * r
        dmu0, dc0 = total[: 2 * hr].view(h, r, 2), total[2 * hr : 4 * hr].view(h, r, 2)
        return draw, dmu0, dc0, total[4 * hr : 5 * hr].view(h, r), total[5 * hr :], None


def apply_cpu_steering(
    v: Tensor,
    fixed: Field,
    raw: Tensor,
    widths: dict[str, int],
    scales: dict[str, Tensor],
    max_offset: float,
    grid: tuple[int, int],
) -> Tensor:
    """``apply_cpu(v, steer(fixed, bound(raw)))`` without the per-token field in between: ``raw`` ``(B, N, P)`` holds
    the enabled taps' raw probe outputs one after another in the order of ``widths`` (tap → its width in ``P``), as
    :class:`~ssog_core.nn.attention.SSOGAttention` computes them in one GEMM."""
    dtype = v.dtype
    starts, at = {}, 0
    for tap, width in widths.items():
        starts[tap], at = at, at + width
    offsets = tuple(starts.get(tap, -1) for tap in ("mu", "sigma", "lambda"))
    zero = raw.new_zeros(())
    gates = torch.stack([
        scales["mu"] * max_offset if "mu" in scales else zero,
        scales.get("sigma", zero),
        scales.get("lambda", zero),
    ]).to(dtype)  # fmt: skip
    c0 = exp2_rate(fixed.sigma, fixed.tau)
    mu0, c0, ll0 = (t.to(dtype).contiguous() for t in (fixed.mu, c0, fixed.log_lam))
    mu, c, log_lam = _SteeringTerms.apply(raw.to(dtype).contiguous(), mu0, c0, ll0, gates, offsets)
    return _apply_terms(v, mu, c, log_lam, grid)
