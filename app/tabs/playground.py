"""Tab 1, the head playground: drag atoms, shape them, and watch the field the model would apply."""

from __future__ import annotations

import base64
import io
from functools import lru_cache, partial
from typing import Any

import gradio as gr
import numpy as np
from PIL import Image

from app import plots
from app.canvas import CSS_TEMPLATE, HTML_TEMPLATE, JS_ON_LOAD, canvas_props
from app.common import error_text, warn, write_downloads
from app.state import AppContext, AppError
from ssog_core import figures, viz
from ssog_core.playground import DEFAULT_SPEC, MAX_ATOMS, HeadSpec, HeadView, evaluate, spec_from_head
from ssog_core.presets import KINDS

CANVAS_SIZE = 440  # px of the canvas' longer side
READOUT_HEADERS = ["atom", "looks at (y, x)", "μ = ★ − key", "σ (y, x)", "width σ√τ", "λ"]


def initial_value() -> dict[str, Any]:
    return {**DEFAULT_SPEC.to_dict(), "sel": 0}


def _spec(value: Any) -> HeadSpec:
    return HeadSpec.from_dict(value)


def head_value(spec: HeadSpec, sel: int = 0) -> dict[str, Any]:
    return {**spec.to_dict(), "sel": min(max(int(sel), 0), len(spec.atoms) - 1)}


def render(value: Any, overlay: bool = False, hover: bool = True) -> tuple[dict[str, Any], HeadSpec, HeadView]:
    """Field image and overlay numbers for the canvas, computed by :func:`ssog_core.playground.evaluate`; with
    ``hover`` also every cell's weight (left out of drag previews, which stay small and fast)."""
    spec = _spec(value)
    view = evaluate(spec)
    d = view.density.numpy()
    rgb = viz.density_rgba(d) if overlay else viz.colorize(d, viz.FIELD_CMAP, 0.0, float(d.max()))
    ky, kx = view.row_marginal.numpy(), view.col_marginal.numpy()
    props = {
        "img": viz.data_url(viz.png_bytes(rgb)),
        "vmax": f"{float(d.max()):.4g}",
        "cbar": legend_gradient(viz.OVERLAY_CMAP if overlay else viz.FIELD_CMAP),
        "ky": [round(float(v), 4) for v in ky / max(ky.max(), 1e-30)],
        "kx": [round(float(v), 4) for v in kx / max(kx.max(), 1e-30)],
        "wid": [[round(float(w), 3) for w in row] for row in view.width],
        "lam": [round(float(v), 4) for v in view.lam],
        "info": f"★ query {tuple(spec.query)} · attention entropy {view.entropy:.2f} nats · "
        f"effective radius {view.radius:.2f} cells · {len(spec.atoms)} atoms = {5 * len(spec.atoms)} numbers",
    }
    if hover:
        props["dens"] = np.round(d, 5).tolist()
    return props, spec, view


@lru_cache(maxsize=4)
def legend_gradient(cmap: str) -> str:
    """A CSS gradient of a colour map, for the canvas' colour bar."""
    stops = viz.colorize(np.linspace(0.0, 1.0, 9)[None], cmap, 0.0, 1.0)[0]
    return "linear-gradient(to right, " + ", ".join(f"rgb({r},{g},{b})" for r, g, b in stops) + ")"


def preview(payload: dict) -> dict[str, Any]:
    """Server function for the live preview while dragging (one JSON argument, validated: the client sends it)."""
    try:
        if not isinstance(payload, dict):
            raise ValueError("preview needs {value, overlay}")
        props, _, _ = render(payload.get("value"), bool(payload.get("overlay")), hover=False)
        return props  # hover reads the last released head's values
    except Exception as e:  # the page shows the message; the server keeps serving
        return {"error": error_text(e)}


def readout(spec: HeadSpec, view: HeadView) -> list[list[str]]:
    rows = []
    for i, (a, mu, w, lam) in enumerate(zip(spec.atoms, view.mu, view.width, view.lam, strict=True)):
        rows.append(
            [
                f"{i + 1}",
                f"({a.y:.1f}, {a.x:.1f})",
                f"({float(mu[0]):+.1f}, {float(mu[1]):+.1f})",
                f"({a.sy:.2f}, {a.sx:.2f})",
                f"({float(w[0]):.2f}, {float(w[1]):.2f})",
                f"{float(lam):.3f}",
            ]
        )
    return rows


def canvas_outputs(value: Any, overlay: bool, extra: dict[str, Any] | None = None, new_value: bool = False):
    """Canvas update (props, plus the value itself when Python changed it) + kernel plot + readout."""
    props, spec, view = render(value, overlay)
    if new_value:
        props["value"] = value
    return gr.update(**props, **(extra or {}), err=""), plots.kernel_plot(spec, view), readout(spec, view)


def _sliders(value: dict[str, Any]):
    """Slider values of the selected atom (rounded for display) and whether atoms can be added / removed."""
    a = value["atoms"][value.get("sel", 0)]
    return (
        gr.update(value=round(a["sy"], 3)),
        gr.update(value=round(a["sx"], 3)),
        gr.update(value=round(a["w"], 3)),
        gr.update(interactive=len(value["atoms"]) < MAX_ATOMS),
        gr.update(interactive=len(value["atoms"]) > 1),
    )


def on_release(value: Any, bg: bool, evt: gr.EventData):
    """Authoritative canvas update after a drag, carrying the release time as ``ack`` (the page shows the round
    trip). Only the canvas: the kernel plot and readout follow in :func:`on_details`, so this stays fast."""
    t = (evt._data or {}).get("t", 0)
    try:
        props, _, _ = render(value, bg)
        return gr.update(**props, ack=t, err="")
    except Exception as e:
        return gr.update(err=error_text(e))


def on_details(value: Any):
    """Kernel plot and readout of the current head."""
    try:
        _, spec, view = render(value)
        return plots.kernel_plot(spec, view), readout(spec, view)
    except Exception:
        return gr.skip(), gr.skip()


def on_pick(value: Any, evt: gr.EventData):
    """An atom was selected on the canvas: its σ and weight go to the sliders."""
    try:
        return _sliders(head_value(_spec(value), (evt._data or {}).get("i", value.get("sel", 0))))
    except Exception:
        return (gr.skip(),) * 5


def on_atom_param(value: Any, sy: float, sx: float, w: float, bg: bool):
    """σy, σx or the weight of the selected atom changed."""
    try:
        v = dict(value)
        sel = int(v.get("sel", 0))
        atoms = [dict(a) for a in v["atoms"]]
        atoms[sel].update(sy=float(sy), sx=float(sx), w=float(w))
        v["atoms"] = atoms
        return canvas_outputs(head_value(_spec(v), sel), bg, new_value=True)
    except Exception as e:
        return gr.update(err=error_text(e)), gr.skip(), gr.skip()


def on_head_param(value: Any, tau: float, grid: int, mode: str, bg: bool):
    """τ, the grid size or the field mode changed. τ and the mode leave the ★ and the atoms where they are; a new
    grid moves the ★ to the same relative place on it (proportionally) and keeps every atom's offset μ from it."""
    try:
        spec = _spec(value)
        g = (int(grid), int(grid))
        q = tuple(rescale_cell(c, n0, n1) for c, n0, n1 in zip(spec.query, spec.grid, g, strict=True))
        dy, dx = q[0] - spec.query[0], q[1] - spec.query[1]
        v = {**spec.to_dict(), "grid": list(g), "query": list(q), "tau": float(tau), "mode": mode}
        v["atoms"] = [{**a, "y": a["y"] + dy, "x": a["x"] + dx} for a in v["atoms"]]
        v = head_value(_spec(v), value.get("sel", 0))
        return _full(v, bg)
    except Exception as e:
        return gr.update(err=error_text(e)), gr.skip(), gr.skip()


def rescale_cell(c: int, n_old: int, n_new: int) -> int:
    """Cell ``c`` of an ``n_old``-cell axis at the same relative place on an ``n_new``-cell axis (cell centres
    scale; unchanged when the size is)."""
    return min(max(round((c + 0.5) * n_new / n_old - 0.5), 0), n_new - 1)


def _full(v: dict[str, Any], bg: bool):
    return canvas_outputs(v, bg, new_value=True)


def on_add(value: Any, bg: bool, evt: gr.EventData):
    """Add an atom (where the user double-clicked, else beside the ★), copying the selected atom's shape."""
    try:
        spec = _spec(value)
        if len(spec.atoms) >= MAX_ATOMS:
            raise AppError(f"a head has at most {MAX_ATOMS} atoms")
        data = evt._data if isinstance(evt._data, dict) else {}
        sel = spec.atoms[min(int(value.get("sel", 0)), len(spec.atoms) - 1)]
        y = float(data.get("y", spec.query[0] - 2))
        x = float(data.get("x", spec.query[1] + 2))
        v = spec.to_dict()
        v["atoms"].append({"y": y, "x": x, "sy": sel.sy, "sx": sel.sx, "w": sel.w})
        v = head_value(_spec(v), len(v["atoms"]) - 1)
        return (*_full(v, bg), *_sliders(v))
    except Exception as e:
        warn(error_text(e))
        return (gr.skip(),) * 8


def on_remove(value: Any, bg: bool):
    try:
        spec = _spec(value)
        if len(spec.atoms) <= 1:
            raise AppError("a head needs at least one atom")
        sel = min(int(value.get("sel", 0)), len(spec.atoms) - 1)
        v = spec.to_dict()
        del v["atoms"][sel]
        v = head_value(_spec(v), max(sel - 1, 0))
        return (*_full(v, bg), *_sliders(v))
    except Exception as e:
        warn(error_text(e))
        return (gr.skip(),) * 8


def head_controls(v: dict[str, Any]):
    return gr.update(value=round(v["tau"], 3)), gr.update(value=v["grid"][0]), gr.update(value=v["mode"])


def on_reset(bg: bool):
    v = initial_value()
    return (*_full(v, bg), *_sliders(v), *head_controls(v), gr.update(value=None), "")


def preset_choices(ctx: AppContext, ckpt: str | None) -> tuple[list[str], str]:
    """Preset labels of the checkpoint's heads (empty for dot models or no checkpoint) and a note."""
    if not ckpt:
        return [], "No checkpoint selected: presets are heads a trained SSOG model converged to."
    try:
        lm = ctx.model(ckpt)
    except AppError as e:
        return [], f"Presets unavailable: {e}"
    if not lm.is_ssog:
        return [], f"{ckpt} is a {lm.kind} attention model: it has no field, so it gives no presets."
    missing = [k for k in KINDS if k not in {p.kind for p in lm.presets}]
    note = f"Presets are heads of **{ckpt}** (by the shape of their field)."
    if missing:
        note += f" No head of this model is a {' or '.join(missing)}."
    return [p.label for p in lm.presets], note


def on_checkpoint(ctx: AppContext, ckpt: str | None):
    """New presets for a new checkpoint; the picker is hidden when the model has none (the note says why)."""
    choices, note = preset_choices(ctx, ckpt)
    return gr.update(choices=choices, value=None, visible=bool(choices)), note


def on_preset(ctx: AppContext, ckpt: str, label: str | None, bg: bool, sha: str | None = None):
    """Load a trained head (atoms, widths, weights, τ) onto the canvas."""
    try:
        if not label:
            return (gr.skip(),) * 13
        lm = ctx.model(ckpt)
        match = [p for p in lm.presets if p.label == label]
        if not match:
            raise AppError(f"preset {label!r} is not a head of {ckpt}")
        return open_head(ctx, ckpt, match[0].shape.layer, match[0].shape.head, bg, sha, f"**{match[0].kind}** = ")
    except Exception as e:
        return (*(gr.skip(),) * 11, warn(error_text(e)), gr.skip())


def open_head(ctx: AppContext, ckpt: str, layer: int, head: int, bg: bool, sha: str | None, prefix: str = ""):
    """A trained head as an editable one, on the model's own patch grid with the ★ at its centre query: the
    field drawn is that query's fixed-field attention, and a picture under it is cut into the patches the model
    sees. Outputs: canvas, kernels, readout, the atom sliders and buttons, τ, grid, mode, note, status."""
    lm = ctx.model(ckpt)
    lf = lm.fields[layer]
    v = head_value(spec_from_head(lf, head, grid=tuple(lm.config.grid), mode=lm.config.field), 0)
    note = (
        f"{prefix}layer {layer}, head {head} of {ckpt}, on the model's {lm.config.grid[0]}×{lm.config.grid[1]} "
        f"patch grid (★ = the centre query): over all queries its attention entropy is {lf.entropy[head]:.2f} "
        f"nats and its effective radius {lf.radius[head]:.2f} cells (τ = {lf.tau:.2f})."
    )
    return load_head(ctx, v, bg, sha, note)


def load_head(ctx: AppContext, v: dict[str, Any], bg: bool, sha: str | None, note: str):
    """Every playground output for a head loaded from elsewhere (a preset, the geometry grid, a steered query):
    canvas (over the picture when the underlay is on), kernels, readout, atom controls, τ, grid, mode, note,
    status."""
    extra, status = {}, ""
    if bg:
        try:
            extra["bg"] = underlay_url(ctx, sha, v)
        except AppError as e:
            status = warn(error_text(e))
    return (
        *canvas_outputs(v, bg and bool(extra), extra, new_value=True),
        *_sliders(v),
        *head_controls(v),
        note,
        status,
    )


def underlay_url(ctx: AppContext, sha: str | None, value: dict[str, Any]) -> str:
    """The picture under the canvas, resized to the grid's aspect as the model's input is (stretched, never
    cropped: on a model's patch grid every cell is then one patch), sent once as a JPEG data URL."""
    if not sha:
        raise AppError("pick or upload an image first (top of the page) to draw the head over it")
    img = ctx.image(sha).image
    gh, gw = value["grid"]
    w = CANVAS_SIZE * gw // max(gh, gw)
    h = CANVAS_SIZE * gh // max(gh, gw)
    fitted = img.convert("RGB").resize((w, h), Image.Resampling.BICUBIC)
    buf = io.BytesIO()
    fitted.save(buf, format="JPEG", quality=85)
    return "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def underlay_note(ctx: AppContext, ckpt: str | None, sha: str | None, value: dict[str, Any]) -> str:
    """Say on which scale the picture is drawn: the selected model's patches, or a grid of the user's own."""
    if not ckpt:
        return ""
    try:
        lm = ctx.model(ckpt)
    except AppError:
        return ""
    grid, model_grid = tuple(value["grid"]), tuple(lm.config.grid)
    size = ctx.image(sha).original_size if sha else None
    h, w = lm.config.img_size
    seen = f" The picture ({size[0]}×{size[1]} px) is resized to {w}×{h} px as {ckpt} sees it." if size else ""
    if grid == model_grid:
        return f"One canvas cell = one of {ckpt}'s {grid[0]}×{grid[1]} patches.{seen}"
    return (
        f"This head's grid is {grid[0]}×{grid[1]} cells, not {ckpt}'s {model_grid[0]}×{model_grid[1]} patch grid: "
        f"the picture is stretched over it. Load a preset (or set the grid to {model_grid[0]}) to see a head at "
        f"the model's scale.{seen}"
    )


def on_underlay(ctx: AppContext, value: Any, show: bool, sha: str | None, ckpt: str | None = None):
    """Turn the image underlay on or off (or refresh it after a new image was picked)."""
    try:
        bg = underlay_url(ctx, sha, value) if show else ""
        canvas, fig, rows = canvas_outputs(value, bool(bg), {"bg": bg})
        return canvas, fig, rows, gr.update(value=bool(bg)), underlay_note(ctx, ckpt, sha, value) if bg else ""
    except Exception as e:  # no picture: the checkbox goes back off so the field is drawn opaque again
        canvas, fig, rows = canvas_outputs(value, False, {"bg": ""})
        return canvas, fig, rows, gr.update(value=False), warn(error_text(e))


def export_figure(ctx: AppContext, value: Any, show: bool, sha: str | None):
    """PNG + SVG of the head (over the picture when the underlay is on), settings in names and metadata."""
    try:
        image = ctx.image(sha).image if (show and sha) else None
        return write_downloads(figures.playground_files(_spec(value), image, sha)), ""
    except Exception as e:
        return None, warn(error_text(e))


def build(ctx: AppContext, shared: dict[str, Any]) -> dict[str, Any]:
    """The tab's components and events; returns the components other parts of the app need."""
    v0 = initial_value()
    props0, spec0, view0 = render(v0)
    with gr.Row(equal_height=False):
        with gr.Column(scale=3, min_width=300):
            canvas = gr.HTML(
                v0,
                html_template=HTML_TEMPLATE,
                css_template=CSS_TEMPLATE,
                js_on_load=JS_ON_LOAD,
                apply_default_css=False,
                elem_id="pg-canvas",
                server_functions=[preview],
                **{**canvas_props(CANVAS_SIZE), **props0},
            )
            gr.Markdown(
                "Drag the numbered atoms to where the head looks, drag the ★ to move the query; double-click to "
                "add an atom. Right: the λ-weighted row kernel; below: the column kernel. Field = softmax over keys "
                "of each atom's Gaussians, computed by `ssog_core.field` (atoms sit at key = ★ − μ).",
                elem_classes="hint",
            )
        with gr.Column(scale=2, min_width=320):
            preset = gr.Dropdown(
                [], label="Preset: a head a trained model converged to", value=None, elem_id="pg-preset"
            )
            preset_note = gr.Markdown(elem_id="pg-preset-note")
            with gr.Group():
                gr.Markdown("**Selected atom** (click an atom on the canvas)")
                sy = gr.Slider(0.25, 16, value=v0["atoms"][0]["sy"], step=0.05, label="σy (cells)", elem_id="pg-sy")
                sx = gr.Slider(0.25, 16, value=v0["atoms"][0]["sx"], step=0.05, label="σx (cells)", elem_id="pg-sx")
                w = gr.Slider(
                    0.01, 1, value=v0["atoms"][0]["w"], step=0.01, label="weight (λ = w / Σw)", elem_id="pg-w"
                )
                with gr.Row():
                    add = gr.Button("Add atom", size="sm", elem_id="pg-add")
                    remove = gr.Button("Remove atom", size="sm", elem_id="pg-remove")
                    reset = gr.Button("Reset", size="sm", elem_id="pg-reset")
            with gr.Group():
                gr.Markdown("**Head**")
                tau = gr.Slider(0.5, 5, value=v0["tau"], step=0.05, label="temperature τ", elem_id="pg-tau")
                grid = gr.Slider(
                    5, 64, value=v0["grid"][0], step=1, label="grid size (cells per side)", elem_id="pg-grid"
                )
                mode = gr.Radio(["factorized", "axial"], value=v0["mode"], label="field mode")
                underlay = gr.Checkbox(False, label="draw over the selected image", elem_id="pg-underlay")
            with gr.Group(visible=False, elem_id="pg-steer") as steer_group:
                steer_note = gr.Markdown(elem_id="pg-steer-note")
                gate = gr.Slider(
                    0,
                    1,
                    value=1,
                    step=0.05,
                    label="content gate: 0 = the fixed field … 1 = the learned gate",
                    elem_id="pg-gate",
                )
            steer_src = gr.State(None)
            pg_status = gr.Markdown()
            with gr.Accordion("Export this head as a figure (PNG + SVG)", open=False):
                fig_btn = gr.Button("Make figure", size="sm")
                fig_files = gr.File(label="figure files", file_count="multiple", interactive=False)
    kernels = gr.Plot(plots.kernel_plot(spec0, view0), show_label=False, label="1D kernels of the ★ query")
    table = gr.Dataframe(
        readout(spec0, view0),
        headers=READOUT_HEADERS,
        label="Atoms (grid cells)",
        interactive=False,
        elem_id="pg-readout",
    )

    fast = dict(show_progress="hidden", trigger_mode="always_last", api_visibility="private")
    main_out = [canvas, kernels, table]
    atom_controls = [sy, sx, w, add, remove]
    canvas.release(on_release, [canvas, underlay], [canvas], queue=False, **fast).then(
        on_details, [canvas], [kernels, table], **fast
    )
    canvas.pick(on_pick, [canvas], atom_controls, queue=False, **fast)
    canvas.addatom(on_add, [canvas, underlay], main_out + atom_controls, **fast)
    for s in (sy, sx, w):
        s.input(on_atom_param, [canvas, sy, sx, w, underlay], main_out, **fast)
    for c in (tau, grid, mode):
        c.input(on_head_param, [canvas, tau, grid, mode, underlay], main_out, **fast)
    add.click(on_add, [canvas, underlay], main_out + atom_controls, **fast)
    remove.click(on_remove, [canvas, underlay], main_out + atom_controls, **fast)
    reset.click(on_reset, [underlay], main_out + atom_controls + [tau, grid, mode, preset, preset_note], **fast)
    preset.input(
        partial(on_preset, ctx),
        [shared["checkpoint"], preset, underlay, shared["image_sha"]],
        main_out + atom_controls + [tau, grid, mode, preset_note, pg_status],
        **fast,
    )
    underlay.input(
        partial(on_underlay, ctx),
        [canvas, underlay, shared["image_sha"], shared["checkpoint"]],
        main_out + [underlay, pg_status],
        **fast,
    )
    fig_btn.click(
        partial(export_figure, ctx),
        [canvas, underlay, shared["image_sha"]],
        [fig_files, pg_status],
        api_visibility="private",
    )
    return {
        "canvas": canvas,
        "preset": preset,
        "preset_note": preset_note,
        "underlay": underlay,
        "main_out": main_out,
        "status": pg_status,
        "head_controls": [tau, grid, mode],
        "atom_controls": atom_controls,
        "steer_group": steer_group,
        "steer_note": steer_note,
        "gate": gate,
        "steer_src": steer_src,
    }
