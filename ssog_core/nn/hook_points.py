"""Named places in the forward pass where a call may read or replace an activation: hook points.

A :class:`HookPoint` is a parameter-free identity submodule (``blocks.{l}.attn.head_out``, ``…attn.field``,
``…attn.probes.{tap}``, ``blocks.{l}.resid_post``), so it has a module path that plain forward hooks and nnsight
reach too. What a point does in one call comes from a :class:`~contextvars.ContextVar` (not a module attribute,
not a registered hook): the app shares one model between users whose requests run in worker threads, so each
thread sees only its own functions, none outlives its ``with`` block, and the model is never written.
:mod:`ssog_core.interventions` installs them (``edited``, ``run_with_cache``, ``run_with_hooks``).

This module imports nothing from the rest of the package, so the modules and the analysis can both use it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.nn.modules import module as module_hooks

PointFn = Callable[[Any], Any]  # activation → its replacement (a probe point may return None: that tap closed)


@dataclass(frozen=True)
class _Active:
    points: Mapping[int, PointFn] = field(default_factory=dict)  # by id of the HookPoint
    removed: Mapping[int, frozenset[int]] = field(default_factory=dict)  # by id of the attention module


_ACTIVE: ContextVar[_Active | None] = ContextVar("ssog_hook_points", default=None)


class HookPoint(nn.Module):
    """The identity, unless this call and thread installed a function here. A compiled model (training on CUDA)
    never has one: the check is a constant for the compiler, so it adds no graph break."""

    def forward(self, x: Any) -> Any:
        if torch.compiler.is_compiling():
            return x
        active = _ACTIVE.get()
        fn = None if active is None else active.points.get(id(self))
        return x if fn is None else fn(x)


def _chain(first: PointFn, then: PointFn) -> PointFn:
    def both(x: Any) -> Any:
        y = first(x)
        return None if y is None else then(y)

    return both


def install(
    points: Mapping[int, PointFn], removed: Mapping[int, frozenset[int]] | None = None, replace: bool = False
) -> object:
    """Make ``points`` (keyed by ``id`` of the :class:`HookPoint`) active in this context; ``removed`` names, per
    ``id`` of an attention module, the heads whose output is not this input's attention (ablated or patched).
    ``replace`` drops what an enclosing block installed; otherwise the new functions run after its ones.
    Returns the token :func:`uninstall` takes; callers keep the modules alive while installed."""
    outer = None if replace else _ACTIVE.get()
    merged, heads = dict(points), dict(removed or {})
    if outer is not None:
        for key, fn in outer.points.items():
            merged[key] = _chain(fn, merged[key]) if key in merged else fn
        for key, hs in outer.removed.items():
            heads[key] = hs | heads.get(key, frozenset())
    return _ACTIVE.set(_Active(merged, heads))


def uninstall(token: object) -> None:
    _ACTIVE.reset(token)  # type: ignore[arg-type]


def is_plain(points: list[nn.Module]) -> bool:
    """Whether ``points`` are the identity in this call: no function installed in this context, no forward hook
    (global or on a point) and no replaced ``forward`` (as a tracer may do). Only then may a fused path skip them."""
    if torch.compiler.is_compiling():  # a compiled model takes the unfused path (and no ContextVar in its graph)
        return False
    active = _ACTIVE.get()
    if (active is not None and (active.points or active.removed)) or module_hooks._global_forward_hooks:
        return False
    if module_hooks._global_forward_pre_hooks:
        return False
    return not any(p._forward_hooks or p._forward_pre_hooks or "forward" in p.__dict__ for p in points)


def removed_heads(attention: nn.Module) -> frozenset[int]:
    """The heads of an attention module that the active edits took out (their attention is not in the head mean)."""
    active = _ACTIVE.get()
    return frozenset() if active is None else active.removed.get(id(attention), frozenset())
