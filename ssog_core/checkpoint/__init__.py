"""Files on disk: the ViT checkpoint format (:mod:`~ssog_core.checkpoint.format`), the language model's
(:mod:`~ssog_core.checkpoint.lm`), the converter from the upstream implementation's state dicts
(:mod:`~ssog_core.checkpoint.upstream`) and atomic writes (:mod:`~ssog_core.checkpoint.files`)."""

from ssog_core.checkpoint.format import (
    TRANSFER_KEY,
    CheckpointError,
    load_checkpoint,
    read_checkpoint,
    save_checkpoint,
    update_metadata,
)

__all__ = [
    "TRANSFER_KEY",
    "CheckpointError",
    "load_checkpoint",
    "read_checkpoint",
    "save_checkpoint",
    "update_metadata",
]
