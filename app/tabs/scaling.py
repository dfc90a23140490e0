"""Tab 6, scaling: forward latency against the token count, measured live for a checkpoint and its dot twin on the
app's device, beside the checkpoint's zero-shot resolution-transfer curve (measured by ``train`` / ``evaluate``).

The SSOG post claims SSOG's cost grows near-linearly with the number of tokens (its field is two 1D passes, no N×N
matrix) while dot attention's grows quadratically; the fitted exponent of each measured curve is shown with it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import gradio as gr
import numpy as np
import plotly.graph_objects as go
from gradio.blocks import Block

from app.common import Updates, error_text, warn
from app.state import UPLOADED, AppContext, AppError, LoadedModel, default_twin
from ssog_core.analysis.latency import GRID_FACTORS, MAX_TOKENS, REPEATS, WARMUP, Latency, machine, measure
from ssog_core.analysis.session import NO_TWIN
from ssog_core.checkpoint.format import TRANSFER_KEY
from ssog_core.checkpoint.transfer import beside, read_transfer

_LAYOUT = dict(template="plotly_white", font=dict(size=12), hoverlabel=dict(font_size=12))
GUIDES = ((1, "∝ N (slope 1, linear)", "dash", "#7f7f7f"), (2, "∝ N² (slope 2, quadratic)", "dot", "#bcbd22"))


@dataclass(frozen=True)
class ScalingUI:
    """The tab's components, by name."""

    measure: gr.Button
    latency_note: gr.Markdown
    latency: gr.Plot
    transfer_note: gr.Markdown
    transfer: gr.Plot

    @property
    def outputs(self) -> list[Block]:
        """What :func:`render` changes."""
        return [self.transfer_note, self.transfer]


def latency_plot(curves: list[Latency], where: str) -> go.Figure:
    """Median latency against tokens on log-log axes with interquartile bars, and labelled linear and quadratic
    guides through the first model's first point."""
    fig = go.Figure()
    for c in curves:
        med, q1, q3 = np.array(c.ms), np.array(c.quantile(0.25)), np.array(c.quantile(0.75))
        fig.add_trace(
            go.Scatter(
                x=c.tokens,
                y=med,
                error_y=dict(type="data", symmetric=False, array=q3 - med, arrayminus=med - q1, thickness=1.2),
                customdata=np.stack([q1, q3], -1),
                mode="lines+markers",
                name=f"{c.name} ({c.kind}, slope {c.exponent():.2f})",
                hovertemplate=f"{c.name}<br>%{{x}} tokens<br>median %{{y:.2f}} ms"
                "<br>IQR %{customdata[0]:.2f} – %{customdata[1]:.2f} ms<extra></extra>",
            )
        )
    if curves and curves[0].tokens:
        n0, t0 = curves[0].tokens[0], curves[0].ms[0]
        n = np.array([min(c.tokens[0] for c in curves), max(c.tokens[-1] for c in curves)], dtype=float)
        for power, name, dash, colour in GUIDES:
            fig.add_trace(
                go.Scatter(
                    x=n, y=t0 * (n / n0) ** power, mode="lines", name=name, line=dict(dash=dash, color=colour),
                    hoverinfo="skip",
                )
            )  # fmt: skip
    fig.update_xaxes(type="log", title="tokens (patches per image)")
    fig.update_yaxes(type="log", title="forward time per image (ms)")
    fig.update_layout(
        **_LAYOUT,
        height=400,
        margin=dict(l=60, r=10, t=70, b=45),
        title=dict(
            text=f"Forward latency vs tokens: median, bars = IQR of {REPEATS} interleaved runs<br><sup>{where}</sup>",
            font=dict(size=13),
        ),
        legend=dict(orientation="h", y=-0.25, font=dict(size=11)),
    )
    return fig


def transfer_plot(rows: list[dict[str, Any]], name: str, trained_tokens: int) -> go.Figure:
    fig = go.Figure(
        go.Scatter(
            x=[r["tokens"] for r in rows],
            y=[r["accuracy"] for r in rows],
            mode="lines+markers",
            name=name,
            customdata=[f"{r['img_size'][0]}×{r['img_size'][1]}" for r in rows],
            hovertemplate="%{customdata} px, %{x} tokens<br>accuracy %{y:.2%}<extra></extra>",
        )
    )
    # shapes and annotations on a log axis take log10 of the position (x=196 would be drawn at 10^196)
    fig.add_vline(x=math.log10(trained_tokens), line=dict(dash="dash", color="gray"), annotation_text="trained at")
    fig.update_xaxes(type="log", title="tokens at evaluation (zero-shot: no fine-tuning)")
    fig.update_yaxes(title="accuracy", tickformat=".0%", rangemode="tozero")
    fig.update_layout(
        **_LAYOUT,
        height=340,
        margin=dict(l=60, r=10, t=50, b=45),
        title=dict(text=f"{name}: zero-shot resolution transfer", font=dict(size=14)),
    )
    return fig


def render(ctx: AppContext, ui: ScalingUI, ckpt: str | None) -> Updates:
    """The transfer note and plot: what is known without measuring anything."""
    hidden = gr.update(value=None, visible=False)
    if not ckpt:
        return {ui.transfer_note: "Pick a checkpoint to see how it scales.", ui.transfer: hidden}
    try:
        loaded = ctx.model(ckpt)
        curve = read_transfer(ctx.resolve(ckpt), loaded.meta, look_beside=not ckpt.startswith(UPLOADED))
        if curve is None:
            note = (
                f"No resolution-transfer curve for **{ckpt}**: neither its metadata (`{TRANSFER_KEY}`, written by "
                f"`train` at the end of a run) nor a `{beside(ckpt).name}` from `evaluate --json` beside it."
            )
            return {ui.transfer_note: note, ui.transfer: hidden}
        rows = curve.rows
        source = curve.source if curve.file is None else f"`{curve.source}`"
        trained = loaded.config.grid[0] * loaded.config.grid[1]
        text = f"Zero-shot resolution transfer of **{ckpt}** ({len(rows)} sizes, from {source})."
        plot = transfer_plot(rows, loaded.name, trained)
        return {ui.transfer_note: text, ui.transfer: gr.update(value=plot, visible=True)}
    except Exception as e:
        return {ui.transfer_note: warn(error_text(e)), ui.transfer: hidden}


def on_measure(
    ctx: AppContext, ui: ScalingUI, ckpt: str | None, timing: Callable[[list[LoadedModel]], list[Latency]] = measure
) -> Updates:
    """Time the checkpoint and its twin now (several seconds on a CPU, ``timing``), and say how each one grows,
    with the spread of every number and only the sizes that were measured."""
    try:
        if not ckpt:
            raise AppError("pick a checkpoint first")
        names = [ckpt]
        twin = default_twin(ctx, ckpt)
        if twin != NO_TWIN:
            names.append(twin)
        curves = timing([ctx.model(n) for n in names])
        where = f"{ctx.device}: {machine(ctx.device)}, batch 1"
        lines = []
        for c in curves:
            q1, q3 = c.quantile(0.25)[-1], c.quantile(0.75)[-1]
            lines.append(
                f"**{c.name}** ({c.kind}): {c.ms[0]:.1f} ms at {c.tokens[0]} tokens → {c.ms[-1]:.1f} ms "
                f"(IQR {q1:.1f}–{q3:.1f}) at {c.tokens[-1]} tokens, slope **{c.exponent():.2f}** on log-log axes"
            )
        largest = max(t for c in curves for t in c.tokens)
        claim = (
            "The SSOG post: SSOG's cost grows near-linearly with the token count (slope ≈ 1: its field is two 1D "
            "passes, no N×N matrix), dot attention's towards quadratically (slope → 2 once attention dominates the "
            f"MLPs). Measured now on {where}, {len(curves[0].tokens)} sizes up to {largest} tokens; each point "
            f"is the median of {len(curves[0].samples[0])} runs after {WARMUP} warm-ups, every model and size "
            "taking turns through the press:"
        )
        return {ui.latency_note: f"{claim}  \n" + "  \n".join(lines), ui.latency: latency_plot(curves, where)}
    except Exception as e:
        return {ui.latency_note: warn(error_text(e))}


def build(ctx: AppContext, shared: dict[str, Any]) -> ScalingUI:
    with gr.Row(equal_height=False):
        with gr.Column():
            gr.Markdown(
                f"Forward latency of the selected checkpoint and its twin at {len(GRID_FACTORS)} image sizes, "
                f"{GRID_FACTORS[0]}× to {GRID_FACTORS[-1]}× the training grid's side (larger than {MAX_TOKENS} "
                f"tokens are left out), timed on **{ctx.device}** ({machine(ctx.device)}) when you press the "
                "button (it takes the cores for several seconds).",
                elem_classes="hint",
            )
            measure_button = gr.Button("Measure latency now", size="sm", elem_id="sc-measure")
            latency_note = gr.Markdown(elem_id="sc-latency-note")
            latency = gr.Plot(show_label=False, label="Latency vs tokens", elem_id="sc-latency")
        with gr.Column():
            transfer_note = gr.Markdown(elem_id="sc-transfer-note")
            transfer = gr.Plot(show_label=False, label="Resolution transfer", elem_id="sc-transfer", visible=False)
    ui = ScalingUI(measure=measure_button, latency_note=latency_note, latency=latency, transfer_note=transfer_note,
                   transfer=transfer)  # fmt: skip
    measure_button.click(partial(on_measure, ctx, ui), [shared["checkpoint"]], [latency_note, latency],
                         api_visibility="private")  # fmt: skip
    return ui
