"""Tab 1, the head playground: drag atoms, shape them, and watch the field the model would apply."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import gradio as gr
import numpy as np
from gradio.blocks import Block

from app import fields, interventions, plots, queues
from app import pictures as chooser
from app.canvas import CANVAS_SIZE, CSS_TEMPLATE, HTML_TEMPLATE, JS_ON_LOAD, canvas_props, underlay_url
from app.common import Updates, error_text, warn, write_downloads
from app.session_protocol import Restoring, SessionPart
from app.state import AppContext, AppError, LoadedModel
from ssog_core.analysis.head_as_field import FIT_ATOMS, fit_spec
from ssog_core.analysis.head_spec import (
    DEFAULT_SPEC,
    MAX_ATOMS,
    SIGMA_RANGE,
    Atom,
    HeadSpec,
    HeadView,
    evaluate,
    spec_from_head,
)
from ssog_core.analysis.measures import DEFAULT_IMAGES
from ssog_core.analysis.presets import KINDS, RULES
from ssog_core.interventions.edit import Edit
from ssog_core.interventions.ops import head_edits
from ssog_core.viz import figures as viz
from ssog_core.viz import files as figures
from ssog_core.viz import raster

# slider ranges a user starts with; a head loaded from elsewhere widens them to hold its numbers (:func:`fit`).
# σ starts at the narrowest a head may have: content steering narrows atoms below a model's σ floor.
SIGMA_SLIDER = (SIGMA_RANGE[0], 16.0)
WEIGHT_SLIDER = (0.01, 1.0)
TAU_SLIDER = (0.5, 5.0)
GRID_SLIDER = (5, 64)
READOUT_HEADERS = ["atom", "looks at (y, x)", "μ = ★ − key", "σ (y, x)", "width σ√τ", "λ"]


@dataclass(frozen=True)
class PlaygroundUI:
    """The tab's components, by name: handlers return ``{component: value}`` for the ones they change."""

    canvas: gr.HTML
    kernels: gr.Plot
    table: gr.Dataframe
    sy: gr.Slider
    sx: gr.Slider
    w: gr.Slider
    add: gr.Button
    remove: gr.Button
    reset: gr.Button
    tau: gr.Slider
    grid: gr.Slider
    mode: gr.Radio
    preset: gr.Dropdown
    preset_note: gr.Markdown
    underlay: gr.Checkbox
    zoom: gr.Checkbox  # show only the ★ and the atoms' extent (the canvas' ``fit``)
    steer_group: gr.Group
    steer_note: gr.Markdown
    gate: gr.Slider
    gate_effect: gr.Markdown  # the model's prediction with this head's gates at the slider's value
    steer_src: gr.State
    status: gr.Markdown
    figure_button: gr.Button
    figure_files: gr.File
    model_src: gr.State  # {"checkpoint", "layer", "head"} of a head opened from a model, else None
    apply: gr.Checkbox  # apply the edited head to the model on every release
    apply_note: gr.Markdown

    @property
    def main_out(self) -> list[Block]:
        """The head as drawn: canvas, kernel plot, readout."""
        return [self.canvas, self.kernels, self.table]

    @property
    def atom_controls(self) -> list[Block]:
        return [self.sy, self.sx, self.w, self.add, self.remove]

    @property
    def head_controls(self) -> list[Block]:
        return [self.tau, self.grid, self.mode]

    @property
    def steer_out(self) -> list[Block]:
        """What opening a steered query's head sets besides :attr:`head_out`."""
        return [self.steer_group, self.steer_note, self.gate, self.gate_effect, self.steer_src]

    @property
    def head_out(self) -> list[Block]:
        """Everything a head loaded from elsewhere (a preset, the geometry grid, a steered query) changes."""
        return [*self.main_out, *self.atom_controls, *self.head_controls, self.preset_note, self.status,
                self.model_src, self.apply, self.apply_note, self.zoom]  # fmt: skip


def initial_value() -> dict[str, Any]:
    return {**DEFAULT_SPEC.to_dict(), "sel": 0}


def _spec(value: Any) -> HeadSpec:
    return HeadSpec.from_dict(value)


def _selected(value: Any, spec: HeadSpec) -> int:
    """The canvas' selected atom, kept inside the head."""
    return min(max(int(value.get("sel", 0)), 0), len(spec.atoms) - 1)


def head_value(spec: HeadSpec, sel: int = 0) -> dict[str, Any]:
    return {**spec.to_dict(), "sel": min(max(int(sel), 0), len(spec.atoms) - 1)}


def render(value: Any, overlay: bool = False, hover: bool = True) -> tuple[dict[str, Any], HeadSpec, HeadView]:
    """Field image and overlay numbers for the canvas, computed by :func:`ssog_core.analysis.head_spec.evaluate`; with
    ``hover`` also every cell's weight (left out of drag previews, which stay small and fast)."""
    spec = _spec(value)
    view = evaluate(spec)
    d = view.density.numpy()
    rgb = raster.density_rgba(d) if overlay else raster.colorize(d, viz.FIELD_CMAP, 0.0, float(d.max()))
    ky, kx = view.row_marginal.numpy(), view.col_marginal.numpy()
    props = {
        "img": raster.data_url(raster.png_bytes(rgb)),
        "vmax": f"{float(d.max()):.4g}",
        "cbar": LEGENDS[viz.OVERLAY_CMAP if overlay else viz.FIELD_CMAP],
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


def legend_gradient(cmap: str) -> str:
    """A CSS gradient of a colour map, for the canvas' colour bar."""
    stops = raster.colorize(np.linspace(0.0, 1.0, 9)[None], cmap, 0.0, 1.0)[0]
    return "linear-gradient(to right, " + ", ".join(f"rgb({r},{g},{b})" for r, g, b in stops) + ")"


LEGENDS = {cmap: legend_gradient(cmap) for cmap in (viz.FIELD_CMAP, viz.OVERLAY_CMAP)}  # the canvas' two maps


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


def canvas_outputs(
    ui: PlaygroundUI, value: Any, overlay: bool, extra: dict[str, Any] | None = None, new_value: bool = False
) -> Updates:
    """Canvas update (props, plus the value itself when Python changed it), kernel plot and readout."""
    props, spec, view = render(value, overlay)
    if new_value:
        props["value"] = value
    return {
        ui.canvas: gr.update(**props, **(extra or {}), err=""),
        ui.kernels: plots.kernel_plot(spec, view),
        ui.table: readout(spec, view),
    }


def fit(value: float, lo: float, hi: float) -> dict[str, Any]:
    """A slider update whose range holds ``value``: a restored or trained head may lie outside the range a user
    starts with, and Gradio refuses a value outside its slider."""
    v = round(float(value), 3)
    return gr.update(minimum=min(lo, v), maximum=max(hi, v), value=v)


def sliders(ui: PlaygroundUI, value: dict[str, Any]) -> Updates:
    """The selected atom's σ and weight in the sliders (rounded for display; the head keeps its exact numbers)
    and whether atoms can be added / removed."""
    a = value["atoms"][value.get("sel", 0)]
    return {
        ui.sy: fit(a["sy"], *SIGMA_SLIDER),
        ui.sx: fit(a["sx"], *SIGMA_SLIDER),
        ui.w: fit(a["w"], *WEIGHT_SLIDER),
        ui.add: gr.update(interactive=len(value["atoms"]) < MAX_ATOMS),
        ui.remove: gr.update(interactive=len(value["atoms"]) > 1),
    }


def head_controls(ui: PlaygroundUI, value: dict[str, Any]) -> Updates:
    return {
        ui.tau: fit(value["tau"], *TAU_SLIDER),
        ui.grid: fit(value["grid"][0], *GRID_SLIDER),
        ui.mode: gr.update(value=value["mode"]),
    }


def on_release(value: Any, bg: bool, evt: gr.EventData):
    """Authoritative canvas update after a drag, carrying the release time as ``ack`` (the page shows the round
    trip). Only the canvas: the kernel plot and readout follow in :func:`on_details`, so this stays fast."""
    t = (evt._data or {}).get("t", 0)
    try:
        props, _, _ = render(value, bg)
        return gr.update(**props, ack=t, err="")
    except Exception as e:
        return gr.update(err=error_text(e))


def on_details(ui: PlaygroundUI, value: Any) -> Updates:
    """Kernel plot and readout of the current head."""
    try:
        _, spec, view = render(value)
        return {ui.kernels: plots.kernel_plot(spec, view), ui.table: readout(spec, view)}
    except Exception:
        return gr.skip()


def on_pick(ui: PlaygroundUI, value: Any, evt: gr.EventData) -> Updates:
    """An atom was selected on the canvas: its σ and weight go to the sliders."""
    try:
        return sliders(ui, head_value(_spec(value), (evt._data or {}).get("i", value.get("sel", 0))))
    except Exception:
        return gr.skip()


def on_atom_param(ui: PlaygroundUI, key: str, value: Any, number: float, bg: bool) -> Updates:
    """σy, σx or the weight (``key``) of the selected atom changed: only that number is written, so a slider
    that shows a rounded value never rewrites the atom's other numbers."""
    try:
        spec = _spec(value)
        sel = _selected(value, spec)
        return canvas_outputs(ui, head_value(spec.with_atom(sel, **{key: number}), sel), bg, new_value=True)
    except Exception as e:
        return {ui.canvas: gr.update(err=error_text(e))}


def on_head_param(ui: PlaygroundUI, value: Any, tau: float, grid: int, mode: str, bg: bool) -> Updates:
    """τ, the grid size or the field mode changed. τ and the mode leave the ★ and the atoms where they are; a new
    grid moves the ★ to the same relative place on it (proportionally) and keeps every atom's offset μ from it."""
    try:
        spec = _spec(value)
        sel = _selected(value, spec)
        spec = replace(spec.with_grid((int(grid), int(grid))), tau=float(tau), mode=mode)
        return canvas_outputs(ui, head_value(spec, sel), bg, new_value=True)
    except Exception as e:
        return {ui.canvas: gr.update(err=error_text(e))}


def _edited(ui: PlaygroundUI, v: dict[str, Any], bg: bool) -> Updates:
    """Every output of an edit that changes the atoms: the drawn head and the selected atom's controls."""
    return {**canvas_outputs(ui, v, bg, new_value=True), **sliders(ui, v)}


def on_add(ui: PlaygroundUI, value: Any, bg: bool, evt: gr.EventData) -> Updates:
    """Add an atom (where the user double-clicked, else beside the ★), copying the selected atom's shape."""
    try:
        spec = _spec(value)
        data = evt._data if isinstance(evt._data, dict) else {}
        shape = spec.atoms[_selected(value, spec)]
        y = float(data.get("y", spec.query[0] - 2))
        x = float(data.get("x", spec.query[1] + 2))
        spec = spec.add_atom(Atom(y, x, shape.sy, shape.sx, shape.w))
        return _edited(ui, head_value(spec, len(spec.atoms) - 1), bg)
    except Exception as e:
        warn(error_text(e))
        return gr.skip()


def on_remove(ui: PlaygroundUI, value: Any, bg: bool) -> Updates:
    """Remove the selected atom; the one before it becomes the selected one."""
    try:
        spec = _spec(value)
        sel = _selected(value, spec)
        return _edited(ui, head_value(spec.remove_atom(sel), max(sel - 1, 0)), bg)
    except Exception as e:
        warn(error_text(e))
        return gr.skip()


def on_reset(ui: PlaygroundUI, bg: bool) -> Updates:
    v = initial_value()
    return {**_edited(ui, v, bg), **head_controls(ui, v), ui.preset: gr.update(value=None), ui.preset_note: ""}


def preset_choices(ctx: AppContext, ckpt: str | None) -> tuple[list[str], str]:
    """Preset labels of the checkpoint's heads (empty for dot models or no checkpoint) and a note."""
    if not ckpt:
        return [], "No checkpoint selected: presets are heads a trained SSOG model converged to."
    try:
        loaded = ctx.model(ckpt)
    except AppError as e:
        return [], f"Presets unavailable: {e}"
    if not loaded.is_ssog:
        fits, said = fitted_presets(ctx, loaded)
        if fits:
            return list(fits), f"Presets are the heads of **{ckpt}** ({loaded.kind}) as fields: {said}."
        return [], (
            f"{ckpt} is a {loaded.kind} attention model: it has no field of its own, so its heads become presets once "
            "measured as fields (Checkpoint geometry → Every head as a field: each head's fitted atoms). The canvas "
            "holds the demo head until then, not one of this model's."
        )
    shown = {p.kind for p in loaded.presets}
    missing = [k for k in KINDS if "elongated" not in k and k not in shown]
    note = f"Presets are heads of **{ckpt}**, named by the measured shape of their fixed field ({RULES})."
    if missing:
        note += f" No head of this model is a {' or '.join(missing)}."
    return [p.label for p in loaded.presets], note


def fitted_presets(ctx: AppContext, loaded: LoadedModel) -> tuple[dict[str, tuple[HeadSpec, str]], str]:
    """The heads of a model without a field as presets: each head's fitted atoms (:func:`fit_spec`) from its latest
    measurement as fields on this server (:func:`app.fields.measure`), by label with the note shown when one is
    opened; and what they were measured on, in words. Empty before any measurement."""
    mine = [(key, stats) for key, stats in ctx.cache.head_fields.items() if key[:2] == (loaded.name, loaded.key)]
    if not mine:
        return {}, ""
    key, stats = mine[-1]
    atoms = key[3]
    out = {}
    for layer in range(len(stats.fits)):
        for head in range(stats.fits[layer].mu.shape[0]):
            share, d = float(stats.share_fit[layer, head]), float(stats.mean_distance_px[layer, head])
            label = (
                f"fit: layer {layer} · head {head} (its {atoms} atoms explain {share:.0%}, mean distance {d:.0f} px)"
            )
            note = (f"Layer {layer}, head {head} of {loaded.name} as its {atoms} fitted atoms (τ = 1), measured on "
                    f"{stats.measured_on}: they explain {share:.0%} of the head.")  # fmt: skip
            out[label] = fit_spec(stats.fits[layer], head, stats.grid), note
    return out, f"each head's {atoms}-atom fit, measured on {stats.measured_on}"


def on_checkpoint(ctx: AppContext, ui: PlaygroundUI, ckpt: str | None) -> Updates:
    """New presets for a new checkpoint; the picker is hidden when the model has none (the note says why)."""
    choices, note = preset_choices(ctx, ckpt)
    return {ui.preset: gr.update(choices=choices, value=None, visible=bool(choices)), ui.preset_note: note}


def on_open(
    ctx: AppContext, ui: PlaygroundUI, ckpt: str | None, choice: str | None = None, request: Any = None
) -> Iterator[Updates]:
    """The playground opened on ``ckpt``: its presets (:func:`on_checkpoint`). For a model without a field whose
    heads were never measured on this server, first measure them: the heavy job of Checkpoint geometry's *Every
    head as a field* (:func:`app.fields.measure`, with its default N and K, on the pictures chosen on the page,
    ``choice``), its progress on the note, then each head's fit as a preset. The canvas keeps the demo head, and
    the note says it is not one of this model's."""
    choices, _ = preset_choices(ctx, ckpt)
    try:
        loaded = ctx.model(ckpt) if ckpt and not choices else None
    except AppError:
        loaded = None
    if loaded is None or loaded.is_ssog:
        yield on_checkpoint(ctx, ui, ckpt)
        return
    try:
        pictures = chooser.chosen(ctx, choice)
        doing = (
            f"Measuring the heads' fields of **{ckpt}** ({loaded.kind}) on "
            f"{pictures.words(loaded.meta, DEFAULT_IMAGES)}, once: each head's {FIT_ATOMS}-atom fit becomes a "
            "preset. The canvas holds the demo head until then, not one of this model's"
        )
        yield {ui.preset: gr.update(choices=[], value=None, visible=False), ui.preset_note: f"{doing}…"}
        work = lambda stop, watch: fields.measure(  # noqa: E731
            ctx, loaded, DEFAULT_IMAGES, FIT_ATOMS, stop, watch, pictures
        )
        for done, progress in queues.watched(request, work, holds=False):  # started by the page, not asked for
            if done is None:
                yield {ui.preset_note: f"{doing}: {progress}…"}
        yield on_checkpoint(ctx, ui, ckpt)
    except Exception as e:  # e.g. another heavy job of this user's runs: the presets wait for a measurement
        yield {ui.preset_note: f"{preset_choices(ctx, ckpt)[1]} {warn(error_text(e))}"}


def on_preset(
    ctx: AppContext, ui: PlaygroundUI, ckpt: str, label: str | None, bg: bool, sha: str | None = None
) -> Updates:
    """Load a trained head (atoms, widths, weights, τ) onto the canvas."""
    try:
        if not label:
            return gr.skip()
        loaded = ctx.model(ckpt)
        if not loaded.is_ssog:
            fits, _ = fitted_presets(ctx, loaded)
            if label not in fits:
                raise AppError(f"preset {label!r} is not a measured head of {ckpt}: measure its heads again")
            spec, note = fits[label]
            return load_head(ctx, ui, head_value(spec), bg, sha, note)
        match = [p for p in loaded.presets if p.label == label]
        if not match:
            raise AppError(f"preset {label!r} is not a head of {ckpt}")
        shape = match[0].shape
        return open_head(ctx, ui, ckpt, shape.layer, shape.head, bg, sha, f"**{match[0].kind}** = ")
    except Exception as e:
        return {ui.preset_note: warn(error_text(e))}


def open_head(
    ctx: AppContext, ui: PlaygroundUI, ckpt: str, layer: int, head: int, bg: bool, sha: str | None, prefix: str = ""
) -> Updates:
    """A trained head as an editable one, on the model's own patch grid with the ★ at its centre query: the
    field drawn is that query's fixed-field attention, and a picture under it is cut into the patches the model
    sees."""
    loaded = ctx.model(ckpt)
    lf = loaded.fields[layer]
    grid = loaded.config.grid
    v = head_value(spec_from_head(lf, head, grid=tuple(grid), mode=loaded.config.field), 0)
    src = {"checkpoint": ckpt, "layer": int(layer), "head": int(head)}
    note = (
        f"{prefix}layer {layer}, head {head} of {ckpt}, on the model's {grid[0]}×{grid[1]} "
        f"patch grid (★ = the centre query): over all queries its attention entropy is {lf.entropy[head]:.2f} "
        f"nats and its effective radius {lf.radius[head]:.2f} cells (τ = {lf.tau:.2f})."
    )
    return load_head(ctx, ui, v, bg, sha, note, src)


def load_head(
    ctx: AppContext, ui: PlaygroundUI, v: dict[str, Any], bg: bool, sha: str | None, note: str, src: Any = None
) -> Updates:
    """Every playground output for a head loaded from elsewhere (:attr:`PlaygroundUI.head_out`): the canvas (over
    the picture when the underlay is on), kernels, readout, atom controls, τ, grid, mode, note and status; ``src``
    names the model's layer and head it came from (only then can it be applied to the model)."""
    extra, status = {}, ""
    if bg:
        try:
            extra["bg"] = underlay_url(ctx, sha, v)
        except AppError as e:
            status = warn(error_text(e))
    extra["fit"] = True  # a trained head piles its atoms near the ★: zoomed to them, they can be told apart
    return {
        **canvas_outputs(ui, v, bg and "bg" in extra, extra, new_value=True),
        **sliders(ui, v),
        **head_controls(ui, v),
        ui.zoom: True,
        ui.preset_note: note,
        ui.status: status,
        ui.model_src: src,
        ui.apply: gr.update(visible=src is not None),
        ui.apply_note: "",
    }


def prediction_change(ctx: AppContext, ckpt: str, sha: str | None, edits: list[Edit], what: str) -> str:
    """One line: the model's prediction on the picture, unedited → under ``edits`` (this request only), from the one
    run entry (the prediction only: no maps)."""
    if not sha:
        raise AppError("pick an image (top of the page) to see the model's prediction change")
    loaded = ctx.model(ckpt)
    change = interventions.run(ctx, loaded, interventions.request(ctx, sha, edits, maps=False)).image.change
    names, top, new = loaded.class_names, change.top, change.winner
    return (
        f"{what}: prediction **{names[top]}** {float(change.unedited[top]):.4f} → **{names[new]}** "
        f"{float(change.edited[new]):.4f} (Δ log p({names[top]}) = {round(change.dlogp, 4) + 0.0:+.4f})."
    )


def on_apply_model(ctx: AppContext, ui: PlaygroundUI, value: Any, src: Any, on: bool, sha: str | None) -> Updates:
    """The edited head put into the model it came from (dragged atoms: ``move_atom``, anything else: ``set_head``):
    the prediction change beside the canvas."""
    if not (on and src):
        return gr.skip()
    try:
        loaded, layer, head = ctx.model(src["checkpoint"]), src["layer"], src["head"]
        opened = spec_from_head(loaded.fields[layer], head, grid=tuple(loaded.config.grid), mode=loaded.config.field)
        edits = head_edits(layer, head, opened, _spec(value))
        what = f"Layer {layer}, head {head} of {src['checkpoint']} set to this head"
        return {ui.apply_note: prediction_change(ctx, src["checkpoint"], sha, edits, what)}
    except Exception as e:
        return {ui.apply_note: warn(error_text(e))}


def underlay_note(ctx: AppContext, ckpt: str | None, sha: str | None, value: dict[str, Any]) -> str:
    """Say on which scale the picture is drawn: the selected model's patches, or a grid of the user's own."""
    if not ckpt:
        return ""
    try:
        loaded = ctx.model(ckpt)
    except AppError:
        return ""
    grid, model_grid = tuple(value["grid"]), tuple(loaded.config.grid)
    size = ctx.image(sha).original_size if sha else None
    h, w = loaded.config.img_size
    seen = f" The picture ({size[0]}×{size[1]} px) is resized to {w}×{h} px as {ckpt} sees it." if size else ""
    if grid == model_grid:
        return f"One canvas cell = one of {ckpt}'s {grid[0]}×{grid[1]} patches.{seen}"
    return (
        f"This head's grid is {grid[0]}×{grid[1]} cells, not {ckpt}'s {model_grid[0]}×{model_grid[1]} patch grid: "
        f"the picture is stretched over it. Load a preset (or set the grid to {model_grid[0]}) to see a head at "
        f"the model's scale.{seen}"
    )


def on_underlay(
    ctx: AppContext, ui: PlaygroundUI, value: Any, show: bool, sha: str | None, ckpt: str | None = None
) -> Updates:
    """Turn the image underlay on or off (or refresh it after a new image was picked)."""
    try:
        bg = underlay_url(ctx, sha, value) if show else ""
        note = underlay_note(ctx, ckpt, sha, value) if bg else ""
        drawn = canvas_outputs(ui, value, bool(bg), {"bg": bg})
        return {**drawn, ui.underlay: gr.update(value=bool(bg)), ui.status: note}
    except Exception as e:  # no picture: the checkbox goes back off so the field is drawn opaque again
        return {
            **canvas_outputs(ui, value, False, {"bg": ""}),
            ui.underlay: gr.update(value=False),
            ui.status: warn(error_text(e)),
        }


def on_make_figure(ctx: AppContext, ui: PlaygroundUI, value: Any, show: bool, sha: str | None) -> Updates:
    """PNG + SVG of the head (over the picture when the underlay is on), settings in names and metadata."""
    try:
        image = ctx.image(sha).image if (show and sha) else None
        return {ui.figure_files: write_downloads(figures.playground_files(_spec(value), image, sha)), ui.status: ""}
    except Exception as e:
        return {ui.figure_files: None, ui.status: warn(error_text(e))}


def restore(ctx: AppContext, ui: PlaygroundUI, section: dict[str, Any], restoring: Restoring) -> Updates:
    """The session's head on the canvas with its selected atom in the sliders (each slider's range widened to
    hold it), the underlay if the session's image is there, and no steered head left behind to redraw."""
    value = head_value(HeadSpec.from_dict(section["head"]), section.get("selected_atom", 0))
    sha = restoring.image_sha
    try:
        bg = underlay_url(ctx, sha, value) if (section.get("image_underlay") and sha) else ""
    except AppError:
        bg = ""
    return {
        **canvas_outputs(ui, value, bool(bg), {"bg": bg}, new_value=True),
        ui.underlay: gr.update(value=bool(bg)),
        **sliders(ui, value),
        **head_controls(ui, value),
        ui.steer_group: gr.update(visible=False),
        ui.steer_src: None,
    }


def session_part(ctx: AppContext, ui: PlaygroundUI) -> SessionPart:
    """The playground's section: the head (its selected atom apart) and the underlay switch."""

    def save(v: dict[str, Any]) -> dict[str, Any]:
        head = {k: x for k, x in v["head"].items() if k != "sel"}
        return {"head": head, "selected_atom": int(v["head"].get("sel", 0)), "image_underlay": bool(v["underlay"])}

    fields = {"head": ui.canvas, "underlay": ui.underlay}
    outputs = [*ui.main_out, ui.underlay, *ui.atom_controls, *ui.head_controls, ui.steer_group, ui.steer_src]
    return SessionPart("playground", fields, partial(restore, ctx, ui), outputs, save)


def build(ctx: AppContext, shared: dict[str, Any]) -> PlaygroundUI:
    """The tab's components and events; returns them by name for the rest of the page."""
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
                a0 = v0["atoms"][0]
                sy = gr.Slider(*SIGMA_SLIDER, value=a0["sy"], step=0.01, label="σy (cells)", elem_id="pg-sy")
                sx = gr.Slider(*SIGMA_SLIDER, value=a0["sx"], step=0.01, label="σx (cells)", elem_id="pg-sx")
                w = gr.Slider(*WEIGHT_SLIDER, value=a0["w"], step=0.01, label="weight (λ = w / Σw)", elem_id="pg-w")
                with gr.Row():
                    add = gr.Button("Add atom", size="sm", elem_id="pg-add")
                    remove = gr.Button("Remove atom", size="sm", elem_id="pg-remove")
                    reset = gr.Button("Reset", size="sm", elem_id="pg-reset")
            with gr.Group():
                gr.Markdown("**Head**")
                tau = gr.Slider(*TAU_SLIDER, value=v0["tau"], step=0.05, label="temperature τ", elem_id="pg-tau")
                grid = gr.Slider(
                    *GRID_SLIDER, value=v0["grid"][0], step=1, label="grid size (cells per side)", elem_id="pg-grid"
                )
                mode = gr.Radio(["factorized", "axial"], value=v0["mode"], label="field mode")
                underlay = gr.Checkbox(False, label="draw over the selected image", elem_id="pg-underlay")
                zoom = gr.Checkbox(False, label="zoom to the ★ and the atoms", elem_id="pg-zoom")
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
                gate_effect = gr.Markdown(elem_id="pg-gate-effect")
            steer_src = gr.State(None)
            status = gr.Markdown()
            with gr.Accordion("Export this head as a figure (PNG + SVG)", open=False):
                figure_button = gr.Button("Make figure", size="sm")
                figure_files = gr.File(label="figure files", file_count="multiple", interactive=False)
            model_src = gr.State(None)
            apply = gr.Checkbox(False, label="apply to the model: the prediction change on every release",
                                visible=False, elem_id="pg-apply")  # fmt: skip
            apply_note = gr.Markdown(elem_id="pg-apply-note")
    kernels = gr.Plot(
        plots.kernel_plot(spec0, view0), show_label=False, label="1D kernels of the ★ query", elem_id="pg-kernels"
    )
    table = gr.Dataframe(
        readout(spec0, view0),
        headers=READOUT_HEADERS,
        label="Atoms (grid cells)",
        interactive=False,
        elem_id="pg-readout",
    )
    ui = PlaygroundUI(
        canvas=canvas, kernels=kernels, table=table, sy=sy, sx=sx, w=w, add=add, remove=remove, reset=reset,
        tau=tau, grid=grid, mode=mode, preset=preset, preset_note=preset_note, underlay=underlay, zoom=zoom,
        steer_group=steer_group, steer_note=steer_note, gate=gate, gate_effect=gate_effect, steer_src=steer_src,
        status=status,
        figure_button=figure_button, figure_files=figure_files, model_src=model_src, apply=apply,
        apply_note=apply_note,
    )  # fmt: skip

    # handlers that take gr.EventData must be plain functions (Gradio finds the parameter by its annotation)
    def picked(value: Any, evt: gr.EventData) -> Updates:
        return on_pick(ui, value, evt)

    def added(value: Any, bg: bool, evt: gr.EventData) -> Updates:
        return on_add(ui, value, bg, evt)

    fast = dict(show_progress="hidden", trigger_mode="always_last", api_visibility="private")
    edit_out = ui.main_out + ui.atom_controls
    released = canvas.release(on_release, [canvas, underlay], [canvas], queue=False, **fast)
    released.then(partial(on_details, ui), [canvas], [kernels, table], **fast)
    model_inputs = [canvas, model_src, apply, shared["image_sha"]]
    on_model = queues.light(**fast)  # the model's prediction under the head: a one-image edit
    released.then(partial(on_apply_model, ctx, ui), model_inputs, [apply_note], **on_model)
    apply.input(partial(on_apply_model, ctx, ui), model_inputs, [apply_note], **on_model)
    canvas.pick(picked, [canvas], ui.atom_controls, queue=False, **fast)
    canvas.addatom(added, [canvas, underlay], edit_out, **fast)
    for key, s in (("sy", sy), ("sx", sx), ("w", w)):
        s.input(partial(on_atom_param, ui, key), [canvas, s, underlay], ui.main_out, **fast)
    for c in (tau, grid, mode):
        c.input(partial(on_head_param, ui), [canvas, tau, grid, mode, underlay], ui.main_out, **fast)
    add.click(added, [canvas, underlay], edit_out, **fast)
    remove.click(partial(on_remove, ui), [canvas, underlay], edit_out, **fast)
    reset.click(partial(on_reset, ui), [underlay], [*edit_out, *ui.head_controls, preset, preset_note], **fast)
    preset.input(
        partial(on_preset, ctx, ui),
        [shared["checkpoint"], preset, underlay, shared["image_sha"]],
        ui.head_out,
        **fast,
    )
    underlay.input(
        partial(on_underlay, ctx, ui),
        [canvas, underlay, shared["image_sha"], shared["checkpoint"]],
        [*ui.main_out, underlay, status],
        **fast,
    )
    zoom.input(lambda on: gr.update(fit=bool(on)), [zoom], [canvas], queue=False, **fast)
    figure_button.click(
        partial(on_make_figure, ctx, ui),
        [canvas, underlay, shared["image_sha"]],
        [figure_files, status],
        api_visibility="private",
    )
    return ui
