"""Read or replace any named activation for one call: :func:`run_with_cache` and :func:`run_with_hooks`.

The points are the model's :class:`~ssog_core.nn.hook_points.HookPoint` submodules, named by module path:

| point | activation |
|---|---|
| ``blocks.{l}.attn.head_out`` | per-head output before the output projection ``(B, N, H, head_dim)`` |
| ``blocks.{l}.attn.field`` | the content-free field that content steers (a ``Field`` of ``(H, R)`` tensors) |
| ``blocks.{l}.attn.probes.{tap}`` | bounded steering probes ``(B, Gh, Gw, H, R[, 2])`` of tap mu/sigma/lambda |
| ``blocks.{l}.resid_post`` | the block's output, the residual stream ``(B, N, dim)`` |

Like edits, both act for this call and this thread only, and inside ``with edited(...)`` they see the edited
model (their functions run after the edits'). Being modules, the points are reached by plain forward hooks and
by nnsight too.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from torch import Tensor, nn

from ssog_core.nn.hook_points import HookPoint, PointFn, install, uninstall

HookFn = Callable[[Any, str], Any]  # (activation, point name) → its replacement


def hook_points(model: nn.Module) -> dict[str, HookPoint]:
    """Every hook point of ``model`` by name, in forward order."""
    return {name: m for name, m in model.named_modules() if isinstance(m, HookPoint)}


def _points(model: nn.Module, names: Sequence[str]) -> dict[str, HookPoint]:
    every = hook_points(model)
    unknown = [n for n in names if n not in every]
    if unknown:
        some = ", ".join(list(every)[:4])
        raise KeyError(f"no hook point {', '.join(map(repr, unknown))} in this model (it has {some}, …)")
    return {n: every[n] for n in names}


@contextlib.contextmanager
def hooked(
    points: Mapping[int, PointFn], removed: Mapping[int, frozenset[int]] | None = None, replace: bool = False
) -> Iterator[None]:
    """Install point functions (by ``id`` of the point) for the ``with`` block (see ``hook_points.install``)."""
    token = install(points, removed, replace)
    try:
        yield
    finally:
        uninstall(token)


def run_with_cache(model: nn.Module, x: Tensor, names: Sequence[str] | None = None) -> tuple[Tensor, dict[str, Any]]:
    """``model(x)`` and the activations at the named points (every point by default): ``(logits, cache)``.

    A point passed twice in one forward (``attn.field`` when ``attention_maps`` also runs) keeps the last; a probe
    tap an active edit closed is absent."""
    points = _points(model, list(hook_points(model)) if names is None else list(names))
    cache: dict[str, Any] = {}

    def keep(name: str) -> PointFn:
        def fn(a: Any) -> Any:
            cache[name] = a
            return a

        return fn

    with hooked({id(m): keep(n) for n, m in points.items()}):
        logits = model(x)
    return logits, cache


def run_with_hooks(model: nn.Module, x: Tensor, hooks: Mapping[str, HookFn]) -> Tensor:
    """``model(x)`` with ``fn(activation, name)`` put in place of each named point's activation."""
    points = _points(model, list(hooks))
    with hooked({id(m): (lambda a, n=n: hooks[n](a, n)) for n, m in points.items()}):
        return model(x)
