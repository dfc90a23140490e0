"""Tab 2, checkpoint geometry: every head's learned field, the gates, the atom table and the model card."""

from __future__ import annotations

import io
from functools import partial
from typing import Any

import gradio as gr
import numpy as np
from PIL import Image

from app import plots
from app.common import LRU, error_text, shown_figure, warn, write_downloads
from app.state import AppContext, LoadedModel
from ssog_core import figures, report, viz
from ssog_core.analysis import attention_maps, has_keys, key_norms

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
_CARDS = LRU(8)
_FIGURES = LRU(8)


def card_markdown(lm: LoadedModel) -> str:
    card = _CARDS.get(lm.key, lambda: report.model_card(lm.model, lm.meta))
    lines = [f"### {lm.name}", "", "| model card | |", "|---|---|"]
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


def geometry_png(lm: LoadedModel) -> tuple[bytes, list[tuple[float, float, float, float]]]:
    """The layers × heads figure as PNG bytes and where each panel sits in it (drawn once per checkpoint)."""

    def draw() -> tuple[bytes, list[tuple[float, float, float, float]]]:
        fig = viz.geometry_figure(lm.fields, lm.name)
        settings = {"figure": "geometry", "checkpoint": lm.name, "colormap": viz.FIELD_CMAP}
        png = viz.figure_bytes(fig, "png", settings)  # rendering fixes the layout: the boxes are read after it
        return png, viz.panel_boxes(fig)

    return _FIGURES.get(("geometry", lm.key), draw)


def geometry_image(lm: LoadedModel) -> str:
    """The figure as a named PNG file (its download keeps the name)."""
    return write_downloads({f"{viz.safe_token('geometry_' + figures.stem_of(lm.name))}.png": geometry_png(lm)[0]})[0]


def head_at(lm: LoadedModel, xy: Any) -> tuple[int, int] | None:
    """The ``(layer, head)`` whose panel is under pixel ``(x, y)`` of the geometry figure, or None."""
    png, boxes = geometry_png(lm)
    width, height = Image.open(io.BytesIO(png)).size
    x, y = float(xy[0]) / width, float(xy[1]) / height
    layers = len(lm.fields)
    for k, (x0, y0, x1, y1) in enumerate(boxes):  # the figure's axes, row-major: head rows × layer columns
        if x0 <= x <= x1 and y0 <= y <= y1:
            return k % layers, k // layers
    return None


def shown(value: Any) -> dict[str, Any]:
    """A component's new value, hidden when there is none (no empty plot boxes or tables)."""
    return gr.update(value=value, visible=value is not None)


def render(ctx: AppContext, ckpt: str | None, layer: float, sha: str | None):
    """Everything the tab shows for a checkpoint: (note, card, figure, gates plot, layer plot, stats plot,
    atom table, layer slider update). What a model does not have (a dot model's field, gates and atoms) is
    hidden, and the note says what is shown instead."""
    hidden = tuple(shown(None) for _ in range(5))
    if not ckpt:
        return (
            "No checkpoint found: put `.safetensors` files in the checkpoint folder or upload one above.",
            "",
            *hidden,
            gr.update(visible=False),
        )
    try:
        lm = ctx.model(ckpt)
        card = card_markdown(lm)
        if not lm.is_ssog:
            text, fig, norms = dot_view(ctx, lm, sha)
            return text, card, shown(fig), shown(None), shown(None), shown(norms), shown(None), gr.update(visible=False)
        layer = min(int(layer or 0), len(lm.fields) - 1)
        init = report.initial_gate_scale(lm.config)
        entropy = np.stack([lf.entropy.numpy() for lf in lm.fields])
        radius = np.stack([lf.radius.numpy() for lf in lm.fields])
        note = (
            f"**{ckpt}**: {len(lm.fields)} layers × {lm.config.num_heads} heads × {lm.config.num_atoms} atoms. "
            "Each panel is a head's field over key offset; `+` marks where an atom looks (−μ), brighter = larger λ. "
            "**Click a panel** to open that head in the playground."
        )
        stats = plots.stats_plot(entropy, radius, "Per-head attention entropy and effective radius (fixed field)",
                                 lm.config.grid[0] * lm.config.grid[1])  # fmt: skip
        atoms = [[round(v, 4) if isinstance(v, float) else v for v in row] for row in report.atom_rows(lm.fields)]
        return (
            note,
            card,
            shown(geometry_image(lm)),
            shown(plots.gates_plot(lm.fields, init)),
            shown(plots.layer_density_plot(lm.fields[layer], layer)),
            shown(stats),
            shown(atoms),
            gr.update(maximum=max(len(lm.fields) - 1, 1), value=layer, visible=True),
        )
    except Exception as e:
        return (warn(error_text(e)), "", *hidden, gr.update(visible=False))


def dot_view(ctx: AppContext, lm: LoadedModel, sha: str | None):
    """A model without a field: say so, and show its attention maps (centre query) and key norms on the
    selected image."""
    text = (
        f"**{lm.name}** is a **{lm.kind}** attention model: its attention is scored from content, so it has "
        "no field, atoms or gates to draw. Shown instead: its attention maps — each layer × head's attention "
        "of the centre patch on the selected image (exact rows of the attention matrix) — and its key norms."
    )
    if not sha:
        return text + "\n\nPick or upload an image at the top to see them.", None, None
    stored = ctx.image(sha)
    x = lm.input(stored.image)
    norms = None
    if has_keys(lm.model):
        kn = key_norms(lm.model, x)
        ratio = float((kn.topk_share / kn.uniform_share.clamp_min(1e-12)).max())
        text += (
            f"\n\n**Key norms** (magnitude bullying): the {kn.top_k} largest-norm keys of a head take at most "
            f"**{ratio:.1f}×** the attention uniform attention would give them"
            + (f"; register tokens take {float(kn.prefix_share.mean()):.0%} on average." if kn.prefix else ".")
        )
        norms = plots.key_norm_plot(kn, f"{lm.name}: key norms on {stored.name}")
    maps = attention_maps(lm.model, x)
    gh, gw = maps.grid
    q = ((gh - 1) // 2, (gw - 1) // 2)
    n = q[0] * gw + q[1]
    rows = np.stack([a[0, :, n].reshape(-1, gh, gw).cpu().numpy() for a in maps.attn])
    display = viz.model_view(stored.image, lm.config.img_size, figures.DISPLAY_WIDTH)
    fig = viz.attention_grid_figure(display, rows, q, f"{lm.name} on {stored.name}")
    settings = {"figure": "attention maps", "checkpoint": lm.name, "image": stored.name, "image_sha256": sha,
                "query": list(q)}  # fmt: skip
    return text, shown_figure(fig, f"attention_{figures.stem_of(lm.name)}_{sha[:8]}_q{q[0]}-{q[1]}", settings), norms


def on_layer(ctx: AppContext, ckpt: str | None, layer: float):
    try:
        lm = ctx.model(ckpt)
        if not lm.is_ssog:
            return None
        layer = min(int(layer), len(lm.fields) - 1)
        return plots.layer_density_plot(lm.fields[layer], layer)
    except Exception as e:
        warn(error_text(e))
        return gr.skip()


def downloads(ctx: AppContext, ckpt: str | None):
    """Geometry + gates figures (PNG, SVG) and the atom table (CSV), the checkpoint in names and metadata."""
    try:
        lm = ctx.model(ckpt)
        if not lm.is_ssog:
            raise ValueError(f"{ckpt} has no field to export (a {lm.config.attn} model)")
        init = report.initial_gate_scale(lm.config)
        return write_downloads(figures.geometry_files(ckpt, lm.fields, init, lm.name)), ""
    except Exception as e:
        return None, warn(error_text(e))


def build(ctx: AppContext, shared: dict[str, Any]) -> dict[str, Any]:
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
                dl_btn = gr.Button("Make files", size="sm")
                dl_files = gr.File(label="files", file_count="multiple", interactive=False)
                dl_status = gr.Markdown()
            status = gr.Markdown(elem_id="geo-status")
    gates = gr.Plot(show_label=False, label="Gate scales vs layer", elem_id="geo-gates")
    layer = gr.Slider(0, 1, value=0, step=1, label="layer for the interactive view", elem_id="geo-layer")
    layer_plot = gr.Plot(show_label=False, label="One layer, interactive", elem_id="geo-layer-plot")
    stats = gr.Plot(show_label=False, label="Per-head entropy and effective radius")
    table = gr.Dataframe(
        headers=ATOM_HEADERS,
        label="Atoms: centres (query − key), widths, weights, head statistics",
        interactive=False,
        elem_id="geo-atoms",
        max_height=420,
    )
    outputs = [note, card, figure, gates, layer_plot, stats, table, layer]

    def show(ckpt, lay, sha):
        return render(ctx, ckpt, lay, sha)

    layer.change(  # release, typed value and keyboard alike (a release alone missed the last two)
        partial(on_layer, ctx),
        [shared["checkpoint"], layer],
        [layer_plot],
        show_progress="hidden",
        trigger_mode="always_last",
        api_visibility="private",
    )
    dl_btn.click(partial(downloads, ctx), [shared["checkpoint"]], [dl_files, dl_status], api_visibility="private")
    return {"render": show, "outputs": outputs, "layer": layer, "figure": figure, "status": status}
