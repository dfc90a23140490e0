"""Checkpoints: safetensors weights with the model config and metadata in the header (docs/DESIGN.md §4).

Nothing here ever unpickles. Loading validates everything a file could get wrong (format, config,
missing / unexpected / mis-shaped tensors, non-finite values) and reports all of it in one message.
Saving writes a temporary file beside the target and renames it, so an interrupted save leaves the
previous checkpoint intact.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from torch import Tensor, nn

from ssog_core.checkpoint.history import PREFIX as HISTORY_PREFIX
from ssog_core.checkpoint.history import History, split_history
from ssog_core.checkpoint.portable import portable_meta
from ssog_core.checkpoint.standard import is_standard_source, load_standard
from ssog_core.checkpoint.weights import (
    CheckpointError,
    cpu_state_dict,
    load_weights,
    read_safetensors,
    software_versions,
    unwrap,
    write_safetensors,
)
from ssog_core.nn.config import ViTConfig

FORMAT = "ssog-lab/1"
TRANSFER_KEY = "resolution_transfer"  # header entry: JSON list of {"img_size": [H, W], "tokens": N, "accuracy": A}


def save_checkpoint(
    path: str | Path,
    model: nn.Module,
    meta: Mapping[str, Any] | None = None,
    dtype: torch.dtype | None = None,
    header: Mapping[str, str] | None = None,
    history: History | None = None,
) -> Path:
    """Write ``model`` (its config, weights and ``meta``) to ``path`` atomically.

    Args:
        meta: JSON-serialisable metadata (class names, normalisation, training command, data, epochs,
            accuracy, ...); software versions are added, absolute paths made relative to the working directory
            (:func:`~ssog_core.checkpoint.portable.portable_meta`).
        dtype: store floating-point weights in this dtype (e.g. ``torch.float16`` for shipping).
        header: further safetensors header entries (strings), e.g. ``TRANSFER_KEY``.
        history: the training history, stored as float32 ``history.*`` tensors beside the weights.
    """
    config: ViTConfig = unwrap(model).config
    full_meta = portable_meta({"software": software_versions(), **(meta or {})})
    entries = {
        **(header or {}),
        "format": FORMAT,
        "config": json.dumps(config.to_dict()),
        "meta": json.dumps(full_meta),
    }
    state = cpu_state_dict(model, dtype)
    if history is not None:
        state.update(history.to_tensors())
    return write_safetensors(path, state, entries)


def update_metadata(path: str | Path, entries: Mapping[str, str]) -> Path:
    """Add or replace header entries of an existing checkpoint (e.g. its transfer curve), tensors untouched:
    the file is rewritten beside itself and renamed, so a reader never sees it half-written."""
    if {"format", "config", "meta"} & set(entries):
        raise ValueError("format, config and meta are written by save_checkpoint only")
    read_checkpoint(path)  # refuse to touch anything but a valid SSOG Lab checkpoint
    header, state = read_safetensors(path)
    return write_safetensors(path, state, {**header, **entries})


def build_model(config: ViTConfig, state: Mapping[str, Tensor], source: str = "checkpoint") -> nn.Module:
    """A ``ViT`` holding ``state`` (float32), after checking that every tensor fits."""
    from ssog_core.nn.vit import ViT

    layers = {k.split(".")[1] for k in state if k.startswith("blocks.") and k.count(".") > 1}
    if len(layers) != config.depth:  # before building: a config claiming a million layers would take hours
        raise CheckpointError(
            f"{source} does not match its config ({config.attn}): depth {config.depth}, but it holds the weights "
            f"of {len(layers)} layer(s)"
        )
    with torch.device("meta"):
        model = ViT(config)
    return load_weights(model, state, source, config.attn)


def read_checkpoint(path: str | Path) -> tuple[ViTConfig, dict[str, Tensor], dict[str, Any]]:
    """Config, raw tensors and metadata of a ViT checkpoint file, with clear errors for bad files."""
    config, state, meta, _ = read_checkpoint_with_history(path)
    return config, state, meta


def has_history(path: str | Path) -> bool:
    """Whether a safetensors checkpoint stores a training history (reads the header only; False if unreadable or a
    model folder)."""
    if Path(path).is_dir():
        return False
    try:
        with safe_open(str(path), framework="pt") as f:
            return any(k.startswith(HISTORY_PREFIX) for k in f.keys())  # noqa: SIM118 (safe_open is not a dict)
    except (OSError, SafetensorError):
        return False


def read_history(path: str | Path) -> History | None:
    """The training history stored in a checkpoint, or ``None`` (trained before histories, or converted; a model
    folder in timm's or transformers' layout records none)."""
    if Path(path).is_dir():
        return None
    return read_checkpoint_with_history(path)[3]


def read_checkpoint_with_history(
    path: str | Path,
) -> tuple[ViTConfig, dict[str, Tensor], dict[str, Any], History | None]:
    """:func:`read_checkpoint` plus the training history (``history.*`` tensors, never part of the model)."""
    name = Path(path).name
    header, state = read_safetensors(path)
    if header.get("format") != FORMAT or "config" not in header:
        raise CheckpointError(
            f"{name} has no SSOG Lab header (format {header.get('format')!r}); if it holds an upstream-"
            "implementation state dict, convert it with `python -m ssog_core convert`"
        )
    try:
        config = ViTConfig.from_dict(json.loads(header["config"]))
        meta = json.loads(header.get("meta", "{}"))
        if not isinstance(meta, dict):
            raise ValueError(f"its meta entry is {type(meta).__name__}, not a JSON object")
        if TRANSFER_KEY in header:
            meta[TRANSFER_KEY] = json.loads(header[TRANSFER_KEY])
    except (json.JSONDecodeError, ValueError, TypeError) as e:
        raise CheckpointError(f"{name} has an unusable model config or metadata: {e}") from None
    try:
        state, history = split_history(state)
    except ValueError as e:
        raise CheckpointError(f"{name}: {e}") from None
    return config, state, meta, history


def load_checkpoint(path: str | Path, device: str | torch.device = "cpu") -> tuple[nn.Module, dict[str, Any]]:
    """Load a checkpoint as an eval-mode float32 :class:`~ssog_core.nn.vit.ViT` plus its metadata (``meta["config"]``
    added); a folder or ``hf-hub:ORG/NAME`` (timm or transformers) too, its config carrying the family's conventions
    (:mod:`ssog_core.checkpoint.standard`)."""
    if is_standard_source(path):
        return load_standard(path, device)
    config, state, meta = read_checkpoint(path)
    model = build_model(config, state, source=Path(path).name).to(device)
    return model, {**meta, "config": config.to_dict()}
