"""Tab 2, checkpoint geometry: every head's learned field, the gates, the atom table and the model card."""

from __future__ import annotations

import io
from dataclasses import dataclass
from functools import partial
from typing import Any

import gradio as gr
import numpy as np
from gradio.blocks import Block
from PIL import Image

from app import plots, widgets
from app.common import Updates, error_text, shown_figure, warn, write_downloads
from app.session_protocol import Restoring, SessionPart
from app.state import AppContext, LoadedModel
from app.widgets import layer_update, model_depth
from ssog_core.analysis import report
from ssog_core.analysis.measures import attention_maps, has_keys, key_norms
from ssog_core.field import centre_query
from ssog_core.viz import figures as viz
from ssog_core.viz import files as figures
from ssog_core.viz import raster

ATOM_HEADERS = [
    "layer",
    "head",
    "atom",
    "μy",
    "μx",
    "looks at dy",
    "looks at dx",
    "σy",
    "σx",
    "λ",
    "head entropy (nats)",
    "head radius (cells)",
]


@dataclass(frozen=True)
class GeometryUI:
    """The tab's components, by name."""

    note: gr.Markdown
    card: gr.Markdown
    figure: gr.Image
    gates: gr.Plot
    layer: gr.Slider
    layer_plot: gr.Plot
    stats: gr.Plot
    table: gr.Dataframe
    files: gr.File
    files_status: gr.Markdown
    status: gr.Markdown

    @property
    def outputs(self) -> list[Block]:
        """What :func:`render` changes."""
        return [self.note, self.card, self.figure, self.gates, self.layer_plot, self.stats, self.table, self.layer]


def card_markdown(ctx: AppContext, loaded: LoadedModel) -> str:
    card = ctx.cache.cards.get(loaded.key, lambda: report.model_card(loaded.model, loaded.meta))
    lines = [f"### {loaded.name}", "", "| model card | |", "|---|---|"]
    for k, v in card.items():
        if k == "parameters":
            v = f"{v:,}"
        elif k == "FLOPs per forward":
            v = f"{v / 1e6:,.1f} M" if v < 1e9 else f"{v / 1e9:.2f} G"
        elif k == "accuracy" and isinstance(v, float):
            v = f"{v:.2%}" if v <= 1 else f"{v:.2f}%"
        elif k == "training command":
            v = f"`{v}`"
        lines.append(f"| {k} | {str(v).replace('|', '/')} |")
    return "\n".join(lines)


def geometry_png(ctx: AppContext, loaded: LoadedModel) -> tuple[bytes, list[tuple[float, float, float, float]]]:
    """The layers × heads figure as PNG bytes and where each panel sits in it (drawn once per checkpoint)."""

    def draw() -> tuple[bytes, list[tuple[float, float, float, float]]]:
        fig = viz.geometry_figure(loaded.fields, loaded.name)
        settings = {"figure": "geometry", "checkpoint": loaded.name, "colormap": viz.FIELD_CMAP}
        png = viz.figure_bytes(fig, "png", settings)  # rendering fixes the layout: the boxes are read after it
        return png, viz.panel_boxes(fig)

    return ctx.cache.figures.get(("geometry", loaded.key), draw)


def geometry_image(ctx: AppContext, loaded: LoadedModel) -> str:
    """The figure as a named PNG file (its download keeps the name)."""
    png = geometry_png(ctx, loaded)[0]
    return write_downloads({f"{viz.safe_token('geometry_' + figures.stem_of(loaded.name))}.png": png})[0]


def head_at(ctx: AppContext, loaded: LoadedModel, xy: Any) -> tuple[int, int] | None:
    """The ``(layer, head)`` whose panel is under pixel ``(x, y)`` of the geometry figure, or None."""
    png, boxes = geometry_png(ctx, loaded)
    width, height = Image.open(io.BytesIO(png)).size
    x, y = float(xy[0]) / width, float(xy[1]) / height
    layers = len(loaded.fields)
    for k, (x0, y0, x1, y1) in enumerate(boxes):  # the figure's axes, row-major: head rows × layer columns
        if x0 <= x <= x1 and y0 <= y <= y1:
            return k % layers, k // layers
    return None


def shown(value: Any) -> dict[str, Any]:
    """A component's new value, hidden when there is none (no empty plot boxes or tables)."""
    return gr.update(value=value, visible=value is not None)


def render(ctx: AppContext, ui: GeometryUI, ckpt: str | None, layer: float, sha: str | None) -> Updates:
    """Everything the tab shows for a checkpoint (:attr:`GeometryUI.outputs`). What a model does not have (a dot
    model's field, gates and atoms) is hidden, and the note says what is shown instead."""
    hidden = {c: shown(None) for c in (ui.figure, ui.gates, ui.layer_plot, ui.stats, ui.table)}
    if not ckpt:
        note = "No checkpoint found: put `.safetensors` files in the checkpoint folder or upload one above."
        return {ui.note: note, ui.card: "", **hidden, ui.layer: gr.update(visible=False)}
    try:
        loaded = ctx.model(ckpt)
        card = card_markdown(ctx, loaded)
        if not loaded.is_ssog:
            text, fig, norms = dot_view(ctx, loaded, sha)
            return {**hidden, ui.note: text, ui.card: card, ui.figure: shown(fig), ui.stats: shown(norms),
                    ui.layer: gr.update(visible=False)}  # fmt: skip
        asked = layer  # the slider's value: sent back only if it has to move into the range
        layer = min(int(layer or 0), len(loaded.fields) - 1)
        init = report.initial_gate_scale(loaded.config)
        entropy = np.stack([lf.entropy.numpy() for lf in loaded.fields])
        radius = np.stack([lf.radius.numpy() for lf in loaded.fields])
        note = (
            f"**{ckpt}**: {len(loaded.fields)} layers × {loaded.config.num_heads} heads × "
            f"{loaded.config.num_atoms} atoms. "
            "Each panel is a head's field over key offset; `+` marks where an atom looks (−μ), brighter = larger λ. "
            "**Click a panel** to open that head in the playground."
        )
        stats = plots.stats_plot(entropy, radius, "Per-head attention entropy and effective radius<br>(fixed field)",
                                 loaded.config.grid[0] * loaded.config.grid[1])  # fmt: skip
        atoms = [[round(v, 4) if isinstance(v, float) else v for v in row] for row in report.atom_rows(loaded.fields)]
        return {
            ui.note: note,
            ui.card: card,
            ui.figure: shown(geometry_image(ctx, loaded)),
            ui.gates: shown(plots.gates_plot(loaded.fields, init, loaded.config.cold_init)),
            ui.layer_plot: shown(plots.layer_density_plot(loaded.fields[layer], layer)),
            ui.stats: shown(stats),
            ui.table: shown(atoms),
            ui.layer: layer_update(asked, len(loaded.fields), keep=True, visible=True),
        }
    except Exception as e:
        return {ui.note: warn(error_text(e)), ui.card: "", **hidden, ui.layer: gr.update(visible=False)}


def dot_view(ctx: AppContext, loaded: LoadedModel, sha: str | None):
    """A model without a field: say so, and show its attention maps (centre query) and key norms on the
    selected image."""
    text = (
        f"**{loaded.name}** is a **{loaded.kind}** attention model: its attention is scored from content, so it has "
        "no field, atoms or gates to draw. Shown instead: its attention maps — each layer × head's attention "
        "of the centre patch on the selected image (exact rows of the attention matrix) — and its key norms."
    )
    if not sha:
        return text + "\n\nPick or upload an image at the top to see them.", None, None
    stored = ctx.image(sha)
    x = loaded.input(stored.image)
    norms = None
    if has_keys(loaded.model):
        kn = key_norms(loaded.model, x)
        ratio = float(kn.sink_ratio.max())
        text += (
            f"\n\n**Key norms** (magnitude bullying): the {kn.top_k} largest-norm keys of a head take at most "
            f"**{ratio:.1f}×** the attention uniform attention would give them"
            + (f"; register tokens take {float(kn.prefix_share.mean()):.0%} on average." if kn.prefix else ".")
        )
        norms = plots.key_norm_plot(kn, f"{loaded.name}: key norms on {stored.name}")
    maps = attention_maps(loaded.model, x)
    gh, gw = maps.grid
    q = centre_query((gh, gw))
    n = q[0] * gw + q[1]
    rows = np.stack([a[0, :, n].reshape(-1, gh, gw).cpu().numpy() for a in maps.attn])
    display = raster.model_view(stored.image, loaded.config.img_size, figures.DISPLAY_WIDTH)
    fig = viz.attention_grid_figure(display, rows, q, f"{loaded.name} on {stored.name}")
    settings = {"figure": "attention maps", "checkpoint": loaded.name, "image": stored.name, "image_sha256": sha,
                "query": list(q)}  # fmt: skip
    stem = f"attention_{figures.stem_of(loaded.name)}_{sha[:8]}_q{q[0]}-{q[1]}"
    return text, shown_figure(fig, stem, settings), norms


def on_layer(ctx: AppContext, ckpt: str | None, layer: float):
    try:
        loaded = ctx.model(ckpt)
        if not loaded.is_ssog:
            return None
        layer = min(int(layer), len(loaded.fields) - 1)
        return plots.layer_density_plot(loaded.fields[layer], layer)
    except Exception as e:
        warn(error_text(e))
        return gr.skip()


def downloads(ctx: AppContext, ui: GeometryUI, ckpt: str | None) -> Updates:
    """Geometry + gates figures (PNG, SVG) and the atom table (CSV), the checkpoint in names and metadata."""
    try:
        loaded = ctx.model(ckpt)
        if not loaded.is_ssog:
            raise ValueError(f"{ckpt} has no field to export (a {loaded.config.attn} model)")
        init = report.initial_gate_scale(loaded.config)
        files = write_downloads(figures.geometry_files(ckpt, loaded.fields, init, loaded.name))
        return {ui.files: files, ui.files_status: ""}
    except Exception as e:
        return {ui.files: None, ui.files_status: warn(error_text(e))}


def session_part(ctx: AppContext, ui: GeometryUI) -> SessionPart:
    """The geometry tab's section: the interactive view's layer, within the restored checkpoint's depth."""

    def restore(section: dict[str, Any], restoring: Restoring) -> Updates:
        return {ui.layer: layer_update(section.get("layer"), model_depth(ctx, restoring.checkpoint))}

    return SessionPart("geometry", {"layer": ui.layer}, restore, [ui.layer])


def build(ctx: AppContext, shared: dict[str, Any]) -> GeometryUI:
    note = gr.Markdown(elem_id="geo-note")
    with gr.Row(equal_height=False):
        with gr.Column(scale=3):
            figure = gr.Image(
                label="Learned geometry: layers × heads",
                type="filepath",
                format="png",
                interactive=False,
                elem_id="geo-figure",
                show_label=False,
                buttons=["download", "fullscreen"],
            )
        with gr.Column(scale=2, min_width=300):
            card = gr.Markdown(elem_id="geo-card")
            with gr.Accordion("Download figures (PNG + SVG) and the atom table (CSV)", open=False):
                made = widgets.downloads()
                files, files_status = made.files, made.status
            status = gr.Markdown(elem_id="geo-status")
    gates = gr.Plot(show_label=False, label="Gate scales vs layer", elem_id="geo-gates")
    layer = widgets.layer_slider("layer for the interactive view", "geo-layer")
    layer_plot = gr.Plot(show_label=False, label="One layer, interactive", elem_id="geo-layer-plot")
    stats = gr.Plot(show_label=False, label="Per-head entropy and effective radius", elem_id="geo-stats")
    table = gr.Dataframe(
        headers=ATOM_HEADERS,
        label="Atoms: centres (query − key), widths, weights, head statistics",
        interactive=False,
        elem_id="geo-atoms",
        max_height=420,
    )
    ui = GeometryUI(note=note, card=card, figure=figure, gates=gates, layer=layer, layer_plot=layer_plot,
                    stats=stats, table=table, files=files, files_status=files_status, status=status)  # fmt: skip
    layer.change(  # release, typed value and keyboard alike (a release alone missed the last two)
        partial(on_layer, ctx),
        [shared["checkpoint"], layer],
        [layer_plot],
        show_progress="hidden",
        trigger_mode="always_last",
        api_visibility="private",
    )
    made.on_click(partial(downloads, ctx, ui), [shared["checkpoint"]])
    return ui
