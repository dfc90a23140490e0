"""Tab 3, steering: how content moves each head's atoms on a picture, and one clicked patch's field."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

import gradio as gr
import numpy as np
from PIL import Image

from app.common import LRU, error_text, shown_figure, warn, write_downloads
from app.state import AppContext, AppError, LoadedModel, StoredImage, resize_note
from ssog_core import figures, report, viz
from ssog_core.analysis import AttentionMaps, SteeringOffsets, attention_maps, steering_offsets
from ssog_core.playground import HeadSpec, steered_spec

_ANALYSES = LRU(3)  # full attention matrices are the largest thing the app keeps: only a few


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
                         maps.logits.cpu())  # fmt: skip


def analyse(lm: LoadedModel, stored: StoredImage) -> Steering:
    def make() -> Steering:
        x = lm.input(stored.image)
        display = viz.model_view(stored.image, lm.config.img_size, figures.DISPLAY_WIDTH)
        steered = on_cpu(attention_maps(lm.model, x))
        if lm.is_ssog:
            return Steering(
                display,
                steered.grid,
                steered,
                on_cpu(attention_maps(lm.model, x, steered=False)),
                steering_offsets(lm.model, x),
                steered.logits,
            )
        return Steering(display, steered.grid, steered, None, None, steered.logits)

    return _ANALYSES.get((lm.key, stored.sha256), make)


def query_rows(s: Steering, layer: int, query: tuple[int, int]) -> tuple[np.ndarray | None, np.ndarray]:
    """``(H, Gh, Gw)`` attention of one query, fixed field (or None) and steered."""
    steered = figures.query_rows(s.steered.attn, s.grid, layer, query)
    fixed = figures.query_rows(s.fixed.attn, s.grid, layer, query) if s.fixed is not None else None
    return fixed, steered


def figure_stem(lm: LoadedModel, stored: StoredImage, layer: int) -> str:
    """The name the steering downloads use, so the figure in the page saves under the same one."""
    return f"steering_{figures.stem_of(lm.name)}_{stored.sha256[:8]}_L{layer}"


def settings(lm: LoadedModel, stored: StoredImage, layer: int) -> dict[str, Any]:
    return {"checkpoint": lm.name, "image": stored.name, "image_sha256": stored.sha256, "layer": layer}


def query_image(lm: LoadedModel, stored: StoredImage, s: Steering, layer: int, query: tuple[int, int]) -> str:
    fixed, steered = query_rows(s, layer, query)
    fig = viz.query_field_figure(s.display, fixed, steered, query, layer, lm.name)
    meta = {**settings(lm, stored, layer), "figure": "query field", "query": list(query)}
    return shown_figure(fig, f"{figure_stem(lm, stored, layer)}_q{query[0]}-{query[1]}", meta)


def render(ctx: AppContext, ckpt: str | None, sha: str | None, layer: float, query: Any, head: Any = 0):
    """(note, clickable picture, prediction, steering figure, query figure, layer slider, head picker, the
    button that opens the head in the playground)."""
    if not ckpt or not sha:
        missing = "a checkpoint" if not ckpt else "an image (top of the page)"
        return f"Pick {missing} to see how content steers the field.", None, None, None, None, *(gr.update(),) * 3
    try:
        lm, stored = ctx.model(ckpt), ctx.image(sha)
        s = analyse(lm, stored)
        depth = len(s.steered.attn)
        layer = min(int(layer or 0), depth - 1)
        q = tuple(query) if query else None
        click = viz.grid_overlay(s.display, s.grid, q)
        pred = report.top_classes(s.logits, lm.class_names)
        if s.offsets is not None:
            fig = figures.steering_figure(s.display, s.offsets, layer, lm.fields[layer], lm.config.max_offset, lm.name)
            meta = {**settings(lm, stored, layer), "figure": "steering", "colormap": viz.OFFSET_CMAP}
            steer = shown_figure(fig, figure_stem(lm, stored, layer), meta)
            note = (
                f"**{lm.name}** on **{stored.name}** ({s.grid[0]}×{s.grid[1]} patches), layer **{layer}**. "
                "Rows: where content moves each head's gaze (μδ, λ-weighted mean shift of its atoms; arrows "
                "scaled with a key), how it widens or tightens the atoms (σδ) and how much weight it moves between "
                f"them (λ). {resize_note(stored, lm)}**Click a patch** to see that query's field, fixed vs steered."
            )
        else:
            steer = None
            note = (
                f"**{lm.name}** is a {lm.kind} attention model: content scores every pair, there is no "
                f"field to steer. **Click a patch** to see its attention per head (layer **{layer}**)."
            )
        qimg = query_image(lm, stored, s, layer, q) if q else None
        heads = lm.config.num_heads
        return (
            note,
            click,
            pred,
            gr.update(value=steer, visible=steer is not None),
            qimg,
            gr.update(maximum=max(depth - 1, 1), value=layer),
            gr.update(choices=list(range(heads)), value=min(int(head or 0), heads - 1), visible=lm.is_ssog),
            gr.update(visible=lm.is_ssog),  # a dot model has no field for content to steer
        )
    except Exception as e:
        return warn(error_text(e)), None, None, None, None, *(gr.update(),) * 3


def on_select(ctx: AppContext, ckpt: str | None, sha: str | None, layer: float, evt: gr.SelectData):
    """A click on the picture: the patch under it becomes the query."""
    try:
        lm, stored = ctx.model(ckpt), ctx.image(sha)
        s = analyse(lm, stored)
        q = viz.cell_at(evt.index, s.display.size, s.grid)
        layer = min(int(layer or 0), len(s.steered.attn) - 1)
        return list(q), viz.grid_overlay(s.display, s.grid, q), query_image(lm, stored, s, layer, q), f"query patch {q}"
    except Exception as e:
        return gr.skip(), gr.skip(), gr.skip(), warn(error_text(e))


def steered_head(ctx: AppContext, src: dict[str, Any], gate: float) -> HeadSpec:
    """The clicked query's head on the model's grid with content's steering at ``gate`` (0 = the fixed field,
    1 = the learned gate), from the image's steering offsets (:func:`ssog_core.playground.steered_spec`)."""
    lm, stored = ctx.model(src["checkpoint"]), ctx.image(src["image_sha256"])
    if not lm.is_ssog:
        raise AppError(f"{lm.name} is a {lm.kind} attention model: it has no field for content to steer")
    s = analyse(lm, stored)
    layer, head, (qy, qx) = int(src["layer"]), int(src["head"]), src["query"]
    t = (0, qy, qx, head)
    o = s.offsets
    return steered_spec(lm.fields[layer], head, tuple(lm.config.grid), (qy, qx), o.dmu[layer][t],
                        o.sigma_ratio[layer][t], o.dlam[layer][t], float(gate), lm.config.field)  # fmt: skip


def downloads(ctx: AppContext, ckpt: str | None, sha: str | None, layer: float, query: Any):
    """Steering and query figures (PNG + SVG) and the raw offsets (.npz), settings in names and metadata."""
    try:
        lm, stored = ctx.model(ckpt), ctx.image(sha)
        s = analyse(lm, stored)
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
            lm.fields[layer] if lm.is_ssog else None,
            lm.config.max_offset,
            q,
            fixed,
            steered,
            lm.name,
        )
        if not files:
            raise ValueError("nothing to export yet: click a patch first")
        return write_downloads(files), ""
    except Exception as e:
        return None, warn(error_text(e))


def build(ctx: AppContext, shared: dict[str, Any]) -> dict[str, Any]:
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
            qtext = gr.Markdown(elem_id="st-query")
            with gr.Row(equal_height=True):
                head = gr.Dropdown([0], value=0, label="head", elem_id="st-head", scale=1, min_width=80)
                open_btn = gr.Button("Watch content steer it in the playground", size="sm", elem_id="st-open", scale=3)
            pred = gr.Label(num_top_classes=5, label="Prediction", elem_id="st-pred")
            layer = gr.Slider(0, 1, value=0, step=1, label="layer", elem_id="st-layer")
            with gr.Accordion("Download figures (PNG + SVG) and raw offsets (.npz)", open=False):
                dl_btn = gr.Button("Make files", size="sm")
                dl_files = gr.File(label="files", file_count="multiple", interactive=False)
                dl_status = gr.Markdown()
        with gr.Column(scale=3):
            steer = gr.Image(
                label="|μδ| per head with direction arrows",
                type="filepath",
                format="png",
                interactive=False,
                elem_id="st-steer",
                show_label=False,
                buttons=["download", "fullscreen"],
            )
            qfig = gr.Image(
                label="The clicked query's field: fixed vs steered, per head",
                type="filepath",
                format="png",
                interactive=False,
                elem_id="st-qfig",
                show_label=False,
                buttons=["download", "fullscreen"],
            )
    outputs = [note, click, pred, steer, qfig, layer, head, open_btn]

    def show(ckpt, sha, lay, q, h):
        return render(ctx, ckpt, sha, lay, q, h)

    def select(ckpt: str | None, sha: str | None, lay: float, evt: gr.SelectData):
        return on_select(ctx, ckpt, sha, lay, evt)

    click.select(
        select,
        [shared["checkpoint"], shared["image_sha"], layer],
        [query, click, qfig, qtext],
        api_visibility="private",
    )
    dl_btn.click(
        partial(downloads, ctx),
        [shared["checkpoint"], shared["image_sha"], layer, query],
        [dl_files, dl_status],
        api_visibility="private",
    )
    return {"render": show, "outputs": outputs, "layer": layer, "query": query, "head": head, "open": open_btn,
            "status": qtext}  # fmt: skip
