"""A control for export maps and rollout: what the maps already show on an image without this image's content.

A trained model's accumulated export is not only about the picture: on a blank grey image an SSOG model's map is
already a centred blob, and objects in a procedural set cover the centre, so "export sits on the object" can be
position alone. A control separates the two; the difference raw − control is what this image changes:

* ``none`` — the raw maps only;
* ``blank`` — the maps of a blank image of the image's mean colour (position and colour, no content), with its
  noise floor: how far the blank maps move when that colour moves by up to ±1/255 per channel (a trained model's
  blank map can move by a tenth of its range for less than that), so a difference within it is not read as an
  effect of the image;
* ``validation`` — the mean maps over N images of the checkpoint's validation data (its metadata's ``data``): what
  the model does on a typical image of its task; or over pictures chosen in its place (:func:`maps_over`, each
  labelled by the model's own prediction).

:func:`class_maps` gives the dataset-level view: the mean accumulated export per class over the validation images,
raw and against a control.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from PIL import Image
from torch import Tensor, nn

from ssog_core.analysis.measures import DEFAULT_ALPHA, DEFAULT_IMAGES, ExportMaps, export_maps
from ssog_core.data.images import to_tensor
from ssog_core.data.sources import DataError, Transformed, open_data

CONTROLS = ("none", "blank", "validation")
BATCH = 16
NOISE_SHIFT = 1 / 255  # the blank control's noise floor: its mean colour moved by up to one grey level per channel


@dataclass(frozen=True)
class ControlMaps:
    """A control's accumulated map and rollout, ``(B, Gh, Gw)`` like the raw maps they are compared with.

    Attributes:
        control: ``blank`` or ``validation``.
        accumulated: the control's accumulated net export.
        rollout: the control's attention rollout.
        images: the pictures behind each control map (1 for ``blank``, N for ``validation``).
        noise: ``blank`` only: per cell, the spread (max − min) of the accumulated map over blank images whose
            colour differs from the mean colour by ±:data:`NOISE_SHIFT` per channel (the 8 corners of that cube
            and the centre); a raw − control difference within it is within noise.
    """

    control: str
    accumulated: Tensor
    rollout: Tensor
    images: int
    noise: Tensor | None = None


@dataclass(frozen=True)
class ValidationMaps:
    """Accumulated export and rollout of every validation image used (``(N, Gh, Gw)``), with the labels."""

    accumulated: Tensor
    rollout: Tensor
    labels: Tensor
    class_names: list[str]
    alpha: float

    def control(self, batch: int = 1) -> ControlMaps:
        """The mean maps, repeated for a batch of ``batch`` images."""
        mean = [x.double().mean(0).float().expand(batch, -1, -1) for x in (self.accumulated, self.rollout)]
        return ControlMaps("validation", mean[0], mean[1], len(self.labels))


def describe(control: str, images: int = 0, pictures: str | None = None) -> str:
    """The control in words, for figure legends and summaries; ``pictures``: which images the validation control
    was made from, in words, where they were chosen in place of the validation set."""
    validation = f"the mean over {images} validation images (a model that records none: the bundled pictures)"
    return {
        "none": "none (raw maps)",
        "blank": "a blank image of the image's mean colour",
        "validation": f"the mean over {pictures}" if pictures else validation,
    }[check_control(control)]


def check_control(control: str) -> str:
    if control not in CONTROLS:
        raise ValueError(f"control {control!r}: use one of {', '.join(CONTROLS)}")
    return control


def blank_images(img: Tensor) -> Tensor:
    """Each image of ``(B, C, H, W)`` replaced by its mean colour. The model input is already normalised, and
    normalisation is affine per channel, so this is the blank picture of the mean colour as the model sees it."""
    return img.mean(dim=(-2, -1), keepdim=True).expand_as(img).contiguous()


def colour_shifts(channels: int, normalization: dict[str, list[float]] | None = None) -> Tensor:
    """The corners of the cube ±:data:`NOISE_SHIFT` per channel, ``(2**channels, channels)``, in the model's input
    units (a normalised input divides a shift by the channel's std)."""
    corners = torch.cartesian_prod(*[torch.tensor([-1.0, 1.0])] * channels).reshape(-1, channels)
    std = torch.tensor(normalization["std"]) if normalization else torch.ones(channels)
    return corners * NOISE_SHIFT / std


def blank_control(
    model: nn.Module, img: Tensor, alpha: float = DEFAULT_ALPHA, normalization: dict[str, list[float]] | None = None
) -> ControlMaps:
    """The blank image's maps and their noise floor (one batch: the blank and its colour-shifted copies)."""
    blank = blank_images(img)
    shifts = colour_shifts(img.shape[1], normalization).to(blank)
    batch = torch.cat([blank, *(blank + s.view(1, -1, 1, 1) for s in shifts)])
    m = export_maps(model, batch, alpha)
    b = img.shape[0]
    acc = m.accumulated.reshape(len(shifts) + 1, b, *m.accumulated.shape[1:])
    return ControlMaps("blank", acc[0], m.rollout[:b], 1, acc.amax(0) - acc.amin(0))


def validation_batch(meta: dict[str, Any], size: tuple[int, int], n: int) -> tuple[Tensor, Tensor, list[str]]:
    """The first ``n`` validation images of the checkpoint's recorded data at ``size`` (the images every effect is
    measured on, :mod:`ssog_core.interventions.validation`: the procedural data sets label image ``i`` as class
    ``i mod K``, so a prefix holds every class), normalised as the metadata says; with their labels and class
    names."""
    spec = meta.get("data")
    if not isinstance(spec, str) or not spec:
        raise DataError("the checkpoint does not record its training data (metadata 'data'): no validation control")
    try:
        source = open_data(spec, size)
    except (ValueError, OSError) as e:
        raise DataError(f"the checkpoint's recorded data {spec!r} cannot be opened here: {e}") from None
    data = Transformed(source.val, size)
    keep = range(min(n, len(data)))
    norm = meta.get("normalization")
    pairs = [data[i] for i in keep]
    x = torch.stack([to_tensor(Image.fromarray(a), normalization=norm) for a, _ in pairs])
    return x, torch.tensor([label for _, label in pairs]), source.class_names


def _like(model: nn.Module, x: Tensor) -> Tensor:
    p = next(model.parameters())
    return x.to(device=p.device, dtype=p.dtype)


def validation_maps(
    model: nn.Module,
    meta: dict[str, Any],
    alpha: float = DEFAULT_ALPHA,
    n: int = DEFAULT_IMAGES,
    size: tuple[int, int] | None = None,
    blank: bool = False,
) -> ValidationMaps:
    """The maps of ``n`` validation images at ``size`` (default: the model's); ``blank=True`` gives the maps of
    each one's blank image instead (what :func:`class_maps` subtracts for the ``blank`` control)."""
    if n < 1:
        raise ValueError(f"a validation control needs at least one image, got {n}")
    size = tuple(size or model.config.img_size)
    x, labels, names = validation_batch(meta, size, n)
    chunks = (_like(model, x[start : start + BATCH]) for start in range(0, len(x), BATCH))
    return maps_over(model, chunks, labels, names, alpha, blank)


def maps_over(
    model: nn.Module,
    batches: Iterable[Tensor],
    labels: Tensor,
    class_names: list[str],
    alpha: float = DEFAULT_ALPHA,
    blank: bool = False,
) -> ValidationMaps:
    """The maps of images given as model-input batches, with their labels (``blank=True``: of each one's blank
    image): the validation control's mean and the per-class view, whichever images stand for the validation set."""
    acc, roll = [], []
    for chunk in batches:
        m = export_maps(model, blank_images(chunk) if blank else chunk, alpha)
        acc.append(m.accumulated)
        roll.append(m.rollout)
    return ValidationMaps(torch.cat(acc), torch.cat(roll), labels, class_names, alpha)


def control_maps(
    model: nn.Module,
    meta: dict[str, Any],
    img: Tensor,
    raw: ExportMaps,
    control: str,
    n: int = DEFAULT_IMAGES,
    validation: ValidationMaps | None = None,
) -> ControlMaps | None:
    """The ``control`` of ``raw`` (the maps of ``img``), or None for ``none``. ``validation``: the validation maps
    already computed (the app caches them per checkpoint); else they are computed here at the image's size."""
    if check_control(control) == "none":
        return None
    if control == "blank":
        return blank_control(model, img, raw.alpha, meta.get("normalization"))
    if validation is None:
        validation = validation_maps(model, meta, raw.alpha, n, tuple(img.shape[-2:]))
    return validation.control(img.shape[0])


def differences(raw: ExportMaps, control: ControlMaps) -> dict[str, Tensor]:
    """raw − control for the accumulated map and rollout; with a noise floor (``blank``) also which cells of the
    accumulated difference lie within it."""
    out = {
        "accumulated_difference": raw.accumulated - control.accumulated,
        "rollout_difference": raw.rollout - control.rollout,
    }
    if control.noise is not None:
        out["accumulated_within_noise"] = out["accumulated_difference"].abs() <= control.noise
    return out


def within_noise_share(raw: ExportMaps, control: ControlMaps) -> Tensor | None:
    """Per image ``(B,)``, the share of cells whose accumulated raw − control lies within the control's noise floor
    (None for a control without one)."""
    if control.noise is None:
        return None
    return differences(raw, control)["accumulated_within_noise"].flatten(1).float().mean(1)


@dataclass(frozen=True)
class ClassMaps:
    """Mean accumulated export per class over the validation images (``(classes, Gh, Gw)``).

    Attributes:
        raw: each class's mean raw map.
        control: ``none``, ``blank`` or ``validation``.
        difference: each class's mean of raw − control (None for ``none``): for ``validation`` the class mean minus
            the mean over all the images, for ``blank`` the mean over the class of each image minus its blank map.
        counts: images per class.
    """

    raw: Tensor
    control: str
    difference: Tensor | None
    counts: Tensor
    class_names: list[str]
    alpha: float


def class_maps(raw: ValidationMaps, control: str, blank: ValidationMaps | None = None) -> ClassMaps:
    """Per-class means of the validation maps ``raw``; ``blank`` (the same images' blank maps) for ``blank``."""
    check_control(control)
    if control == "blank" and blank is None:
        raise ValueError("the blank control per class needs the blank maps of the same validation images")
    classes = len(raw.class_names)
    counts = torch.bincount(raw.labels, minlength=classes)
    acc = raw.accumulated.double()

    def by_class(x: Tensor) -> Tensor:
        sums = torch.zeros(classes, *x.shape[1:], dtype=x.dtype).index_add_(0, raw.labels, x)
        return (sums / counts.clamp_min(1).view(-1, 1, 1)).float()

    diff = None
    if control == "validation":
        diff = by_class(acc - acc.mean(0))
    elif control == "blank":
        diff = by_class(acc - blank.accumulated.double())
    return ClassMaps(by_class(acc), control, diff, counts, raw.class_names, raw.alpha)
