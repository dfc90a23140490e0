"""Interactive Plotly figures: values on hover, labelled colour scales, titles that do not collide.

They only lay out numbers that :mod:`ssog_core` computed; static figures for download come from
:mod:`ssog_core.viz.figures`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ssog_core.analysis.head_as_field import HeadFieldStats
from ssog_core.analysis.head_spec import HeadSpec, HeadView
from ssog_core.analysis.measures import KeyNorms, LayerField

_LAYOUT = dict(template="plotly_white", font=dict(size=12), hoverlabel=dict(font_size=12))
_TAP_NAMES = {"mu": "s(μδ)", "sigma": "s(σδ)", "lambda": "s(λ)"}
ATOM_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")
# one colour per atom index, the same in both passes (Plotly's automatic colours count traces, so atom 1 of the
# column pass took the colour of a row-pass trace, not its legend entry's)


def kernel_plot(spec: HeadSpec, view: HeadView) -> go.Figure:
    """The query's row and column kernels per atom (dashed) and the λ-weighted marginals (solid)."""
    fig = make_subplots(
        rows=1,
        cols=2,
        subplot_titles=(f"row pass<br>(★ {spec.query[0]} dashed)", f"column pass<br>(★ {spec.query[1]} dashed)"),
        horizontal_spacing=0.12,
    )
    qy, qx = spec.query
    per_atom = view.row.shape[0] == len(spec.atoms)
    for c, (kernels, marginal, q, axis) in enumerate(
        (
            (view.row.numpy(), view.row_marginal.numpy(), qy, "row"),
            (view.col.numpy(), view.col_marginal.numpy(), qx, "col"),
        ),
        start=1,
    ):
        keys = np.arange(marginal.shape[0])
        for r, k in enumerate(kernels):
            name = f"atom {r + 1} (λ={float(view.lam[r]):.2f})" if per_atom else "axial mixture"
            fig.add_trace(
                go.Scatter(
                    x=keys,
                    y=k,
                    mode="lines",
                    line=dict(dash="dot", width=1.5, color=ATOM_COLOURS[r % len(ATOM_COLOURS)]),
                    name=name,
                    legendgroup=name,
                    showlegend=c == 1,
                    hovertemplate=f"{name}<br>key {axis} %{{x}}<br>weight %{{y:.4f}}<extra></extra>",
                ),
                row=1,
                col=c,
            )
        fig.add_trace(
            go.Scatter(
                x=keys,
                y=marginal,
                mode="lines+markers",
                line=dict(color="black", width=2.5),
                marker=dict(size=4),
                name="field marginal",
                legendgroup="marginal",
                showlegend=c == 1,
                hovertemplate=f"field<br>key {axis} %{{x}}<br>weight %{{y:.4f}}<extra></extra>",
            ),
            row=1,
            col=c,
        )
        fig.add_vline(x=q, line=dict(color="#888", dash="dash"), row=1, col=c)
        fig.update_xaxes(title_text=f"key {axis}", row=1, col=c)  # short: two titles share a phone's width
    fig.update_yaxes(title_text="weight", row=1, col=1)
    fig.update_layout(
        **_LAYOUT,
        height=380,
        # the title starts below Plotly's toolbar (top right), which covered it on a phone's width
        title=dict(
            text="1D kernels of the ★ query",
            font=dict(size=14),
            yref="container",
            y=1,
            yanchor="top",
            pad=dict(t=34),
            x=0.02,
            xanchor="left",
        ),
        margin=dict(l=50, r=10, t=100, b=45),
        legend=dict(orientation="h", y=-0.3, font=dict(size=11)),
    )
    return fig


def gates_plot(fields: Sequence[LayerField], init: float, cold: bool) -> go.Figure:
    """Gate scales vs layer on a log axis, so that a gate's growth from its start (a cold start sits near zero
    on a linear one) can be read; the start is a dashed line (a trace: it stays in data coordinates)."""
    fig = go.Figure()
    layers = list(range(len(fields)))
    for tap in ("mu", "sigma", "lambda"):
        if fields and all(tap in lf.gates for lf in fields):
            fig.add_trace(
                go.Scatter(
                    x=layers,
                    y=[lf.gates[tap] for lf in fields],
                    mode="lines+markers",
                    name=_TAP_NAMES[tap],
                    customdata=[lf.gates[tap] / init for lf in fields],
                    hovertemplate=f"layer %{{x}}<br>{_TAP_NAMES[tap]} = %{{y:.3g}} "
                    "(×%{customdata:,.0f} its start)<extra></extra>",
                )
            )
    start = "cold start softplus(−8) + 1e-4" if cold else "warm start softplus(−2) + 1e-4"
    fig.add_trace(
        go.Scatter(
            x=[-0.3, max(len(fields) - 0.7, 0.3)],
            y=[init, init],
            mode="lines",
            line=dict(dash="dash", color="gray"),
            name=f"{start} = {init:.3g}",
            hoverinfo="skip",
        )
    )
    fig.update_layout(
        **_LAYOUT,
        height=340,
        margin=dict(l=55, r=10, t=45, b=45),
        title=dict(text="Gate scale of each content tap vs layer (log scale)", font=dict(size=14)),
        xaxis=dict(title="layer", dtick=1),
        yaxis=dict(title="gate scale s", type="log", exponentformat="power"),
        legend=dict(orientation="h", y=-0.25, font=dict(size=11)),
    )
    return fig


def layer_density_plot(lf: LayerField, layer: int) -> go.Figure:
    """One layer's heads as heatmaps over key offset, with the density on hover and atom centres."""
    heads = lf.density.shape[0]
    ey, ex = lf.extent
    fig = make_subplots(
        rows=1,
        cols=heads,
        subplot_titles=[f"head {h}<br>H={lf.entropy[h]:.2f}<br>r={lf.radius[h]:.1f}" for h in range(heads)],
        horizontal_spacing=0.03,
    )
    dy = np.arange(-ey, ey + 1)
    dx = np.arange(-ex, ex + 1)
    for h in range(heads):
        d = lf.density[h].numpy()
        fig.add_trace(
            go.Heatmap(
                z=d,
                x=dx,
                y=dy,
                colorscale="Viridis",
                showscale=h == heads - 1,
                colorbar=dict(title=dict(text="weight", side="right"), len=0.9),
                hovertemplate="key offset dy=%{y}, dx=%{x}<br>weight %{z:.4f}<extra></extra>",
            ),
            row=1,
            col=h + 1,
        )
        look = -lf.mu[h].numpy()
        lam = lf.lam[h].numpy()
        fig.add_trace(
            go.Scatter(
                x=look[:, 1],
                y=look[:, 0],
                mode="markers",
                showlegend=False,
                marker=dict(symbol="cross-thin", size=12, line=dict(width=2, color="white"), opacity=1.0),
                customdata=np.stack([lam, lf.sigma[h, :, 0].numpy(), lf.sigma[h, :, 1].numpy()], -1),
                hovertemplate="atom looks at dy=%{y:.2f}, dx=%{x:.2f}<br>λ=%{customdata[0]:.3f}, "
                "σ=(%{customdata[1]:.2f}, %{customdata[2]:.2f})<extra></extra>",
            ),
            row=1,
            col=h + 1,
        )
        fig.add_trace(
            go.Scatter(
                x=[0],
                y=[0],
                mode="markers",
                showlegend=False,
                hoverinfo="skip",
                marker=dict(symbol="star", size=13, color="white", line=dict(width=1, color="black")),
            ),
            row=1,
            col=h + 1,
        )
        fig.update_yaxes(  # constrained to its domain: a narrow page shrinks the panel, not widens its range
            autorange="reversed",
            scaleanchor=f"x{h + 1 if h else ''}",
            constrain="domain",
            row=1,
            col=h + 1,
            showticklabels=h == 0,
        )
        fig.update_xaxes(constrain="domain", row=1, col=h + 1)
    fig.update_layout(
        **_LAYOUT,
        height=380,
        margin=dict(l=40, r=10, t=125, b=30),
        title=dict(text=f"Layer {layer}: each head's field over key offset<br>(hover for weights)", font=dict(size=14)),
    )
    fig.update_annotations(font_size=11)
    return fig


def map_plot(
    a: np.ndarray, title: str, colorbar: str, symmetric: bool = True, mark: tuple[int, int] | None = None
) -> go.Figure:
    """A patch-grid map with its value on hover (RdBu zero-centred when ``symmetric``); ``mark`` outlines one
    patch (the query picked in another view)."""
    lim = float(np.abs(a).max()) or 1e-12
    fig = go.Figure(
        go.Heatmap(
            z=a,
            colorscale="RdBu_r" if symmetric else "Viridis",
            zmid=0 if symmetric else None,
            zmin=-lim if symmetric else None,
            zmax=lim if symmetric else None,
            colorbar=dict(title=dict(text=colorbar, side="right")),
            hovertemplate="patch row %{y}, col %{x}<br>value %{z:.4f}<extra></extra>",
        )
    )
    if mark is not None:
        y, x = mark
        fig.add_shape(type="rect", x0=x - 0.5, x1=x + 0.5, y0=y - 0.5, y1=y + 0.5, line=dict(color="#ffd400", width=3))
    gh, gw = a.shape
    # the ranges are the grid's: with square cells and free ranges Plotly pads the short axis far past the grid
    fig.update_yaxes(range=[gh - 0.5, -0.5], scaleanchor="x", constrain="domain", title="patch row")
    fig.update_xaxes(range=[-0.5, gw - 0.5], constrain="domain", title="patch col")
    fig.update_layout(
        **_LAYOUT, height=380, margin=dict(l=50, r=10, t=50, b=45), title=dict(text=title, font=dict(size=14))
    )
    return fig


def stats_plot(entropy: np.ndarray, radius: np.ndarray, title: str, tokens: int) -> go.Figure:
    """Per layer × head attention entropy and effective radius, side by side, values on hover. Colours span the
    possible range (entropy 0 to ln N nats, radius from 0), so a 0.3-nat difference looks like one. Each colour
    bar lies under its own panel, so at a phone's width it cannot cover the other one."""
    spacing = 0.12
    fig = make_subplots(
        rows=1, cols=2, subplot_titles=("attention entropy<br>(nats)", "effective radius<br>(cells)"),
        horizontal_spacing=spacing,
    )  # fmt: skip
    ranges = ((0.0, float(np.log(tokens))), (0.0, max(float(radius.max()), 1e-9)))
    panel = (1 - spacing) / 2
    for c, (a, name, (lo, hi)) in enumerate(((entropy, "entropy", ranges[0]), (radius, "radius", ranges[1])), 1):
        fig.add_trace(
            go.Heatmap(
                z=a,
                zmin=lo,
                zmax=hi,
                colorscale="Cividis",
                colorbar=dict(
                    orientation="h",
                    x=(c - 1) * (panel + spacing) + panel / 2,
                    xanchor="center",
                    len=panel,
                    y=-0.32,
                    yanchor="top",
                    thickness=12,
                ),  # fmt: skip
                hovertemplate=f"layer %{{y}}, head %{{x}}<br>{name} %{{z:.3f}}<extra></extra>",
            ),
            row=1,
            col=c,
        )
        fig.update_xaxes(title_text="head", dtick=1, row=1, col=c)
        fig.update_yaxes(title_text="layer", dtick=1, autorange="reversed", row=1, col=c)
    fig.update_layout(
        **_LAYOUT, height=400, margin=dict(l=50, r=10, t=110, b=70), title=dict(text=title, font=dict(size=14))
    )
    fig.update_annotations(font_size=12)
    return fig


def key_norm_plot(kn: KeyNorms, title: str) -> go.Figure:
    """The "magnitude bullying" question for a dot / RBF model: per-layer key-norm distributions (left) and how
    much attention the largest-norm keys take relative to uniform attention (right, one line per head)."""
    fig = make_subplots(
        rows=1,
        cols=2,
        subplot_titles=("key-norm distribution per layer", f"attention on the {kn.top_k} largest keys ÷ uniform"),
        horizontal_spacing=0.14,
    )
    edges, dens = kn.histogram()
    centres = (0.5 * (edges[1:] + edges[:-1])).numpy()
    for layer, d in enumerate(dens.numpy()):
        fig.add_trace(
            go.Scatter(
                x=centres,
                y=d,
                mode="lines",
                name=f"layer {layer} ({kn.kinds[layer]})",
                hovertemplate=f"layer {layer}<br>‖k‖ %{{x:.3f}}<br>density %{{y:.3f}}<extra></extra>",
            ),
            row=1,
            col=1,
        )
    ratio = kn.sink_ratio.numpy()  # (L, H)
    layers = np.arange(ratio.shape[0])
    for head in range(ratio.shape[1]):
        fig.add_trace(
            go.Scatter(
                x=layers,
                y=ratio[:, head],
                mode="lines+markers",
                name=f"head {head}",
                customdata=np.stack([kn.topk_share[:, head].numpy(), kn.uniform_share[:, head].numpy()], -1),
                hovertemplate=(
                    f"layer %{{x}}, head {head}<br>ratio %{{y:.2f}}<br>share %{{customdata[0]:.3f}}"
                    " vs uniform %{customdata[1]:.3f}<extra></extra>"
                ),
            ),
            row=1,
            col=2,
        )
    fig.add_hline(y=1.0, line=dict(dash="dash", color="grey"), row=1, col=2)
    fig.update_xaxes(title_text="key norm ‖k‖", row=1, col=1)
    fig.update_yaxes(title_text="density", row=1, col=1)
    fig.update_xaxes(title_text="layer", dtick=1, row=1, col=2)
    fig.update_yaxes(title_text="× uniform", type="log", row=1, col=2)
    fig.update_layout(
        **_LAYOUT, height=340, margin=dict(l=50, r=10, t=70, b=45), title=dict(text=title, font=dict(size=14))
    )
    return fig


def edited_attention_plot(before: np.ndarray, after: np.ndarray, removed: Sequence[int], layer: int) -> go.Figure:
    """One query's attention per head (``(H, Gh, Gw)``), unedited (top row) and edited (bottom row); a head the
    edit took out of the head mean (ablated or patched) says so in its title."""
    heads = before.shape[0]
    titles = [f"head {h}" for h in range(heads)] + [
        f"head {h} (not in the mean)" if h in removed else f"head {h}" for h in range(heads)
    ]
    fig = make_subplots(rows=2, cols=heads, subplot_titles=titles, horizontal_spacing=0.02, vertical_spacing=0.1)
    top = float(max(before.max(), after.max())) or 1e-12
    for row, maps in ((1, before), (2, after)):
        for h in range(heads):
            fig.add_trace(
                go.Heatmap(z=maps[h], zmin=0, zmax=top, colorscale="Viridis", showscale=row == 1 and h == heads - 1,
                           hovertemplate="key row %{y}, col %{x}<br>weight %{z:.4f}<extra></extra>"),
                row=row, col=h + 1,
            )  # fmt: skip
    fig.update_yaxes(autorange="reversed", showticklabels=False)
    fig.update_xaxes(showticklabels=False)
    fig.update_layout(
        **_LAYOUT, height=420, margin=dict(l=10, r=10, t=60, b=10),
        title=dict(text=f"layer {layer}, centre query: unedited (top), edited (bottom)", font=dict(size=14)),
    )  # fmt: skip
    return fig


def importance_plot(drops: np.ndarray, noise: np.ndarray, title: str, columns: Sequence[str]) -> go.Figure:
    """A layers × columns table of log p drops (red: the edit hurts), ``·`` on cells within noise."""
    lim = float(np.abs(drops).max()) or 1e-12
    marks = np.where(noise, " ·", "")
    text = [[f"{v:+.3f}{m}" for v, m in zip(*rows, strict=True)] for rows in zip(drops, marks, strict=True)]
    fig = go.Figure(
        go.Heatmap(
            z=drops, x=list(columns), y=[f"layer {i}" for i in range(drops.shape[0])], text=text,
            texttemplate="%{text}", colorscale="RdBu_r", zmid=0, zmin=-lim, zmax=lim,
            colorbar=dict(title=dict(text="log p drop", side="right")),
            hovertemplate="%{y}, %{x}<br>log p(true) drop %{z:.4f}<extra></extra>",
        )
    )  # fmt: skip
    fig.update_yaxes(autorange="reversed")
    fig.update_layout(**_LAYOUT, height=90 + 40 * drops.shape[0], margin=dict(l=60, r=10, t=50, b=30),
                      title=dict(text=title, font=dict(size=14)))  # fmt: skip
    return fig


def _per_head(stats: HeadFieldStats, values: np.ndarray, offset: float) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """x (layer, heads spread a little around it and nudged by ``offset``), y and hover text of every head."""
    layers, heads = values.shape
    spread = np.linspace(-0.12, 0.12, heads) if heads > 1 else np.zeros(1)
    x = (np.arange(layers)[:, None] + offset + spread[None]).ravel()
    text = [f"layer {layer}, head {h}" for layer in range(layers) for h in range(heads)]
    return x, values.ravel(), text


def head_field_charts(models: Sequence[tuple[str, HeadFieldStats]]) -> tuple[go.Figure, go.Figure]:
    """Every head of every model against its layer: mean attention distance (pixels; the ViT paper's figure) and
    the share of the head its K fitted atoms explain (filled), its positional field explains (hollow) and the
    uniform field explains (a dash: the baseline a field with no geometry reaches; hover gives the normalised shares
    and marks diffuse heads). Each model's legend group is titled with the images it was measured on (how many,
    which)."""
    distance, share = go.Figure(), go.Figure()
    for i, (name, stats) in enumerate(models):
        on = f"{name} on {stats.measured_on.replace('`', '')}" if stats.measured_on else name
        group = dict(legendgroup=str(i), legendgrouptitle=dict(text=on))
        colour = ATOM_COLOURS[i % len(ATOM_COLOURS)]
        nudge = 0.3 * (i - (len(models) - 1) / 2) / max(len(models), 1)
        x, y, text = _per_head(stats, stats.mean_distance_px.numpy(), nudge)
        distance.add_trace(go.Scatter(x=x, y=y, mode="markers", name=name, text=text, marker=dict(color=colour),
                                      hovertemplate="%{text}<br>%{y:.1f} px<extra>" + on + "</extra>",
                                      **group))  # fmt: skip
        k = stats.fits[0].mu.shape[1]
        norm = {"fit": stats.normalised_fit.numpy().ravel(), "field": stats.normalised_field.numpy().ravel()}
        diffuse = stats.diffuse.numpy().ravel()
        for values, label, symbol, kind in ((stats.share_fit, f"{k} atoms", "circle", "fit"),
                                            (stats.share_field, "positional field", "circle-open", "field"),
                                            (stats.share_uniform, "uniform field", "line-ew-open", None)):  # fmt: skip
            x, y, text = _per_head(stats, values.numpy(), nudge)
            if kind is not None:
                text = [f"{t}<br>{'diffuse (within 0.1 of uniform)' if d else f'normalised {n:.3f}'}"
                        for t, n, d in zip(text, norm[kind], diffuse, strict=True)]  # fmt: skip
            share.add_trace(go.Scatter(x=x, y=y, mode="markers", name=f"{name}: {label}", text=text,
                                       marker=dict(color=colour, symbol=symbol, line=dict(color=colour, width=2)),
                                       **group,
                                       hovertemplate="%{text}<br>%{y:.3f}<extra>" + on + "</extra>"))  # fmt: skip
    depth = max((s.mean_distance_px.shape[0] for _, s in models), default=1)
    for fig, title, axis in (
        (distance, "Mean attention distance per head (patch queries, patch keys)", "mean distance (pixels)"),
        (
            share,
            "Share of each head a content-blind field explains (1 − mean TV); dash: the uniform field's",
            "share explained",
        ),
    ):
        fig.update_layout(**_LAYOUT, title=dict(text=title, font=dict(size=13)), height=380,
                          margin=dict(l=60, r=20, t=50, b=50), legend=dict(font=dict(size=10)))  # fmt: skip
        fig.update_xaxes(title_text="layer", tickvals=list(range(depth)))
        fig.update_yaxes(title_text=axis, rangemode="tozero")
    share.update_yaxes(range=[0, 1.02])
    return distance, share


def target_share_plot(report: dict, title: str) -> go.Figure:
    """The target share per layer (a ``/target_share`` answer) with its 95% intervals, the share with every μ gate
    closed beside it (a model that steers μ) and the line at chance (the discs not told apart)."""
    fig = go.Figure()
    closed = report["closed_mu"]
    rows = [("unedited", report["layers"], "#1f77b4")]
    if closed is not None:
        rows.append(("μ gates closed", closed["layers"], "#7f7f7f"))
    for k, (name, layers, colour) in enumerate(rows):
        share = np.array([r["share"] for r in layers])
        low, high = (np.array([r["ci95"][i] for r in layers]) for i in (0, 1))
        fig.add_trace(go.Scatter(
            x=np.arange(len(layers)) + 0.12 * (k - (len(rows) - 1) / 2), y=share, mode="markers+lines", name=name,
            marker=dict(color=colour, size=9), line=dict(color=colour, width=1),
            error_y=dict(type="data", symmetric=False, array=high - share, arrayminus=share - low, thickness=1.4),
            customdata=np.stack([np.arange(len(layers)), low, high], -1),
            hovertemplate=f"{name}<br>layer %{{customdata[0]}}<br>share %{{y:.3f}} "
                          "[%{customdata[1]:.3f}, %{customdata[2]:.3f}]<extra></extra>",
        ))  # fmt: skip
    chance = report["chance"]
    fig.add_hline(y=chance, line=dict(dash="dash", color="#333"), annotation_text=f"{chance:.2f}: not told apart",
                  annotation_position="bottom right")  # fmt: skip
    fig.update_xaxes(title_text="layer", tickvals=list(range(len(report["layers"]))))
    fig.update_yaxes(title_text="attention on the pointed disc / on all three", range=[0, 1.02])
    fig.update_layout(**_LAYOUT, height=380, margin=dict(l=60, r=20, t=60, b=50), legend=dict(font=dict(size=11)),
                      title=dict(text=title, font=dict(size=13)))  # fmt: skip
    return fig
