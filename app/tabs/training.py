"""Training tab: how a checkpoint's gates, accuracy and fields moved during training, from the history it stores.

Everything drawn here is read from the checkpoint's history (``ssog_core.history``) and measured by
``ssog_core.trajectory``; the step slider draws the fields of that step with Checkpoint geometry's figure
(:func:`ssog_core.viz.figures.geometry_figure`), in one window for every step (so a field that grows is seen to
grow), each step's picture drawn once and kept.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

import gradio as gr
import numpy as np
import plotly.graph_objects as go
from gradio.blocks import Block
from matplotlib.figure import Figure
from plotly.subplots import make_subplots

from app.common import Updates, error_text, warn, write_downloads
from app.history import history_of, read
from app.session_protocol import Restoring, SessionPart
from app.state import AppContext, AppError, LoadedModel
from ssog_core.analysis import report
from ssog_core.analysis.trajectory import (
    GeometryTrajectory,
    geometry_trajectory,
    snapshot_densities,
    snapshot_layer_fields,
)
from ssog_core.checkpoint.format import has_history
from ssog_core.checkpoint.history import History
from ssog_core.runtime.lru import LRU
from ssog_core.viz import figures as viz
from ssog_core.viz import files, raster
from ssog_core.viz.figures import TAP_LABELS

TAP_COLOURS = {"mu": "#1f77b4", "sigma": "#d62728", "lambda": "#2ca02c"}
GRID_CAPTION = (
    "Fields at this step, drawn as Checkpoint geometry draws the trained model: layers across, heads down, each "
    "panel scaled to its own peak, one window for every step"
)
PLAY_SECONDS = 0.4  # one snapshot per tick while playing (a step not drawn yet takes longer: the slider runs ahead)
FRAMES = 32  # pictures of steps kept per checkpoint (PNG, ~0.2 MB each)


@dataclass(frozen=True)
class TrainingView:
    """What the tab draws for one checkpoint, computed once: its history, the geometry at every snapshot, the
    fields' window (half-width (y, x) in cells showing every snapshot's fields, None without fields) and the
    pictures of the steps drawn so far (PNG bytes by snapshot)."""

    history: History
    geometry: GeometryTrajectory | None
    window: tuple[float, float] | None
    frames: LRU[bytes]


@dataclass(frozen=True)
class TrainingUI:
    note: gr.Markdown
    gates: gr.Plot
    accuracy: gr.Plot
    geometry: gr.Plot
    step: gr.Slider
    play: gr.Button
    timer: gr.Timer
    step_text: gr.Markdown
    grid: gr.Image
    status: gr.Markdown
    pending: gr.State  # the training step a restored session asks for, until the tab renders it
    checkpoint: gr.Dropdown  # the page's checkpoint picker (a saved step is read against its history)

    @property
    def inputs(self) -> list[Block]:
        return [self.pending]

    @property
    def outputs(self) -> list[Block]:
        """What :func:`render` changes."""
        return [self.note, self.gates, self.accuracy, self.geometry, self.step, self.step_text, self.grid]


def training_view(ctx: AppContext, loaded: LoadedModel) -> TrainingView | None:
    """The checkpoint's history and what is drawn from it (cached per checkpoint), or None without a history."""

    def make() -> TrainingView | None:
        history = read(ctx, loaded)
        if history is None:
            return None
        if not (loaded.is_ssog and history.fields["mu"]):
            return TrainingView(history, None, None, LRU(FRAMES))
        grid, mode = loaded.config.grid, loaded.config.field
        dens = np.stack([snapshot_densities(history, i, grid, mode).float().numpy() for i in range(len(history.steps))])
        window = viz.support_extent(dens, np.stack(history.fields["mu"]))
        return TrainingView(history, geometry_trajectory(history, grid, mode), window, LRU(FRAMES))

    return ctx.cache.figures.get(("training", loaded.key), make)


def fields_figure(loaded: LoadedModel, view: TrainingView, index: int) -> Figure:
    """Checkpoint geometry's figure of the fields at snapshot ``index``, in the window of every snapshot."""
    fields = snapshot_layer_fields(view.history, index, loaded.config.grid, loaded.config.field)
    return viz.geometry_figure(fields, f"{loaded.name} at step {view.history.steps[index]}", window=view.window)


def fields_image(loaded: LoadedModel, view: TrainingView, index: int) -> str:
    """The fields at snapshot ``index`` as a named PNG (drawn once per step and checkpoint; the download keeps the
    name)."""

    def draw() -> bytes:
        settings = {"figure": "training fields", "checkpoint": loaded.name, "step": view.history.steps[index]}
        return viz.figure_bytes(fields_figure(loaded, view, index), "png", settings)

    name = f"fields_{files.stem_of(loaded.name)}_step{view.history.steps[index]}.png"
    return write_downloads({viz.safe_token(name): view.frames.get(index, draw)})[0]


def gates_plot(history: History, cold: float) -> go.Figure:
    """Gate scale of every layer and tap vs step, log y, the cold start dashed."""
    fig = go.Figure()
    steps = history.steps
    for tap, rows in history.gates.items():
        per_layer = np.asarray(rows)
        for layer in range(per_layer.shape[1]):
            fig.add_trace(
                go.Scatter(
                    x=steps,
                    y=per_layer[:, layer],
                    mode="lines",
                    name=f"{TAP_LABELS[tap]} layer {layer}",
                    legendgroup=tap,
                    line=dict(color=TAP_COLOURS[tap], width=1 + 2 * layer / max(per_layer.shape[1] - 1, 1)),
                    opacity=0.45 + 0.55 * layer / max(per_layer.shape[1] - 1, 1),
                )
            )
    fig.add_trace(
        go.Scatter(x=[steps[0], steps[-1]], y=[cold, cold], mode="lines", name=f"cold start {cold:.3g}",
                   line=dict(color="black", dash="dash", width=1))
    )  # fmt: skip
    fig.update_layout(
        title="Gate scales s = softplus(raw) + 1e-4 (log scale; thicker = deeper layer)",
        xaxis_title="step",
        yaxis=dict(type="log", title="gate scale"),
        height=360,
        margin=dict(l=60, r=20, t=50, b=45),
        legend=dict(font=dict(size=9)),
    )
    return fig


def accuracy_plot(history: History, chance: float) -> go.Figure:
    """Validation accuracy at every evaluation and train accuracy between snapshots vs step, chance dotted."""
    fig = go.Figure()
    if history.train:
        t = np.asarray(history.train)
        fig.add_trace(go.Scatter(x=t[:, 0], y=t[:, 2], mode="lines", name="train (since the previous snapshot)",
                                 line=dict(color="#999999", width=1)))  # fmt: skip
    if history.val:
        v = np.asarray(history.val)
        fig.add_trace(go.Scatter(x=v[:, 0], y=v[:, 1], mode="lines+markers", name="validation",
                                 line=dict(color="#1f77b4", width=2)))  # fmt: skip
    end = history.steps[-1] if history.steps else 1
    fig.add_trace(go.Scatter(x=[0, end], y=[chance, chance], mode="lines", name=f"chance {chance:.0%}",
                             line=dict(color="black", dash="dot", width=1)))  # fmt: skip
    for start in history.stages[1:]:
        fig.add_vline(x=start, line=dict(color="#888", dash="dash"), annotation_text="new stage")
    fig.update_layout(title="Accuracy", xaxis_title="step", yaxis=dict(title="accuracy", range=[0, 1.02]),
                      height=320, margin=dict(l=60, r=20, t=50, b=45), legend=dict(font=dict(size=9)))  # fmt: skip
    return fig


def geometry_plot(geometry: GeometryTrajectory) -> go.Figure:
    """Per layer: mean reach and the largest elongation over its heads, vs step."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("mean reach per layer (cells)", "most elongated head"))
    reach = geometry.reach.mean(-1).numpy()
    elong = geometry.elongation.max(-1).values.numpy()
    layers = reach.shape[1]
    for layer in range(layers):
        colour = viz_colour(layer, layers)
        for col, values in ((1, reach), (2, elong)):
            trace = go.Scatter(x=geometry.steps, y=values[:, layer], mode="lines", name=f"layer {layer}",
                               legendgroup=str(layer), showlegend=col == 1, line=dict(color=colour))  # fmt: skip
            fig.add_trace(trace, row=1, col=col)
    fig.update_xaxes(title_text="step")
    fig.update_yaxes(title_text="cells", row=1, col=1)
    fig.update_yaxes(title_text="long ÷ short spread", row=1, col=2)
    fig.update_layout(height=330, margin=dict(l=60, r=20, t=50, b=45), legend=dict(font=dict(size=9)))
    return fig


def viz_colour(index: int, count: int) -> str:
    """The ``index``-th of ``count`` colours along viridis (shallow layers dark, deep ones bright)."""
    r, g, b = raster.colorize(np.array([[index / max(count - 1, 1)]]), raster.FIELD_CMAP, 0.0, 1.0)[0, 0]
    return f"rgb({r},{g},{b})"


def step_label(history: History, index: int) -> str:
    step = history.steps[index]
    val = [r for r in history.val if r[0] <= step]
    acc = f"; last validation accuracy {val[-1][1]:.1%} (step {val[-1][0]})" if val else ""
    return f"Snapshot {index + 1} of {len(history.steps)}: **step {step}**{acc}."


def slider_index(position: Any, count: int) -> int:
    """The snapshot (0-based) at slider ``position``: the slider counts snapshots from 1, as its text does."""
    return int(min(max(round(position or 1) - 1, 0), count - 1))


def snapshot_index(history: History, step: Any) -> int:
    """The snapshot at or before training step ``step`` (the last one when ``step`` is None)."""
    if step is None:
        return len(history.steps) - 1
    return max(0, sum(1 for s in history.steps if s <= int(step)) - 1)


def recorded(ctx: AppContext, name: str) -> bool:
    """Whether picker name ``name`` is a checkpoint with a training history (False for one that cannot be found)."""
    try:
        return has_history(ctx.resolve(name))
    except AppError:
        return False


def render(ctx: AppContext, ui: TrainingUI, ckpt: str | None, pending: Any = None) -> Updates:
    """The tab for a checkpoint: plots, and the step slider's range with its value (the last snapshot, or the step a
    restored session asked for) in one update."""
    empty = {ui.gates: gr.update(visible=False), ui.accuracy: gr.update(visible=False),
             ui.geometry: gr.update(visible=False), ui.grid: gr.update(visible=False),
             ui.step: gr.update(visible=False), ui.step_text: ""}  # fmt: skip
    if not ckpt:
        return {**empty, ui.note: "No checkpoint selected."}
    try:
        loaded = ctx.model(ckpt)
        view = training_view(ctx, loaded)
        if view is None:
            others = [n for n in ctx.checkpoint_names() if n != ckpt and recorded(ctx, n)]
            hint = f" Checkpoints here with one: {', '.join(others)}." if others else ""
            why = (
                "it is a model folder in timm's or transformers' layout, which records none"
                if ctx.resolve(ckpt).is_dir()
                else "it was trained before histories were recorded, or converted from another implementation"
            )
            return {**empty, ui.note: f"**{ckpt}** has no training history ({why}).{hint}"}  # fmt: skip
        h = view.history
        chance = 1.0 / max(loaded.config.num_classes, 1)
        out: Updates = {
            **empty,
            ui.accuracy: gr.update(value=accuracy_plot(h, chance), visible=True),
            ui.note: f"**{ckpt}**: {len(h.steps)} snapshots over {h.steps[-1]} steps"
            + (f" in {len(h.stages)} stages" if len(h.stages) > 1 else "")
            + ". Move the slider (or press ▶) to see the fields at that step.",
        }
        if h.gates:
            out[ui.gates] = gr.update(value=gates_plot(h, report.initial_gate_scale(loaded.config)), visible=True)
        if view.geometry is not None:
            shown_at = snapshot_index(h, pending)
            out[ui.geometry] = gr.update(value=geometry_plot(view.geometry), visible=True)
            out[ui.step] = gr.update(minimum=1, maximum=max(len(h.steps), 2), value=shown_at + 1, visible=True)
            out[ui.grid] = gr.update(value=fields_image(loaded, view, shown_at), visible=True)
            out[ui.step_text] = step_label(h, shown_at)
        return out
    except Exception as e:
        return {**empty, ui.note: warn(error_text(e))}


def on_step(ctx: AppContext, ui: TrainingUI, ckpt: str | None, position: float) -> Updates:
    """The slider moved (to snapshot ``position``, counted from 1): the field grid at that snapshot."""
    try:
        loaded = ctx.model(ckpt) if ckpt else None
        view = training_view(ctx, loaded) if loaded else None
        if view is None or view.window is None:
            return gr.skip()
        i = slider_index(position, len(view.history.steps))
        return {ui.grid: fields_image(loaded, view, i), ui.step_text: step_label(view.history, i), ui.status: ""}
    except Exception as e:
        return {ui.status: warn(error_text(e))}


def on_play(playing: bool) -> tuple[gr.Timer, str, bool]:
    """▶ starts stepping through the snapshots, ⏸ stops."""
    return gr.Timer(active=not playing), ("⏸ Pause" if not playing else "▶ Play"), not playing


def on_tick(ctx: AppContext, ckpt: str | None, position: float) -> Any:
    """One snapshot further; at the last one, start again from the first (slider positions count from 1)."""
    view = training_view(ctx, ctx.model(ckpt)) if ckpt else None
    if view is None or view.window is None:
        return gr.skip()
    count = len(view.history.steps)
    return 1 if round(position or 1) >= count else round(position or 1) + 1


def session_part(ctx: AppContext, ui: TrainingUI) -> SessionPart:
    """The Training tab's section: the training step shown (a step, not a slider position, so it means the same
    whatever the history's snapshots); the tab shows it when it renders, within the restored checkpoint's run."""

    def save(values: dict[str, Any]) -> dict[str, Any]:
        ckpt, position = values.get("checkpoint"), values.get("snapshot")
        try:
            history = history_of(ctx, ckpt) if ckpt else None
        except AppError:
            history = None
        if history is None or position is None:
            return {}
        return {"step": history.steps[slider_index(position, len(history.steps))]}

    def restore(section: dict[str, Any], restoring: Restoring) -> Updates:
        step = section.get("step")
        return {ui.pending: int(step) if isinstance(step, int | float) else None}

    return SessionPart("training", {"snapshot": ui.step, "checkpoint": ui.checkpoint}, restore, [ui.pending], save)


def build(ctx: AppContext, shared: dict[str, Any]) -> TrainingUI:
    note = gr.Markdown(elem_id="train-note")
    gates = gr.Plot(label="Gate scales", elem_id="train-gates")
    accuracy = gr.Plot(label="Accuracy", elem_id="train-acc")
    gr.Markdown("### Fields at a step", elem_classes="hint")
    with gr.Row():
        step = gr.Slider(1, 2, value=1, step=1, label="Snapshot", elem_id="train-step", scale=4)
        play = gr.Button("▶ Play", elem_id="train-play", scale=1, size="sm")
    step_text = gr.Markdown(elem_id="train-step-text")
    # the caption sits above the picture: as the image's label it floated over the column titles
    gr.Markdown(f"{GRID_CAPTION}.", elem_classes="hint", elem_id="train-grid-caption")
    grid = gr.Image(label=GRID_CAPTION, show_label=False, interactive=False, elem_id="train-grid",
                    buttons=["download"])  # fmt: skip
    geometry = gr.Plot(label="Reach and elongation", elem_id="train-geometry")
    status = gr.Markdown(elem_id="train-status")
    timer = gr.Timer(PLAY_SECONDS, active=False)
    playing = gr.State(False)
    ui = TrainingUI(note, gates, accuracy, geometry, step, play, timer, step_text, grid, status, gr.State(None),
                    shared["checkpoint"])  # fmt: skip
    hidden = dict(api_visibility="private")
    step.change(partial(on_step, ctx, ui), [shared["checkpoint"], step], [grid, step_text, status],
                show_progress="hidden", trigger_mode="always_last", **hidden)  # fmt: skip
    play.click(on_play, [playing], [timer, play, playing], **hidden)
    timer.tick(partial(on_tick, ctx), [shared["checkpoint"], step], [step], show_progress="hidden", **hidden)
    return ui
