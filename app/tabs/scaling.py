"""Tab 6, scaling: forward latency against the token count, measured live for a checkpoint and its dot twin on the
app's device, beside the checkpoint's zero-shot resolution-transfer curve (measured by ``train`` / ``evaluate``).

The SSOG post claims SSOG's cost grows near-linearly with the number of tokens (its field is two 1D passes, no N×N
matrix) while dot attention's grows quadratically; the fitted exponent of each measured curve is shown with it.
"""

from __future__ import annotations

import json
import math
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
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
WARMUP = 2  # untimed forwards of every model at a size before any is timed: allocations, caches, compilation
REPEATS = 15  # timed forwards per model and size: the median is plotted, the quartiles as its spread
_LAYOUT = dict(template="plotly_white", font=dict(size=12), hoverlabel=dict(font_size=12))
GUIDES = ((1, "∝ N (slope 1, linear)", "dash", "#7f7f7f"), (2, "∝ N² (slope 2, quadratic)", "dot", "#bcbd22"))

Clock = Callable[[], float]  # seconds, as time.perf_counter
Forward = Callable[[LoadedModel, torch.Tensor], None]


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
    """Every timed forward of one model at several token counts (ms), and their medians and quartiles."""

    name: str
    kind: str
    tokens: list[int] = field(default_factory=list)
    samples: list[list[float]] = field(default_factory=list)  # per token count, every timed forward (ms)

    def quantile(self, q: float) -> list[float]:
        return [float(np.quantile(s, q)) for s in self.samples]

    @property
    def ms(self) -> list[float]:
        """The median forward time at each token count."""
        return self.quantile(0.5)

    def exponent(self) -> float:
        """Slope of log median time against log tokens: 1 = linear, 2 = quadratic (NaN with fewer than two)."""
        if len(self.tokens) < 2:
            return float("nan")
        return float(np.polyfit(np.log(self.tokens), np.log(self.ms), 1)[0])


def cpu_model() -> str:
    """The processor's name as the OS reports it (``/proc/cpuinfo`` on Linux)."""
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def machine(device: str) -> str:
    """What the timings ran on: the processor (or GPU) and torch's thread count."""
    chip = torch.cuda.get_device_name(torch.device(device)) if device.startswith("cuda") else cpu_model()
    return f"{chip}, {torch.get_num_threads()} torch thread(s)"


def forward(loaded: LoadedModel, x: torch.Tensor) -> None:
    """One forward of ``loaded`` on ``x``, finished (a GPU is waited for) when it returns."""
    with torch.inference_mode():
        loaded.model(x)
    if loaded.device.type == "cuda":
        torch.cuda.synchronize(loaded.device)


def sizes(loaded: LoadedModel) -> list[tuple[int, int]]:
    """Input sizes (H, W) to time: multiples of the patch around the training grid, up to MAX_TOKENS tokens."""
    (gh, gw), p = loaded.config.grid, loaded.config.patch_size
    out = []
    for f in GRID_FACTORS:
        h, w = max(1, round(gh * f)), max(1, round(gw * f))
        if h * w <= MAX_TOKENS and (h * p, w * p) not in out:
            out.append((h * p, w * p))
    return out


def measure(
    models: Sequence[LoadedModel],
    repeats: int = REPEATS,
    warmup: int = WARMUP,
    clock: Clock = time.perf_counter,
    run: Forward = forward,
) -> list[Latency]:
    """Time every model at every size of :func:`sizes` on random inputs. Every (model, size) point is warmed up
    first; then each round times every point once, the order reversed every round (A B C …, … C B A). A point's
    runs are thus spread over the whole press: a slow spell of the machine (another job, a clock change) falls on
    every model and size alike and shows in each point's spread, rather than shifting one point's median."""
    plans = [sizes(m) for m in models]
    points = [(i, m, plans[i][k]) for k in range(max(map(len, plans), default=0))
              for i, m in enumerate(models) if k < len(plans[i])]  # fmt: skip
    inputs = [torch.rand(1, 3, h, w, device=m.device) for _, m, (h, w) in points]
    for _ in range(warmup):
        for (_, m, _), x in zip(points, inputs, strict=True):
            run(m, x)
    times: list[list[float]] = [[] for _ in points]
    order = list(range(len(points)))
    for r in range(repeats):
        for j in order if r % 2 == 0 else order[::-1]:
            t = clock()
            run(points[j][1], inputs[j])
            times[j].append((clock() - t) * 1e3)
    curves = [Latency(m.name, m.kind) for m in models]
    for (i, m, (h, w)), samples in zip(points, times, strict=True):
        p = m.config.patch_size
        curves[i].tokens.append((h // p) * (w // p))
        curves[i].samples.append(samples)
    return curves


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
