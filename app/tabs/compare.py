"""Tab 5, two checkpoints side by side on the same image, one layer slider for both, and their difference."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

import gradio as gr
from gradio.blocks import Block

from app import widgets
from app.common import Updates, error_text, shown_figure, warn, write_downloads
from app.export_maps import maps_for, summary
from app.session_protocol import Restoring, SessionPart
from app.state import AppContext
from app.widgets import layer_update, model_depth
from ssog_core.analysis.measures import DEFAULT_ALPHA
from ssog_core.viz import figures as viz
from ssog_core.viz import files as figures
from ssog_core.viz import raster


@dataclass(frozen=True)
class CompareUI:
    """The tab's components, by name, and the inputs every render reads."""

    a: gr.Dropdown
    b: gr.Dropdown
    alpha: gr.Slider
    layer: gr.Slider
    text: gr.Markdown
    figure: gr.Image
    files: gr.File
    files_status: gr.Markdown
    inputs: list[Block]  # A, B, image, α, layer

    @property
    def outputs(self) -> list[Block]:
        """What :func:`render` changes."""
        return [self.text, self.figure, self.layer]


def _analyse(ctx: AppContext, a: str, b: str, sha: str, alpha: float):
    stored = ctx.image(sha)
    la, lb = ctx.model(a), ctx.model(b)
    display = raster.model_view(stored.image, la.config.img_size, figures.EXPORT_WIDTH)
    return stored, display, maps_for(ctx, la, stored, alpha), maps_for(ctx, lb, stored, alpha)


def render(
    ctx: AppContext, ui: CompareUI, a: str | None, b: str | None, sha: str | None, alpha: float, layer: float
) -> Updates:
    """The summary, the figure and the layer slider."""
    if not a or not b or not sha:
        return {ui.text: "Pick two checkpoints and an image (top of the page) to compare them.", ui.figure: None}
    try:
        stored, display, ma, mb = _analyse(ctx, a, b, sha, alpha)
        depth = min(ma.net.shape[1], mb.net.shape[1])
        asked = layer  # the slider's value: sent back only if it has to move into the range
        layer = min(int(layer or 0), depth - 1)
        fig = figures.compare_figure((a, ma), (b, mb), display, layer, stored.name)
        text = f"α = **{alpha:.2f}**, layer **{layer}** for both.  \nA — {summary(a, ma)}  \nB — {summary(b, mb)}"
        if ma.grid != mb.grid:
            text += (
                f"  \nA sees a {ma.grid[0]}×{ma.grid[1]} patch grid and B a {mb.grid[0]}×{mb.grid[1]} one: they are "
                "shown side by side, each on its own grid; the difference map A − B needs equal grids."
            )
        meta = {"figure": "compare", "A": a, "B": b, "image": stored.name, "image_sha256": sha, "alpha": float(alpha),
                "layer": layer, "colormap": viz.NET_CMAP}  # fmt: skip
        stem = f"compare_{figures.stem_of(a)}_vs_{figures.stem_of(b)}_{sha[:8]}_L{layer}_alpha{alpha:.2f}"
        return {
            ui.text: text,
            ui.figure: shown_figure(fig, stem, meta),
            ui.layer: layer_update(asked, depth, keep=True),
        }
    except Exception as e:
        return {ui.text: warn(error_text(e)), ui.figure: None}


def downloads(
    ctx: AppContext, ui: CompareUI, a: str | None, b: str | None, sha: str | None, alpha: float, layer: float
) -> Updates:
    try:
        stored, display, ma, mb = _analyse(ctx, a, b, sha, alpha)
        settings = {"image": stored.name, "image_sha256": sha}
        files = figures.compare_files((a, ma), (b, mb), display, int(layer or 0), settings)
        return {ui.files: write_downloads(files), ui.files_status: ""}
    except Exception as e:
        return {ui.files: None, ui.files_status: warn(error_text(e))}


def session_part(ctx: AppContext, ui: CompareUI) -> SessionPart:
    """The compare tab's section: A, B, α and the layer, within the shallower of the two models."""

    def restore(section: dict[str, Any], restoring: Restoring) -> Updates:
        names = ctx.checkpoint_names()
        picked = {}
        for key, picker in (("a", ui.a), ("b", ui.b)):
            name = section.get(key)
            if name and name not in names:
                restoring.notes.append(f"compare {key.upper()} {name!r} is not in the checkpoint folder")
                name = None
            picked[picker] = name
        depths = [d for d in map(partial(model_depth, ctx), picked.values()) if d]
        return {
            **{picker: gr.update(choices=names, value=name) for picker, name in picked.items()},
            ui.alpha: gr.update(value=section.get("alpha", DEFAULT_ALPHA)),
            ui.layer: layer_update(section.get("layer"), min(depths, default=None)),
        }

    fields = {"a": ui.a, "b": ui.b, "alpha": ui.alpha, "layer": ui.layer}
    return SessionPart("compare", fields, restore, list(fields.values()))


def build(ctx: AppContext, shared: dict[str, Any]) -> CompareUI:
    with gr.Row():
        a = gr.Dropdown([], label="Checkpoint A", elem_id="cmp-a", scale=2)
        b = gr.Dropdown([], label="Checkpoint B", elem_id="cmp-b", scale=2)
        alpha = gr.Slider(0.0, 1.0, value=DEFAULT_ALPHA, step=0.05, label="α", elem_id="cmp-alpha", scale=1)
        layer = widgets.layer_slider("layer (shared by A and B)", "cmp-layer", scale=2)
    text = gr.Markdown(elem_id="cmp-summary")
    figure = gr.Image(
        label="A, B and A − B",
        type="filepath",
        format="png",
        interactive=False,
        elem_id="cmp-figure",
        show_label=False,
        buttons=["download", "fullscreen"],
    )
    with gr.Accordion("Download the figure (PNG + SVG) and the maps of both (.npz)", open=False):
        made = widgets.downloads()
        files, files_status = made.files, made.status
    inputs = [a, b, shared["image_sha"], alpha, layer]
    ui = CompareUI(a=a, b=b, alpha=alpha, layer=layer, text=text, figure=figure, files=files,
                   files_status=files_status, inputs=inputs)  # fmt: skip
    for picker in (a, b):
        picker.input(partial(render, ctx, ui), inputs, ui.outputs, api_visibility="private")
    made.on_click(partial(downloads, ctx, ui), inputs)
    return ui
