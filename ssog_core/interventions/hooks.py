"""Read or replace any named activation for one call: :func:`run_with_cache` and :func:`run_with_hooks`.

The points are the model's :class:`~ssog_core.nn.hook_points.HookPoint` submodules, named by module path. ``P`` is
the number of prefix tokens (class, distillation, register), first in the sequence (0 for SSOG but a distilled
student's, ``prefix_dot``), ``N`` the grid's ``Gh·Gw`` tokens (a language model's ``T`` tokens, on a ``1 × T``
grid):

| point | activation |
|---|---|
| ``blocks.{l}.attn.hook_in`` | the input the attention sees, the block's LayerNormed stream ``(B, P + N, dim)`` |
| ``blocks.{l}.attn.field`` | SSOG: the content-free field that content steers (a ``Field`` of ``(H, R)`` tensors) |
| ``blocks.{l}.attn.probes.{tap}`` | SSOG: bounded steering probes ``(B, Gh, Gw, H, R[, 2])`` of tap mu/sigma/lambda |
| ``blocks.{l}.attn.pattern`` | post-softmax attention, what mixes the values ``(B, H, P + N, P + N)`` |
| ``blocks.{l}.attn.head_out`` | per-head output before the output projection ``(B, P + N, H, head_dim)`` |
| ``blocks.{l}.resid_post`` | the block's output, the residual stream ``(B, P + N, dim)`` |

The pattern is formed only while something is installed at its point (the fused paths never form it); a function
that returns another pattern changes the output. Like edits, both act for this call and this thread only, and
inside ``with edited(...)`` they see the edited model (their functions run after the edits'). Being modules, the
points are reached by plain forward hooks and by nnsight too. A ``torch.compile`` wrapper is looked through (names
have no ``_orig_mod.``) and its compiled forward runs the functions (:mod:`ssog_core.nn.hook_points`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from torch import Tensor, nn

from ssog_core.checkpoint.format import unwrap
from ssog_core.field import Field
from ssog_core.nn.hook_points import HookPoint, hooked, reading

HookFn = Callable[[Any, str], Any]  # (activation, point name) → its replacement


def hook_points(model: nn.Module) -> dict[str, HookPoint]:
    """Every hook point of ``model`` (or of the module behind its compile wrapper) by name, in forward order."""
    return {name: m for name, m in unwrap(model).named_modules() if isinstance(m, HookPoint)}


def _points(model: nn.Module, names: Sequence[str]) -> dict[str, HookPoint]:
    every = hook_points(model)
    unknown = [n for n in names if n not in every]
    if unknown:
        some = ", ".join(list(every)[:4])
        raise KeyError(f"no hook point {', '.join(map(repr, unknown))} in this model (it has {some}, …)")
    return {n: every[n] for n in names}


def _detached(a: Any) -> Any:
    if isinstance(a, Field):
        return dataclasses.replace(a, **{f.name: getattr(a, f.name).detach() for f in dataclasses.fields(a)})
    return a.detach() if isinstance(a, Tensor) else a


def run_with_cache(
    model: nn.Module, x: Tensor, names: Sequence[str] | None = None, detach: bool = True
) -> tuple[Tensor, dict[str, Any]]:
    """``model(x)`` and the activations at the named points (every point by default): ``(logits, cache)``.

    The cache holds detached tensors, so it keeps no autograd graph alive (``detach=False`` keeps the graphs, for
    gradients through a cached activation). A point passed twice in one forward (``attn.field`` when
    ``attention_maps`` also runs) keeps the last; a probe tap an active edit closed is absent."""
    points = _points(model, list(hook_points(model)) if names is None else list(names))
    with reading(points) as cache:
        logits = model(x)
    return logits, {n: _detached(a) for n, a in cache.items()} if detach else dict(cache)


def run_with_hooks(model: nn.Module, x: Tensor, hooks: Mapping[str, HookFn]) -> Tensor:
    """``model(x)`` with ``fn(activation, name)`` put in place of each named point's activation."""
    points = _points(model, list(hooks))
    with hooked({id(m): (lambda a, n=n: hooks[n](a, n)) for n, m in points.items()}):
        return model(x)
