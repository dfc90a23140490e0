"""Tab 2, checkpoint geometry: every head's learned field, the gates, the atom table and the model card; and, for any
model (SSOG, dot, RBF or a standard ViT alike), every head measured as a field over displacement with its K-atom fit
(:mod:`ssog_core.analysis.head_as_field`, run as a heavy job); a dot-attention model distilled into an SSOG student
from there (:mod:`app.distill`, a heavy job) and the student's report beside its teacher's fields."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any

import gradio as gr
import numpy as np
from gradio.blocks import Block

from app import distill as distilling
from app import fields, plots, queues, widgets
from app import pictures as chooser
from app.common import Updates, error_text, shown_figure, warn, write_downloads
from app.session_protocol import Restoring, SessionPart
from app.state import AppContext, AppError, LoadedModel, teacher_of
from app.widgets import layer_update, model_depth
from ssog_core.analysis import report
from ssog_core.analysis.head_as_field import FIT_ATOMS, MAX_FIT_ATOMS, HeadFieldStats, fit_spec
from ssog_core.analysis.head_spec import HeadSpec
from ssog_core.analysis.measures import DEFAULT_IMAGES, attention_maps, has_keys, key_norms, query_rows
from ssog_core.field import centre_query
from ssog_core.interventions.validation import MAX_EVAL_IMAGES, Pictures
from ssog_core.viz import figures as viz
from ssog_core.viz import files as figures
from ssog_core.viz import raster

FIELD_HEADERS = ["layer", "head", "mean distance (px)", "share: atoms", "share: positional field", "prefix share"]
FIELD_LEGEND = (
    "d = mean attention distance (pixels), fit = share of the head its atoms explain (1 − mean TV), over patch "
    "queries and patch keys."
)
DISTILL_HEADERS = [
    "layer",
    "head",
    "share: fit",
    "share: steered",
    "share: uniform",
    "normalised: fit",
    "normalised: steered",
    "steered − fit",
    "steering reach (cells)",
]
STOPPED = "Stopped: the distillation ended there and nothing was written (the checkpoint folder is as it was)."
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
    field_images: gr.Slider
    field_atoms: gr.Slider
    field_note: gr.Markdown
    field_figure: gr.Image  # measured positional fields, fitted atoms marked: a click opens that fit
    fit_figure: gr.Image  # the fitted atoms' own fields: a click opens that fit
    distance: gr.Plot
    share: gr.Plot
    field_table: gr.Dataframe
    field_shown: gr.State  # {"checkpoint", "images", "atoms"} of the head fields on show (what a click opens)
    distill_steps: gr.Slider
    distill_steer: gr.Radio
    distill_note: gr.Markdown
    distill_figure: gr.Image  # the student's report: shares per head, raw and normalised
    distill_table: gr.Dataframe
    distill_compare: gr.Button  # opens the student beside its teacher in Compare (wired by app/layout.py)
    distill_shown: gr.State  # {"student", "teacher"} of the report on show; a new one refreshes the pickers

    @property
    def field_outputs(self) -> list[Block]:
        """What :func:`on_measure` changes."""
        return [self.field_note, self.field_figure, self.fit_figure, self.distance, self.share, self.field_table,
                self.field_shown]  # fmt: skip

    @property
    def distill_outputs(self) -> list[Block]:
        """What :func:`on_distill` changes."""
        return [self.distill_note, self.distill_figure, self.distill_table, self.distill_compare, self.distill_shown]

    @property
    def outputs(self) -> list[Block]:
        """What :func:`render` changes."""
        return [self.note, self.card, self.figure, self.gates, self.layer_plot, self.stats, self.table, self.layer]

    @property
    def rendered(self) -> list[Block]:
        """What :func:`render` may change: :attr:`outputs`, and the head fields and a distillation report when they
        were another model's."""
        return [*self.outputs, *self.field_outputs, *self.distill_outputs]


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
    source = loaded.meta.get("source")
    if isinstance(source, dict) and "layout" in source:  # a model folder (timm, transformers): what it is
        lines.append(f"| folder | {source.get('layout')}: {source.get('architecture')} |")
        lines.append(f"| prefix tokens | {loaded.model.num_prefix_tokens} |")
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
    return viz.panel_at(*geometry_png(ctx, loaded), len(loaded.fields), xy)


def shown(value: Any) -> dict[str, Any]:
    """A component's new value, hidden when there is none (no empty plot boxes or tables)."""
    return gr.update(value=value, visible=value is not None)


def render(
    ctx: AppContext, ui: GeometryUI, ckpt: str | None, layer: float, sha: str | None, fields_of: dict | None = None,
    distilled: dict | None = None,
) -> Updates:  # fmt: skip
    """Everything the tab shows for a checkpoint (:attr:`GeometryUI.outputs`), and no head fields measured for
    another model (``fields_of``: those on show), nor a distillation report of neither this teacher nor its student
    (``distilled``); a distilled student brings its own report (:func:`student_report`). What a model does not have
    (a dot model's field, gates and atoms) is hidden, and the note says what is shown instead."""
    other = fields_of is not None and fields_of.get("checkpoint") != ckpt
    unrelated = distilled is not None and ckpt not in (distilled.get("teacher"), distilled.get("student"))
    own = distilled is not None and ckpt == distilled.get("student")  # its report is on show already
    report = {} if own or not ckpt else student_report(ctx, ui, ckpt)
    hidden = {**(fields_hidden(ui) if other else {}), **(distill_hidden(ui) if unrelated else {})}
    return {**hidden, **report, **_render(ctx, ui, ckpt, layer, sha)}


def student_report(ctx: AppContext, ui: GeometryUI, ckpt: str) -> Updates:
    """A distilled student's report (:func:`app.distill.opened`) in the *Distill into SSOG* section, or, when it has
    none of its own, why, in that section's note; nothing for any other model."""
    try:
        loaded = ctx.model(ckpt)
        student = distilling.opened(ctx, loaded)
    except AppError as e:
        return {**distill_hidden(ui), ui.distill_note: warn(error_text(e))}
    except Exception:  # an unreadable checkpoint: _render says why in the tab's note
        return {}
    return {} if student is None else distill_view(ui, student, teacher_of(ctx, loaded))


def _render(ctx: AppContext, ui: GeometryUI, ckpt: str | None, layer: float, sha: str | None) -> Updates:
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
        "no field, atoms or gates of its own to draw. Shown instead: its attention maps — each layer × head's "
        "attention of the centre patch on the selected image (exact rows of the attention matrix, prefix tokens left "
        "out) — and its key norms. **Every head as a field** (below) measures and fits a field to each head."
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
    q = centre_query(maps.grid)
    rows = np.stack([query_rows(a[0], q, maps.grid).cpu().numpy() for a in maps.attn])
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


# ------------------------------------------------------------------------------ every head as a field


def field_pngs(
    ctx: AppContext, loaded: LoadedModel, stats: HeadFieldStats, n: int, atoms: int, pictures: Pictures | None = None
) -> dict[str, tuple[bytes, list[tuple[float, float, float, float]]]]:
    """The measured fields (``field``) and the fits' own fields (``fit``) as layers × heads figures drawn like an
    SSOG model's geometry, PNG bytes with their panel boxes (cached per model, N and K; :func:`fields.measure`)."""

    def draw() -> dict[str, tuple[bytes, list[tuple[float, float, float, float]]]]:
        measured, fitted = report.head_field_layers(stats)
        d, fit, field = (t.tolist() for t in (stats.mean_distance_px, stats.share_fit, stats.share_field))
        text = [
            [f"d={d[layer][h]:.0f} fit={fit[layer][h]:.2f}" for h in range(len(d[layer]))] for layer in range(len(d))
        ]
        shared = f"{loaded.name}, {stats.measured_on.replace('`', '')}, K = {atoms}"
        out = {}
        for kind, layers, title in (
            ("field", measured, f"Positional fields (+ fitted atoms): {shared}"),
            ("fit", fitted, f"Fitted atoms' fields (τ = 1): {shared}"),
        ):
            fig = viz.geometry_figure(layers, title, panel_text=text, legend=FIELD_LEGEND)
            settings = {"figure": f"head fields ({kind})", "checkpoint": loaded.name, "images": stats.images,
                        "atoms": atoms, "colormap": viz.FIELD_CMAP}  # fmt: skip
            png = viz.figure_bytes(fig, "png", settings)
            out[kind] = png, viz.panel_boxes(fig)
        return out

    return ctx.cache.figures.get(("head fields", loaded.key, n, atoms, pictures), draw)


def field_rows_table(stats: HeadFieldStats) -> list[list[float | int]]:
    """One row per head: :data:`FIELD_HEADERS`."""
    per = (stats.mean_distance_px, stats.share_fit, stats.share_field, stats.prefix_share)
    return [[layer, h, *(round(float(t[layer, h]), 4) for t in per)]
            for layer in range(per[0].shape[0]) for h in range(per[0].shape[1])]  # fmt: skip


def field_view(
    ctx: AppContext, ui: GeometryUI, loaded: LoadedModel, n: int, atoms: int, choice: str | None = None
) -> Updates:
    """The measured head fields of ``loaded`` on the chosen pictures (``choice``, the page's chooser) drawn: both
    figures, both charts (with every model measured alike, each legend entry naming its images) and the table."""
    pictures = chooser.chosen(ctx, choice)
    stats = fields.measure(ctx, loaded, n, atoms, pictures=pictures)
    pngs = field_pngs(ctx, loaded, stats, n, atoms, pictures)
    stem = figures.stem_of(loaded.name)
    files = write_downloads({f"{viz.safe_token(f'head_{kind}_{stem}_K{atoms}_N{n}')}.png": pngs[kind][0]
                             for kind in ("field", "fit")})  # fmt: skip
    distance, share = plots.head_field_charts(fields.measured_alike(ctx, n, atoms))
    prefix = float(stats.prefix_share.mean())
    note = (
        f"**{loaded.name}**: every head measured on {stats.measured_on}, {stats.grid[0]}×{stats.grid[1]} patches, "
        f"{atoms} atoms fitted per head (L-BFGS). Mean share its atoms explain "
        f"**{float(stats.share_fit.mean()):.2f}**, its positional field **{float(stats.share_field.mean()):.2f}**"
        + (
            f"; patch queries put **{prefix:.1%}** of their attention on the {stats.num_prefix} prefix token(s), "
            "left out of the fields"
            if stats.num_prefix
            else ""
        )  # fmt: skip
        + ". **Click a panel** to open that head's fit in the playground. The charts hold every model measured "
        f"here with N = {n} and {atoms} atoms, each on the images its legend entry names."
    )
    return {
        ui.field_note: note,
        ui.field_figure: gr.update(value=files[0], visible=True),
        ui.fit_figure: gr.update(value=files[1], visible=True),
        ui.distance: gr.update(value=distance, visible=True),
        ui.share: gr.update(value=share, visible=True),
        ui.field_table: gr.update(value=field_rows_table(stats), visible=True),
        ui.field_shown: {"checkpoint": loaded.name, "images": int(n), "atoms": int(atoms), "pictures": choice},
    }


def on_measure(
    ctx: AppContext, ui: GeometryUI, ckpt: str | None, n: float, atoms: float, request: Any = None,
    choice: str | None = None,
) -> Iterator[Updates]:  # fmt: skip
    """Measure every head of the checkpoint as a field on the chosen pictures (a heavy job, its progress on the
    note), then draw it."""
    try:
        if not ckpt:
            raise AppError("pick a checkpoint first")
        loaded, pictures = ctx.model(ckpt), chooser.chosen(ctx, choice)
        yield {**fields_hidden(ui), ui.field_note: f"Measuring every head of **{ckpt}** as a field…"}
        for done, progress in queues.watched(
            request, lambda stop, watch: fields.measure(ctx, loaded, int(n), int(atoms), stop, watch, pictures)
        ):
            if done is None:
                yield {ui.field_note: f"Measuring every head of **{ckpt}** as a field: {progress}…"}
        yield field_view(ctx, ui, loaded, int(n), int(atoms), choice)
    except Exception as e:
        yield {ui.field_note: warn(error_text(e))}


def fields_hidden(ui: GeometryUI) -> Updates:
    """No head fields on show: what the section shows while another measurement waits or runs, and for another
    model (never the previous numbers under a new name)."""
    hide = gr.update(value=None, visible=False)
    return {ui.field_note: "", ui.field_figure: hide, ui.fit_figure: hide, ui.distance: hide, ui.share: hide,
            ui.field_table: hide, ui.field_shown: None}  # fmt: skip


def fitted_head_at(ctx: AppContext, shown: dict | None, kind: str, xy: Any) -> tuple[HeadSpec, str] | None:
    """The fitted head under pixel ``xy`` of the ``kind`` figure on show, as a playground head, with a note; None
    outside every panel."""
    if not shown:
        raise AppError("measure the heads first")
    loaded = ctx.model(shown["checkpoint"])
    n, atoms, pictures = shown["images"], shown["atoms"], chooser.chosen(ctx, shown.get("pictures"))
    stats = fields.measured(ctx, loaded, n, atoms, pictures)
    at = viz.panel_at(*field_pngs(ctx, loaded, stats, n, atoms, pictures)[kind], len(stats.fits), xy)
    if at is None:
        return None
    layer, head = at
    spec = fit_spec(stats.fits[layer], head, stats.grid)
    note = (
        f"Layer {layer}, head {head} of {loaded.name} as {atoms} fitted atoms (τ = 1) on the "
        f"{spec.grid[0]}×{spec.grid[1]} displacement grid, ★ at its centre: its atoms explain "
        f"{float(stats.share_fit[layer, head]):.0%} of the head, its positional field "
        f"{float(stats.share_field[layer, head]):.0%}; mean attention distance "
        f"{float(stats.mean_distance_px[layer, head]):.1f} px."
    )
    return spec, note


# ------------------------------------------------------------------------------ distill into SSOG


def distill_rows(report: dict[str, Any]) -> list[list[Any]]:
    """One row per head of a distillation report: :data:`DISTILL_HEADERS` (a diffuse head's normalised shares
    say *diffuse*)."""

    def normalised(value: float | None) -> float | str:
        return "diffuse" if value is None else round(value, 4)

    return [[h["layer"], h["head"], round(h["share_fit"], 4), round(h["share_steered"], 4),
             round(h["share_uniform"], 4), normalised(h["normalised_fit"]), normalised(h["normalised_steered"]),
             round(h["difference"], 4), round(h["steering_reach"], 4)] for h in report["heads"]]  # fmt: skip


def distill_view(ui: GeometryUI, student: distilling.Student, teacher: str | None) -> Updates:
    """A distillation's report drawn, of a student just written (where, and what was there) or opened (read beside
    its file): agreement and KL at step 0 and at the end, the chart (:func:`ssog_core.viz.figures.distill_figure`)
    and the table of every head's shares. ``teacher`` is the teacher's picker name, None when the pickers do not
    offer it (then there is no *Compare with its teacher*)."""
    report, name = student.report, student.name
    a0, a1 = report["step0"], report["final"]
    held = report.get("held_out")
    after = held.get("after") if isinstance(held, dict) else None
    accuracy = (
        f" Accuracy {a0['accuracy']:.3f} → {a1['accuracy']:.3f} (the teacher's {a1['teacher_accuracy']:.3f})."
        if a1.get("accuracy") is not None and a0.get("accuracy") is not None and a1.get("teacher_accuracy") is not None
        else ""
    )
    pictures = report.get("pictures")
    first = pictures.get("first") if isinstance(pictures, dict) else None
    trained = f"{report['step']} steps" + (f" on {first} pictures" if first is not None else "")
    if student.existed is None:
        head = (
            f"**{name}** is an SSOG student of **{student.teacher}** ({trained}): its report, read from beside its "
            "file. "
        )
        compare = "**Compare with its teacher** opens them side by side."
        tail = compare if teacher else "Its teacher is not among the checkpoints here."
    else:
        kept = ", ".join(f"`{n}`" for n in student.existed)
        existed = f" ({kept} already there: nothing was replaced)" if kept else ""
        head = (
            f"Wrote **{name}** into the checkpoint folder{existed}: an SSOG student of **{student.teacher}**, "
            f"{trained}, its step 0 the fits above. "
        )
        tail = "It is in the picker now; **Compare with its teacher** opens them side by side."
    note = (
        f"{head}Agreement with the teacher **{a0['agreement']:.3f} → {a1['agreement']:.3f}**, KL "
        f"**{a0['kl']:.4f} → {a1['kl']:.4f}** on {report['held_out_images']} held-out pictures"
        + (f" (after the first {after})" if after is not None else "")
        + f".{accuracy} Still content-scored: {report['content_scored']}. {tail} Per head: the share of the "
        "teacher's head its fitted field explains (geometry alone) and the steered student's (geometry that content "
        "steers), both also normalised against the uniform field."
    )
    fig = viz.distill_figure(report, f"{name} from {student.teacher}")
    settings = {"figure": "distillation report", "student": name, "teacher": student.teacher}
    stem = f"distill_{figures.stem_of(name)}"
    return {
        ui.distill_note: note,
        ui.distill_figure: gr.update(value=shown_figure(fig, stem, settings), visible=True),
        ui.distill_table: gr.update(value=distill_rows(report), visible=True),
        ui.distill_compare: gr.update(visible=teacher is not None),
        ui.distill_shown: {"student": name, "teacher": teacher},
    }


def distill_hidden(ui: GeometryUI) -> Updates:
    """No distillation report on show (while another runs, and for an unrelated model)."""
    hide = gr.update(value=None, visible=False)
    return {ui.distill_note: "", ui.distill_figure: hide, ui.distill_table: hide,
            ui.distill_compare: gr.update(visible=False), ui.distill_shown: None}  # fmt: skip


def on_distill(
    ctx: AppContext, ui: GeometryUI, ckpt: str | None, n: float, atoms: float, steer: str, steps: float,
    request: Any = None, choice: str | None = None,
) -> Iterator[Updates]:  # fmt: skip
    """Distil the checkpoint into an SSOG student on the chosen pictures (a heavy job, its steps on the note), then
    show its report; refusals (no dot heads, bad steps) come before any slot is taken."""
    try:
        if not ckpt:
            raise AppError("pick a checkpoint first")
        loaded = ctx.model(ckpt)
        asked = distilling.request(ctx, loaded, n, atoms, steer, steps, chooser.chosen(ctx, choice))
        yield {**distill_hidden(ui), ui.distill_note: f"Distilling **{ckpt}** into SSOG…"}
        work = lambda stop, watch: distilling.run(ctx, loaded, asked, stop, watch)  # noqa: E731
        for done, progress in queues.watched(request, work, unit="steps"):
            if done is None:
                yield {ui.distill_note: f"Distilling **{ckpt}** into SSOG: {progress}…"}
        yield distill_view(ui, done, done.teacher)  # the picker name it was distilled from
    except Exception as e:
        yield {ui.distill_note: warn(error_text(e))}


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
    with gr.Accordion("Every head as a field: its positional field, a K-atom fit, distance and share charts",
                      open=True, elem_id="geo-fields"):  # fmt: skip
        gr.Markdown(
            "Any model's heads (SSOG, dot, RBF, a standard ViT) measured alike over patch queries and patch keys: "
            "each head's attention averaged by displacement (query − key) is its **positional field**; K Gaussian "
            "atoms, an SSOG head's own kind of field, are fitted to it. The **share** a field explains is "
            "1 − the mean total-variation distance between the head's rows and the field's. Measured on the pictures "
            "chosen at the top of the page: a model's recorded data is the first N images of its validation set (the "
            "bundled pictures for a model that records none); or up to N bundled or uploaded pictures.",
            elem_classes="hint",
        )
        with gr.Row():
            field_images_ = gr.Slider(1, MAX_EVAL_IMAGES, value=DEFAULT_IMAGES, step=1, label="images (N)",
                                      elem_id="geo-field-images", scale=2)  # fmt: skip
            field_atoms = gr.Slider(1, MAX_FIT_ATOMS, value=FIT_ATOMS, step=1, label="atoms per head (K)",
                                    elem_id="geo-field-atoms", scale=2)  # fmt: skip
            measure = gr.Button("Measure every head as a field", elem_id="geo-field-measure", scale=1)
            stop = gr.Button("Stop", size="sm", elem_id="geo-field-stop", scale=0, min_width=70)
        field_note = gr.Markdown(elem_id="geo-field-note")
        field_figure = gr.Image(label="Positional field of every head, fitted atoms marked", type="filepath",
                                format="png", interactive=False, elem_id="geo-field-figure", show_label=False,
                                visible=False, buttons=["download", "fullscreen"])  # fmt: skip
        fit_figure = gr.Image(label="The fitted atoms' own fields", type="filepath", format="png", interactive=False,
                              elem_id="geo-fit-figure", show_label=False, visible=False,
                              buttons=["download", "fullscreen"])  # fmt: skip
        with gr.Row(equal_height=False):
            distance = gr.Plot(show_label=False, label="Mean attention distance per head vs layer",
                               elem_id="geo-field-distance", visible=False)  # fmt: skip
            share = gr.Plot(show_label=False, label="Share per head vs layer", elem_id="geo-field-share", visible=False)
        field_table = gr.Dataframe(headers=FIELD_HEADERS, label="Every head as a field", interactive=False,
                                   elem_id="geo-field-table", max_height=360, visible=False)  # fmt: skip
        gr.Markdown(
            "**Distill into SSOG** (a model with dot-product heads: a dot twin, a standard ViT): an SSOG student "
            "whose heads are these fits (N and K above), steered by content, trained to match this model's outputs "
            "on the N pictures, then reported on up to N pictures after them, held out. The student is written into "
            "the checkpoint folder as `NAME_distilled.safetensors` (`_2`, … when that exists: nothing is replaced).",
            elem_classes="hint",
        )
        with gr.Row():
            distill_steps = gr.Slider(1, distilling.MAX_STEPS, value=distilling.DEFAULT_STEPS, step=1,
                                      label="steps", elem_id="geo-distill-steps", scale=2)  # fmt: skip
            distill_steer = gr.Radio(list(distilling.STEER_CHOICES), value="mu,sigma,lambda", label="content steers",
                                     elem_id="geo-distill-steer", scale=2)  # fmt: skip
            distill = gr.Button("Distill into SSOG", elem_id="geo-distill", scale=1)
            distill_stop = gr.Button("Stop", size="sm", elem_id="geo-distill-stop", scale=0, min_width=70)
        distill_note = gr.Markdown(elem_id="geo-distill-note")
        distill_figure = gr.Image(label="The student's report", type="filepath", format="png", interactive=False,
                                  elem_id="geo-distill-figure", show_label=False, visible=False,
                                  buttons=["download", "fullscreen"])  # fmt: skip
        distill_table = gr.Dataframe(headers=DISTILL_HEADERS, label="Every head: teacher vs fit vs student",
                                     interactive=False, elem_id="geo-distill-table", max_height=360,
                                     visible=False)  # fmt: skip
        distill_compare = gr.Button("Compare with its teacher", elem_id="geo-distill-compare", visible=False,
                                    size="sm")  # fmt: skip
    ui = GeometryUI(note=note, card=card, figure=figure, gates=gates, layer=layer, layer_plot=layer_plot,
                    stats=stats, table=table, files=files, files_status=files_status, status=status,
                    field_images=field_images_, field_atoms=field_atoms, field_note=field_note,
                    field_figure=field_figure, fit_figure=fit_figure, distance=distance, share=share,
                    field_table=field_table, field_shown=gr.State(None), distill_steps=distill_steps,
                    distill_steer=distill_steer, distill_note=distill_note, distill_figure=distill_figure,
                    distill_table=distill_table, distill_compare=distill_compare,
                    distill_shown=gr.State(None))  # fmt: skip

    def measured(c: str | None, n: float, k: float, p: str | None, request: gr.Request) -> Iterator[Updates]:
        yield from on_measure(ctx, ui, c, n, k, request, p)  # a plain function: Gradio finds its Request

    running = measure.click(queues.busy_note, None, [field_note], queue=False, show_progress="hidden",
                            api_visibility="private").then(
        measured, [shared["checkpoint"], field_images_, field_atoms, shared["pictures"]], ui.field_outputs,
        **queues.heavy(api_visibility="private"),
    )  # fmt: skip
    stop.click(lambda: "Stopped.", None, [field_note], cancels=[running], api_visibility="private")

    def distilled(c: str | None, n: float, k: float, steer: str, steps: float, p: str | None,
                  request: gr.Request) -> Iterator[Updates]:  # fmt: skip
        yield from on_distill(ctx, ui, c, n, k, steer, steps, request, p)  # a plain function: Gradio finds its Request

    distilling_ = distill.click(queues.busy_note, None, [distill_note], queue=False, show_progress="hidden",
                                api_visibility="private").then(
        distilled, [shared["checkpoint"], field_images_, field_atoms, distill_steer, distill_steps, shared["pictures"]],
        ui.distill_outputs, **queues.heavy(api_visibility="private"),
    )  # fmt: skip
    distill_stop.click(lambda: STOPPED, None, [distill_note], cancels=[distilling_], api_visibility="private")
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
