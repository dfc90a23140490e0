"""The Target share tab: where a ``pointer`` model's attention goes. Of the attention patch queries put on the three
discs, the share on the disc the cue points at, per layer (1/3 when the discs are not told apart): on one validation
image, drawn over its scene, and as the mean over the first N validation images with 95% intervals; for a model that
steers μ also with every μ gate closed (does steering send attention to the pointed disc?).

Every number comes from :mod:`ssog_core.interventions.target_share` through :mod:`app.target_share`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import gradio as gr
from gradio.blocks import Block

from app import plots, queues
from app import target_share as shares
from app.common import Updates, error_text, shown_figure, warn
from app.session_protocol import Restoring, SessionPart
from app.state import AppContext, AppError, LoadedModel
from ssog_core.interventions.target_share import CHANCE, close_mu
from ssog_core.interventions.validation import MAX_EVAL_IMAGES
from ssog_core.viz import figures as viz
from ssog_core.viz import files as figures

HEADERS = ["layer", "share [95% interval]", "μ gates closed [95% interval]", "change [95% interval]"]


@dataclass(frozen=True)
class TargetShareUI:
    """The tab's components, by name."""

    note: gr.Markdown
    index: gr.Number
    figure: gr.Image
    n: gr.Slider
    read: gr.Button
    stop: gr.Button
    mean_note: gr.Markdown
    plot: gr.Plot
    table: gr.Dataframe
    shown: gr.State  # the checkpoint whose mean the plot and table show, or None

    @property
    def outputs(self) -> list[Block]:
        """What :func:`render` changes."""
        return [self.note, self.figure, self.mean_note, self.plot, self.table, self.shown]

    @property
    def mean_outputs(self) -> list[Block]:
        """What :func:`on_read` changes."""
        return [self.mean_note, self.plot, self.table, self.shown]


def cleared(ui: TargetShareUI) -> Updates:
    """The mean's view emptied (it showed another model)."""
    return {ui.mean_note: "", ui.plot: None, ui.table: gr.update(value=None, visible=False), ui.shown: None}


def image_view(loaded: LoadedModel, index: int, one: Any) -> str:
    """One image's figure as a named PNG (it downloads under that name)."""
    fig = viz.target_share_figure(one.scene.image, one.scene.discs, one.shares, one.closed_mu, one.class_name, CHANCE,
                                  f"{loaded.name} · validation image {index}")  # fmt: skip
    settings = {"checkpoint": loaded.name, "data": loaded.meta.get("data"), "validation_image": index,
                "figure": "target share"}  # fmt: skip
    return shown_figure(fig, f"target_share_{figures.stem_of(loaded.name)}_val{index}", settings)


def render(ctx: AppContext, ui: TargetShareUI, ckpt: str | None, index: float | None, shown: str | None) -> Updates:
    """The note and one validation image's figure; the mean's view is emptied when it showed another model."""
    out = cleared(ui) if shown and shown != ckpt else {}
    if not ckpt:
        return {**out, ui.note: "Pick a `pointer` checkpoint to see where its attention goes.", ui.figure: None}
    try:
        loaded = ctx.model(ckpt)
        index = int(index or 0)
        one = shares.one_image(ctx, loaded, index)
        layers = ", ".join(f"{s:.2f}" for s in one.shares)
        closed = "" if one.closed_mu is None else (
            f"; with every μ gate closed {', '.join(f'{s:.2f}' for s in one.closed_mu)}")  # fmt: skip
        note = (
            f"**{ckpt}** on validation image **{index}** of `{loaded.meta['data']}` (the cue points at the "
            f"**{one.class_name}** disc, outlined solid): its target share per layer {layers}{closed}. "
            f"{CHANCE:.2f} means the model does not tell the discs apart."
        )
        return {**out, ui.note: note, ui.figure: image_view(loaded, index, one)}
    except Exception as e:
        return {**out, ui.note: warn(error_text(e)), ui.figure: None}


def mean_text(ckpt: str, report: dict[str, Any]) -> str:
    """What the mean's numbers are, in words."""
    images = report["images"]
    text = (f"**{ckpt}**: the mean target share per layer over the first **{images['first']}** validation images of "
            f"`{images['data']}`, each with its 95% interval (bootstrap over the images).")  # fmt: skip
    if report["closed_mu"]:
        text += (
            " With every μ gate closed beside it; the change (closed − unedited) has a paired interval, the "
            "same images on both sides: an interval below 0 says steering sends attention to the pointed disc."
        )
    else:
        text += " This model does not steer μ: there are no μ gates to close."
    return text


def table_rows(report: dict[str, Any]) -> list[list[str]]:
    """One row per layer: share [interval], and for a model that steers μ the share with its μ gates closed and the
    paired change."""
    closed = report["closed_mu"]

    def cell(value: float, ci: list[float], sign: str = "") -> str:
        return f"{value:{sign}.3f} [{ci[0]:{sign}.3f}, {ci[1]:{sign}.3f}]"

    rows = []
    for i, layer in enumerate(report["layers"]):
        row = [f"layer {layer['layer']}", cell(layer["share"], layer["ci95"])]
        if closed:
            c, d = closed["layers"][i], closed["change"][i]
            row += [cell(c["share"], c["ci95"]), cell(d["change"], d["ci95"], "+")]
        else:
            row += ["–", "–"]
        rows.append(row)
    return rows


def on_read(
    ctx: AppContext, ui: TargetShareUI, ckpt: str | None, n: float, request: gr.Request | None = None
) -> Iterator[Updates]:
    """The mean over the first N validation images, as a heavy job (its progress on the note), then drawn."""
    try:
        if not ckpt:
            raise AppError("pick a checkpoint first")
        loaded = ctx.model(ckpt)
        shares.scenes(loaded)  # a model of other data is refused before a heavy slot is taken
        passes = "two passes (unedited, μ gates closed)" if close_mu(loaded.model) else "one pass"
        what = f"Reading the target share of **{ckpt}** on {int(n)} validation images, {passes}"
        yield {ui.mean_note: f"{what}…"}
        for report, progress in queues.watched(
            request, lambda stop, watch: shares.readout(ctx, loaded, int(n), stop, watch)
        ):
            if report is None:
                yield {ui.mean_note: f"{what}: {progress}…"}
                continue
            title = f"{ckpt}: target share per layer, {report['images']['first']} validation images"
            yield {ui.mean_note: mean_text(ckpt, report), ui.plot: plots.target_share_plot(report, title),
                   ui.table: gr.update(value=table_rows(report), visible=True), ui.shown: ckpt}  # fmt: skip
    except Exception as e:
        yield {**cleared(ui), ui.mean_note: warn(error_text(e))}


def build(ctx: AppContext, shared: dict[str, Any]) -> TargetShareUI:
    gr.Markdown(
        "On a `pointer` model (a cue points at one of three coloured discs; the class is the colour of the one it "
        "points at): of the attention patch queries put on the three discs' patches, the share on the disc the cue "
        f"points at, per layer, every head pooled. **{CHANCE:.2f}** = the discs are not told apart. For a model "
        "that steers μ it is read again with every μ gate closed: does steering send attention to the pointed disc?",
        elem_classes="hint",
    )
    note = gr.Markdown(elem_id="ts-note")
    with gr.Row(equal_height=False):
        with gr.Column(scale=1, min_width=200):
            index = gr.Number(0, precision=0, minimum=0, label="validation image", elem_id="ts-index")
        with gr.Column(scale=4):
            figure = gr.Image(label="The scene, its discs outlined, and its target share per layer", type="filepath",
                              format="png", interactive=False, elem_id="ts-figure", show_label=False,
                              buttons=["download", "fullscreen"])  # fmt: skip
    with gr.Accordion("The mean over the first N validation images, with 95% intervals", open=True):
        with gr.Row():
            n = gr.Slider(10, MAX_EVAL_IMAGES, value=shares.DEFAULT_IMAGES, step=10, label="validation images (N)",
                          elem_id="ts-n", scale=3)  # fmt: skip
            read = gr.Button("Read the target share", elem_id="ts-read", scale=1)
            stop = gr.Button("Stop", size="sm", elem_id="ts-stop", scale=0, min_width=70)
        mean_note = gr.Markdown(elem_id="ts-mean-note")
        plot = gr.Plot(show_label=False, label="Target share per layer", elem_id="ts-plot")
        table = gr.Dataframe(headers=HEADERS, label="Target share per layer", interactive=False, elem_id="ts-table",
                             visible=False)  # fmt: skip
    ui = TargetShareUI(note=note, index=index, figure=figure, n=n, read=read, stop=stop, mean_note=mean_note,
                       plot=plot, table=table, shown=gr.State(None))  # fmt: skip

    def measured(c: str | None, k: float, request: gr.Request) -> Iterator[Updates]:
        yield from on_read(ctx, ui, c, k, request)  # a plain function: Gradio finds its Request

    running = read.click(queues.busy_note, None, [mean_note], queue=False, show_progress="hidden",
                         api_visibility="private").then(
        measured, [shared["checkpoint"], n], ui.mean_outputs, **queues.heavy(api_visibility="private")
    )  # fmt: skip
    stop.click(lambda: "Stopped.", None, [mean_note], cancels=[running], api_visibility="private")
    return ui


def session_part(ui: TargetShareUI) -> SessionPart:
    """The Target share tab's section: the validation image shown and the mean's N (written only when either differs
    from its default). A restored value outside its range is left out and named in the restore's notes; the tab
    shows the image when it renders the restored checkpoint."""

    def save(values: dict[str, Any]) -> dict[str, Any]:
        index, n = int(values.get("index") or 0), int(values.get("images") or shares.DEFAULT_IMAGES)
        return {"index": index, "images": n} if (index, n) != (0, shares.DEFAULT_IMAGES) else {}

    def restore(section: dict[str, Any], restoring: Restoring) -> Updates:
        out: Updates = {}
        index, n = section.get("index", 0), section.get("images", shares.DEFAULT_IMAGES)
        if isinstance(index, int) and not isinstance(index, bool) and index >= 0:
            out[ui.index] = index
        else:
            restoring.notes.append(f"target share image {index!r}: not a validation image's index")
        if isinstance(n, int) and not isinstance(n, bool) and 10 <= n <= MAX_EVAL_IMAGES:
            out[ui.n] = n
        else:
            restoring.notes.append(f"target share images {n!r}: use 10 to {MAX_EVAL_IMAGES}")
        return out

    return SessionPart("target_share", {"index": ui.index, "images": ui.n}, restore, [ui.index, ui.n], save)
