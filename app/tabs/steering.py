"""Tab 3, steering: how content moves each head's atoms on a picture, and one clicked patch's field."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

import gradio as gr
import numpy as np
from gradio.blocks import Block
from PIL import Image

from app import widgets
from app.common import Updates, error_text, shown_figure, warn, write_downloads
from app.session_protocol import Restoring, SessionPart
from app.state import AppContext, AppError, LoadedModel, StoredImage, resize_note
from app.widgets import layer_update, model_depth
from ssog_core.analysis import report
from ssog_core.analysis.head_spec import HeadSpec, steered_spec
from ssog_core.analysis.measures import AttentionMaps, SteeringOffsets, attention_maps, steering_offsets
from ssog_core.viz import figures as viz
from ssog_core.viz import files as figures
from ssog_core.viz import raster


@dataclass(frozen=True)
class SteeringUI:
    """The tab's components, by name."""

    note: gr.Markdown
    query: gr.State  # the clicked patch [row, col], or None
    click: gr.Image
    query_text: gr.Markdown
    head: gr.Dropdown
    open: gr.Button
    prediction: gr.Label
    layer: gr.Slider
    steering: gr.Image
    query_figure: gr.Image
    files: gr.File
    files_status: gr.Markdown

    @property
    def outputs(self) -> list[Block]:
        """What :func:`render` changes."""
        return [self.note, self.click, self.prediction, self.steering, self.query_figure, self.layer, self.head,
                self.open]  # fmt: skip


@dataclass
class Steering:
    """One model on one image: what content did to the field, and the exact attention with and without it."""

    display: Image.Image  # the picture stretched to the model's aspect, as the model sees it
    grid: tuple[int, int]
    steered: AttentionMaps
    fixed: AttentionMaps | None  # None for models without a field
    offsets: SteeringOffsets | None
    logits: Any


def on_cpu(maps: AttentionMaps) -> AttentionMaps:
    """Attention matrices computed on the app's device, brought to the CPU for drawing."""
    return AttentionMaps([a.cpu() for a in maps.attn], [s.cpu() for s in maps.prefix_share], maps.grid,
                         maps.logits.cpu(), maps.removed)  # fmt: skip


def analyse(ctx: AppContext, loaded: LoadedModel, stored: StoredImage) -> Steering:
    def make() -> Steering:
        x = loaded.input(stored.image)
        display = raster.model_view(stored.image, loaded.config.img_size, figures.DISPLAY_WIDTH)
        steered = on_cpu(attention_maps(loaded.model, x))
        if loaded.is_ssog:
            return Steering(
                display,
                steered.grid,
                steered,
                on_cpu(attention_maps(loaded.model, x, steered=False)),
                steering_offsets(loaded.model, x),
                steered.logits,
            )
        return Steering(display, steered.grid, steered, None, None, steered.logits)

    return ctx.cache.steering.get((loaded.key, stored.sha256), make)


def query_rows(s: Steering, layer: int, query: tuple[int, int]) -> tuple[np.ndarray | None, np.ndarray]:
    """``(H, Gh, Gw)`` attention of one query, fixed field (or None) and steered."""
    steered = figures.query_rows(s.steered.attn, s.grid, layer, query)
    fixed = figures.query_rows(s.fixed.attn, s.grid, layer, query) if s.fixed is not None else None
    return fixed, steered


def figure_stem(loaded: LoadedModel, stored: StoredImage, layer: int) -> str:
    """The name the steering downloads use, so the figure in the page saves under the same one."""
    return f"steering_{figures.stem_of(loaded.name)}_{stored.sha256[:8]}_L{layer}"


def settings(loaded: LoadedModel, stored: StoredImage, layer: int) -> dict[str, Any]:
    return {"checkpoint": loaded.name, "image": stored.name, "image_sha256": stored.sha256, "layer": layer}


def query_image(loaded: LoadedModel, stored: StoredImage, s: Steering, layer: int, query: tuple[int, int]) -> str:
    fixed, steered = query_rows(s, layer, query)
    fig = viz.query_field_figure(s.display, fixed, steered, query, layer, loaded.name)
    meta = {**settings(loaded, stored, layer), "figure": "query field", "query": list(query)}
    return shown_figure(fig, f"{figure_stem(loaded, stored, layer)}_q{query[0]}-{query[1]}", meta)


def render(
    ctx: AppContext, ui: SteeringUI, ckpt: str | None, sha: str | None, layer: float, query: Any, head: Any = 0
) -> Updates:
    """The note, the clickable picture, the prediction, the steering and query figures, the layer slider, the
    head picker and the button that opens the head in the playground (:attr:`SteeringUI.outputs`)."""
    empty = {ui.click: None, ui.prediction: None, ui.steering: None, ui.query_figure: None}
    if not ckpt or not sha:
        missing = "a checkpoint" if not ckpt else "an image (top of the page)"
        return {ui.note: f"Pick {missing} to see how content steers the field.", **empty}
    try:
        loaded, stored = ctx.model(ckpt), ctx.image(sha)
        s = analyse(ctx, loaded, stored)
        depth = len(s.steered.attn)
        asked = layer  # the slider's value: sent back only if it has to move into the range
        layer = min(int(layer or 0), depth - 1)
        q = tuple(query) if query else None
        if s.offsets is not None:
            fig = figures.steering_figure(
                s.display, s.offsets, layer, loaded.fields[layer], loaded.config.max_offset, loaded.name
            )
            meta = {**settings(loaded, stored, layer), "figure": "steering", "colormap": viz.OFFSET_CMAP}
            steer = shown_figure(fig, figure_stem(loaded, stored, layer), meta)
            rows = {
                "mu": "where content moves each head's gaze (μδ, λ-weighted mean shift of its atoms; arrows scaled "
                "with a key)",
                "sigma": "how it widens or tightens the atoms (σδ)",
                "lambda": "how much weight it moves between them (λ)",
            }
            steered = [text for tap, text in rows.items() if tap in loaded.fields[layer].gates]
            note = (
                f"**{loaded.name}** on **{stored.name}** ({s.grid[0]}×{s.grid[1]} patches), layer **{layer}**. "
                f"Rows, one per tap this layer steers: {'; '.join(steered)}. {resize_note(stored, loaded)}"
                "**Click a patch** to see that query's field, fixed vs steered."
            )
        else:
            steer = None
            note = (
                f"**{loaded.name}** is a {loaded.kind} attention model: content scores every pair, there is no "
                f"field to steer. **Click a patch** to see its attention per head (layer **{layer}**)."
            )
        heads = loaded.config.num_heads
        return {
            ui.note: note,
            ui.click: raster.grid_overlay(s.display, s.grid, q),
            ui.prediction: report.top_classes(s.logits, loaded.class_names),
            ui.steering: gr.update(value=steer, visible=steer is not None),
            ui.query_figure: query_image(loaded, stored, s, layer, q) if q else None,
            ui.layer: layer_update(asked, depth, keep=True),
            ui.head: gr.update(
                choices=list(range(heads)), value=min(int(head or 0), heads - 1), visible=loaded.is_ssog
            ),
            ui.open: gr.update(visible=loaded.is_ssog),  # a dot model has no field for content to steer
        }
    except Exception as e:
        return {ui.note: warn(error_text(e)), **empty}


def on_select(
    ctx: AppContext, ui: SteeringUI, ckpt: str | None, sha: str | None, layer: float, evt: gr.SelectData
) -> Updates:
    """A click on the picture: the patch under it becomes the query."""
    try:
        loaded, stored = ctx.model(ckpt), ctx.image(sha)
        s = analyse(ctx, loaded, stored)
        q = raster.cell_at(evt.index, s.display.size, s.grid)
        layer = min(int(layer or 0), len(s.steered.attn) - 1)
        return {
            ui.query: list(q),
            ui.click: raster.grid_overlay(s.display, s.grid, q),
            ui.query_figure: query_image(loaded, stored, s, layer, q),
            ui.query_text: f"query patch {q}",
        }
    except Exception as e:
        return {ui.query_text: warn(error_text(e))}


def steered_head(ctx: AppContext, src: dict[str, Any], gate: float) -> HeadSpec:
    """The clicked query's head on the model's grid with content's steering at ``gate`` (0 = the fixed field,
    1 = the learned gate), from the image's steering offsets (:func:`ssog_core.analysis.head_spec.steered_spec`)."""
    loaded, stored = ctx.model(src["checkpoint"]), ctx.image(src["image_sha256"])
    if not loaded.is_ssog:
        raise AppError(f"{loaded.name} is a {loaded.kind} attention model: it has no field for content to steer")
    s = analyse(ctx, loaded, stored)
    layer, head, (qy, qx) = int(src["layer"]), int(src["head"]), src["query"]
    t = (0, qy, qx, head)
    o = s.offsets
    return steered_spec(loaded.fields[layer], head, tuple(loaded.config.grid), (qy, qx), o.dmu[layer][t],
                        o.sigma_ratio[layer][t], o.dlam[layer][t], float(gate), loaded.config.field)  # fmt: skip


def downloads(ctx: AppContext, ui: SteeringUI, ckpt: str | None, sha: str | None, layer: float, query: Any) -> Updates:
    """Steering and query figures (PNG + SVG) and the raw offsets (.npz), settings in names and metadata."""
    try:
        loaded, stored = ctx.model(ckpt), ctx.image(sha)
        s = analyse(ctx, loaded, stored)
        layer = min(int(layer or 0), len(s.steered.attn) - 1)
        settings = {"checkpoint": ckpt, "image": stored.name, "image_sha256": sha}
        q = tuple(query) if query else None
        fixed, steered = query_rows(s, layer, q) if q else (None, None)
        files = figures.steering_files(
            ckpt,
            s.display,
            layer,
            settings,
            s.offsets,
            loaded.fields[layer] if loaded.is_ssog else None,
            loaded.config.max_offset,
            q,
            fixed,
            steered,
            loaded.name,
        )
        if not files:
            raise ValueError("nothing to export yet: click a patch first")
        return {ui.files: write_downloads(files), ui.files_status: ""}
    except Exception as e:
        return {ui.files: None, ui.files_status: warn(error_text(e))}


def session_part(ctx: AppContext, ui: SteeringUI) -> SessionPart:
    """The steering tab's section: its layer (within the restored checkpoint's depth) and the picked query."""

    def save(v: dict[str, Any]) -> dict[str, Any]:
        return {"layer": v["layer"], "query": [int(c) for c in v["query"]] if v["query"] else None}

    def restore(section: dict[str, Any], restoring: Restoring) -> Updates:
        query = section.get("query")
        return {
            ui.layer: layer_update(section.get("layer"), model_depth(ctx, restoring.checkpoint)),
            ui.query: list(query) if query else None,
            ui.query_text: f"query patch {tuple(query)}" if query else "",
        }

    fields = {"layer": ui.layer, "query": ui.query}
    return SessionPart("steering", fields, restore, [ui.layer, ui.query, ui.query_text], save)


def build(ctx: AppContext, shared: dict[str, Any]) -> SteeringUI:
    note = gr.Markdown(elem_id="st-note")
    query = gr.State(None)
    with gr.Row(equal_height=False):
        with gr.Column(scale=2, min_width=320):
            click = gr.Image(
                label="Click a patch to inspect its field",
                type="numpy",
                interactive=False,
                elem_id="st-click",
                buttons=["fullscreen"],
            )
            query_text = gr.Markdown(elem_id="st-query")
            with gr.Row(equal_height=True):
                head = gr.Dropdown([0], value=0, label="head", elem_id="st-head", scale=1, min_width=80)
                open_button = gr.Button(
                    "Watch content steer it in the playground", size="sm", elem_id="st-open", scale=3
                )
            prediction = gr.Label(num_top_classes=5, label="Prediction", elem_id="st-pred")
            layer = widgets.layer_slider("layer", "st-layer")
            with gr.Accordion("Download figures (PNG + SVG) and raw offsets (.npz)", open=False):
                made = widgets.downloads()
                files, files_status = made.files, made.status
        with gr.Column(scale=3):
            steering = gr.Image(
                label="|μδ| per head with direction arrows",
                type="filepath",
                format="png",
                interactive=False,
                elem_id="st-steer",
                show_label=False,
                buttons=["download", "fullscreen"],
            )
            query_figure = gr.Image(
                label="The clicked query's field: fixed vs steered, per head",
                type="filepath",
                format="png",
                interactive=False,
                elem_id="st-qfig",
                show_label=False,
                buttons=["download", "fullscreen"],
            )
    ui = SteeringUI(note=note, query=query, click=click, query_text=query_text, head=head, open=open_button,
                    prediction=prediction, layer=layer, steering=steering, query_figure=query_figure, files=files,
                    files_status=files_status)  # fmt: skip

    def select(ckpt: str | None, sha: str | None, lay: float, evt: gr.SelectData) -> Updates:
        return on_select(ctx, ui, ckpt, sha, lay, evt)  # a plain function: Gradio finds its SelectData

    click.select(
        select,
        [shared["checkpoint"], shared["image_sha"], layer],
        [query, click, query_figure, query_text],
        api_visibility="private",
    )
    made.on_click(partial(downloads, ctx, ui), [shared["checkpoint"], shared["image_sha"], layer, query])
    return ui
