"""Read a state dict saved by the upstream implementation's PyTorch ViT (the AGPL implementation SSOG Lab converts
from; read for its semantics and file format only) into a validated SSOG Lab ``ViT``.

The file is read with ``torch.load(weights_only=True)``: a pickle that tries to run code is refused, never
executed. Parameter names already match, so conversion is validation: every missing, unexpected or mis-shaped
tensor is reported in one message. The command line is :mod:`ssog_core.cli.convert`.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ssog_core.checkpoint.format import build_model
from ssog_core.checkpoint.weights import CheckpointError, read_weights_only
from ssog_core.field import TAPS
from ssog_core.nn.config import ViTConfig

# The upstream ViT's constructor defaults (its CIFAR-100 setting).
UPSTREAM_DEFAULTS: dict[str, Any] = dict(
    num_classes=100,
    img_size=32,
    patch_size=2,
    dim=256,
    depth=6,
    num_heads=4,
    mlp_ratio=2.0,
    dropout_rate=0.1,
    attn="ssog",
    num_atoms=4,
)


def upstream_config(kwargs: Mapping[str, Any]) -> ViTConfig:
    """Our config for a upstream ``ViT(**kwargs)`` (its SSOG always has all three steering taps).

    Our own field names (``field``, ``steer``, ``max_offset``, ...) are accepted too.
    """
    merged = {**UPSTREAM_DEFAULTS, **kwargs}
    merged["dropout"] = merged.pop("dropout_rate", merged.get("dropout", 0.1))
    lookat = merged.pop("lookat", True)
    merged.setdefault("steer", TAPS if lookat else ())
    return ViTConfig.from_dict(merged)


def convert(path: str | Path, kwargs: Mapping[str, Any]):
    """Reference ``.pt`` + its ViT arguments → a validated float32 ``ViT`` of ours."""
    try:
        config = upstream_config(kwargs)
    except ValueError as e:
        raise CheckpointError(str(e)) from None
    return build_model(config, read_weights_only(path), source=Path(path).name)
