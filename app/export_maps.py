"""The export maps the Export and Compare tabs and the API share: computed once per model, picture and α, with
their controls (the validation control on the pictures chosen on the page, :mod:`app.pictures`), and the one-line
summary both tabs print under them."""

from __future__ import annotations

from typing import Any

from app import pictures as chooser
from app import queues
from app.state import AppContext, LoadedModel, StoredImage
from ssog_core.analysis.controls import (
    ControlMaps,
    ValidationMaps,
    control_maps,
    differences,
    within_noise_share,
)
from ssog_core.analysis.measures import DEFAULT_IMAGES, ExportMaps, export_maps
from ssog_core.interventions import heavy
from ssog_core.interventions.validation import LABEL, Pictures

ALPHA_PLACES = 4  # α is used to this many decimal places, so the cache key holds exactly what the maps depend on


def maps_for(ctx: AppContext, loaded: LoadedModel, stored: StoredImage, alpha: float) -> ExportMaps:
    """The export maps of a model on a picture (cached: the export and compare tabs and the API share them)."""
    alpha = round(float(alpha), ALPHA_PLACES)

    def make() -> ExportMaps:
        return export_maps(loaded.model, loaded.input(stored.image), alpha)

    return ctx.cache.export_maps.get((loaded.key, stored.sha256, alpha), make)


def chosen(ctx: AppContext, pictures: Pictures | None) -> Pictures:
    """``pictures`` as chosen on the page, or the recorded data (the bundled pictures for a model without it)."""
    return pictures or chooser.chosen(ctx, None)


def validation_words(loaded: LoadedModel, pictures: Pictures, n: int = DEFAULT_IMAGES) -> str:
    """Which images the validation control and the per-class view of ``loaded`` are made from on ``pictures`` (up
    to ``n``), in words (pictures are labelled by the model's own prediction, and the words say so)."""
    words = pictures.words(loaded.meta, n)
    return words if pictures.reference(loaded.meta) == LABEL else f"{words}, each in the class the model predicts"


def validation_for(
    ctx: AppContext,
    loaded: LoadedModel,
    alpha: float,
    blank: bool = False,
    request: Any = None,
    pictures: Pictures | None = None,
) -> ValidationMaps:
    """The maps of the images the validation control stands on (``blank``: of their blank images), cached per
    checkpoint, α and pictures: computed once, as a heavy job (batch export: :func:`app.queues.submitted`), shared
    by the validation control of every picture and the per-class view. The images are the checkpoint's validation
    images, or up to :data:`DEFAULT_IMAGES` of the ``pictures`` chosen on the page (default: the recorded data; a
    model without validation images, a standard ViT, stands on the bundled pictures), each labelled by the
    unedited prediction (:func:`validation_words`). Computing them is the user's one heavy job
    (:func:`app.queues.one_per_user`, the user of ``request``); reading them once cached is not."""
    alpha = round(float(alpha), ALPHA_PLACES)
    pictures = chosen(ctx, pictures)
    key = (loaded.key, DEFAULT_IMAGES, alpha, blank, pictures.key(loaded.meta))
    kept = ctx.cache.validation.peek(key)
    if kept is not None:
        return kept
    n = DEFAULT_IMAGES
    with queues.one_per_user(request):
        return queues.submitted(ctx.cache.validation, key, heavy.export_maps, loaded.key[0], alpha, n, blank, pictures)


def control_for(
    ctx: AppContext,
    loaded: LoadedModel,
    stored: StoredImage,
    raw: ExportMaps,
    control: str,
    request: Any = None,
    pictures: Pictures | None = None,
) -> ControlMaps | None:
    """The control of a picture's maps (None for ``none``), cached beside the maps (the validation control per
    ``pictures`` too); the validation control's batch is a heavy job of the user of ``request``
    (:func:`validation_for`)."""
    if control == "none":
        return None
    pictures = chosen(ctx, pictures)

    def make() -> ControlMaps | None:
        validation = (
            validation_for(ctx, loaded, raw.alpha, request=request, pictures=pictures)
            if control == "validation"
            else None
        )
        x = loaded.input(stored.image)
        return control_maps(loaded.model, loaded.meta, x, raw, control, validation=validation)

    on = pictures.key(loaded.meta) if control == "validation" else None
    return ctx.cache.export_maps.get((loaded.key, stored.sha256, raw.alpha, control, on), make)


def maps_with_control(
    ctx: AppContext,
    loaded: LoadedModel,
    stored: StoredImage,
    alpha: float,
    control: str,
    request: Any = None,
    pictures: Pictures | None = None,
) -> tuple[ExportMaps, ControlMaps | None]:
    """A picture's maps and their control (the validation control on ``pictures``), for a
    :func:`app.queues.may_wait` request: the validation control's batch (the user's heavy job) is waited for first,
    holding nothing; the light work then takes a light slot."""
    if control == "validation":
        validation_for(ctx, loaded, alpha, request=request, pictures=pictures)
    with queues.light_slot():
        maps = maps_for(ctx, loaded, stored, alpha)
        return maps, control_for(ctx, loaded, stored, maps, control, request, pictures)


def summary(name: str, m: ExportMaps, control: ControlMaps | None = None) -> str:
    s = m.summary()
    prefix = m.prefix_share.mean(0)  # (L,) per layer
    extra = (
        f" · prefix tokens (class, distillation, register) took {float(prefix.mean()):.1%} of patch attention "
        f"(per layer {', '.join(f'{float(p):.0%}' for p in prefix)}; left out of the maps, rows renormalised)"
        if float(prefix.max()) > 0
        else ""
    )
    if control is not None:
        d = differences(m, control)["accumulated_difference"][0]
        extra += f" · raw − control in [{float(d.min()):.3f}, {float(d.max()):.3f}]"
        if control.noise is not None:
            within = float(within_noise_share(m, control)[0])
            extra += (
                f" · {within:.0%} of cells within the blank's noise floor (its map moves by up to "
                f"{float(control.noise[0].max()):.3f} for colours within ±1/255)"
            )
    return (
        f"**{name}**: accumulated net export in [{s['acc_min']:.3f}, {s['acc_max']:.3f}], "
        f"**{s['exporter_share']:.0%}** of patches are net exporters (red){extra}"
    )
