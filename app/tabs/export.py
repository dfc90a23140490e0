"""Tab 4, export maps: which patches the others read from (sources) and which gather (per layer and summed),
the SSOG model beside its dot twin, and attention rollout for comparison; against a control (a blank image, or the
mean over validation images: :mod:`ssog_core.analysis.controls`), and per class over the validation images. The
validation images are the pictures chosen at the top of the page (:mod:`app.pictures`; by default the model's
recorded data), named wherever a number made from them is shown."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

import gradio as gr
from gradio.blocks import Block

from app import pictures as chooser
from app import plots, widgets
from app.common import Updates, error_text, shown_figure, warn, write_downloads
from app.export_maps import maps_with_control, summary, validation_for, validation_words
from app.session_protocol import Restoring, SessionPart
from app.state import AppContext, AppError, LoadedModel, StoredImage, resize_note
from app.widgets import layer_update, model_depth
from ssog_core.analysis.controls import (
    CONTROLS,
    class_maps,
    describe,
)
from ssog_core.analysis.measures import DEFAULT_ALPHA
from ssog_core.analysis.session import NO_TWIN
from ssog_core.interventions.validation import Pictures
from ssog_core.viz import figures as viz
from ssog_core.viz import files as figures
from ssog_core.viz import raster


@dataclass(frozen=True)
class ExportUI:
    """The tab's components, by name, and the inputs every render reads."""

    twin: gr.Dropdown
    alpha: gr.Slider
    layer: gr.Slider
    control: gr.Dropdown
    layout: gr.Radio  # wide (every layer) or narrow (this layer in two columns: a phone)
    text: gr.Markdown
    figure: gr.Image
    control_figure: gr.Image
    accumulated: gr.Plot
    files: gr.File
    files_status: gr.Markdown
    classes: gr.Image
    classes_status: gr.Markdown
    inputs: list[Block]  # checkpoint, twin, image, α, layer, the query picked in Steering, the control, the layout,
    # the pictures chosen at the top of the page

    @property
    def outputs(self) -> list[Block]:
        """What :func:`render` changes."""
        return [self.text, self.figure, self.accumulated, self.layer, self.control_figure]

    @property
    def rendered(self) -> list[Block]:
        """What :func:`render` may change: :attr:`outputs`, and the control picker's help (naming its pictures)."""
        return [*self.outputs, self.control]


def control_info(loaded: LoadedModel, pictures: Pictures) -> str:
    """The control picker's help for ``loaded``, naming the pictures its validation control is made from."""
    return (
        f"blank: the image's mean colour; validation: the mean over {validation_words(loaded, pictures)} (computed "
        "once per checkpoint, α and pictures; the pictures are chosen at the top of the page)"
    )


def chosen_words(loaded: LoadedModel, pictures: Pictures, n: int) -> str | None:
    """The ``n`` pictures of the validation control in words where they were chosen in place of the recorded data
    (None for the recorded data, which :func:`~ssog_core.analysis.controls.describe` and :func:`images_text`
    name)."""
    return validation_words(loaded, pictures, n) if pictures.folder is not None else None


def _display(stored: StoredImage, loaded: LoadedModel):
    return raster.model_view(stored.image, loaded.config.img_size, figures.EXPORT_WIDTH)


def with_twin(ctx: AppContext, ckpt: str, loaded: LoadedModel, twin: str | None) -> list[tuple[str, LoadedModel]]:
    """The picked model, and its twin when one other than it is picked."""
    return [(ckpt, loaded)] + ([(twin, ctx.model(twin))] if twin and twin != NO_TWIN and twin != ckpt else [])


def render(
    ctx: AppContext,
    ui: ExportUI,
    ckpt: str | None,
    twin: str | None,
    sha: str | None,
    alpha: float,
    layer: float,
    query: Any = None,
    control: str = "none",
    layout: str = "wide",
    pictures: str | None = None,
    request: gr.Request | None = None,
) -> Updates:
    """The summary, the figure, the accumulated-map plot, the layer slider, and with a control the figure of raw,
    control and raw − control; ``query``, the patch picked in Steering, is outlined on every map; ``layout``
    "narrow" draws one layer in two columns (a phone's width); ``pictures`` (the page's chooser) are what the
    validation control is the mean over."""
    if not ckpt or not sha:
        missing = "a checkpoint" if not ckpt else "an image (top of the page)"
        return {ui.text: f"Pick {missing} to compute export maps.", ui.figure: None, ui.accumulated: None,
                ui.control_figure: None}  # fmt: skip
    try:
        loaded, stored, chosen = ctx.model(ckpt), ctx.image(sha), chooser.chosen(ctx, pictures)
        pairs = with_twin(ctx, ckpt, loaded, twin)
        computed = [maps_with_control(ctx, lm, stored, alpha, control, request, chosen) for _, lm in pairs]
        models = [(n, lm, m) for (n, lm), (m, _) in zip(pairs, computed, strict=True)]
        controls = [c for _, c in computed]
        depth = max(m.net.shape[1] for _, _, m in models)
        asked = layer  # the slider's value: sent back only if it has to move into the range
        layer = min(int(layer or 0), depth - 1)
        q = (int(query[0]), int(query[1])) if query else None
        named = [(n, m) for n, _, m in models]
        narrow = layout == "narrow"
        fig = figures.named_export_maps_figure(named, _display(stored, loaded), layer, stored.name, q, narrow)
        names = "+".join(figures.stem_of(n) for n, _, _ in models)
        meta = {"figure": "export maps", "checkpoints": [n for n, _, _ in models], "image": stored.name,
                "image_sha256": sha, "alpha": float(alpha), "layer": layer, "colormap": viz.NET_CMAP,
                "query": list(q) if q else None, "layout": "narrow" if narrow else "wide"}  # fmt: skip
        stem = f"export_{names}_{sha[:8]}_L{layer}_alpha{alpha:.2f}_{viz.NET_CMAP}" + ("_narrow" if narrow else "")
        shown = shown_figure(fig, stem, meta)
        control_shown = None
        named = chosen_words(loaded, chosen, controls[0].images) if controls[0] is not None else None
        if controls[0] is not None:
            rows = [(figures.stem_of(n), m, c) for (n, _, m), c in zip(models, controls, strict=True)]
            cfig = viz.control_figure(_display(stored, loaded), rows, f"on {stored.name}", named)
            cmeta = {**meta, "figure": "export maps against a control", "control": control}
            control_shown = shown_figure(cfig, f"export_control_{control}_{names}_{sha[:8]}_alpha{alpha:.2f}", cmeta)
        text = (
            f"α = **{alpha:.2f}** (Â = α·Ā + (1−α)·I). Red = source (others read it), blue = gatherer. "
            f"{resize_note(stored, loaded)}"
            + (f"The query patch {q} picked in Steering is outlined in yellow. " if q else "")
            + f"Control: **{describe(control, controls[0].images if controls[0] else 0, named)}**. "
            + " \n"
            + "  \n".join(summary(n, m, c) for (n, _, m), c in zip(models, controls, strict=True))
        )
        acc = models[0][2].accumulated[0].numpy()
        plot = plots.map_plot(acc, f"{loaded.name}: accumulated net export (hover for values)", "Σ net export", mark=q)
        return {
            ui.text: text,
            ui.figure: shown,
            ui.accumulated: plot,
            ui.layer: layer_update(asked, depth, keep=True),
            ui.control: gr.update(info=control_info(loaded, chosen)),
            ui.control_figure: gr.update(value=control_shown, visible=control_shown is not None),
        }
    except Exception as e:
        return {ui.text: warn(error_text(e)), ui.figure: None, ui.accumulated: None, ui.control_figure: None}


def images_text(count: int, data: str | None, chosen: str | None = None) -> str:
    """Which images the per-class view averaged: validation images, or bundled pictures for a model without them;
    ``chosen``: the pictures chosen at the top of the page in their place, in words."""
    if chosen:
        return f"{chosen} (chosen at the top of the page)."
    if data:
        return f"{count} validation images of `{data}`."
    return f"{count} bundled pictures, each in the class the model predicts for it (no validation set recorded)."


def per_class(
    ctx: AppContext,
    ui: ExportUI,
    ckpt: str | None,
    alpha: float,
    control: str,
    pictures: str | None = None,
    request: gr.Request | None = None,
) -> Updates:
    """Mean accumulated export per class over the checkpoint's validation images (or the ``pictures`` chosen on
    the page, each in the class the model predicts), raw and against the control (the validation maps are cached
    per checkpoint, α and pictures, so this is computed once)."""
    try:
        if not ckpt:
            raise AppError("pick a checkpoint first")
        loaded, chosen = ctx.model(ckpt), chooser.chosen(ctx, pictures)
        raw = validation_for(ctx, loaded, alpha, request=request, pictures=chosen)
        blank = (
            validation_for(ctx, loaded, alpha, blank=True, request=request, pictures=chosen)
            if control == "blank"
            else None
        )
        c = class_maps(raw, control, blank)
        count = int(c.counts.sum())
        words = chosen_words(loaded, chosen, count)
        stem = figures.stem_of(ckpt)
        meta = {"figure": "export maps per class", "checkpoint": ckpt, "alpha": float(alpha), "control": control,
                "images": count, "data": loaded.meta.get("data"), "pictures": words}  # fmt: skip
        shown = shown_figure(
            viz.class_maps_figure(stem, c, pictures=words), f"export_classes_{stem}_{control}_alpha{alpha:.2f}", meta
        )
        return {ui.classes: shown, ui.classes_status: images_text(count, meta["data"], words)}
    except Exception as e:
        return {ui.classes: None, ui.classes_status: warn(error_text(e))}


def downloads(
    ctx: AppContext,
    ui: ExportUI,
    ckpt: str | None,
    twin: str | None,
    sha: str | None,
    alpha: float,
    layer: float,
    query: Any = None,
    control: str = "none",
    layout: str = "wide",
    pictures: str | None = None,
) -> Updates:
    """The figure (PNG + SVG) and every model's raw maps (.npz + CSV); with a control also the figure against it
    and the control's maps in each .npz; settings in file names and metadata. The files are the wide figure
    whatever the screen's ``layout``: they are for papers, not phones."""
    try:
        loaded, stored, chosen = ctx.model(ckpt), ctx.image(sha), chooser.chosen(ctx, pictures)
        pairs = with_twin(ctx, ckpt, loaded, twin)
        computed = [maps_with_control(ctx, lm, stored, alpha, control, pictures=chosen) for _, lm in pairs]
        models = [(n, m) for (n, _), (m, _) in zip(pairs, computed, strict=True)]
        controls = [c for _, c in computed]
        settings = {"image": stored.name, "image_sha256": sha}
        if controls[0] is not None and (named := chosen_words(loaded, chosen, controls[0].images)):
            settings["control_pictures"] = named  # the validation control's chosen pictures, in words
        q = (int(query[0]), int(query[1])) if query else None
        layer = int(layer or 0)
        files = figures.export_files(
            models, _display(stored, loaded), layer, settings, q, controls if controls[0] else None
        )
        return {ui.files: write_downloads(files), ui.files_status: ""}
    except Exception as e:
        return {ui.files: None, ui.files_status: warn(error_text(e))}


def build(ctx: AppContext, shared: dict[str, Any]) -> ExportUI:
    with gr.Row():
        twin = gr.Dropdown(
            [NO_TWIN], value=NO_TWIN, label="Beside it (its dot twin, or any checkpoint)", elem_id="ex-twin", scale=2
        )
        alpha = gr.Slider(
            0.0,
            1.0,
            value=DEFAULT_ALPHA,
            step=0.05,
            label="α: residual mixing Â = α·Ā + (1−α)·I",
            info="For pull-in, pull-out and net, α only rescales the map (which patches export stays); rollout "
            "changes shape with α (flat near 0, peaked near 1).",
            elem_id="ex-alpha",
            scale=2,
        )
        layer = widgets.layer_slider("layer for pull-in / pull-out / net", "ex-layer", scale=2)
        control = gr.Dropdown(
            list(CONTROLS),
            value="none",
            label="control: compare with a blank image or the validation mean",
            info="blank: the image's mean colour; validation: the mean over the pictures chosen at the top of the page "
            "(by default the checkpoint's validation images; named once a checkpoint is shown)",
            elem_id="ex-control",
            scale=2,
        )
    layout = gr.Radio(
        ["wide", "narrow"],
        value="wide",
        label="figure layout: wide (this layer and every layer's net export) or narrow (this layer only, two "
        "columns: phones; chosen for you on a narrow screen)",
        elem_id="ex-layout",
    )
    gr.Markdown(  # above the figure: read before the maps, not found after them
        "**How to read it.** With the head-mean attention Ā of a layer and Â = α·Ā + (1−α)·I: "
        "pull-in = 1 − Â_ii (how much patch i reads from the others), pull-out = Σ_j Â_ji − Â_ii (how much "
        "the others read from i), net = pull-out − pull-in (sums to 0 in every layer). The accumulated map "
        "sums net over layers; rollout multiplies the Â of all layers (Abnar & Zuidema 2020).",
        elem_id="ex-how",
        elem_classes="hint",
    )
    text = gr.Markdown(elem_id="ex-summary")
    figure = gr.Image(
        label="Export maps",
        type="filepath",
        format="png",
        interactive=False,
        elem_id="ex-figure",
        show_label=False,
        buttons=["download", "fullscreen"],
    )
    control_figure = gr.Image(
        label="Export maps against the control",
        type="filepath",
        format="png",
        interactive=False,
        elem_id="ex-control-figure",
        show_label=False,
        visible=False,
        buttons=["download", "fullscreen"],
    )
    with gr.Row(equal_height=False):
        accumulated = gr.Plot(show_label=False, label="Accumulated net export (interactive)", elem_id="ex-acc")
        with gr.Column():
            made = widgets.downloads("Make files: figure PNG + SVG, maps .npz + CSV", "ex-dl", "ex-files")
            files, files_status = made.files, made.status
    classes_button = gr.Button(
        "Per class: mean accumulated export over the validation images or the chosen pictures (raw and against the "
        "control)",
        size="sm",
        elem_id="ex-classes-button",
    )
    classes_status = gr.Markdown()
    classes = gr.Image(
        label="Mean accumulated export per class",
        type="filepath",
        format="png",
        interactive=False,
        elem_id="ex-classes",
        show_label=False,
        buttons=["download", "fullscreen"],
    )
    inputs = [shared["checkpoint"], twin, shared["image_sha"], alpha, layer, shared["query"], control, layout,
              shared["pictures"]]  # fmt: skip
    ui = ExportUI(twin=twin, alpha=alpha, layer=layer, control=control, layout=layout, text=text, figure=figure,
                  control_figure=control_figure, accumulated=accumulated, files=files, files_status=files_status,
                  classes=classes, classes_status=classes_status, inputs=inputs)  # fmt: skip
    for picker in (twin, control, layout):
        picker.input(partial(render, ctx, ui), inputs, ui.rendered, api_visibility="private")
    made.on_click(partial(downloads, ctx, ui), inputs)
    classes_button.click(
        partial(per_class, ctx, ui), [shared["checkpoint"], alpha, control, shared["pictures"]],
        [classes, classes_status],
        api_visibility="private",
    )  # fmt: skip
    return ui


def session_part(ctx: AppContext, ui: ExportUI) -> SessionPart:
    """The export tab's section: twin, α and layer, the layer within the deeper of the two models."""

    def restore(section: dict[str, Any], restoring: Restoring) -> Updates:
        names = ctx.checkpoint_names()
        twin = section.get("twin") or NO_TWIN
        if twin not in (NO_TWIN, *names):
            restoring.notes.append(f"export twin {twin!r} is not in the checkpoint folder")
            twin = NO_TWIN
        depths = [d for d in (model_depth(ctx, restoring.checkpoint), model_depth(ctx, twin)) if d]
        return {
            ui.twin: gr.update(choices=[NO_TWIN, *names], value=twin),
            ui.alpha: gr.update(value=section.get("alpha", DEFAULT_ALPHA)),
            ui.layer: layer_update(section.get("layer"), max(depths, default=None)),
        }

    fields = {"twin": ui.twin, "alpha": ui.alpha, "layer": ui.layer}
    return SessionPart("export", fields, restore, list(fields.values()))
