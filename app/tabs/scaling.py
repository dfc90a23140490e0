"""Tab 6, scaling: forward latency against the token count, measured live for a checkpoint and its dot twin on the
app's device, beside the checkpoint's zero-shot resolution-transfer curve (measured by ``train`` / ``evaluate``).

The SSOG post claims SSOG's cost grows near-linearly with the number of tokens (its field is two 1D passes, no N×N
matrix) while dot attention's grows quadratically; the fitted exponent of each measured curve is shown with it.
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import gradio as gr
import numpy as np
import plotly.graph_objects as go
import torch
from gradio.blocks import Block
from safetensors import safe_open

from app.common import Updates, error_text, warn
from app.state import UPLOADED, AppContext, AppError, LoadedModel
from app.tabs.export import default_twin
from ssog_core.analysis.session import NO_TWIN

TRANSFER_KEY = "resolution_transfer"  # safetensors metadata key written by train at the end of a run
GRID_FACTORS = (0.5, 1.0, 1.5, 2.0, 3.0)  # token grids measured, relative to the training grid's side
MAX_TOKENS = 4096  # beyond this a CPU forward of a demo model takes seconds: the curve's shape is clear before
REPEATS = 3  # timed forwards per size (the median is plotted); one untimed warm-up first
_LAYOUT = dict(template="plotly_white", font=dict(size=12), hoverlabel=dict(font_size=12))


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


@dataclass
class Latency:
    """Median forward time of one model at several token counts."""

    name: str
    kind: str
    tokens: list[int]
    ms: list[float]

    def exponent(self) -> float:
        """Slope of log time against log tokens: 1 = linear, 2 = quadratic (NaN with fewer than two sizes)."""
        if len(self.tokens) < 2:
            return float("nan")
        return float(np.polyfit(np.log(self.tokens), np.log(self.ms), 1)[0])


def sizes(loaded: LoadedModel) -> list[tuple[int, int]]:
    """Input sizes (H, W) to time: multiples of the patch around the training grid, up to MAX_TOKENS tokens."""
    (gh, gw), p = loaded.config.grid, loaded.config.patch_size
    out = []
    for f in GRID_FACTORS:
        h, w = max(1, round(gh * f)), max(1, round(gw * f))
        if h * w <= MAX_TOKENS and (h * p, w * p) not in out:
            out.append((h * p, w * p))
    return out


def measure(loaded: LoadedModel, repeats: int = REPEATS) -> Latency:
    """Time ``loaded``'s forward on random inputs of every size in :func:`sizes`, on the model's own device."""
    device = loaded.device
    tokens, ms = [], []
    with torch.no_grad():
        for h, w in sizes(loaded):
            x = torch.rand(1, 3, h, w, device=device)
            loaded.model(x)  # warm-up: allocations, kernel compilation on a GPU
            times = []
            for _ in range(repeats):
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                t = time.perf_counter()
                loaded.model(x)
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                times.append((time.perf_counter() - t) * 1e3)
            tokens.append((h // loaded.config.patch_size) * (w // loaded.config.patch_size))
            ms.append(statistics.median(times))
    return Latency(loaded.name, loaded.kind, tokens, ms)


def latency_plot(curves: list[Latency], device: str) -> go.Figure:
    """Latency against tokens on log-log axes, with linear and quadratic guides through the first point."""
    fig = go.Figure()
    for c in curves:
        fig.add_trace(
            go.Scatter(
                x=c.tokens,
                y=c.ms,
                mode="lines+markers",
                name=f"{c.name} ({c.kind}, slope {c.exponent():.2f})",
                hovertemplate=f"{c.name}<br>%{{x}} tokens<br>%{{y:.2f}} ms<extra></extra>",
            )
        )
    if curves and curves[0].tokens:
        n0, t0 = curves[0].tokens[0], curves[0].ms[0]
        n = np.array([min(c.tokens[0] for c in curves), max(c.tokens[-1] for c in curves)], dtype=float)
        for power, name in ((1, "linear (slope 1)"), (2, "quadratic (slope 2)")):
            fig.add_trace(
                go.Scatter(
                    x=n, y=t0 * (n / n0) ** power, mode="lines", name=name, line=dict(dash="dot", color="gray"),
                    hoverinfo="skip",
                )
            )  # fmt: skip
    fig.update_xaxes(type="log", title="tokens (patches per image)")
    fig.update_yaxes(type="log", title="forward time per image (ms)")
    fig.update_layout(
        **_LAYOUT,
        height=380,
        margin=dict(l=60, r=10, t=50, b=45),
        title=dict(text=f"Forward latency vs token count on {device} (median of {REPEATS})", font=dict(size=14)),
        legend=dict(orientation="h", y=-0.25, font=dict(size=11)),
    )
    return fig


def _transfer_rows(data: Any, source: str) -> list[dict[str, Any]]:
    """Check a resolution-transfer list: ``[{"img_size": [H, W], "tokens": N, "accuracy": A}, ...]``."""
    if isinstance(data, str):
        data = json.loads(data)
    if not isinstance(data, list) or not data:
        raise AppError(f"{source}: a resolution-transfer curve is a non-empty JSON list")
    rows = []
    for i, r in enumerate(data):
        try:
            h, w = (int(v) for v in r["img_size"])
            rows.append({"img_size": [h, w], "tokens": int(r["tokens"]), "accuracy": float(r["accuracy"])})
        except (KeyError, TypeError, ValueError):
            raise AppError(f"{source}, entry {i}: expected img_size [H, W], tokens and accuracy") from None
    return sorted(rows, key=lambda r: r["tokens"])


def transfer_curve(ctx: AppContext, loaded: LoadedModel) -> tuple[list[dict[str, Any]], str] | None:
    """The checkpoint's zero-shot resolution-transfer curve and where it came from: its safetensors metadata
    (``resolution_transfer``, written by ``train``), else an ``evaluate --json`` file beside it
    (``<stem>.transfer.json``); None when neither exists."""
    path = ctx.resolve(loaded.name)
    if TRANSFER_KEY in loaded.meta:
        return _transfer_rows(loaded.meta[TRANSFER_KEY], f"{loaded.name} metadata"), "the checkpoint's metadata"
    with safe_open(str(path), framework="pt") as f:
        header = f.metadata() or {}
    if TRANSFER_KEY in header:
        return _transfer_rows(header[TRANSFER_KEY], f"{loaded.name} metadata"), "the checkpoint's metadata"
    beside = path.with_name(path.name.removesuffix(".safetensors") + ".transfer.json")
    if not loaded.name.startswith(UPLOADED) and beside.is_file():
        try:
            return _transfer_rows(beside.read_text(encoding="utf-8"), beside.name), f"`{beside.name}`"
        except json.JSONDecodeError as e:
            raise AppError(f"{beside.name} is not valid JSON: {e}") from None
    return None


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
    fig.add_vline(x=trained_tokens, line=dict(dash="dash", color="gray"), annotation_text="trained at")
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
        found = transfer_curve(ctx, loaded)
        if found is None:
            stem = Path(ckpt).name.removesuffix(".safetensors")
            note = (
                f"No resolution-transfer curve for **{ckpt}**: neither its metadata (`{TRANSFER_KEY}`, written by "
                f"`train` at the end of a run) nor a `{stem}.transfer.json` from `evaluate --json` beside it."
            )
            return {ui.transfer_note: note, ui.transfer: hidden}
        rows, source = found
        trained = loaded.config.grid[0] * loaded.config.grid[1]
        text = f"Zero-shot resolution transfer of **{ckpt}** ({len(rows)} sizes, from {source})."
        plot = transfer_plot(rows, loaded.name, trained)
        return {ui.transfer_note: text, ui.transfer: gr.update(value=plot, visible=True)}
    except Exception as e:
        return {ui.transfer_note: warn(error_text(e)), ui.transfer: hidden}


def on_measure(ctx: AppContext, ui: ScalingUI, ckpt: str | None) -> Updates:
    """Time the checkpoint and its twin now (several seconds on a CPU), and say how each one grows."""
    try:
        if not ckpt:
            raise AppError("pick a checkpoint first")
        names = [ckpt]
        twin = default_twin(ctx, ckpt)
        if twin != NO_TWIN:
            names.append(twin)
        curves = [measure(ctx.model(n)) for n in names]
        lines = [
            f"**{c.name}** ({c.kind}): {c.ms[0]:.1f} ms at {c.tokens[0]} tokens → {c.ms[-1]:.1f} ms at "
            f"{c.tokens[-1]} tokens, slope **{c.exponent():.2f}** on log-log axes"
            for c in curves
        ]
        claim = (
            "The SSOG post: SSOG's cost grows near-linearly with the token count (slope ≈ 1: its field is two 1D "
            "passes, no N×N matrix), dot attention's towards quadratically (slope → 2 once attention dominates the "
            "MLPs). Measured now on this machine, batch 1:"
        )
        return {ui.latency_note: f"{claim}  \n" + "  \n".join(lines), ui.latency: latency_plot(curves, ctx.device)}
    except Exception as e:
        return {ui.latency_note: warn(error_text(e))}


def build(ctx: AppContext, shared: dict[str, Any]) -> ScalingUI:
    with gr.Row(equal_height=False):
        with gr.Column():
            gr.Markdown(
                f"Forward latency of the selected checkpoint and its twin at {len(GRID_FACTORS)} image sizes around "
                f"the training grid (up to {MAX_TOKENS} tokens), timed on **{ctx.device}** when you press the "
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
