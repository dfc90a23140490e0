"""Read a state dict saved by the upstream implementation's PyTorch ViT (the AGPL implementation SSOG Lab converts
from; read for its semantics and file format only) into a validated SSOG Lab ``ViT``.

The file is read with ``torch.load(weights_only=True)``: a pickle that tries to run code is refused, never
executed. Parameter names already match, so conversion is validation: every missing, unexpected or mis-shaped
tensor is reported in one message. The command line is :mod:`ssog_core.cli.convert`.
"""

from __future__ import annotations

import pickle
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ssog_core.checkpoint.format import CheckpointError, build_model
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
_WRAPPER_PREFIXES = ("_orig_mod.", "module.")  # torch.compile and DistributedDataParallel


def upstream_config(kwargs: Mapping[str, Any]) -> ViTConfig:
    """Our config for a upstream ``ViT(**kwargs)`` (its SSOG always has all three steering taps).

    Our own field names (``field``, ``steer``, ``max_offset``, ...) are accepted too.
    """
    merged = {**UPSTREAM_DEFAULTS, **kwargs}
    merged["dropout"] = merged.pop("dropout_rate", merged.get("dropout", 0.1))
    lookat = merged.pop("lookat", True)
    merged.setdefault("steer", TAPS if lookat else ())
    return ViTConfig.from_dict(merged)


def clean_state_dict(obj: Any) -> dict[str, Tensor]:
    """The tensors of a loaded ``.pt`` object, unwrapped from training dicts and wrapper prefixes."""
    if isinstance(obj, Mapping):
        for key in ("model", "state_dict", "model_state_dict"):
            if isinstance(obj.get(key), Mapping):
                obj = obj[key]
                break
    if not isinstance(obj, Mapping) or not all(isinstance(v, Tensor) for v in obj.values()):
        raise CheckpointError("the file does not hold a state dict (a mapping of names to tensors)")
    state = {}
    for name, t in obj.items():
        for prefix in _WRAPPER_PREFIXES:
            if name.startswith(prefix):
                name = name[len(prefix) :]
        state[name] = t
    return state


def _unpickler_detail(message: str) -> str:
    """What torch's weights-only unpickler stumbled on (e.g. the function a pickle would call), without its
    advice to retry with ``weights_only=False``, which is exactly what must never be done with such a file."""
    found = re.search(r"Unsupported global: GLOBAL (\S+)", message)
    if found:
        return f" (it would call {found.group(1)})"
    found = re.search(r"WeightsUnpickler error:\s*(.+)", message)
    return f" ({found.group(1).strip()[:120]})" if found else ""


def load_upstream(path: str | Path) -> dict[str, Tensor]:
    """Read a upstream ``.pt`` safely (``weights_only=True``: tensors and plain containers only)."""
    path = Path(path)
    if not path.is_file() or path.stat().st_size == 0:
        raise CheckpointError(f"{path.name}: missing or empty file")
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        raise CheckpointError(
            f"{path.name} was refused: it contains objects other than tensors and plain containers, "
            f"so loading it could run code{_unpickler_detail(str(e))}"
        ) from None
    except (RuntimeError, EOFError, OSError, ValueError) as e:
        raise CheckpointError(f"{path.name} is not a readable PyTorch file (truncated or corrupt?): {e}") from None
    return clean_state_dict(obj)


def convert(path: str | Path, kwargs: Mapping[str, Any]):
    """Reference ``.pt`` + its ViT arguments → a validated float32 ``ViT`` of ours."""
    try:
        config = upstream_config(kwargs)
    except ValueError as e:
        raise CheckpointError(str(e)) from None
    return build_model(config, load_upstream(path), source=Path(path).name)
