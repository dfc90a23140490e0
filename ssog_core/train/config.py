"""What a training run computes and how it runs: :class:`TrainConfig` (built by the command line, stored in the
resume state and the checkpoint metadata as a plain dict), the options a resumed run may change, and the errors a
run stops with."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from ssog_core.data.sources import CROP_PADDING
from ssog_core.field import TAPS

RUNTIME_OPTIONS = {
    "resume",
    "device",
    "compile",
    "amp",
    "workers",
    "plot",
    "stop_after",
    "ckpt_every",
    "save_dtype",
    "progress",
    "eval_batch_size",
    "out",
    "transfer_sizes",
}


TRANSFER_IMAGES = 1000  # val images per size of the transfer curve measured at the end (keeps it cheap)


SAVE_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


DEFAULT_PATCH = {
    "cifar100": 2,
    "imagefolder": 16,
    "shapes": 4,
    "layouts": 4,
    "pointer": 4,
    "relation": 4,
}  # the SSOG post's 16×16 (CIFAR) and 14×14 (224²) grids


class TrainError(RuntimeError):
    """A run that cannot start or go on, with a message meant for a person."""


class DivergedError(TrainError):
    """The loss became NaN or infinite."""


@dataclass
class TrainConfig:
    """Every setting of a run, one field per ``python -m ssog_core.train`` option (``--mlp-ratio`` → ``mlp_ratio``),
    with the command line's defaults. ``img_size`` and ``patch_size`` ``None`` mean "the data's default"; the
    trainer resolves them. Field order is the command line's: :meth:`to_dict` is what ``train_state.pt`` stores as
    ``args`` and the checkpoint metadata as ``train_args``."""

    # data
    data: str = "shapes"
    img_size: tuple[int, int] | None = None
    augment: tuple[str, ...] = ("crop", "flip")
    crop_pad: int = CROP_PADDING
    workers: int | None = None
    # model
    attn: str = "ssog"
    field: str = "factorized"
    steer: tuple[str, ...] = TAPS
    atoms: int = 4
    patch_size: int | None = None
    dim: int = 256
    depth: int = 6
    heads: int = 4
    mlp_ratio: float = 2.0
    dropout: float = 0.1
    max_offset: float = 4.0
    sigma_floor: float = 0.25
    warm_gates: bool = False
    registers: int = 0
    qk_norm: bool = False
    susie: bool = False
    susie_dim: int = 0
    # optimisation
    epochs: int = 100
    batch_size: int = 128
    lr: float = 1e-3
    weight_decay: float = 0.05
    warmup_epochs: float = 5.0
    gate_lr_mult: float = 1.0
    field_lr_mult: float = 1.0
    seed: int = 0
    # run
    out: str | None = None
    resume: bool = False
    init_from: str | None = None
    ckpt_every: int = 0
    stop_after: int | None = None
    save_dtype: str = "float32"
    plot: bool = False
    tensorboard: str | None = None  # a folder for TensorBoard events (needs the tensorboard package)
    device: str | None = None
    compile: bool = False
    amp: bool | None = None
    eval_batch_size: int = 256
    progress: bool = True
    transfer_sizes: str | tuple[tuple[int, int], ...] = "auto"

    def to_dict(self) -> dict[str, Any]:
        """Plain values (tuples as lists), as ``train_state.pt`` and the checkpoint metadata store them."""
        return {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> TrainConfig:
        """A config from :meth:`to_dict`'s output or an older run's stored ``args``: keys this version does not
        know are ignored, settings the run predates take their defaults."""
        known = {f.name for f in dataclasses.fields(cls)}
        kept = {k: v for k, v in values.items() if k in known}
        for name in ("steer", "augment", "img_size"):
            if kept.get(name) is not None:
                kept[name] = tuple(kept[name])
        sizes = kept.get("transfer_sizes")
        if sizes is not None and not isinstance(sizes, str):
            kept["transfer_sizes"] = tuple(tuple(s) for s in sizes)
        return cls(**kept)


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value
