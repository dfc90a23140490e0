"""What every model the lab opens offers (:class:`LabModel`): the analysis, the interventions and the app read a model
through these members only, never through where it came from (a lab checkpoint, an upstream ``.pt``, a timm or
transformers folder). :class:`~ssog_core.nn.vit.ViT` is the one model that has them.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from torch import Tensor, nn

from ssog_core.nn.config import ViTConfig


@runtime_checkable
class LabModel(Protocol):
    """A hooked image model: its hook points are the :class:`~ssog_core.nn.hook_points.HookPoint` submodules
    ``blocks.{l}.attn.hook_in``, ``…attn.pattern``, ``…attn.head_out``, ``blocks.{l}.resid_post`` (and with SSOG
    attention ``…attn.field``, ``…attn.probes.{tap}``), reached by module path
    (:func:`ssog_core.interventions.hooks.hook_points`)."""

    config: ViTConfig  # the architecture, with ``family`` (whose conventions) and ``attn`` (which attention)
    blocks: nn.ModuleList  # each ``block(x, grid)``; ``block.attn`` has ``num_heads`` and ``attention_matrix``

    @property
    def num_prefix_tokens(self) -> int:
        """Tokens before the patches (class, distillation, registers)."""
        ...

    @property
    def patch_size(self) -> int:
        """Pixels per patch side."""
        ...

    @property
    def normalization(self) -> dict[str, list[float]] | None:
        """The mean and std the model applies to its [0, 1] input itself, or None."""
        ...

    def grid_for(self, height: int, width: int) -> tuple[int, int]:
        """The patch grid of a picture of this size (refused unless the patch divides both sides)."""
        ...

    def embed(self, img: Tensor) -> tuple[Tensor, tuple[int, int]]:
        """Tokens entering the first block, prefix first, and the patch grid."""
        ...

    def readout(self, x: Tensor) -> Tensor:
        """Logits from the residual stream after the last block."""
        ...

    def __call__(self, img: Tensor) -> Tensor: ...
