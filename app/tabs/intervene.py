"""The Intervene tab: build an edit list, see what it changes on the picture and on the validation set (with a
noise floor), and find the heads that matter (head importance; a click on a cell adds that edit).

Every number comes from :mod:`ssog_core.interventions` through :mod:`app.interventions`; the edits apply to this
request only (the shared model is never changed). The edit form is built from the registry of ops
(:data:`~ssog_core.interventions.edit.EDITS`): one field per declared field name (the registry keeps one meaning
per name), of which the chosen op's are shown, with that op's help; a new op shows up here by being defined.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import MISSING, dataclass, fields
from functools import partial
from typing import Any

import gradio as gr
import numpy as np
from gradio.blocks import Block

from app import interventions, plots, queues
from app import pictures as chooser
from app.common import Updates, error_text, stoppable, warn
from app.session_protocol import Restoring, SessionPart
from app.state import AppContext, AppError, LoadedModel, default_twin
from ssog_core.analysis.head_as_field import FIT_ATOMS
from ssog_core.analysis.measures import query_rows
from ssog_core.analysis.session import NO_TWIN
from ssog_core.field import TAPS, centre_query
from ssog_core.interventions.edit import EDITS, Param, check_edits, describe, ops_for, parse_edits
from ssog_core.interventions.effects import ValidationEffect
from ssog_core.interventions.importance import HeadImportance
from ssog_core.interventions.ops import TAP_NAMES, AblateHead, CloseGate, ReplaceWithField
from ssog_core.interventions.result import reference
from ssog_core.interventions.validation import (
    CHOSEN_BUNDLED,
    DEFAULT_EVAL_IMAGES,
    FOLDER,
    LABEL,
    MAX_EVAL_IMAGES,
    TERMS,
    Pictures,
    picture_count,
)

CURRENT = "(the current picture)"
MODES = AblateHead.params()["mode"].choices  # the head-importance sweep's ablation modes
MAX_HEADS_SHOWN = 64  # the head-importance table's column titles (Gradio keeps as many as a table has columns)
FORM_ROW = 4  # form fields per row
LEFT_OUT = -1  # an optional whole-number field at −1 is left out of the edit
EVALUATION_TITLE = "The validation set, with a noise floor"
SWEEP_TITLE = "Head importance: each head ablated or replaced by its fit, each layer's gates closed"


def form_fields() -> dict[str, Param]:
    """Every field name a form can hold, across the ops: one component each (a name means one kind of value in
    every op that declares it, so any op's declaration builds it)."""
    return {name: p for cls in EDITS.values() for name, p in cls.params().items() if p.form}


def op_fields(op: str) -> dict[str, Param]:
    """The form fields of ``op``, as it declares them (none for an unknown op)."""
    return {name: p for name, p in EDITS[op].params().items() if p.form} if op in EDITS else {}


def _start(op: str, name: str) -> Any:
    """The form's starting value of field ``name`` for ``op``: its declared start, else its default (−1 for an
    optional whole number: left out)."""
    p, default = EDITS[op].params()[name], {f.name: f.default for f in fields(EDITS[op])}[name]
    if p.start is not None:
        return p.start
    if default is None and p.kind == "int" and p.optional:
        return LEFT_OUT
    return None if default is MISSING else default


def _settings(p: Param) -> dict[str, Any]:
    """A field's settings as an op declares it: its help, and a number's lowest value (−1 when it may be left
    out)."""
    out: dict[str, Any] = {"info": p.help + (" (−1 leaves it out)" if p.kind == "int" and p.optional else "")}
    if p.kind in ("int", "float"):
        out["minimum"] = LEFT_OUT if p.optional else p.low
    return out


def _component(op: str, name: str) -> Block:
    """Field ``name`` of the form, shown as ``op`` (the op chosen at the start) declares it; hidden, with the
    first declaring op's settings, when ``op`` does not take it."""
    owner = op if name in op_fields(op) else next(o for o in EDITS if name in op_fields(o))
    p, start = EDITS[owner].params()[name], _start(owner, name)
    common = dict(label=name, elem_id=f"iv-{name}", visible=owner == op, **_settings(p))
    low = common.pop("minimum", None)
    if p.kind == "choice":
        return gr.Dropdown(list(p.choices), value=start, **common)
    if p.kind == "image":
        return gr.Dropdown([CURRENT], value=CURRENT, **common)
    if p.kind == "bool":
        return gr.Checkbox(bool(start), **common)
    if p.kind == "text":
        return gr.Textbox(start or "", **common)
    return gr.Number(start or 0, precision=0 if p.kind == "int" else None, minimum=low, maximum=p.high, **common)


def on_op(ui: InterveneUI, op: str, *values: Any) -> Updates:
    """Show the chosen op's fields only, each with that op's help and lowest value; a value below it (a head left
    out, for an op that needs one) goes back to the op's start. ``values`` follow ``ui.fields``."""
    mine = op_fields(op)
    out: Updates = {}
    for (name, c), v in zip(ui.fields.items(), values, strict=True):
        if name not in mine:
            out[c] = gr.update(visible=False)
            continue
        settings = _settings(mine[name])
        low = settings.get("minimum")
        fits = low is None or (isinstance(v, int | float) and v >= low)
        out[c] = gr.update(visible=True, **settings, **({} if fits else {"value": _start(op, name)}))
    return out


@dataclass(frozen=True)
class InterveneUI:
    """The tab's components, by name."""

    note: gr.Markdown
    edits: gr.State  # the edit list, as JSON dicts
    listing: gr.Markdown
    op: gr.Dropdown
    fields: dict[str, Block]  # the form, one component per declared field name (form_fields)
    index: gr.Number
    status: gr.Markdown
    prediction: gr.Markdown
    maps: list[gr.Plot]  # accumulated export map unedited, edited, difference
    attention: gr.Plot
    n: gr.Slider
    evaluation: gr.Accordion  # titled after what the model is measured on
    validation: gr.Markdown
    per_class: gr.Dataframe
    sweep_mode: gr.Dropdown
    heads_plot: gr.Plot
    gates_plot: gr.Plot
    heads_table: gr.Dataframe
    fits_table: gr.Dataframe  # each head's attention replaced by its fit
    gates_table: gr.Dataframe
    tables: gr.Column  # the tables, shown once there is a sweep
    sweep_note: gr.Markdown
    sweep: gr.Accordion  # titled after what the model has (gates or none)
    shown: gr.State  # the checkpoint whose edits and results are on show: another one resets them
    pictures: gr.Dropdown  # the page's pictures chooser (app.pictures): what N images are

    @property
    def results(self) -> list[Block]:
        """Everything made for one model: emptied when another is picked."""
        return [self.edits, self.listing, self.status, self.prediction, *self.maps, self.attention, self.validation,
                self.per_class, self.heads_plot, self.gates_plot, self.heads_table, self.fits_table, self.gates_table,
                self.tables, self.sweep_note]  # fmt: skip

    @property
    def outputs(self) -> list[Block]:
        """What :func:`render` (a new checkpoint, or other pictures) changes."""
        return list(dict.fromkeys([self.note, self.op, self.n, self.evaluation, self.sweep, self.shown,
                                   *self.image_fields, *self.results]))  # fmt: skip

    @property
    def image_fields(self) -> list[Block]:
        return [c for name, c in self.fields.items() if form_fields()[name].kind == "image"]


def render(
    ctx: AppContext, ui: InterveneUI, ckpt: str | None, op: str | None = None, shown: str | None = None,
    pictures: str | None = None,
) -> Updates:  # fmt: skip
    """The note and the ops a checkpoint takes (:func:`~ssog_core.interventions.edit.ops_for`: a dot-product model
    ablation, output patching and replacement by a field; a model without gates no gate ops, plot or table), and
    what its N images are. Another checkpoint than ``shown`` empties the edit list and every result (they were the
    previous model's). The op chosen stays when the model takes it: this answer can land after the person picked
    another op, and must not put the first one back."""
    if not ckpt:
        return {ui.note: "Pick a checkpoint (top of the page) to edit it."}
    try:
        loaded = ctx.model(ckpt)
        chosen = chooser.chosen(ctx, pictures)
    except Exception as e:
        return {ui.note: warn(error_text(e))}
    ops = ops_for(loaded.model)
    gates = "close_gate" in ops
    depth, heads = len(loaded.model.blocks), loaded.model.blocks[0].attn.num_heads
    note = f"**{ckpt}** ({loaded.kind}, {depth} layers × {heads} heads). Edits apply in order, to this request only. "
    if not loaded.is_ssog:
        takes = " and ".join(EDITS[o].dot_product_words() for o in ops)
        note += f"A {loaded.kind} model has no field: it takes {takes}."
    elif not gates:
        note += "Its field is fixed (no steering gates): every op but the gate ops."
    sources = [CURRENT, *ctx.bundled_images()]
    reset = ckpt != shown
    cleared = {"value": None} if reset else {}
    return {
        **(emptied(ui) if reset else {}),
        ui.note: note,
        ui.op: gr.update(choices=ops) if op in ops else gr.update(choices=ops, value=ops[0]),
        ui.gates_plot: gr.update(visible=gates, **cleared),
        ui.gates_table: gr.update(visible=gates, **cleared),
        ui.sweep: gr.update(label=SWEEP_TITLE if gates else SWEEP_TITLE.split(", each layer")[0]),
        ui.shown: ckpt,
        **measured_on(ctx, ui, loaded, chosen),
        **{c: gr.update(choices=sources) for c in ui.image_fields},
    }


def emptied(ui: InterveneUI) -> Updates:
    """No edits and no results: what the tab shows for a model just picked."""
    empty: Updates = {ui.edits: [], ui.listing: listing([]), ui.status: "", ui.prediction: "", ui.attention: None,
                      ui.validation: "", ui.per_class: None, ui.heads_plot: None, ui.gates_plot: None,
                      ui.heads_table: None, ui.fits_table: None, ui.gates_table: None,
                      ui.tables: gr.update(visible=False), ui.sweep_note: ""}  # fmt: skip
    return {**empty, **{m: None for m in ui.maps}}


def measured_on(ctx: AppContext, ui: InterveneUI, loaded: LoadedModel, pictures: Pictures) -> Updates:
    """The image-count slider and its section's title for what ``loaded`` is measured on (the page's pictures
    chooser): its validation set (up to :data:`MAX_EVAL_IMAGES`), or pictures (all of them, the most there are),
    against the unedited model's predictions."""
    if pictures.reference(loaded.meta) == LABEL:
        return {
            ui.n: gr.update(minimum=10, maximum=MAX_EVAL_IMAGES, step=10, value=DEFAULT_EVAL_IMAGES,
                            label="validation images (N)"),
            ui.evaluation: gr.update(label=EVALUATION_TITLE),
        }  # fmt: skip
    folder = pictures.folder or pictures.bundled
    count = picture_count(folder)
    source = pictures.eval_source(loaded.meta)
    what = {FOLDER: f"pictures of {folder.name}", CHOSEN_BUNDLED: "bundled pictures"}.get(source, "bundled pictures")
    why = "" if source in (FOLDER, CHOSEN_BUNDLED) else ": this model records no validation set, so its edits are"
    why = why or ", as chosen at the top of the page: edits are"
    return {
        ui.n: gr.update(minimum=1, maximum=max(count, 1), step=1, value=max(count, 1),
                        label=f"{what} (N, of {count})"),
        ui.evaluation: gr.update(label=f"The {what}, with a noise floor{why} measured against the unedited model's "
                                 "predictions"),
    }  # fmt: skip


def listing(edits: list[dict]) -> str:
    if not edits:
        return "_No edits yet: add one below, or click a cell of the head-importance tables._"
    return "\n".join(f"{i + 1}. {line}" for i, line in enumerate(describe(parse_edits(edits))))


def _checked(ctx: AppContext, ckpt: str | None, edits: list[dict]) -> list[dict]:
    """``edits`` if the checkpoint can take them (patch sources are checked when they are applied)."""
    if not ckpt:
        raise AppError("pick a checkpoint first")
    parsed = parse_edits(edits)
    names = {name: None for e in parsed for name in e.sources()}
    check_edits(ctx.model(ckpt).model, parsed, names, has_means=True, has_attention=True)
    return [e.to_dict() for e in parsed]


def _with(ctx: AppContext, ui: InterveneUI, ckpt: str | None, edits: list[dict]) -> Updates:
    try:
        edits = _checked(ctx, ckpt, edits)
        return {ui.edits: edits, ui.listing: listing(edits), ui.status: ""}
    except Exception as e:
        return {ui.status: warn(error_text(e))}


def on_add(
    ctx: AppContext, ui: InterveneUI, ckpt: str | None, sha: str | None, edits: list[dict], op: str, *values: Any
) -> Updates:
    """Append the edit the form describes: ``values`` follow ``ui.fields``; fields the op does not take, and an
    optional one at −1, are left out."""
    given = dict(zip(ui.fields, values, strict=True))
    edit: dict[str, Any] = {"op": op}
    for name, p in EDITS[op].params().items() if op in EDITS else ():
        if not p.form or name not in given:
            continue
        v = given[name]
        if p.kind == "int":
            if p.optional and (v is None or v < 0):
                continue
            v = int(v or 0)
        elif p.kind == "image":
            v = sha if v == CURRENT else v
        edit[name] = v
    return _with(ctx, ui, ckpt, [*(edits or []), edit])


def on_move(ctx: AppContext, ui: InterveneUI, ckpt: str | None, edits: list[dict], index: float, by: int) -> Updates:
    """Remove edit ``index`` (1-based, ``by`` = 0) or move it up (−1) or down (+1)."""
    edits = list(edits or [])
    i = int(index or 0) - 1
    if not 0 <= i < len(edits):
        return {ui.status: warn(f"there is no edit {i + 1} (the list has {len(edits)})")}
    item = edits.pop(i)
    if by:
        edits.insert(min(max(i + by, 0), len(edits)), item)
    return _with(ctx, ui, ckpt, edits)


def top_table(names: list[str], unedited: np.ndarray, edited: np.ndarray) -> str:
    """The five most likely classes unedited, with their edited probability, and the edited winner below them
    when it is not among them."""
    order = [int(i) for i in np.argsort(-unedited)[:5]]
    top = int(np.argmax(edited))
    rows = ["| class | unedited | edited |", "|---|---:|---:|"]
    rows += [f"| {names[i]} | {unedited[i]:.4f} | {edited[i]:.4f} |" for i in [*order, *([top] * (top not in order))]]
    return "\n".join(rows) + f"\n\nEdited prediction: **{names[top]}** ({edited[top]:.4f})."


def on_prepare(
    ctx: AppContext, ui: InterveneUI, ckpt: str | None, sha: str | None, edits: list[dict], pictures: str | None = None
) -> Iterator[Updates]:
    """What *Apply* must make once per model and pictures before its first image (head means for ``dataset_mean``
    ablation, mean attention for ``replace_with_field``: a pass over hundreds of images), with its progress and a
    time left measured on the batches done. A separate step, so the one-image step's own time estimate (Gradio's, from
    its past runs) holds."""
    try:
        if not ckpt or not sha:
            return
        loaded = ctx.model(ckpt)
        asked = interventions.request(ctx, sha, edits or [], 0, chooser.chosen(ctx, pictures))
        images = interventions.preparing(ctx, loaded, asked)
        if not images:
            return
        meter = interventions.Meter(images)
        made = " and ".join(interventions.PREPARING[w] for w in interventions.core.preparing(
            asked.parsed(), interventions.memo(ctx, loaded), loaded.meta, asked.pictures))  # fmt: skip
        for _ in stoppable(lambda stop: interventions.prepare(ctx, loaded, asked, meter, stop)):
            yield {ui.status: f"Measuring {made} over {images} images (once for this model and pictures): "
                   f"{meter.note()}…"}  # fmt: skip
        yield {ui.status: ""}
    except Exception as e:
        yield {ui.status: warn(error_text(e))}


def on_apply(
    ctx: AppContext, ui: InterveneUI, ckpt: str | None, sha: str | None, edits: list[dict], pictures: str | None = None
) -> Updates:
    """The one-image panels: probabilities, Δ log p, accumulated export maps and the first edited layer."""
    try:
        if not ckpt or not sha:
            raise AppError("pick a checkpoint and an image (top of the page)")
        loaded = ctx.model(ckpt)
        asked = interventions.request(ctx, sha, edits or [], 0, chooser.chosen(ctx, pictures))
        eff = interventions.run(ctx, loaded, asked).image
        names = loaded.class_names
        text = top_table(names, eff.probs_unedited.numpy(), eff.probs_edited.numpy())
        text += f" Δ log p of the unedited prediction: **{eff.dlogp:+.4f}**."
        acc0, acc1 = eff.accumulated_unedited.numpy(), eff.accumulated_edited.numpy()
        out: Updates = {
            ui.prediction: text,
            ui.maps[0]: plots.map_plot(acc0, "accumulated export, unedited", "net"),
            ui.maps[1]: plots.map_plot(acc1, "accumulated export, edited", "net"),
            ui.maps[2]: plots.map_plot(acc1 - acc0, "edited − unedited", "Δ net"),
            ui.status: "",
        }
        if eff.layer is not None:
            grid = tuple(eff.accumulated_unedited.shape)
            q = centre_query(grid)
            rows = [query_rows(a, q, grid).numpy() for a in (eff.attention_unedited, eff.attention_edited)]
            out[ui.attention] = plots.edited_attention_plot(*rows, sorted(eff.removed), eff.layer)
        return out
    except Exception as e:
        return {ui.status: warn(error_text(e))}


def validation_text(v: ValidationEffect) -> str:
    a, lp = v.accuracy, v.logp_true
    acc, logp, images = TERMS[reference(v)]
    noise = lambda c: " — **within noise**" if c.within_noise else ""  # noqa: E731
    return (
        f"On the first **{v.n}** {images}: {acc} **{a.unedited:.4f} → {a.edited:.4f}** (change "
        f"{a.change:+.4f}, 95% interval [{a.ci95[0]:+.4f}, {a.ci95[1]:+.4f}]{noise(a)}; McNemar exact p = "
        f"{v.mcnemar_p:.3g}, mid-p {v.mcnemar_mid_p:.3g}; {v.lost} images lost, {v.gained} gained).  \n"
        f"Mean {logp} change **{lp.change:+.4f}** [{lp.ci95[0]:+.4f}, {lp.ci95[1]:+.4f}]{noise(lp)}.  \n"
        f"Per class (by {reference(v)}) below: {acc} unedited and edited, and the change in {logp}."
    )


def class_rows(v: ValidationEffect) -> list[list[Any]]:
    return [
        [r["class"], r["n"], round(r["accuracy"]["unedited"], 4), round(r["accuracy"]["edited"], 4),
         round(r["logp_true"]["change"], 4), f"[{r['logp_true']['ci95'][0]:+.4f}, {r['logp_true']['ci95'][1]:+.4f}]",
         "within noise" if r["within_noise"] else ""]
        for r in v.per_class
    ]  # fmt: skip


def on_evaluate(
    ctx: AppContext, ui: InterveneUI, ckpt: str | None, edits: list[dict], n: float, request: gr.Request | None = None,
    pictures: str | None = None,
) -> Iterator[Updates]:  # fmt: skip
    """The edits on N images of the chosen pictures (the page's chooser; by default the validation set), as a
    generator so a closed page stops the work between batches and frees the user's heavy slot (the first value is
    yielded before the slot is taken: a cancel there holds nothing)."""
    try:
        if not ckpt:
            raise AppError("pick a checkpoint first")
        loaded, chosen = ctx.model(ckpt), chooser.chosen(ctx, pictures)
        asked = interventions.request(ctx, None, parse_edits(edits or []), int(n), chosen)
        images = TERMS[chosen.reference(loaded.meta)][2]
        yield {ui.validation: f"Evaluating the edits on {int(n)} {images}…"}
        for result, progress in queues.watched(
            request, lambda stop, watch: interventions.run(ctx, loaded, asked, stop, watch=watch)
        ):
            if result is None:  # a value now and then is also when Gradio can stop it
                yield {ui.validation: f"Evaluating the edits: {progress}…"}
                continue
            v = result.validation
            yield {ui.validation: validation_text(v), ui.per_class: class_rows(v), ui.status: ""}
    except Exception as e:
        yield {ui.validation: warn(error_text(e))}


def _cell(c: Any) -> str:
    return "–" if c is None else f"{c.logp_drop:+.3f} [{c.ci95[0]:+.3f}, {c.ci95[1]:+.3f}]" + (" ·" * c.within_noise)


def importance_updates(ctx: AppContext, ui: InterveneUI, loaded: LoadedModel, imp: HeadImportance) -> Updates:
    heads = len(imp.ablate[0])
    drops = np.array([[c.logp_drop for c in row] for row in imp.ablate])
    noise = np.array([[c.within_noise for c in row] for row in imp.ablate])
    out: Updates = {
        ui.heads_plot: plots.importance_plot(drops, noise, f"each head ablated ({imp.mode})",
                                             [f"head {h}" for h in range(heads)]),
        ui.heads_table: [[f"layer {i}", *(_cell(c) for c in row)] for i, row in enumerate(imp.ablate)],
        ui.fits_table: [[f"layer {i}", *(_cell(c) for c in row)] for i, row in enumerate(imp.replace)],
        ui.tables: gr.update(visible=True),
    }  # fmt: skip
    acc, logp, images = TERMS[imp.reference]
    note = f"{imp.n} {images}, unedited {acc} {imp.unedited_accuracy:.4f}. Cells: {logp} drop [95% interval]"
    note += f"; · = within noise. Replaced by its fit: the head's attention is its {imp.atoms}-atom fit over"
    note += " displacement (how much the head needs content to score). Click a cell of a table to add that edit."
    if imp.close_gate:
        taps = list(imp.close_gate)
        cells = [[imp.close_gate[t][i] for t in taps] for i in range(len(imp.ablate))]
        g = np.array([[0.0 if c is None else c.logp_drop for c in row] for row in cells])
        gn = np.array([[c is None or c.within_noise for c in row] for row in cells])
        out[ui.gates_plot] = plots.importance_plot(
            g, gn, "each layer's gate closed", [f"{TAP_NAMES[t]} gate" for t in taps]
        )
        out[ui.gates_table] = [[f"layer {i}", *(_cell(c) for c in row)] for i, row in enumerate(cells)]
        twin = default_twin(ctx, loaded.name, "ssog_fixed")
        if twin != NO_TWIN:
            fixed = interventions.accuracy(ctx, ctx.model(twin), imp.n)
            note += (
                f"  \nClosing gates after training measures reliance on steering, not what a model trained without it "
                f"does: the matched fixed-field model **{twin}** reaches **{float(fixed):.4f}** on the same images."
            )
    out[ui.sweep_note] = note
    return out


def on_sweep(
    ctx: AppContext, ui: InterveneUI, ckpt: str | None, n: float, mode: str, request: gr.Request | None = None,
    pictures: str | None = None,
) -> Iterator[Updates]:  # fmt: skip
    """Head importance on N of the chosen pictures, as a generator so a Stop press (or a closed page) stops the
    sweep between batches."""
    try:
        if not ckpt:
            raise AppError("pick a checkpoint first")
        loaded, chosen = ctx.model(ckpt), chooser.chosen(ctx, pictures)
        yield {ui.sweep_note: f"Sweeping every head and gate of **{ckpt}** on {int(n)} images…"}
        for imp, progress in queues.watched(
            request, lambda stop, watch: interventions.importance(ctx, loaded, int(n), mode, stop, watch, chosen)
        ):
            if imp is None:
                yield {ui.sweep_note: f"Sweeping every head and gate of **{ckpt}**: {progress}…"}
            else:
                yield importance_updates(ctx, ui, loaded, imp)
    except Exception as e:
        yield {ui.sweep_note: warn(error_text(e))}


def on_cell(
    ctx: AppContext, ui: InterveneUI, ckpt: str | None, edits: list[dict], mode: str, gates: bool, index: Any
) -> Updates:
    """A click on a head-importance cell adds that edit (ablate that head, or close that layer's gate)."""
    row, col = (int(v) for v in index)
    if col == 0:  # the layer's name: nothing to add (an empty dict would be taken as a value by Gradio)
        return {ui.status: gr.skip()}
    edit = CloseGate(row, TAPS[col - 1]) if gates else AblateHead(row, col - 1, mode)
    return _with(ctx, ui, ckpt, [*(edits or []), edit.to_dict()])


def on_fit_cell(ctx: AppContext, ui: InterveneUI, ckpt: str | None, edits: list[dict], index: Any) -> Updates:
    """A click on a cell of the replaced-by-its-fit table adds that edit."""
    row, col = (int(v) for v in index)
    if col == 0:
        return {ui.status: gr.skip()}
    edit = ReplaceWithField(row, col - 1, "fit", FIT_ATOMS)
    return _with(ctx, ui, ckpt, [*(edits or []), edit.to_dict()])


def build(ctx: AppContext, shared: dict[str, Any]) -> InterveneUI:
    hidden = dict(api_visibility="private")
    note = gr.Markdown(elem_id="iv-note")
    edits = gr.State([])
    with gr.Row(equal_height=False):
        with gr.Column(scale=2, min_width=340):
            listing_md = gr.Markdown(listing([]), elem_id="iv-list")
            op = gr.Dropdown(list(EDITS), value=next(iter(EDITS)), label="op", elem_id="iv-op")
            names, fields = list(form_fields()), {}
            for start in range(0, len(names), FORM_ROW):
                with gr.Row(equal_height=True):
                    fields |= {name: _component(op.value, name) for name in names[start : start + FORM_ROW]}
            add = gr.Button("Add edit", variant="primary", size="sm", elem_id="iv-add")
            with gr.Row():
                index = gr.Number(1, precision=0, minimum=1, label="edit #", elem_id="iv-index", scale=1)
                up = gr.Button("↑", size="sm", scale=1)
                down = gr.Button("↓", size="sm", scale=1)
                remove = gr.Button("Remove", size="sm", scale=1)
                clear = gr.Button("Clear", size="sm", scale=1)
            status = gr.Markdown(elem_id="iv-status")
            apply = gr.Button("Apply to the picture", variant="primary", elem_id="iv-apply")
            prediction = gr.Markdown(elem_id="iv-pred")
        with gr.Column(scale=3):
            with gr.Row():
                maps = [gr.Plot(show_label=False, elem_id=f"iv-map{i}") for i in range(3)]
            attention = gr.Plot(show_label=False, elem_id="iv-attn")
    with gr.Accordion(EVALUATION_TITLE, open=True) as evaluation:
        with gr.Row():
            n = gr.Slider(10, MAX_EVAL_IMAGES, value=DEFAULT_EVAL_IMAGES, step=10, label="validation images (N)",
                          elem_id="iv-n", scale=3)  # fmt: skip
            evaluate = gr.Button("Evaluate the edits", elem_id="iv-eval", scale=1)
        validation = gr.Markdown(elem_id="iv-val")
        per_class = gr.Dataframe(
            headers=["class", "n", "unedited", "edited", "Δ log p", "95% interval", ""],
            interactive=False, elem_id="iv-classes",
        )  # fmt: skip
    with gr.Accordion(SWEEP_TITLE, open=True) as sweep_section:
        with gr.Row():
            sweep_mode = gr.Dropdown(list(MODES), value=MODES[0], label="ablation", elem_id="iv-smode")
            sweep = gr.Button("Run head importance", elem_id="iv-sweep")
            stop = gr.Button("Stop", variant="stop", elem_id="iv-stop")
        sweep_note = gr.Markdown(elem_id="iv-snote")
        with gr.Row():
            heads_plot = gr.Plot(show_label=False, elem_id="iv-heads")
            gates_plot = gr.Plot(show_label=False, elem_id="iv-gates")
        with gr.Column(visible=False) as tables:  # shown with the first sweep: empty tables have no columns yet
            heads_table = gr.Dataframe(
                headers=["layer", *(f"head {h}" for h in range(MAX_HEADS_SHOWN))],  # cut to the model's heads
                interactive=False, elem_id="iv-heads-table", label="log p drop per head",
            )  # fmt: skip
            fits_table = gr.Dataframe(
                headers=["layer", *(f"head {h}" for h in range(MAX_HEADS_SHOWN))],
                interactive=False, elem_id="iv-fits-table", label="log p drop per head, replaced by its fit",
            )  # fmt: skip
            gates_table = gr.Dataframe(
                headers=["layer", *(f"{TAP_NAMES[t]} gate" for t in TAPS)],
                interactive=False, elem_id="iv-gates-table", label="log p drop per gate",
            )  # fmt: skip
    ui = InterveneUI(note=note, edits=edits, listing=listing_md, op=op, fields=fields, index=index, status=status,
                     prediction=prediction, maps=maps, attention=attention, n=n, evaluation=evaluation,
                     validation=validation,
                     per_class=per_class, sweep_mode=sweep_mode, heads_plot=heads_plot, gates_plot=gates_plot,
                     heads_table=heads_table, fits_table=fits_table, gates_table=gates_table, tables=tables,
                     sweep_note=sweep_note, sweep=sweep_section, shown=gr.State(None),
                     pictures=shared["pictures"])  # fmt: skip
    ckpt, sha, pictures = shared["checkpoint"], shared["image_sha"], shared["pictures"]
    list_out = [edits, listing_md, status]
    builder = [ckpt, sha, edits, op, *fields.values()]
    add.click(partial(on_add, ctx, ui), builder, list_out, **hidden)
    op.change(
        partial(on_op, ui), [op, *fields.values()], list(fields.values()), queue=False, show_progress="hidden", **hidden
    )
    for button, by in ((remove, 0), (up, -1), (down, 1)):
        button.click(partial(on_move, ctx, ui, by=by), [ckpt, edits, index], list_out, **hidden)
    clear.click(lambda: {edits: [], listing_md: listing([]), status: ""}, None, list_out, **hidden)
    one_image = [prediction, *maps, attention, status]
    # what a first use needs (hundreds of images) has its own step, progress and estimate: Gradio's estimate of the
    # one-image step, from its past runs, then holds
    apply.click(partial(on_prepare, ctx, ui), [ckpt, sha, edits, pictures], [status], show_progress="hidden",
                **queues.light(**hidden)).then(
        partial(on_apply, ctx, ui), [ckpt, sha, edits, pictures], one_image, **queues.light(**hidden))  # fmt: skip
    heavy = queues.heavy(**hidden)
    waiting = dict(queue=False, show_progress="hidden", **hidden)  # at once, before the job joins the queue

    def evaluated(c: str | None, e: list[dict], k: float, p: str | None, request: gr.Request) -> Iterator[Updates]:
        yield from on_evaluate(ctx, ui, c, e, k, request, p)  # plain functions: Gradio finds their Request

    def swept(c: str | None, k: float, m: str, p: str | None, request: gr.Request) -> Iterator[Updates]:
        yield from on_sweep(ctx, ui, c, k, m, request, p)

    evaluating = evaluate.click(queues.busy_note, None, [validation], **waiting).then(
        evaluated, [ckpt, edits, n, pictures], [validation, per_class, status], **heavy
    )
    sweep_outputs = [heads_plot, gates_plot, heads_table, fits_table, gates_table, tables, sweep_note]
    running = sweep.click(queues.busy_note, None, [sweep_note], **waiting).then(
        swept, [ckpt, n, sweep_mode, pictures], sweep_outputs, **heavy
    )
    stop.click(lambda: {sweep_note: "Stopped."}, None, [sweep_note], cancels=[running, evaluating], **hidden)

    def head_cell(c: str | None, e: list[dict], m: str, evt: gr.SelectData) -> Updates:
        return on_cell(ctx, ui, c, e, m, False, evt.index)  # a plain function: Gradio finds its SelectData

    def gate_cell(c: str | None, e: list[dict], m: str, evt: gr.SelectData) -> Updates:
        return on_cell(ctx, ui, c, e, m, True, evt.index)

    def fit_cell(c: str | None, e: list[dict], evt: gr.SelectData) -> Updates:
        return on_fit_cell(ctx, ui, c, e, evt.index)

    heads_table.select(head_cell, [ckpt, edits, sweep_mode], list_out, **hidden)
    fits_table.select(fit_cell, [ckpt, edits], list_out, **hidden)
    gates_table.select(gate_cell, [ckpt, edits, sweep_mode], list_out, **hidden)
    return ui


def session_part(ui: InterveneUI) -> SessionPart:
    """The Intervene tab's section: its edit list as JSON (written only when there are edits). A restored list is
    checked edit by edit; an unusable one is left out and named in the restore's notes."""

    def save(values: dict[str, Any]) -> dict[str, Any]:
        edits = list(values.get("edits") or [])
        return {"edits": edits} if edits else {}

    def restore(section: dict[str, Any], restoring: Restoring) -> Updates:
        try:
            edits = [e.to_dict() for e in parse_edits(list(section.get("edits") or []))]
        except ValueError as e:
            restoring.notes.append(f"intervene edits: {e}")
            edits = []
        # the edits are the restored checkpoint's: the tab keeps them when it renders it
        return {ui.edits: edits, ui.listing: listing(edits), ui.shown: restoring.checkpoint}

    return SessionPart("intervene", {"edits": ui.edits}, restore, [ui.edits, ui.listing, ui.shown], save)
