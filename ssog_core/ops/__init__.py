"""Attention operators behind one entry point per family (:func:`ssog_apply`, :func:`rbf_attention`); backends
are chosen in :mod:`ssog_core.ops.dispatch`. Files are named ``<op>_<backend>``:

* :mod:`~ssog_core.ops.ssog_cpu` / ``ssog_cpu.c`` — fused C kernels for steered fields on the CPU, compiled on
  first use;
* :mod:`~ssog_core.ops.ssog_torch` — the fast PyTorch SSOG path (fixed fields on the CPU, and the fallback anywhere);
* :mod:`~ssog_core.ops.ssog_triton` — the launcher of the fused Triton kernels (CUDA), imported only when they run;
  the kernels are :mod:`~ssog_core.ops.ssog_triton_axial` and :mod:`~ssog_core.ops.ssog_triton_factorized`, their
  tile sizes :mod:`~ssog_core.ops.triton_tiles`;
* :mod:`~ssog_core.ops.rbf_torch` / :mod:`~ssog_core.ops.rbf_triton` — RBF attention (SDPA on augmented vectors /
  flash-style kernels);
* :mod:`~ssog_core.ops.triton_compile` — compiles the kernels for a GPU target without a GPU (CI, reports);
* :mod:`~ssog_core.ops.env` — the environment checks (Triton installed, interpreter), importing nothing from here.

The ``definition`` backend is :func:`ssog_core.field.apply_field` itself. ``backend=`` per call, or
``SSOG_BACKEND=triton|cpu|torch|definition`` / ``RBF_BACKEND=triton|torch``, forces a backend.
"""

from ssog_core.ops.dispatch import rbf_attention, ssog_apply

__all__ = ["rbf_attention", "ssog_apply"]
