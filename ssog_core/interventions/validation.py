"""The validation images an effect is measured on: one definition for the CLI, the app, the notebook and MCP.

They are the *first* ``n`` images of the validation split of the checkpoint's recorded data (``meta["data"]``),
at the model's input size, not a random subset: the procedural data sets label image ``i`` as class ``i mod K``,
so a prefix is balanced, and every caller gets the same images for the same ``n``. :meth:`EvalSet.describe` is
what a result records about them.

:func:`pictures_for` is the one choice of what a model is measured on, for the CLI, the jobs and the app: a folder
the user names, else the recorded data's validation images, else (a model that records no data, e.g. a standard ViT
folder) the bundled pictures; the :class:`EvalSet` it returns says which (:meth:`EvalSet.describe`,
:meth:`EvalSet.words`), so every number made from it can name its pictures. Pictures have no labels, so the
unedited model's own top-1 predictions are the reference (:func:`ssog_core.interventions.result.labelled_by`):
"accuracy" is then agreement with the unedited model and "log p(true)" is log p(the unedited model's class), and
every report names them so (:data:`TERMS`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch import Tensor, nn

from ssog_core.data.images import list_images, load_image
from ssog_core.data.sources import DataError, Transformed, open_data

DEFAULT_EVAL_IMAGES = 500
MAX_EVAL_IMAGES = 2000
BATCH = 100
LABEL, PREDICTION = "label", "unedited prediction"  # what an eval set's outcomes are measured against
TERMS = {  # reference → (what "accuracy" is, what "log p(true)" is, what the images are), in words
    LABEL: ("accuracy", "log p(true class)", "validation images"),
    PREDICTION: ("agreement with the unedited model", "log p(the unedited model's class)", "pictures"),
}
VALIDATION, FOLDER, BUNDLED = "validation", "folder", "bundled"  # where an eval set's images come from
CHOSEN_BUNDLED = "bundled, chosen"  # the bundled pictures, chosen in place of a model's recorded data


@dataclass
class EvalSet:
    """The first ``n`` validation images of a checkpoint's data, as the model takes them (uint8, NHWC); or the first
    ``n`` pictures of a folder (``reference`` :data:`PREDICTION`; ``labels`` ``None`` until the unedited model
    labels them)."""

    images: Tensor
    labels: Tensor | None
    class_names: list[str]
    spec: str
    normalization: dict[str, list[float]] | None = None
    reference: str = LABEL
    source: str = VALIDATION  # VALIDATION, FOLDER (named by the user), BUNDLED (for a model without data) or
    # CHOSEN_BUNDLED (the bundled pictures, named by the user)

    def __len__(self) -> int:
        return len(self.images)

    def words(self) -> str:
        """Which images these are, in words, for every note and chart made from them."""
        return images_words(self.source, len(self), self.spec)

    def describe(self) -> dict[str, Any]:
        """Which images these are, as a result records them."""
        if self.reference == LABEL:
            return {"data": self.spec, "split": "validation", "first": len(self)}
        return {"pictures": self.spec, "first": len(self), "reference": self.reference}

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


def images_words(source: str, n: int, spec: str) -> str:
    """``n`` images from ``source`` (:attr:`EvalSet.source`; ``spec`` the data or the folder's name), in words:
    :meth:`EvalSet.words` of loaded ones, :meth:`Pictures.words` of chosen ones before they are loaded."""
    if source == VALIDATION:
        return f"the first {n} validation images of `{spec}`"
    if source == BUNDLED:
        return f"{n} bundled picture(s) (the model records no validation set)"
    if source == CHOSEN_BUNDLED:
        return f"{n} bundled picture(s)"
    return f"{n} picture(s) of `{spec}`"


def eval_images(n: int | None, split: int) -> int:
    """``n`` (default :data:`DEFAULT_EVAL_IMAGES`) checked against the split and the cap, in words."""
    cap = min(split, MAX_EVAL_IMAGES)
    n = min(DEFAULT_EVAL_IMAGES, cap) if n is None else int(n)
    if not 1 <= n <= cap:
        raise ValueError(f"evaluate 1 to {cap} images (the split holds {split}, at most {MAX_EVAL_IMAGES}), got {n}")
    return n


def reference_of(meta: dict[str, Any], pictures: str | Path | None) -> str:
    """What a model is measured against: :data:`LABEL` (its validation set) when it records its data or no pictures
    are given, else :data:`PREDICTION` (the pictures, labelled by the unedited model)."""
    return LABEL if meta.get("data") or pictures is None else PREDICTION


def picture_count(folder: str | Path) -> int:
    """How many pictures of ``folder`` a model without a validation set can be measured on (at most
    :data:`MAX_EVAL_IMAGES`; 0 when there is no such folder)."""
    return min(len(list_images(folder)), MAX_EVAL_IMAGES) if Path(folder).is_dir() else 0


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


def class_names(model: nn.Module, meta: Mapping[str, Any]) -> list[str]:
    """The checkpoint's class names, or ``class i`` where it records none."""
    return [str(n) for n in meta.get("class_names") or [f"class {i}" for i in range(model.config.num_classes)]]


def load_pictures(
    folder: str | Path,
    img_size: Sequence[int],
    class_names: Sequence[str],
    meta: dict[str, Any],
    n: int | None = None,
    up_to: bool = False,
    source: str = FOLDER,
) -> EvalSet:
    """The first ``n`` pictures of ``folder`` (by name; default all, at most :data:`DEFAULT_EVAL_IMAGES`) at
    ``img_size``, unlabelled: what a model without a validation set is measured on. ``up_to``: ``n`` is a most
    (a folder with fewer gives them all), not a count the folder must hold."""
    paths = list_images(folder) if Path(folder).is_dir() else []
    if not paths:
        raise DataError(f"this model records no validation set, and {folder} holds no pictures to measure it on")
    cap = min(len(paths), MAX_EVAL_IMAGES)
    n = min(DEFAULT_EVAL_IMAGES, cap) if n is None else int(n)
    n = min(n, cap) if up_to else n
    if not 1 <= n <= cap:
        raise ValueError(
            f"evaluate 1 to {cap} pictures ({folder} holds {len(paths)}, at most {MAX_EVAL_IMAGES}), got {n}"
        )
    size = (int(img_size[1]), int(img_size[0]))
    images = [np.asarray(load_image(p).resize(size, Image.Resampling.BICUBIC)) for p in paths[:n]]
    return EvalSet(
        images=torch.from_numpy(np.stack(images)),
        labels=None,
        class_names=list(class_names),
        spec=Path(folder).name,
        normalization=meta.get("normalization"),
        reference=PREDICTION,
        source=source,
    )


def pictures_for(
    model: nn.Module,
    meta: Mapping[str, Any],
    n: int | None = None,
    *,
    folder: str | Path | None = None,
    bundled: str | Path | None = None,
    size: Sequence[int] | None = None,
    up_to: bool = False,
) -> EvalSet:
    """What ``model`` is measured on, the one choice for the CLI, the jobs and the app: the first ``n`` pictures of
    ``folder`` when the user names one; else the first ``n`` validation images of the checkpoint's recorded data;
    else, for a model that records none, the first ``n`` of the ``bundled`` pictures (the app's; the intervene
    command's ``--pictures``). Pictures are unlabelled (``reference`` :data:`PREDICTION`); ``up_to`` takes at most
    ``n`` of them where a folder holds fewer. ``size`` (default the model's) is the images' size; the result names
    its images (:meth:`EvalSet.describe`, :meth:`EvalSet.words`)."""
    size = tuple(model.config.img_size) if size is None else size
    if folder is None and (meta.get("data") or bundled is None):
        return load_eval_set(dict(meta), size, n)
    source = Pictures(None if folder is None else Path(folder), None if bundled is None else Path(bundled))
    where = bundled if folder is None else folder
    return load_pictures(where, size, class_names(model, meta), dict(meta), n, up_to, source.eval_source(meta))


@dataclass(frozen=True)
class Pictures:
    """What a model is measured on, as a caller chose it (:func:`pictures_for`): ``folder`` when the user named
    one (it wins over the recorded data), else the model's recorded validation set, else ``bundled`` (the pictures
    for a model that records none). ``Pictures()`` is the recorded data only."""

    folder: Path | None = None
    bundled: Path | None = None

    @classmethod
    def of(cls, given: Pictures | str | Path | None) -> Pictures:
        """``given`` as a choice: a :class:`Pictures` as it is, a folder as the bundled pictures (the
        pictures for a model without data, as the app's and the intervene command's ``--pictures`` are)."""
        return given if isinstance(given, Pictures) else cls(bundled=None if given is None else Path(given))

    def eval_set(self, model: nn.Module, meta: Mapping[str, Any], n: int | None = None, up_to: bool = False) -> EvalSet:
        """The first ``n`` of them for ``model`` (:func:`pictures_for`)."""
        return pictures_for(model, meta, n, folder=self.folder, bundled=self.bundled, up_to=up_to)

    def key(self, meta: Mapping[str, Any]) -> str | None:
        """Which images these are for a model with ``meta``, in a memo key (``None``: its validation set)."""
        if self.folder is not None:
            return str(self.folder)
        return None if reference_of(dict(meta), self.bundled) == LABEL else str(self.bundled)

    def eval_source(self, meta: Mapping[str, Any]) -> str:
        """Where the images come from for a model with ``meta`` (:attr:`EvalSet.source`), without loading them."""
        if self.folder is None:
            return BUNDLED if self.key(meta) is not None else VALIDATION
        same = self.bundled is not None and Path(self.folder).resolve() == Path(self.bundled).resolve()
        return CHOSEN_BUNDLED if same else FOLDER

    def words(self, meta: Mapping[str, Any], n: int) -> str:
        """The first ``n`` of them for a model with ``meta`` (up to ``n`` pictures), in words, without loading them:
        what :meth:`EvalSet.words` of :meth:`eval_set` with ``up_to`` says."""
        source = self.eval_source(meta)
        if source == VALIDATION:
            return images_words(source, n, str(meta.get("data")))
        folder = Path(self.folder or self.bundled)
        return images_words(source, min(n, picture_count(folder)), folder.name)

    def reference(self, meta: Mapping[str, Any]) -> str:
        """What outcomes on them are measured against (:data:`LABEL` or :data:`PREDICTION`)."""
        return PREDICTION if self.key(meta) is not None else LABEL
