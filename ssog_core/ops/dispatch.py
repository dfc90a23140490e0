"""Choose the implementation of the SSOG operator for a given input.

Today every input runs the PyTorch reference (:func:`ssog_core.field.apply_field`); faster backends
register here so that modules, training and analysis never need to know which one ran.
"""

from __future__ import annotations

from torch import Tensor

from ssog_core.field import Field, FieldMode, apply_field


def ssog_apply(v: Tensor, field: Field, grid: tuple[int, int], mode: FieldMode = "factorized") -> Tensor:
    """Apply an SSOG field to values ``v`` of shape ``(B, N, H, D)``; returns ``(B, N, H, D)``."""
    return apply_field(v, field, grid, mode)
