"""Named places in the forward pass where a call may read or replace an activation (hook points), and the per-call
switch that runs a model with eval semantics (:func:`evaluating`).

A :class:`HookPoint` is a parameter-free identity submodule (``blocks.{l}.attn.hook_in``, ``…attn.pattern``,
``…attn.head_out``, ``…attn.field``, ``…attn.probes.{tap}``, ``blocks.{l}.resid_post``), so it has a module path that
plain forward hooks and nnsight reach too. What a point does in one call comes from a
:class:`~contextvars.ContextVar` (not a module attribute, not a registered hook): the app shares one model between
users whose requests run in worker threads, so
each thread sees only its own functions, none outlives its ``with`` block, and the model is never written. Work
handed to another thread or a pool carries the context only when wrapped with :func:`in_context`.
:mod:`ssog_core.interventions` installs the functions (``edited``, ``run_with_cache``, ``run_with_hooks``).

Under ``torch.compile`` the context variable cannot be traced, so compiled code reads one module flag instead
(``_live``: whether any thread has a function or eval semantics installed), which the compiler guards as a
constant. While nothing is installed anywhere a point and a :class:`Dropout` trace as the plain identity and dropout:
one graph, as training needs. While something is installed, compiled code is recompiled once with a graph break at
each point and dropout, which then run eagerly and read this thread's context (correct, slower; a model compiled with
``fullgraph=True`` cannot break its graph and raises torch's error instead).

This module imports nothing from the rest of the package, so the modules and the analysis can both use it.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import threading
from collections.abc import Callable, Hashable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.modules import module as module_hooks

PointFn = Callable[[Any], Any]  # activation → its replacement (a probe point may return None: that tap closed)
T = TypeVar("T")
K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True)
class _Active:
    points: Mapping[int, PointFn] = field(default_factory=dict)  # by id of the HookPoint
    removed: Mapping[int, frozenset[int]] = field(default_factory=dict)  # by id of the attention module


_ACTIVE: contextvars.ContextVar[_Active | None] = contextvars.ContextVar("ssog_hook_points", default=None)
_EVAL: contextvars.ContextVar[bool] = contextvars.ContextVar("ssog_eval", default=False)
_live = False  # any thread has a point function or eval semantics installed: what compiled code reads (guarded)
_holders = 0
_lock = threading.Lock()


def _hold(delta: int) -> None:
    global _holders, _live
    with _lock:
        _holders += delta
        _live = _holders > 0


def _apply(point: HookPoint, x: Any) -> Any:
    active = _ACTIVE.get()
    fn = None if active is None else active.points.get(id(point))
    return x if fn is None else fn(x)


def _dropout(m: nn.Dropout, x: Tensor) -> Tensor:
    return F.dropout(x, m.p, m.training and not _EVAL.get(), m.inplace)


class HookPoint(nn.Module):
    """The identity, unless this call and thread installed a function here (compiled code: see the module doc)."""

    def forward(self, x: Any) -> Any:
        if torch.compiler.is_compiling():  # a graph break while live: compiled code cannot read the context variable
            return torch.compiler.disable(_apply)(self, x) if _live else x
        return _apply(self, x)


class Dropout(nn.Dropout):
    """``nn.Dropout`` that a call switches off for itself with :func:`evaluating`, without writing ``training``
    (another thread may be training the same model)."""

    def forward(self, x: Tensor) -> Tensor:
        if torch.compiler.is_compiling():
            if _live:
                return torch.compiler.disable(_dropout)(self, x)
            return F.dropout(x, self.p, self.training, self.inplace)
        return _dropout(self, x)


@contextlib.contextmanager
def evaluating() -> Iterator[None]:
    """Run the model with eval semantics (no dropout) in this block and thread, whatever its ``training`` says: the
    analysis and the interventions never call ``model.eval()``, which other threads would see."""
    token = _EVAL.set(True)
    _hold(1)
    try:
        yield
    finally:
        _hold(-1)
        _EVAL.reset(token)


def _chain(first: PointFn, then: PointFn) -> PointFn:
    def both(x: Any) -> Any:
        y = first(x)
        return None if y is None else then(y)

    return both


@contextlib.contextmanager
def hooked(
    points: Mapping[int, PointFn], removed: Mapping[int, frozenset[int]] | None = None, replace: bool = False
) -> Iterator[None]:
    """Make ``points`` (functions keyed by ``id`` of the :class:`HookPoint`) active in this block and thread;
    ``removed`` names, per ``id`` of an attention module, the heads whose output is not this input's attention
    (ablated or patched). ``replace`` drops what an enclosing block installed; otherwise the new functions run after
    its ones. Callers keep the modules alive while installed."""
    outer = None if replace else _ACTIVE.get()
    merged, heads = dict(points), dict(removed or {})
    if outer is not None:
        for key, fn in outer.points.items():
            merged[key] = _chain(fn, merged[key]) if key in merged else fn
        for key, hs in outer.removed.items():
            heads[key] = hs | heads.get(key, frozenset())
    token = _ACTIVE.set(_Active(merged, heads))
    live = bool(merged)
    if live:
        _hold(1)
    try:
        yield
    finally:
        if live:
            _hold(-1)
        _ACTIVE.reset(token)


@contextlib.contextmanager
def reading(points: Mapping[K, HookPoint], replace: bool = False) -> Iterator[dict[K, Any]]:
    """What each of ``points`` passes on in this block, by the caller's key (the last value of a point that runs
    twice). Read after the functions an enclosing block installed (an edit's replacement is what is read), or with
    ``replace`` on the model as it is, unedited."""
    seen: dict[K, Any] = {}

    def keep(key: K) -> PointFn:
        def fn(a: Any) -> Any:
            seen[key] = a
            return a

        return fn

    with hooked({id(p): keep(k) for k, p in points.items()}, replace=replace):
        yield seen


def in_context(fn: Callable[..., T]) -> Callable[..., T]:
    """``fn`` carrying this thread's context (edits, hooks, eval semantics) to wherever it runs: a new thread or a
    pool's worker starts in an empty one. Each call runs in its own copy; finish the work inside the ``with`` block
    that installed what it needs."""
    ctx = contextvars.copy_context()

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> T:
        return ctx.copy().run(fn, *args, **kwargs)

    return run


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


def is_hooked(point: nn.Module) -> bool:
    """Whether ``point`` may be more than the identity in this call: a function installed at it in this context, a
    forward hook of its own or a replaced ``forward``; compiled code cannot read the context, so there it is whether
    anything is installed anywhere. An activation a fused path never forms (an attention pattern) is formed only
    then. Global forward hooks do not count: they are tracers of every module (a FLOP counter's), which measure the
    fused path."""
    if torch.compiler.is_compiling():
        return _live
    active = _ACTIVE.get()
    if active is not None and id(point) in active.points:
        return True
    return bool(point._forward_hooks or point._forward_pre_hooks or "forward" in point.__dict__)


def removed_heads(attention: nn.Module) -> frozenset[int]:
    """The heads of an attention module that the active edits took out (their attention is not in the head mean)."""
    active = _ACTIVE.get()
    return frozenset() if active is None else active.removed.get(id(attention), frozenset())
