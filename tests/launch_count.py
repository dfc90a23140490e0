"""Count the kernel launches of a piece of eager PyTorch code on the CPU (docs/KERNELS.md §5).

A launch is an ATen operation dispatched that is not a view (a view launches nothing on a GPU) or a Triton kernel
launch. The ATen operations are recorded by a dispatch mode, which also sees the operations inside the package's
custom ops (their implementations run under it); Triton launches are counted where
:class:`ssog_core.ops.ssog_triton.Launch` runs them (under ``TRITON_INTERPRET=1`` or on a GPU), or are stubbed out
(``run_kernels=False``: the launches are counted, not run, so any CPU build can count them).
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Callable, Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# operations that return a tensor sharing its input's storage without being marked a view: no kernel either
_ALIASING = {torch.ops.aten._unsafe_view.default}


class _Recorder(TorchDispatchMode):
    """Records every non-view ATen operation; the package's custom ops are run under the mode, not counted."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.namespace == "ssog":  # a custom op: count what its implementation dispatches and launches
            with self:  # the implementation below the mode (CPU: where the counts are taken), recorded
                return func.redispatch(torch._C.DispatchKeySet(torch._C.DispatchKey.CPU), *args, **kwargs)
        if not (func.is_view or func in _ALIASING):
            self.ops[str(func.overloadpacket.__name__)] += 1
        return func(*args, **kwargs)


@contextlib.contextmanager
def count_launches(run_kernels: bool = True) -> Iterator[Counter[str]]:
    """Within the block, count launches into the returned counter: ATen operation names and ``triton:<kernel>``.
    ``run_kernels=False`` counts the Triton launches without running them (their outputs stay uninitialised)."""
    from ssog_core.ops import ssog_triton

    counts: Counter[str] = Counter()
    recorder = _Recorder()
    original: Callable = ssog_triton.Launch.__call__

    def launch(self) -> None:
        counts[f"triton:{self.name}"] += 1
        if run_kernels:
            original(self)

    ssog_triton.Launch.__call__ = launch
    try:
        with recorder:
            yield counts
    finally:
        ssog_triton.Launch.__call__ = original
        counts.update(recorder.ops)
