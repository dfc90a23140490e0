"""Deprecated: a standard ViT is a :class:`~ssog_core.nn.vit.ViT` whose config has the family's conventions
(:func:`~ssog_core.nn.config.standard_config`). ``StandardViT`` and ``StandardViTConfig`` still build one, with a
``DeprecationWarning``."""

from __future__ import annotations

import warnings
from typing import Any

from ssog_core.nn.config import ViTConfig, standard_config
from ssog_core.nn.vit import ViT


def _warn(old: str, new: str) -> None:
    warnings.warn(f"{old} is deprecated: use {new}", DeprecationWarning, stacklevel=3)


def StandardViTConfig(family: str = "timm", **fields: Any) -> ViTConfig:  # noqa: N802 (the old class's name)
    """The old standard config's fields as a :class:`ViTConfig` (its ``proj_bias`` covered the MLP's biases too)."""
    _warn("StandardViTConfig", "ssog_core.nn.config.standard_config")
    if "proj_bias" in fields:
        fields["mlp_bias"] = fields["proj_bias"]
    return standard_config(family, **fields)


def StandardViT(config: ViTConfig) -> ViT:  # noqa: N802 (the old class's name)
    _warn("StandardViT", "ssog_core.nn.vit.ViT")
    return ViT(config)
