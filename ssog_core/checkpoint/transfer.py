"""The zero-shot resolution-transfer curve kept with a checkpoint, read back and checked.

``train`` stores it in the checkpoint's header (``resolution_transfer``, docs/DESIGN.md §4), ``evaluate --store``
adds it there, and ``evaluate --json FILE`` writes the same list to a file; the app looks for
``<stem>.transfer.json`` beside a checkpoint. Either way it is a JSON list of
``{"img_size": [H, W], "tokens": N, "accuracy": A}``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ssog_core.checkpoint.format import TRANSFER_KEY, CheckpointError

BESIDE_SUFFIX = ".transfer.json"  # <stem>.transfer.json beside <stem>.safetensors: an `evaluate --json` file


@dataclass(frozen=True)
class TransferCurve:
    """A checked curve, sorted by token count, and where it was read: ``file`` is None for the checkpoint's
    header, else the JSON file beside it."""

    rows: list[dict[str, Any]]
    file: Path | None

    @property
    def source(self) -> str:
        return "the checkpoint's metadata" if self.file is None else self.file.name


def parse_transfer(data: Any, source: str) -> list[dict[str, Any]]:
    """A resolution-transfer list (a JSON string or its parsed value) checked and sorted by token count; raises
    :class:`CheckpointError` naming ``source`` and the bad entry."""
    if isinstance(data, str):
        try:
            data = json.loads(data)
        except json.JSONDecodeError as e:
            raise CheckpointError(f"{source} is not valid JSON: {e}") from None
    if not isinstance(data, list) or not data:
        raise CheckpointError(f"{source}: a resolution-transfer curve is a non-empty JSON list")
    rows = []
    for i, r in enumerate(data):
        try:
            h, w = (int(v) for v in r["img_size"])
            rows.append({"img_size": [h, w], "tokens": int(r["tokens"]), "accuracy": float(r["accuracy"])})
        except (KeyError, TypeError, ValueError):
            raise CheckpointError(f"{source}, entry {i}: expected img_size [H, W], tokens and accuracy") from None
    return sorted(rows, key=lambda r: r["tokens"])


def beside(path: str | Path) -> Path:
    """Where ``evaluate --json`` output for checkpoint ``path`` is looked for: ``<stem>.transfer.json``."""
    path = Path(path)
    return path.with_name(path.name.removesuffix(".safetensors") + BESIDE_SUFFIX)


def read_transfer(path: str | Path, meta: Mapping[str, Any], look_beside: bool = True) -> TransferCurve | None:
    """The transfer curve of checkpoint ``path``, whose metadata (as :func:`~ssog_core.checkpoint.format.
    load_checkpoint` returns it, header entry included) is ``meta``: from the metadata, else (``look_beside``)
    from ``<stem>.transfer.json`` beside the file; None when neither holds one."""
    name = Path(path).name
    if TRANSFER_KEY in meta:
        return TransferCurve(parse_transfer(meta[TRANSFER_KEY], f"{name} metadata"), None)
    file = beside(path)
    if look_beside and file.is_file():
        return TransferCurve(parse_transfer(file.read_text(encoding="utf-8"), file.name), file)
    return None
