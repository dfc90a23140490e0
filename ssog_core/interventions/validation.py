"""The validation images an effect is measured on: one definition for the CLI, the app, the notebook and MCP.

They are the *first* ``n`` images of the validation split of the checkpoint's recorded data (``meta["data"]``),
at the model's input size, not a random subset: the procedural data sets label image ``i`` as class ``i mod K``,
so a prefix is balanced, and every caller gets the same images for the same ``n``. :meth:`EvalSet.describe` is
what a result records about them.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from ssog_core.data.sources import DataError, Transformed, open_data

DEFAULT_EVAL_IMAGES = 500
MAX_EVAL_IMAGES = 2000
BATCH = 100


@dataclass
class EvalSet:
    """The first ``n`` validation images of a checkpoint's data, as the model takes them (uint8, NHWC)."""

    images: Tensor
    labels: Tensor
    class_names: list[str]
    spec: str
    normalization: dict[str, list[float]] | None = None

    def __len__(self) -> int:
        return len(self.labels)

    def describe(self) -> dict[str, Any]:
        """Which images these are, as a result records them."""
        return {"data": self.spec, "split": "validation", "first": len(self)}

    def batch(
        self, start: int, stop: int, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32
    ) -> Tensor:
        """Images ``start:stop`` as a model input ``(B, C, H, W)`` in [0, 1] (normalised if the checkpoint is)."""
        x = self.images[start:stop].to(device).permute(0, 3, 1, 2).to(dtype).div_(255.0)
        if self.normalization:
            mean = torch.tensor(self.normalization["mean"], device=x.device, dtype=dtype).view(1, -1, 1, 1)
            std = torch.tensor(self.normalization["std"], device=x.device, dtype=dtype).view(1, -1, 1, 1)
            x = (x - mean) / std
        return x

    def batches(self, model: nn.Module, batch_size: int = BATCH) -> Iterator[Tensor]:
        """The images in batches, on the model's device and in its dtype."""
        p = next(model.parameters())
        for s in range(0, len(self), batch_size):
            yield self.batch(s, min(s + batch_size, len(self)), p.device, p.dtype)


def eval_images(n: int | None, split: int) -> int:
    """``n`` (default :data:`DEFAULT_EVAL_IMAGES`) checked against the split and the cap, in words."""
    cap = min(split, MAX_EVAL_IMAGES)
    n = min(DEFAULT_EVAL_IMAGES, cap) if n is None else int(n)
    if not 1 <= n <= cap:
        raise ValueError(f"evaluate 1 to {cap} images (the split holds {split}, at most {MAX_EVAL_IMAGES}), got {n}")
    return n


def load_eval_set(meta: dict[str, Any], img_size: Sequence[int], n: int | None = None) -> EvalSet:
    """The first ``n`` validation images of ``meta["data"]`` (the checkpoint's recorded data) at ``img_size``."""
    spec = meta.get("data")
    if not spec:
        raise DataError("this checkpoint does not record its data (meta['data']): there is no validation set to use")
    size = (int(img_size[0]), int(img_size[1]))
    source = open_data(spec, size)
    names = meta.get("class_names")
    if names and list(names) != list(source.class_names):
        raise DataError(f"{spec} has other classes than the checkpoint ({', '.join(source.class_names[:3])}, ...)")
    n = eval_images(n, len(source.val))
    data = Transformed(source.val, size)
    items = [data[i] for i in range(n)]
    return EvalSet(
        images=torch.from_numpy(np.stack([a for a, _ in items])),
        labels=torch.tensor([int(y) for _, y in items]),
        class_names=list(source.class_names),
        spec=spec,
        normalization=meta.get("normalization"),
    )
