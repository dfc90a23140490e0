"""Tab 4, export maps: which patches the others read from (sources) and which gather (per layer and summed),
the SSOG model beside its dot twin, and attention rollout for comparison."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

import gradio as gr
from gradio.blocks import Block

from app import plots
from app.common import Updates, error_text, shown_figure, warn, write_downloads
from app.state import AppContext, LoadedModel, StoredImage, resize_note
from ssog_core.analysis.measures import DEFAULT_ALPHA, ExportMaps, export_maps
from ssog_core.analysis.session import NO_TWIN
from ssog_core.viz import figures as viz
from ssog_core.viz import files as figures
from ssog_core.viz import raster


@dataclass(frozen=True)
class ExportUI:
    """The tab's components, by name, and the inputs every render reads."""

    twin: gr.Dropdown
    alpha: gr.Slider
    layer: gr.Slider
    text: gr.Markdown
    figure: gr.Image
    accumulated: gr.Plot
    files: gr.File
    files_status: gr.Markdown
    inputs: list[Block]  # checkpoint, twin, image, α, layer, the query picked in Steering

    @property
    def outputs(self) -> list[Block]:
        """What :func:`render` changes."""
        return [self.text, self.figure, self.accumulated, self.layer]


def maps_for(ctx: AppContext, loaded: LoadedModel, stored: StoredImage, alpha: float) -> ExportMaps:
    """The export maps of a model on a picture (cached: the export and compare tabs and the API share them)."""

    def make() -> ExportMaps:
        return export_maps(loaded.model, loaded.input(stored.image), alpha)

    return ctx.cache.export_maps.get((loaded.key, stored.sha256, round(float(alpha), 4)), make)


def default_twin(ctx: AppContext, ckpt: str | None) -> str:
    """The other kind of model to show beside ``ckpt``: its metadata's ``twin``, else a name match, else the
    first checkpoint of the other attention kind."""
    if not ckpt:
        return NO_TWIN
    names = ctx.checkpoint_names()
    try:
        loaded = ctx.model(ckpt)
    except Exception:
        return NO_TWIN
    hinted = loaded.meta.get("twin")
    if isinstance(hinted, str) and hinted in names:
        return hinted
    swapped = ckpt.replace("ssog", "dot") if loaded.is_ssog else ckpt.replace("dot", "ssog")
    if swapped != ckpt and swapped in names:
        return swapped
    for name in names:
        if name == ckpt:
            continue
        try:
            if ctx.model(name).config.attn != loaded.config.attn:
                return name
        except Exception:
            continue
    return NO_TWIN


def _display(stored: StoredImage, loaded: LoadedModel):
    return raster.model_view(stored.image, loaded.config.img_size, figures.EXPORT_WIDTH)


def summary(name: str, m: ExportMaps) -> str:
    s = m.summary()
    prefix = float(m.prefix_share.mean())
    extra = f" · register tokens took {prefix:.1%} of patch attention (removed, rows renormalised)" if prefix else ""
    return (
        f"**{name}**: accumulated net export in [{s['acc_min']:.3f}, {s['acc_max']:.3f}], "
        f"**{s['exporter_share']:.0%}** of patches are net exporters (red){extra}"
    )


def render(
    ctx: AppContext,
    ui: ExportUI,
    ckpt: str | None,
    twin: str | None,
    sha: str | None,
    alpha: float,
    layer: float,
    query: Any = None,
) -> Updates:
    """The summary, the figure, the accumulated-map plot and the layer slider; ``query``, the patch picked in
    Steering, is outlined on every map."""
    if not ckpt or not sha:
        missing = "a checkpoint" if not ckpt else "an image (top of the page)"
        return {ui.text: f"Pick {missing} to compute export maps.", ui.figure: None, ui.accumulated: None}
    try:
        loaded, stored = ctx.model(ckpt), ctx.image(sha)
        models = [(ckpt, loaded, maps_for(ctx, loaded, stored, alpha))]
        if twin and twin != NO_TWIN and twin != ckpt:
            tw = ctx.model(twin)
            models.append((twin, tw, maps_for(ctx, tw, stored, alpha)))
        depth = max(m.net.shape[1] for _, _, m in models)
        layer = min(int(layer or 0), depth - 1)
        q = (int(query[0]), int(query[1])) if query else None
        named = [(n, m) for n, _, m in models]
        fig = figures.named_export_maps_figure(named, _display(stored, loaded), layer, stored.name, q)
        names = "+".join(figures.stem_of(n) for n, _, _ in models)
        meta = {"figure": "export maps", "checkpoints": [n for n, _, _ in models], "image": stored.name,
                "image_sha256": sha, "alpha": float(alpha), "layer": layer, "colormap": viz.NET_CMAP,
                "query": list(q) if q else None}  # fmt: skip
        shown = shown_figure(fig, f"export_{names}_{sha[:8]}_L{layer}_alpha{alpha:.2f}_{viz.NET_CMAP}", meta)
        text = (
            f"α = **{alpha:.2f}** (Â = α·Ā + (1−α)·I). Red = source (others read it), blue = gatherer. "
            f"{resize_note(stored, loaded)}"
            + (f"The query patch {q} picked in Steering is outlined in yellow. " if q else "")
            + " \n"
            + "  \n".join(summary(n, m) for n, _, m in models)
        )
        acc = models[0][2].accumulated[0].numpy()
        plot = plots.map_plot(acc, f"{loaded.name}: accumulated net export (hover for values)", "Σ net export", mark=q)
        return {
            ui.text: text,
            ui.figure: shown,
            ui.accumulated: plot,
            ui.layer: gr.update(maximum=max(depth - 1, 1), value=layer),
        }
    except Exception as e:
        return {ui.text: warn(error_text(e)), ui.figure: None, ui.accumulated: None}


def downloads(
    ctx: AppContext,
    ui: ExportUI,
    ckpt: str | None,
    twin: str | None,
    sha: str | None,
    alpha: float,
    layer: float,
    query: Any = None,
) -> Updates:
    """The figure (PNG + SVG) and every model's raw maps (.npz + CSV); settings in file names and metadata."""
    try:
        loaded, stored = ctx.model(ckpt), ctx.image(sha)
        models = [(ckpt, maps_for(ctx, loaded, stored, alpha))]
        if twin and twin != NO_TWIN and twin != ckpt:
            models.append((twin, maps_for(ctx, ctx.model(twin), stored, alpha)))
        settings = {"image": stored.name, "image_sha256": sha}
        q = (int(query[0]), int(query[1])) if query else None
        files = figures.export_files(models, _display(stored, loaded), int(layer or 0), settings, q)
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
            info="α only rescales the maps (their range grows with α); which patches export does not change.",
            elem_id="ex-alpha",
            scale=2,
        )
        layer = gr.Slider(
            0, 1, value=0, step=1, label="layer for pull-in / pull-out / net", elem_id="ex-layer", scale=2
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
    with gr.Row(equal_height=False):
        accumulated = gr.Plot(show_label=False, label="Accumulated net export (interactive)", elem_id="ex-acc")
        with gr.Column():
            gr.Markdown(
                "**How to read it.** With the head-mean attention Ā of a layer and Â = α·Ā + (1−α)·I: "
                "pull-in = 1 − Â_ii (how much patch i reads from the others), pull-out = Σ_j Â_ji − Â_ii (how much "
                "the others read from i), net = pull-out − pull-in (sums to 0 in every layer). The accumulated map "
                "sums net over layers; rollout multiplies the Â of all layers (Abnar & Zuidema 2020)."
            )
            files_button = gr.Button("Make files: figure PNG + SVG, maps .npz + CSV", size="sm", elem_id="ex-dl")
            files = gr.File(label="files", file_count="multiple", interactive=False, elem_id="ex-files")
            files_status = gr.Markdown()
    inputs = [shared["checkpoint"], twin, shared["image_sha"], alpha, layer, shared["query"]]
    ui = ExportUI(twin=twin, alpha=alpha, layer=layer, text=text, figure=figure, accumulated=accumulated,
                  files=files, files_status=files_status, inputs=inputs)  # fmt: skip
    twin.input(partial(render, ctx, ui), inputs, ui.outputs, api_visibility="private")
    files_button.click(partial(downloads, ctx, ui), inputs, [files, files_status], api_visibility="private")
    return ui
