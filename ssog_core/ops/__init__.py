"""Attention operators behind one entry point per family (:func:`ssog_apply`, :func:`rbf_attention`); backends
are chosen in :mod:`ssog_core.ops.dispatch`.

* :mod:`~ssog_core.ops.cpu_ssog` / ``cpu_kernels.c`` — fused C kernels for steered fields on the CPU, compiled on
  first use;
* :mod:`~ssog_core.ops.torch_ssog` — the fast PyTorch SSOG path (fixed fields on the CPU, and the fallback anywhere);
* :mod:`~ssog_core.ops.triton_ssog` / :mod:`~ssog_core.ops.triton_kernels` — the fused Triton kernels (CUDA),
  imported only when they run;
* :mod:`~ssog_core.ops.triton_compile` — compiles the kernels for a GPU target without a GPU (CI, reports).

``backend=`` per call, or ``SSOG_BACKEND=triton|cpu|torch|reference`` / ``RBF_BACKEND=triton|torch``, forces a backend.
"""

from ssog_core.ops.dispatch import rbf_attention, ssog_apply

__all__ = ["rbf_attention", "ssog_apply"]
