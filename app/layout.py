"""The page: the top row (checkpoint and image pickers), the tabs, and the events that link them.

Every handler returns ``{component: value}`` for the components it changes (Gradio leaves the other outputs of the
event as they are), with components named by the tabs' UI dataclasses and :class:`Page`, so adding an output never
shifts the others. Tabs render lazily: a change of checkpoint or image re-renders only the tab being looked at;
the others catch up when they are opened (:func:`lazy`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import gradio as gr
from PIL import Image

from app import pictures as chooser
from app import queues
from app import session_protocol as session
from app.api import register_api
from app.canvas import underlay_url
from app.common import Updates, error_text, warn, write_downloads
from app.state import AppContext, AppError, StoredImage, default_image, default_twin
from app.tabs import compare, export, geometry, intervene, playground, scaling, steering, target_share, training
from app.tabs import session as session_tab
from ssog_core.analysis.session import NO_TWIN, dumps
from ssog_core.checkpoint.standard import HUB_PREFIX
from ssog_core.interventions.ops import ScaleGate
from ssog_core.viz import figures as viz

NARROW_PX = 700  # a screen narrower than this gets the export figure one layer at a time

FONTS = ["ui-sans-serif", "system-ui", "-apple-system", "Segoe UI", "Roboto", "sans-serif"]  # no web fonts
MONO = ["ui-monospace", "SFMono-Regular", "Menlo", "Consolas", "monospace"]
CSS = """
.hint { font-size: 13px; color: var(--body-text-color-subdued); }
#geo-card table { width: 100%; }
#geo-card td:first-child { white-space: nowrap; }
#geo-card td { overflow-wrap: anywhere; }
#geo-card, #geo-atoms, #pg-readout { max-width: 100%; overflow-x: auto; }  /* wide tables scroll inside */
/* figures start below the image's download / fullscreen buttons, which covered their titles */
#st-steer img, #st-qfig img, #ex-figure img, #cmp-figure img { padding-top: 34px; }
#geo-card code { white-space: pre-wrap; overflow-wrap: anywhere; }
#thumb img { object-fit: contain; }
#status, #status * { overflow-wrap: anywhere; white-space: normal; }  /* a long message wraps, never cut off */
"""
HEADER = (
    "## SSOG Lab\nAttention as a handful of Gaussian atoms over relative position, which content may only "
    "**steer**. Every number is computed by `ssog_core`, the code the models are trained with; models run on "
    "**{device}**."
)
THUMB_HEIGHT = 96  # px of the picked image's thumbnail in the top row

# The first one present opens (README says why): the converged pointer model whose accuracy rests on its steering
# (closing its μ gates costs most of it, and its last layer sends attention to the pointed disc), its matched twins
# one pick away; then a layouts model.
DEMO_CHECKPOINTS = (
    "matched_ssog_mu_pointer14.safetensors",
    "matched_ssog_layouts.safetensors",
    "ssog_layouts.safetensors",
)
# What the checkpoint picker says beside a bundled file's name (checkpoints/MODEL_CARD.md has the numbers), so that
# whoever picks a model knows what it is before reading its answers.
TRIO_MEMBERS = {"ssog": "steered SSOG", "ssog_fixed": "fixed field", "dot": "dot twin"}
POINTER_MEMBERS = {"ssog_mu": "+μδ (steers μ only)", "ssog": "steered SSOG", "ssog_fixed": "fixed field"}
CHECKPOINT_NOTES = {
    **{f"matched_{k}_layouts.safetensors": f"layouts trio, {v}: fully trained" for k, v in TRIO_MEMBERS.items()},
    **{f"matched_{k}_pointer14.safetensors": f"pointer, {v}: 10,000 steps, solved" for k, v in POINTER_MEMBERS.items()},
    "matched_dot_pointer14.safetensors": "pointer, dot twin: 10,000 steps, still on its plateau (about half right)",
}  # fmt: skip


def theme() -> gr.themes.Base:
    return gr.themes.Soft(font=FONTS, font_mono=MONO)


@dataclass(frozen=True)
class Page:
    """Every component of the page by name: the top row, the shared state and each tab's components."""

    checkpoint: gr.Dropdown
    checkpoint_upload: gr.UploadButton
    hub: gr.Textbox  # hf-hub:ORG/NAME from the local Hugging Face cache
    image_pick: gr.Dropdown
    image_upload: gr.UploadButton
    thumb: gr.Image
    status: gr.Markdown
    pictures: gr.Dropdown  # what measurements on many images are made on (app.pictures)
    image_sha: gr.State  # the SHA-256 of the current picture's file: handlers look pictures up by it
    active: gr.State  # the id of the open tab
    tabs: gr.Tabs
    playground: playground.PlaygroundUI
    geometry: geometry.GeometryUI
    steering: steering.SteeringUI
    export: export.ExportUI
    compare: compare.CompareUI
    scaling: scaling.ScalingUI
    training: training.TrainingUI
    intervene: intervene.InterveneUI
    session: session_tab.SessionUI
    target_share: target_share.TargetShareUI

    def session_parts(self, ctx: AppContext) -> list[session.SessionPart]:
        """Each tab's section of a session file (:mod:`app.session_protocol`); a new tab adds its part here."""
        return [
            playground.session_part(ctx, self.playground),
            geometry.session_part(ctx, self.geometry),
            steering.session_part(ctx, self.steering),
            export.session_part(ctx, self.export),
            compare.session_part(ctx, self.compare),
            training.session_part(ctx, self.training),
            intervene.session_part(self.intervene),
            target_share.session_part(self.target_share),
        ]


def default_checkpoint(ctx: AppContext, names: Sequence[str]) -> str | None:
    """The first of :data:`DEMO_CHECKPOINTS` present, else the first SSOG checkpoint, else the first one."""
    for demo in DEMO_CHECKPOINTS:
        if demo in names:
            return demo
    for name in names:
        try:
            if ctx.model(name).is_ssog:
                return name
        except AppError:
            continue
    return names[0] if names else None


def checkpoint_choices(names: Sequence[str], ctx: AppContext | None = None) -> list[tuple[str, str]]:
    """The checkpoint picker's ``(label, name)`` choices: the name, with its note when it has one (a model folder:
    its layout, architecture and size, :meth:`AppContext.checkpoint_label`)."""
    notes = {n: CHECKPOINT_NOTES.get(n) or (ctx.checkpoint_label(n) if ctx else "") for n in names}
    return [(f"{n} ({notes[n]})" if notes[n] else n, n) for n in names]


def folder_status(ctx: AppContext, names: Sequence[str]) -> str:
    if not names:
        return (
            f"⚠️ **No checkpoint found** in `{ctx.checkpoint_dir}`. The head playground works without one; for "
            "geometry, steering and export maps put `.safetensors` checkpoints there (start with "
            "`--checkpoint-dir`) or upload one above."
        )
    return f"{len(names)} checkpoint(s) in `{ctx.checkpoint_dir}`."


def lazy(tab_id: str, render: Callable[..., Updates], last: gr.State) -> Callable[..., Updates]:
    """Wrap a tab's render so it runs only while the tab is open and its inputs changed since last time (kept in
    ``last``, which the event must list among its outputs)."""

    def run(active: str, seen: str | None, *args: Any) -> Updates:
        key = repr(args)
        if active != tab_id or key == seen:
            return gr.skip()
        return {last: key, **render(*args)}

    return run


# ---- the top row ------------------------------------------------------------------------------------------


def checkpoint_updates(ctx: AppContext, page: Page, value: str | None) -> Updates:
    """Choices for every checkpoint picker after the folder or the uploads changed."""
    names = ctx.checkpoint_names()
    twin = default_twin(ctx, value)
    return {
        page.checkpoint: gr.update(choices=checkpoint_choices(names, ctx), value=value),
        page.export.twin: gr.update(choices=[NO_TWIN, *names], value=twin),
        page.compare.a: gr.update(choices=names, value=value),
        page.compare.b: gr.update(choices=names, value=compared_with(names, value, twin)),
    }


def compared_with(names: Sequence[str], ckpt: str | None, twin: str) -> str | None:
    """The second model Compare opens with beside ``ckpt``: its twin, else the first other model (the same one
    only when there is no other)."""
    if twin != NO_TWIN:
        return twin
    return next((n for n in names if n != ckpt), ckpt)


def on_checkpoint_upload(ctx: AppContext, page: Page, files: Any, current: str | None) -> Updates:
    try:
        paths = files if isinstance(files, list) else [files]
        name = ctx.add_upload([str(p) for p in paths if p])
        return {**checkpoint_updates(ctx, page, name), page.status: f"Loaded **{name}**: it is now selected."}
    except Exception as e:
        return {page.status: warn(error_text(e))}


def on_pictures_upload(ctx: AppContext, page: Page, files: Any) -> Updates:
    """Keep uploaded pictures (a folder, a .zip or files) and choose them for every measurement on many images."""
    try:
        name = chooser.add(ctx, [str(p) for p in (files if isinstance(files, list) else [files]) if p])
        count = chooser.count(ctx, name)
        return {page.pictures: gr.update(choices=chooser.choices(ctx), value=name),
                page.status: f"Kept **{count}** pictures as **{name}**: head fields, edits on N images, head "
                "importance and the export maps' validation control are now measured on them."}  # fmt: skip
    except Exception as e:
        return {page.status: warn(error_text(e))}


def on_hub_open(ctx: AppContext, page: Page, text: str | None) -> Updates:
    """Open ``hf-hub:ORG/NAME`` from the local Hugging Face cache and select it; offline, the sentence naming the
    folder it would be in."""
    try:
        name = ctx.open_hub(text or "")
        return {**checkpoint_updates(ctx, page, name), page.status: f"Opened **{name}** from the local Hugging Face "
                f"cache (`{ctx.resolve(name)}`): it is now selected."}  # fmt: skip
    except Exception as e:
        return {page.status: warn(error_text(e))}


def on_checkpoint_change(ctx: AppContext, page: Page, ckpt: str | None) -> Updates:
    """Presets, twin and comparison defaults follow the selected checkpoint."""
    names = ctx.checkpoint_names()
    twin = default_twin(ctx, ckpt)
    return {
        **playground.on_checkpoint(ctx, page.playground, ckpt),
        page.export.twin: gr.update(choices=[NO_TWIN, *names], value=twin),
        page.compare.a: gr.update(choices=names, value=ckpt),
        page.compare.b: gr.update(choices=names, value=compared_with(names, ckpt, twin)),
    }


def thumbnail(stored: StoredImage) -> Image.Image:
    thumb = stored.image.copy()
    thumb.thumbnail((4 * THUMB_HEIGHT, THUMB_HEIGHT))
    return thumb


def image_view(page: Page, stored: StoredImage, how: str = "") -> Updates:
    """A picture becomes the current one: its hash, its thumbnail and a status line naming it (and ``how`` it
    came). The query picked in Steering belonged to the old picture: it is cleared, not outlined on the new one."""
    return {
        page.image_sha: stored.sha256,
        page.thumb: thumbnail(stored),
        page.status: f"Image **{stored.name}** (sha256 {stored.sha256[:12]}…)" + (f", {how}" if how else ""),
        page.steering.query: None,
        page.steering.query_text: "",
    }


def on_image_pick(ctx: AppContext, page: Page, name: str | None) -> Updates:
    try:
        if not name:
            return {page.status: ""}
        return image_view(page, ctx.open_bundled(name))
    except Exception as e:
        return {page.status: warn(error_text(e))}


def on_image_upload(ctx: AppContext, page: Page, path: Any) -> Updates:
    try:
        return {**image_view(page, ctx.open_upload(str(path))), page.image_pick: gr.update(value=None)}
    except Exception as e:  # the page keeps its current picture
        return {page.status: warn(error_text(e))}


# ---- linked views: heads opened in the playground from other tabs ----------------------------------------


def show_playground(page: Page) -> Updates:
    return {page.tabs: gr.Tabs(selected="playground"), page.active: "playground"}


def on_geometry_click(
    ctx: AppContext, page: Page, ckpt: str | None, bg: bool, sha: str | None, evt: gr.SelectData
) -> Updates:
    """Open the clicked head of the geometry grid in the playground, as an editable head on the model's grid."""
    status = page.geometry.status
    try:
        loaded = ctx.model(ckpt)
        at = geometry.head_at(ctx, loaded, evt.index) if loaded.is_ssog else None
        if at is None:
            return {status: "Click inside a head's panel to open it in the playground."}
        out = playground.open_head(ctx, page.playground, ckpt, *at, bg, sha, "Opened from the geometry grid: ")
        return {**out, **show_playground(page), status: ""}
    except Exception as e:
        return {status: warn(error_text(e))}


def on_field_click(
    ctx: AppContext, page: Page, kind: str, shown: dict | None, bg: bool, sha: str | None, evt: gr.SelectData
) -> Updates:
    """Open the clicked head's K-atom fit (any model's, from "every head as a field") in the playground, as the
    geometry grid opens an SSOG head."""
    status = page.geometry.field_note
    try:
        found = geometry.fitted_head_at(ctx, shown, kind, evt.index)
        if found is None:
            return {status: "Click inside a head's panel to open its fit in the playground."}
        spec, note = found
        out = playground.load_head(ctx, page.playground, playground.head_value(spec), bg, sha, note)
        return {**out, **show_playground(page)}
    except Exception as e:
        return {status: warn(error_text(e))}


def on_new_student(ctx: AppContext, page: Page, ckpt: str | None) -> Updates:
    """A distillation wrote a student into the checkpoint folder: every picker offers it (the selection stays)."""
    return checkpoint_updates(ctx, page, ckpt)


def on_compare_student(
    ctx: AppContext, page: Page, shown: dict | None, sha: str | None, alpha: float, layer: float
) -> Updates:
    """Open Compare with the student just distilled as A and its teacher as B."""
    cmp = page.compare
    try:
        if not shown:
            raise AppError("distill a model first: its student then opens beside it")
        names = ctx.checkpoint_names()
        a, b = shown["student"], shown["teacher"]
        return {
            cmp.a: gr.update(choices=names, value=a),
            cmp.b: gr.update(choices=names, value=b),
            **compare.render(ctx, cmp, a, b, sha, alpha, layer),
            page.tabs: gr.Tabs(selected="compare"),
            page.active: "compare",
        }
    except Exception as e:
        return {page.geometry.distill_note: warn(error_text(e))}


def on_open_steered(
    ctx: AppContext, page: Page, ckpt: str | None, sha: str | None, layer: float, query: Any, head: Any, bg: bool
) -> Updates:
    """Open the clicked Steering query's head in the playground at the learned gate, with the gate slider."""
    pg, status = page.playground, page.steering.query_text
    try:
        if not query:
            raise AppError("click a patch of the picture first: its head opens in the playground")
        src = {"checkpoint": ckpt, "image_sha256": sha, "layer": int(layer or 0), "head": int(head or 0),
               "query": [int(query[0]), int(query[1])]}  # fmt: skip
        v = playground.head_value(steering.steered_head(ctx, src, 1.0))
        name = ctx.image(sha).name
        note = (
            f"Head {src['head']} of layer {src['layer']} of {ckpt}, seen from query patch ★ {tuple(src['query'])} "
            f"of {name}, on the model's patch grid. Turn the gate down to 0 to see its fixed field, up to 1 for "
            "the learned gate: the atoms move, widen and re-weight as this patch's content steers them."
        )
        return {
            **playground.load_head(ctx, pg, v, bg, sha, ""),  # the note is shown once, beside the gate
            pg.steer_group: gr.update(visible=True),
            pg.steer_note: note,
            pg.gate: gr.update(value=1.0),
            pg.gate_effect: "",
            pg.steer_src: src,
            **show_playground(page),
            status: "",
        }
    except Exception as e:
        return {status: warn(error_text(e))}


def on_gate(
    ctx: AppContext, pg: playground.PlaygroundUI, src: dict | None, gate: float, bg: bool, sha: str | None
) -> Updates:
    """The content gate moved: redraw the steered head at that fraction of the learned gate."""
    if not src:
        return gr.skip()
    try:
        v = playground.head_value(steering.steered_head(ctx, src, float(gate)))
        extra = {"bg": underlay_url(ctx, sha, v)} if bg and sha else {}
        drawn = playground.canvas_outputs(pg, v, bool(extra), extra, new_value=True)
        return {**drawn, **playground.sliders(pg, v), pg.status: ""}  # the sliders show the atom as it is now
    except Exception as e:
        return {pg.status: warn(error_text(e))}


def on_gate_release(ctx: AppContext, pg: playground.PlaygroundUI, src: dict | None, gate: float) -> Updates:
    """The content gate let go: the model's prediction on the steered picture with this head's gates at that
    fraction (``scale_gate``, every query of the head; the canvas shows one query)."""
    if not src:
        return gr.skip()
    try:
        layer, head = src["layer"], src["head"]
        edit = ScaleGate(layer, "all", head, factor=float(gate))
        what = f"Layer {layer}, head {head}: every gate × {float(gate):g} at every query"
        return {pg.gate_effect: playground.prediction_change(ctx, src["checkpoint"], src["image_sha256"], [edit], what)}
    except Exception as e:
        return {pg.gate_effect: warn(error_text(e))}


def refresh_underlay(
    ctx: AppContext, pg: playground.PlaygroundUI, canvas: Any, show: bool, sha: str | None, ckpt: str | None = None
) -> Updates:
    """A new picture was picked: redraw the playground's underlay if it is on."""
    if not show:
        return gr.skip()
    return playground.on_underlay(ctx, pg, canvas, show, sha, ckpt)


# ---- session ----------------------------------------------------------------------------------------------


def save_session(ctx: AppContext, page: Page, ckpt: str | None, sha: str | None, *values: Any) -> Updates:
    """Write the page's current values as a session file to download; ``values`` are those of every tab's
    session fields (:func:`app.session_protocol.inputs`)."""
    ui = page.session
    try:
        parts = page.session_parts(ctx)
        data = session.make_session(ctx, parts, ckpt, sha, session.by_section(parts, values))
        # ckpt is a picker name: uploads carry an "uploaded/" prefix, which is no file name
        name = "ssog_session" + (f"_{viz.safe_token(ckpt.removesuffix('.safetensors'))}" if ckpt else "") + ".json"
        return {ui.file: write_downloads({name: dumps(data)})[0], ui.status: "Session saved."}
    except Exception as e:
        return {ui.file: None, ui.status: warn(error_text(e))}


def restore_session(ctx: AppContext, page: Page, path: Any, ckpt: str | None = None, sha: str | None = None) -> Updates:
    """Set the top row from a session file, then let every tab restore its own section (ranges with values); say
    what could not be restored. ``ckpt`` and ``sha`` are the page's current ones, kept where the session's are
    not available."""
    ui = page.session
    try:
        s = session.read_session(str(path))
    except Exception as e:
        return {ui.status: warn(error_text(e))}
    restoring, stored = session.restoring_of(ctx, s, ckpt, sha)
    out: Updates = {}
    if restoring.checkpoint == s.checkpoint:
        out[page.checkpoint] = gr.update(value=s.checkpoint)
    if stored is not None:
        out.update(image_view(page, stored, "restored from the session"))
        bundled = stored.name in ctx.bundled_images() and ctx.open_bundled(stored.name).sha256 == stored.sha256
        out[page.image_pick] = gr.update(value=stored.name if bundled else None)  # an upload: named in the status
    out.update(session.restore_parts(page.session_parts(ctx), s, restoring))
    notes = restoring.notes
    text = session.restored_text(notes)
    return {**out, ui.status: warn(text) if notes else text}


# ---- the page ---------------------------------------------------------------------------------------------


def build_page(ctx: AppContext, login: bool = False) -> tuple[gr.Blocks, Page]:
    """The whole UI for one checkpoint folder and one folder of bundled images, and its components by name;
    with ``login`` (the server asks for one) a log-out button, which goes to Gradio's ``/logout``."""
    names = ctx.checkpoint_names()
    ckpt0 = default_checkpoint(ctx, names)
    img0 = default_image(ctx, ckpt0)
    with gr.Blocks(title="SSOG Lab", delete_cache=(3600, 3600)) as demo:  # uploads older than an hour go
        with gr.Row(equal_height=True):
            gr.Markdown(HEADER.format(device=ctx.device), elem_id="header")
            if login:
                gr.Button("Log out", link="logout", size="sm", scale=0, min_width=90, elem_id="logout")
        status = gr.Markdown(folder_status(ctx, names), elem_id="status")
        with gr.Row(equal_height=True):
            ckpt = gr.Dropdown(checkpoint_choices(names, ctx), value=ckpt0, label="Checkpoint", elem_id="ckpt", scale=3)
            ckpt_up = gr.UploadButton(
                "Upload checkpoint (.safetensors, .zip of a model folder, or .pt + .json)",
                file_count="multiple",
                elem_id="ckpt-upload",
                scale=2,
                size="sm",
            )
            hub = gr.Textbox(
                placeholder=f"{HUB_PREFIX}ORG/NAME, then Enter",
                label="Or a model in the local Hugging Face cache",
                elem_id="ckpt-hub",
                scale=2,
                max_lines=1,
            )
            img_pick = gr.Dropdown(
                ctx.bundled_images(),
                value=img0.name if img0 else None,
                label="Image (bundled)",
                elem_id="img-pick",
                scale=2,
            )
            img_up = gr.UploadButton("Upload image", file_count="single", elem_id="img-upload", scale=1, size="sm")
            thumb = gr.Image(
                thumbnail(img0) if img0 else None,
                show_label=False,
                height=THUMB_HEIGHT,
                interactive=False,
                elem_id="thumb",
                scale=1,
                container=False,
                buttons=[],
            )
        with gr.Row(equal_height=True):
            pics = gr.Dropdown(
                chooser.choices(ctx),
                value=chooser.RECORDED,
                label="Pictures to measure on (head fields, edits on N images, head importance, the export maps' "
                "validation control)",
                info="the model's recorded data is its validation set (the bundled pictures for a model that "
                "records none); or the bundled pictures, or pictures you upload",
                elem_id="pics",
                scale=4,
            )
            pics_folder = gr.UploadButton("Upload a folder of pictures", file_count="directory", elem_id="pics-folder",
                                          scale=1, size="sm")  # fmt: skip
            pics_files = gr.UploadButton("Upload pictures (.zip or files)", file_count="multiple", elem_id="pics-files",
                                         scale=1, size="sm")  # fmt: skip
        image_sha = gr.State(img0.sha256 if img0 else None)
        active = gr.State("playground")
        shared = {"checkpoint": ckpt, "image_sha": image_sha, "pictures": pics}

        with gr.Tabs(elem_id="tabs") as tabs:
            with gr.Tab("Head playground", id="playground", elem_id="tab-playground") as t_pg:
                pg = playground.build(ctx, shared)
            with gr.Tab("Checkpoint geometry", id="geometry", elem_id="tab-geometry") as t_geo:
                geo = geometry.build(ctx, shared)
            with gr.Tab("Steering", id="steering", elem_id="tab-steering") as t_st:
                st = steering.build(ctx, shared)
            shared["query"] = st.query  # the patch picked in Steering is outlined in the export maps
            with gr.Tab("Export maps", id="export", elem_id="tab-export") as t_ex:
                ex = export.build(ctx, shared)
            with gr.Tab("Compare two checkpoints", id="compare", elem_id="tab-compare") as t_cmp:
                cmp = compare.build(ctx, shared)
            with gr.Tab("Scaling", id="scaling", elem_id="tab-scaling") as t_sc:
                sc = scaling.build(ctx, shared)
            with gr.Tab("Training", id="training", elem_id="tab-training") as t_tr:
                tr = training.build(ctx, shared)
            with gr.Tab("Intervene", id="intervene", elem_id="tab-intervene") as t_iv:
                iv = intervene.build(ctx, shared)
            with gr.Tab("Session", id="session", elem_id="tab-session") as t_ses:
                ses = session_tab.build()
            with gr.Tab("Target share", id="target_share", elem_id="tab-target_share") as t_ts:  # after Session:
                ts = target_share.build(ctx, shared)  # at 1400 px the tab bar then keeps Session in view
        page = Page(
            checkpoint=ckpt, checkpoint_upload=ckpt_up, hub=hub, image_pick=img_pick, image_upload=img_up, thumb=thumb,
            status=status, pictures=pics, image_sha=image_sha, active=active, tabs=tabs, playground=pg, geometry=geo,
            steering=st,
            export=ex, compare=cmp, scaling=sc, training=tr, intervene=iv, session=ses, target_share=ts,
        )  # fmt: skip
        hidden = dict(api_visibility="private")

        # ---- global pickers and lazy tab rendering ---------------------------------------------------------
        # A checkpoint the user picks (or uploads) first brings its twin and comparison pickers, then the open tab
        # renders with them. A restored session sets those pickers itself: only the presets follow every change.
        follow = [pg.preset, pg.preset_note, ex.twin, cmp.a, cmp.b]
        picked = ckpt.input(partial(on_checkpoint_change, ctx, page), [ckpt], follow, **hidden)
        uploaded = ckpt_up.upload(
            partial(on_checkpoint_upload, ctx, page), [ckpt_up, ckpt], [ckpt, ex.twin, cmp.a, cmp.b, status], **hidden
        )
        hub_opened = hub.submit(partial(on_hub_open, ctx, page), [hub], [ckpt, ex.twin, cmp.a, cmp.b, status], **hidden)
        for button in (pics_folder, pics_files):
            button.upload(partial(on_pictures_upload, ctx, page), [button], [pics, status], **hidden)
        changed = ckpt.change(partial(playground.on_checkpoint, ctx, pg), [ckpt], [pg.preset, pg.preset_note],
                              **hidden)  # fmt: skip
        page_loaded = demo.load(partial(on_checkpoint_change, ctx, page), [ckpt], follow, **hidden)
        demo.load(None, None, [ex.layout], js=f"() => window.innerWidth < {NARROW_PX} ? 'narrow' : 'wide'", **hidden)
        views = {
            "geometry": (t_geo, partial(geometry.render, ctx, geo),
                         [ckpt, geo.layer, image_sha, geo.field_shown, geo.distill_shown], geo.rendered, []),
            "steering": (t_st, partial(steering.render, ctx, st), [ckpt, image_sha, st.layer, st.query, st.head],
                         st.outputs, [st.layer]),
            "export": (t_ex, partial(export.render, ctx, ex), ex.inputs, ex.rendered, [ex.alpha, ex.layer, pics]),
            "compare": (t_cmp, partial(compare.render, ctx, cmp), cmp.inputs, cmp.outputs, [cmp.alpha, cmp.layer]),
            "scaling": (t_sc, partial(scaling.render, ctx, sc), [ckpt], sc.outputs, []),
            "training": (t_tr, partial(training.render, ctx, tr), [ckpt, *tr.inputs], tr.outputs, []),
            "intervene": (t_iv, partial(intervene.render, ctx, iv), [ckpt, iv.op, iv.shown, pics], iv.outputs, [pics]),
            "target_share": (t_ts, partial(target_share.render, ctx, ts), [ckpt, ts.index, ts.shown], ts.outputs,
                             [ts.index]),
        }  # fmt: skip
        for tab_id, (tab, render, inputs, outputs, controls) in views.items():
            last = gr.State(None)
            run = lazy(tab_id, render, last)
            args = ([active, last, *inputs], [last, *outputs])
            # export maps against the validation control may wait for the batch (a heavy job): no worker limit
            queue = {**hidden, **(queues.may_wait() if tab_id == "export" else {})}
            tab.select(lambda t=tab_id: t, None, active, **hidden).then(run, *args, **queue)
            for event in (picked, uploaded, hub_opened, page_loaded):
                event.then(run, *args, **queue)
            image_sha.change(run, *args, **queue)
            # every way a slider moves (mouse release, typed value, keyboard) is a change: the open tab redraws
            # with the value the slider shows; a slider set by a restored session waits until its tab is opened
            for control in controls:
                control.change(run, *args, trigger_mode="always_last", **queue)
        t_ses.select(lambda: "session", None, active, **hidden)
        # plots drawn while their tab was hidden come out narrow: redraw the playground's when it is shown
        shown_pg = t_pg.select(lambda: "playground", None, active, **hidden)
        shown_pg.then(
            partial(playground.on_details, pg), [pg.canvas], [pg.kernels, pg.table], show_progress="hidden", **hidden
        )

        # the playground opened on a model without a field measures its heads once (a heavy job) to offer their
        # fits as presets; on every opening, on a new model while it is open, and on the page's first load. A new
        # model stops a measurement under way: its presets would not be the new model's
        def open_playground(tab: str, c: str | None, p: str | None, request: gr.Request) -> Iterator[Updates]:
            if tab != "playground":  # another tab is open: the playground measures once it is opened
                yield gr.skip()
                return
            yield from playground.on_open(ctx, pg, c, p, request)  # a plain function: Gradio finds its Request

        opening = [
            event.then(open_playground, [active, ckpt, pics], [pg.preset, pg.preset_note], show_progress="hidden",
                       **queues.may_wait(**hidden))
            for event in (shown_pg, changed, page_loaded)
        ]  # fmt: skip
        ckpt.change(None, None, None, cancels=opening, **hidden)

        # ---- linked views: a head clicked in the geometry grid opens in the playground --------------------------
        def geometry_click(ckpt: str | None, bg: bool, sha: str | None, evt: gr.SelectData) -> Updates:
            return on_geometry_click(ctx, page, ckpt, bg, sha, evt)  # a plain function: Gradio finds its SelectData

        to_playground = [tabs, active]
        geo.figure.select(
            geometry_click, [ckpt, pg.underlay, image_sha], [*pg.head_out, *to_playground, geo.status], **hidden
        )

        def field_click(kind: str) -> Callable[..., Updates]:
            def click(shown: dict | None, bg: bool, sha: str | None, evt: gr.SelectData) -> Updates:
                return on_field_click(ctx, page, kind, shown, bg, sha, evt)

            return click

        for kind, image in (("field", geo.field_figure), ("fit", geo.fit_figure)):  # any model's fitted heads too
            image.select(field_click(kind), [geo.field_shown, pg.underlay, image_sha],
                         [*pg.head_out, *to_playground, geo.field_note], **hidden)  # fmt: skip
        # a distilled student: every picker offers it, and Compare opens it beside its teacher
        geo.distill_shown.change(partial(on_new_student, ctx, page), [ckpt], [ckpt, ex.twin, cmp.a, cmp.b], **hidden)
        geo.distill_compare.click(
            partial(on_compare_student, ctx, page), [geo.distill_shown, image_sha, cmp.alpha, cmp.layer],
            [cmp.a, cmp.b, *cmp.outputs, tabs, active, geo.distill_note], **hidden,
        )  # fmt: skip
        # ... and a query clicked in Steering opens its head there, steered by the image's content
        st.open.click(
            partial(on_open_steered, ctx, page),
            [ckpt, image_sha, st.layer, st.query, st.head, pg.underlay],
            [*pg.head_out, *pg.steer_out, *to_playground, st.query_text],
            **hidden,
        )
        pg.gate.change(
            partial(on_gate, ctx, pg),
            [pg.steer_src, pg.gate, pg.underlay, image_sha],
            [*pg.main_out, *pg.atom_controls, pg.status],
            show_progress="hidden",
            trigger_mode="always_last",
            **hidden,
        )
        pg.gate.release(
            partial(on_gate_release, ctx, pg), [pg.steer_src, pg.gate], [pg.gate_effect], show_progress="hidden",
            trigger_mode="always_last", **hidden,
        )  # fmt: skip
        shown = [image_sha, thumb, status, st.query, st.query_text]
        img_pick.input(partial(on_image_pick, ctx, page), [img_pick], shown, **hidden)
        img_up.upload(partial(on_image_upload, ctx, page), [img_up], [*shown, img_pick], **hidden)
        image_sha.change(
            partial(refresh_underlay, ctx, pg),
            [pg.canvas, pg.underlay, image_sha, ckpt],
            [*pg.main_out, pg.underlay, pg.status],
            show_progress="hidden",
            **hidden,
        )

        # ---- session -------------------------------------------------------------------------------------
        parts = page.session_parts(ctx)
        ses_inputs = [ckpt, image_sha, *session.inputs(parts)]
        ses.save.click(partial(save_session, ctx, page), ses_inputs, [ses.file, ses.status], **hidden)
        top = [ckpt, image_sha, thumb, img_pick, status, st.query, st.query_text]
        ses_outputs = list(dict.fromkeys([*top, *session.outputs(parts), ses.status]))
        ses.upload.upload(partial(restore_session, ctx, page), [ses.upload, ckpt, image_sha], ses_outputs, **hidden)

        register_api(ctx, parts)
    return demo, page


def build_app(ctx: AppContext, login: bool = False) -> gr.Blocks:
    """The whole UI for one checkpoint folder and one folder of bundled images (with a log-out button when the
    server asks for a login)."""
    return build_page(ctx, login)[0]
