"""Where an intervention reaches into a running model: the per-call hooks the attention modules consult.

:mod:`ssog_core.analysis.interventions` builds one :class:`LayerHook` per edited layer and installs them for the length
of a ``with`` block through a :class:`~contextvars.ContextVar`. A context variable (not a module attribute, not a
forward hook) because the app shares one model between users whose requests run in worker threads: each thread
sees only its own edits, an edit cannot outlive its call, and the model's parameters are never written.

This module imports nothing from the rest of the package, so the attention modules and the analysis layer can
both consult it without an import cycle.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextvars import ContextVar
from typing import TYPE_CHECKING, Protocol

import torch

if TYPE_CHECKING:
    from torch import Tensor, nn

    from ssog_core.field import Field


class LayerHook(Protocol):
    """What an edit plan changes in one attention layer (each method returns new tensors, never in place)."""

    removed_heads: frozenset[int]  # heads whose output is not this input's attention (ablated or patched)

    def fixed(self, field: Field) -> Field:
        """The layer's content-free field, edited (atoms replaced, dropped or mirrored)."""

    def probes(self, probes: dict[str, Tensor]) -> dict[str, Tensor]:
        """The bounded steering probes per tap, edited (gates closed, patched, mirrored); a tap left out is fixed."""

    def output(self, y: Tensor) -> Tensor:
        """The per-head attention output ``(B, N, H, D)`` before the output projection, edited."""


_ACTIVE: ContextVar[Mapping[int, LayerHook] | None] = ContextVar("ssog_active_edits", default=None)


def hook_for(module: nn.Module) -> LayerHook | None:
    """The active hook of an attention module in this call (``None``: run it unedited). A compiled model (training
    on CUDA) never has one: the check is a constant for the compiler, so it adds no graph break."""
    if torch.compiler.is_compiling():
        return None
    active = _ACTIVE.get()
    return None if active is None else active.get(id(module))


def install(hooks: Mapping[int, LayerHook]) -> object:
    """Make ``hooks`` (keyed by ``id`` of the attention module) active in this context; returns the token that
    :func:`uninstall` takes. Callers hold the modules alive for as long as the hooks are installed."""
    return _ACTIVE.set(dict(hooks))


def uninstall(token: object) -> None:
    _ACTIVE.reset(token)  # type: ignore[arg-type]
