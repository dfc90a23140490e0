"""SSOG Lab's web app: ``build_app(ctx)`` composes the tabs; ``main()`` parses the command line and launches.

    python -m app [--host 127.0.0.1] [--port 7860] [--checkpoint-dir checkpoints/] [--assets-dir assets/]
                  [--device cpu|cuda|cuda:N] [--auth-file users.txt]

The app is a thin layer: every number it shows comes from :mod:`ssog_core` (field, analysis, checkpoints,
images), drawn by :mod:`ssog_core.viz` or :mod:`app.plots`. Tabs render lazily: a change of checkpoint or image
re-renders only the tab being looked at; the others catch up when they are opened.
"""

from __future__ import annotations

import argparse
import atexit
import ctypes
import ipaddress
import os
import shutil
import signal
import sys
from collections.abc import Callable, Mapping, Sequence
from functools import partial, wraps
from pathlib import Path
from typing import Any

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")  # air-gapped by default: no telemetry calls
# Gradio's queue keeps a record of the last N events and rebuilds a pandas summary of them after every event
# (for its monitoring page): 10000 by default, which costs memory and CPU that grow with the server's age.
os.environ.setdefault("GRADIO_ANALYTICS_MAX_EVENTS", "500")

import gradio as gr  # noqa: E402
import torch  # noqa: E402
from gradio.data_classes import FileData  # noqa: E402
from gradio.utils import get_upload_folder  # noqa: E402

from app.common import EXPECTED_ERRORS, error_text, warn, write_downloads  # noqa: E402
from app.state import AppContext, AppError, default_image  # noqa: E402
from app.tabs import compare, export, geometry, playground, scaling, session, steering  # noqa: E402
from ssog_core import report, viz  # noqa: E402

MAX_UPLOAD = "64mb"  # checkpoints of the size this project trains fit; anything larger is refused by Gradio
QUEUE_SIZE = 512  # requests waiting beyond this are told the server is busy (a class firing bursts at once fits)
CONCURRENCY = 2  # analysis requests computed at once (2 CPU cores); the rest wait in the queue
M_ARENA_MAX = -8  # glibc's mallopt() parameter number
SESSIONS = 128  # browser tabs / API clients whose state Gradio keeps (~0.3-2 MB each); the least recent go first
FONTS = ["ui-sans-serif", "system-ui", "-apple-system", "Segoe UI", "Roboto", "sans-serif"]  # no web fonts
MONO = ["ui-monospace", "SFMono-Regular", "Menlo", "Consolas", "monospace"]
CSS = """
.hint { font-size: 13px; color: var(--body-text-color-subdued); }
#geo-card table { width: 100%; }
#geo-card td:first-child { white-space: nowrap; }
#geo-card td { overflow-wrap: anywhere; }
#thumb img { object-fit: contain; }
"""
HEADER = (
    "## SSOG Lab\nAttention as a handful of Gaussian atoms over relative position, which content may only "
    "**steer**. Every number is computed by `ssog_core`, the code the models are trained with; models run on "
    "**{device}**."
)
AUTH_ENV = "SSOG_LAB_AUTH"  # user:password lines, as in an --auth-file (never a password on the command line)


def theme() -> gr.themes.Base:
    return gr.themes.Soft(font=FONTS, font_mono=MONO)


def default_checkpoint(ctx: AppContext, names: Sequence[str]) -> str | None:
    """The demo SSOG checkpoint if present, else the first SSOG one, else the first one."""
    if "ssog_layouts.safetensors" in names:
        return "ssog_layouts.safetensors"
    for name in names:
        try:
            if ctx.model(name).is_ssog:
                return name
        except AppError:
            continue
    return names[0] if names else None


def folder_status(ctx: AppContext, names: Sequence[str]) -> str:
    if not names:
        return (
            f"⚠️ **No checkpoint found** in `{ctx.checkpoint_dir}`. The head playground works without one; for "
            "geometry, steering and export maps put `.safetensors` checkpoints there (start with "
            "`--checkpoint-dir`) or upload one above."
        )
    return f"{len(names)} checkpoint(s) in `{ctx.checkpoint_dir}`."


def lazy(tab_id: str, show: Callable[..., tuple], n_out: int) -> Callable[..., tuple]:
    """Wrap a tab's render so it runs only while the tab is open and its inputs changed since last time."""

    def run(active: str, last: str | None, *args: Any) -> tuple:
        key = repr(args)
        if active != tab_id or key == last:
            return (gr.skip(),) * (n_out + 1)
        return (key, *show(*args))

    return run


def checkpoint_updates(ctx: AppContext, value: str | None) -> tuple:
    """Choices for every checkpoint picker after the folder or the uploads changed."""
    names = ctx.checkpoint_names()
    twin = export.default_twin(ctx, value)
    return (
        gr.update(choices=names, value=value),
        gr.update(choices=[export.NO_TWIN, *names], value=twin),
        gr.update(choices=names, value=value),
        gr.update(choices=names, value=twin if twin != export.NO_TWIN else value),
    )


def on_checkpoint_upload(ctx: AppContext, files: Any, current: str | None) -> tuple:
    try:
        paths = files if isinstance(files, list) else [files]
        name = ctx.add_upload([str(p) for p in paths if p])
        return (*checkpoint_updates(ctx, name), f"Loaded **{name}**: it is now selected.")
    except Exception as e:
        return (*(gr.skip(),) * 4, warn(error_text(e)))


def on_checkpoint_change(ctx: AppContext, ckpt: str | None) -> tuple:
    """Presets, twin and comparison defaults follow the selected checkpoint."""
    presets, note = playground.on_checkpoint(ctx, ckpt)
    names = ctx.checkpoint_names()
    twin = export.default_twin(ctx, ckpt)
    return (
        presets,
        note,
        gr.update(choices=[export.NO_TWIN, *names], value=twin),
        gr.update(choices=names, value=ckpt),
        gr.update(choices=names, value=twin if twin != export.NO_TWIN else ckpt),
    )


def _image_outputs(stored) -> tuple:
    h = 96
    thumb = stored.image.copy()
    thumb.thumbnail((4 * h, h))
    return stored.sha256, thumb, f"Image **{stored.name}** (sha256 {stored.sha256[:12]}…)"


def on_image_pick(ctx: AppContext, name: str | None) -> tuple:
    try:
        if not name:
            return gr.skip(), gr.skip(), ""
        return _image_outputs(ctx.open_bundled(name))
    except Exception as e:
        return gr.skip(), gr.skip(), warn(error_text(e))


def on_image_upload(ctx: AppContext, path: Any) -> tuple:
    try:
        sha, thumb, text = _image_outputs(ctx.open_upload(str(path)))
        return sha, thumb, gr.update(value=None), text
    except Exception as e:
        return gr.skip(), gr.skip(), gr.skip(), warn(error_text(e))


def build_app(ctx: AppContext) -> gr.Blocks:
    """The whole UI for one checkpoint folder and one folder of bundled images."""
    names = ctx.checkpoint_names()
    ckpt0 = default_checkpoint(ctx, names)
    img0 = default_image(ctx)
    bundled = ctx.bundled_images()
    with gr.Blocks(title="SSOG Lab", delete_cache=(3600, 3600)) as demo:  # uploads older than an hour go
        gr.Markdown(HEADER.format(device=ctx.device), elem_id="header")
        status = gr.Markdown(folder_status(ctx, names), elem_id="status")
        with gr.Row(equal_height=True):
            ckpt = gr.Dropdown(names, value=ckpt0, label="Checkpoint", elem_id="ckpt", scale=3)
            ckpt_up = gr.UploadButton(
                "Upload checkpoint (.safetensors, or .pt + .json)",
                file_count="multiple",
                elem_id="ckpt-upload",
                scale=2,
                size="sm",
            )
            img_pick = gr.Dropdown(
                bundled, value=img0.name if img0 else None, label="Image (bundled)", elem_id="img-pick", scale=2
            )
            img_up = gr.UploadButton("Upload image", file_count="single", elem_id="img-upload", scale=1, size="sm")
            thumb = gr.Image(
                _image_outputs(img0)[1] if img0 else None,
                show_label=False,
                height=96,
                interactive=False,
                elem_id="thumb",
                scale=1,
                container=False,
                buttons=[],
            )
        image_sha = gr.State(img0.sha256 if img0 else None)
        active = gr.State("playground")
        shared = {"checkpoint": ckpt, "image_sha": image_sha}

        with gr.Tabs(elem_id="tabs") as tabs:
            with gr.Tab("Head playground", id="playground", elem_id="tab-playground") as t_pg:
                pg = playground.build(ctx, shared)
            with gr.Tab("Checkpoint geometry", id="geometry", elem_id="tab-geometry") as t_geo:
                geo = geometry.build(ctx, shared)
            with gr.Tab("Steering", id="steering", elem_id="tab-steering") as t_st:
                st = steering.build(ctx, shared)
            shared["query"] = st["query"]  # the patch picked in Steering is outlined in the export maps
            with gr.Tab("Export maps", id="export", elem_id="tab-export") as t_ex:
                ex = export.build(ctx, shared)
            with gr.Tab("Compare two checkpoints", id="compare", elem_id="tab-compare") as t_cmp:
                cmp = compare.build(ctx, shared)
            with gr.Tab("Scaling", id="scaling", elem_id="tab-scaling") as t_sc:
                sc = scaling.build(ctx, shared)
            with gr.Tab("Session", id="session", elem_id="tab-session") as t_ses:
                gr.Markdown(
                    "A session file records the checkpoint, the image (by SHA-256), the playground head and each "
                    "tab's settings. Restore it here, or export the same figures headless with "
                    "`python -m ssog_core.figures --session FILE`."
                )
                with gr.Row():
                    save_btn = gr.Button("Save session", elem_id="ses-save")
                    ses_file = gr.File(label="session.json", interactive=False, elem_id="ses-file")
                    ses_up = gr.File(label="Restore a session (.json)", file_types=[".json"], elem_id="ses-upload")
                ses_status = gr.Markdown(elem_id="ses-status")

        # ---- global pickers and lazy tab rendering ---------------------------------------------------------
        # A new checkpoint first updates presets, twin and comparison pickers, then the open tab renders with them.
        hidden = dict(api_visibility="private")
        follow = [pg["preset"], pg["preset_note"], ex["twin"], cmp["a"], cmp["b"]]
        picked = ckpt.change(partial(on_checkpoint_change, ctx), [ckpt], follow, **hidden)
        loaded = demo.load(partial(on_checkpoint_change, ctx), [ckpt], follow, **hidden)
        views = {
            "geometry": (t_geo, geo["render"], [ckpt, geo["layer"], image_sha], geo["outputs"], []),
            "steering": (
                t_st,
                st["render"],
                [ckpt, image_sha, st["layer"], st["query"], st["head"]],
                st["outputs"],
                [st["layer"]],
            ),  # fmt: skip
            "export": (t_ex, ex["render"], ex["inputs"], ex["outputs"], [ex["alpha"], ex["layer"]]),
            "compare": (t_cmp, cmp["render"], cmp["inputs"], cmp["outputs"], [cmp["alpha"], cmp["layer"]]),
            "scaling": (t_sc, sc["render"], [ckpt], sc["outputs"], []),
        }
        for tab_id, (tab, show, inputs, outputs, controls) in views.items():
            last = gr.State(None)
            run = lazy(tab_id, show, len(outputs))
            args = ([active, last, *inputs], [last, *outputs])
            tab.select(lambda t=tab_id: t, None, active, **hidden).then(run, *args, **hidden)
            picked.then(run, *args, **hidden)
            loaded.then(run, *args, **hidden)
            image_sha.change(run, *args, **hidden)
            # every way a slider moves (mouse release, typed value, keyboard) is a change: the open tab redraws
            # with the value the slider shows; a slider set by a restored session waits until its tab is opened
            for control in controls:
                control.change(run, *args, trigger_mode="always_last", **hidden)
        t_ses.select(lambda: "session", None, active, **hidden)
        # plots drawn while their tab was hidden come out narrow: redraw the playground's when it is shown
        t_pg.select(lambda: "playground", None, active, **hidden).then(
            playground.on_details, [pg["canvas"]], pg["main_out"][1:], show_progress="hidden", **hidden
        )
        # ---- linked views: a head clicked in the geometry grid opens in the playground --------------------------
        head_out = [*pg["main_out"], *pg["atom_controls"], *pg["head_controls"], pg["preset_note"], pg["status"]]

        def geometry_click(ckpt: str | None, bg: bool, sha: str | None, evt: gr.SelectData) -> tuple:
            return on_geometry_click(ctx, ckpt, bg, sha, evt)  # a plain function: Gradio finds its SelectData

        geo["figure"].select(
            geometry_click,
            [ckpt, pg["underlay"], image_sha],
            [*head_out, tabs, active, geo["status"]],
            **hidden,
        )
        # ... and a query clicked in Steering opens its head there, steered by the image's content
        steer_out = [pg["steer_group"], pg["steer_note"], pg["gate"], pg["steer_src"]]
        st["open"].click(
            partial(on_open_steered, ctx),
            [ckpt, image_sha, st["layer"], st["query"], st["head"], pg["underlay"]],
            [*head_out, *steer_out, tabs, active, st["status"]],
            **hidden,
        )
        pg["gate"].change(
            partial(on_gate, ctx),
            [pg["steer_src"], pg["gate"], pg["underlay"], image_sha],
            [*pg["main_out"], pg["status"]],
            show_progress="hidden",
            trigger_mode="always_last",
            **hidden,
        )
        ckpt_up.upload(
            partial(on_checkpoint_upload, ctx),
            [ckpt_up, ckpt],
            [ckpt, ex["twin"], cmp["a"], cmp["b"], status],
            **hidden,
        )
        img_pick.input(partial(on_image_pick, ctx), [img_pick], [image_sha, thumb, status], **hidden)
        img_up.upload(partial(on_image_upload, ctx), [img_up], [image_sha, thumb, img_pick, status], **hidden)
        image_sha.change(
            partial(refresh_underlay, ctx),
            [pg["canvas"], pg["underlay"], image_sha, ckpt],
            pg["main_out"] + [pg["underlay"], pg["status"]],
            show_progress="hidden",
            **hidden,
        )

        # ---- session -------------------------------------------------------------------------------------
        tab_settings = [geo["layer"], st["layer"], st["query"], ex["twin"], ex["alpha"], ex["layer"],
                        cmp["a"], cmp["b"], cmp["alpha"], cmp["layer"]]  # fmt: skip
        ses_inputs = [ckpt, image_sha, pg["canvas"], pg["underlay"], *tab_settings]
        save_btn.click(partial(save_session, ctx), ses_inputs, [ses_file, ses_status], **hidden)
        ses_outputs = [ckpt, image_sha, thumb, img_pick, *pg["main_out"], pg["underlay"], *pg["head_controls"],
                       *tab_settings, ses_status]  # fmt: skip
        ses_up.upload(partial(restore_session, ctx), [ses_up], ses_outputs, **hidden)

        register_api(ctx)
    return demo


def on_geometry_click(ctx: AppContext, ckpt: str | None, bg: bool, sha: str | None, evt: gr.SelectData) -> tuple:
    """Open the clicked head of the geometry grid in the playground, as an editable head on the model's grid."""
    try:
        lm = ctx.model(ckpt)
        at = geometry.head_at(lm, evt.index) if lm.is_ssog else None
        if at is None:
            return (*(gr.skip(),) * 15, "Click inside a head's panel to open it in the playground.")
        out = playground.open_head(ctx, ckpt, *at, bg, sha, "Opened from the geometry grid: ")
        return (*out, gr.Tabs(selected="playground"), "playground", "")
    except Exception as e:
        return (*(gr.skip(),) * 15, warn(error_text(e)))


def on_open_steered(
    ctx: AppContext, ckpt: str | None, sha: str | None, layer: float, query: Any, head: Any, bg: bool
) -> tuple:
    """Open the clicked Steering query's head in the playground at the learned gate, with the gate slider."""
    n_out = 13 + 4 + 3
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
        out = playground.load_head(ctx, v, bg, sha, note)
        steer = (gr.update(visible=True), note, gr.update(value=1.0), src)
        return (*out, *steer, gr.Tabs(selected="playground"), "playground", "")
    except Exception as e:
        return (*(gr.skip(),) * (n_out - 1), warn(error_text(e)))


def on_gate(ctx: AppContext, src: dict | None, gate: float, bg: bool, sha: str | None) -> tuple:
    """The content gate moved: redraw the steered head at that fraction of the learned gate."""
    if not src:
        return gr.skip(), gr.skip(), gr.skip(), gr.skip()
    try:
        v = playground.head_value(steering.steered_head(ctx, src, float(gate)))
        extra = {"bg": playground.underlay_url(ctx, sha, v)} if bg and sha else {}
        return (*playground.canvas_outputs(v, bool(extra), extra, new_value=True), "")
    except Exception as e:
        return gr.skip(), gr.skip(), gr.skip(), warn(error_text(e))


def refresh_underlay(ctx: AppContext, canvas: Any, show: bool, sha: str | None, ckpt: str | None = None) -> tuple:
    if not show:
        return (gr.skip(),) * 5
    return playground.on_underlay(ctx, canvas, show, sha, ckpt)


def save_session(ctx: AppContext, *values: Any) -> tuple:
    import json

    try:
        data = session.make_session(ctx, *values)
        ckpt = values[0]  # a picker name: uploads carry an "uploaded/" prefix, which is no file name
        name = "ssog_session" + (f"_{viz.safe_token(ckpt.removesuffix('.safetensors'))}" if ckpt else "") + ".json"
        return write_downloads({name: json.dumps(data, indent=2, ensure_ascii=False)})[0], "Session saved."
    except Exception as e:
        return None, warn(error_text(e))


def restore_session(ctx: AppContext, path: Any) -> tuple:
    """Set every picker, slider and the canvas from a session file; say what could not be restored."""
    n_out = 4 + 3 + 1 + 3 + 11
    try:
        data = session.read_session(str(path))
    except Exception as e:
        return (*(gr.skip(),) * (n_out - 1), warn(error_text(e)))
    notes = []
    names = ctx.checkpoint_names()
    ckpt = data.get("checkpoint")
    if ckpt and ckpt not in names:
        notes.append(f"checkpoint {ckpt!r} is not in the checkpoint folder")
        ckpt_update: Any = gr.skip()
    else:
        ckpt_update = gr.update(value=ckpt)
    sha_update: Any = gr.skip()
    thumb_update: Any = gr.skip()
    pick_update: Any = gr.skip()
    image = data.get("image") or {}
    if image.get("sha256"):
        try:
            stored = ctx.image(image["sha256"])
            sha_update, thumb_update, _ = _image_outputs(stored)
            bundled = stored.name in ctx.bundled_images() and ctx.open_bundled(stored.name).sha256 == stored.sha256
            pick_update = gr.update(value=stored.name if bundled else None)  # an upload is named in the status
        except AppError as e:
            notes.append(f"image {image.get('name') or image['sha256'][:12]}: {e}")
    pgd = data["playground"]
    value = {**pgd["head"], "sel": int(pgd.get("selected_atom", 0))}
    value["sel"] = min(max(value["sel"], 0), len(value["atoms"]) - 1)
    sha_for_bg = sha_update if isinstance(sha_update, str) else None
    try:
        bg = playground.underlay_url(ctx, sha_for_bg, value) if (pgd.get("image_underlay") and sha_for_bg) else ""
    except AppError:
        bg = ""
    canvas, fig, rows = playground.canvas_outputs(value, bool(bg), {"bg": bg}, new_value=True)
    ex_d, cmp_d = data.get("export", {}), data.get("compare", {})
    st_d = data.get("steering", {})
    text = "Session restored." + (" Not restored: " + "; ".join(notes) + "." if notes else "")
    return (
        ckpt_update,
        sha_update,
        thumb_update,
        pick_update,
        canvas,
        fig,
        rows,
        gr.update(value=bool(bg)),
        *playground.head_controls(value),
        gr.update(value=int(data.get("geometry", {}).get("layer", 0))),
        gr.update(value=int(st_d.get("layer", 0))),
        st_d.get("query"),
        gr.update(value=ex_d.get("twin") or export.NO_TWIN),
        gr.update(value=float(ex_d.get("alpha", 0.5))),
        gr.update(value=int(ex_d.get("layer", 0))),
        gr.update(value=cmp_d.get("a")),
        gr.update(value=cmp_d.get("b")),
        gr.update(value=float(cmp_d.get("alpha", 0.5))),
        gr.update(value=int(cmp_d.get("layer", 0))),
        warn(text) if notes else text,
    )


def register_api(ctx: AppContext) -> None:
    """Typed endpoints for scripts (gradio_client): the same computations the tabs draw. Expected failures
    (a bad name, a path outside the folder, an unusable head) come back as a readable error message."""

    def api(fn: Callable[..., Any]) -> Callable[..., Any]:
        @wraps(fn)
        def call(*args: Any) -> Any:
            try:
                return fn(*args)
            except EXPECTED_ERRORS as e:
                raise gr.Error(error_text(e)) from None

        return call

    @api
    def checkpoints() -> list[str]:
        """Checkpoint names the app can open."""
        return ctx.checkpoint_names()

    @api
    def head_field(head: dict, image: str = "") -> dict:
        """A playground head (JSON as in a session file) → its query's field, kernels and statistics; with an
        image (bundled name or SHA-256 from /upload_image) also the picture as the canvas draws it under the head."""
        value = {**head, "sel": 0} if isinstance(head, dict) else head
        _, spec, view = playground.render(value, overlay=bool(image))
        out = {
            "density": view.density.tolist(),
            "row": view.row_marginal.tolist(),
            "col": view.col_marginal.tolist(),
            "lambda": view.lam.tolist(),
            "entropy": view.entropy,
            "radius": view.radius,
        }
        if image:
            out["underlay"] = playground.underlay_url(ctx, ctx.find_image(image).sha256, spec.to_dict())
        return out

    @api
    def geometry_summary(checkpoint: str) -> dict:
        """Model card, gate scales and τ per layer, and the atom table of a checkpoint."""
        lm = ctx.model(checkpoint)
        return {
            "card": report.model_card(lm.model, lm.meta, flops=False),
            "layers": report.gate_rows(lm.fields),
            "atoms": report.atom_rows(lm.fields),
        }

    @api
    def export_summary(checkpoint: str, image: str, alpha: float = 0.5) -> dict:
        """Export-map summary of a checkpoint on a bundled image (by name) or a seen one (by SHA-256)."""
        maps = export.maps_for(ctx.model(checkpoint), ctx.find_image(image), float(alpha))
        return {
            **maps.summary(),
            "alpha": maps.alpha,
            "grid": list(maps.grid),
            "accumulated": maps.accumulated[0].tolist(),
        }

    @api
    def upload_image(image: FileData) -> dict:
        """Send a picture (``gradio_client.handle_file(path)``); returns its SHA-256 for the other endpoints."""
        stored = ctx.open_upload(uploaded_path(image))
        return {"sha256": stored.sha256, "name": stored.name, "size": list(stored.image.size)}

    @api
    def upload_checkpoint(files: list[FileData]) -> str:
        """Send a ``.safetensors`` checkpoint, or a reference ``.pt`` with its config ``.json``; returns the
        name to pass to the other endpoints (it also appears in the page's picker)."""
        if not isinstance(files, list):
            files = [files]
        return ctx.add_upload([uploaded_path(f) for f in files])

    for fn in (checkpoints, head_field, geometry_summary, export_summary, upload_image, upload_checkpoint):
        gr.api(fn, api_name=fn.__name__)


def uploaded_path(file: Any) -> str:
    """The server-side path of a file sent with the request. Only files Gradio received in an upload are read:
    a plain path string, or a file reference pointing anywhere else, is refused."""
    path = file.get("path") if isinstance(file, dict) else None
    if not isinstance(path, str) or not path:
        raise AppError("send the file itself (gradio_client.handle_file(path)), not a path on the server")
    real = Path(path).resolve()
    if not real.is_relative_to(Path(get_upload_folder()).resolve()) or not real.is_file():
        raise AppError(f"refused file {Path(path).name!r}: the API reads only files uploaded with the request")
    return str(real)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m app", description="SSOG Lab web app")
    ap.add_argument("--host", default="127.0.0.1", help="interface to bind (default: this machine only)")
    ap.add_argument("--port", type=int, default=7860)
    ap.add_argument("--checkpoint-dir", default="checkpoints", type=Path, help="folder of .safetensors checkpoints")
    ap.add_argument("--assets-dir", default="assets", type=Path, help="folder of bundled images")
    ap.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads per request (1 keeps concurrent requests from fighting over the cores)",
    )
    ap.add_argument(
        "--device",
        default=None,
        help="where models and their analysis run: cpu, cuda or cuda:N (default: CUDA when available, else CPU)",
    )
    ap.add_argument(
        "--auth-file",
        type=Path,
        default=None,
        help=f"file of user:password lines: the page and the API ask for a login (or set {AUTH_ENV})",
    )
    return ap.parse_args(argv)


def choose_device(requested: str | None) -> str:
    """The device models run on: the one asked for (refused with the reason if this machine lacks it), else
    the first GPU when there is one. On CUDA the models' SSOG layers run the fused Triton kernels through the
    same ``ssog_apply`` dispatch as training, so the app shows what those kernels compute."""
    if requested is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        dev = torch.device(requested)
    except (RuntimeError, ValueError):
        raise ValueError(f"--device {requested!r}: use cpu, cuda or cuda:N") from None
    if dev.type == "cpu":
        return "cpu"
    if dev.type != "cuda":
        raise ValueError(f"--device {requested!r}: use cpu, cuda or cuda:N")
    if not torch.cuda.is_available():
        raise ValueError(f"--device {requested}: this machine has no CUDA GPU that torch can use")
    if dev.index is not None and dev.index >= torch.cuda.device_count():
        raise ValueError(f"--device {requested}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return str(dev)


def read_auth(path: Path | None, environ: Mapping[str, str]) -> list[tuple[str, str]] | None:
    """Logins from ``path`` or else the ``SSOG_LAB_AUTH`` variable: one ``user:password`` per line (blank lines
    and ``#`` comments skipped; the password may contain ``:``). None when neither is given."""
    if path is not None:
        try:
            text, source = path.read_text(encoding="utf-8"), str(path)
        except OSError as e:
            raise ValueError(f"--auth-file {path}: {e.strerror or e}") from None
    elif environ.get(AUTH_ENV):
        text, source = environ[AUTH_ENV], AUTH_ENV
    else:
        return None
    logins = []
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        user, sep, password = line.partition(":")
        if not sep or not user.strip() or not password:
            raise ValueError(f"{source}, line {n}: expected user:password")
        logins.append((user.strip(), password))
    if not logins:
        raise ValueError(f"{source} holds no user:password line")
    return logins


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve to any interface
        return False


def access_warning(host: str, auth: Sequence[tuple[str, str]] | None) -> str | None:
    """What to print at start when the app is reachable from other machines without a login."""
    if auth or is_loopback(host):
        return None
    return (
        f"WARNING: serving on {host} without a login: anyone who can reach this machine can use the app, "
        f"upload files and run models. Give users a login with --auth-file FILE (or {AUTH_ENV}), or bind "
        "--host 127.0.0.1."
    )


def launch(demo: gr.Blocks, host: str, port: int, **extra: Any) -> None:
    """Queue (bursts wait rather than fail) and serve with the upload cap, a bound on the sessions kept in memory
    (Gradio keeps every session's state until it is evicted), the offline theme and no share link."""
    demo.queue(default_concurrency_limit=CONCURRENCY, max_size=QUEUE_SIZE)
    demo.launch(
        server_name=host,
        server_port=port,
        share=False,
        max_file_size=MAX_UPLOAD,
        state_session_capacity=SESSIONS,
        theme=theme(),
        css=CSS,
        show_error=False,
        footer_links=["api"],
        **extra,
    )


def limit_malloc_arenas(arenas: int = 2) -> bool:
    """Cap glibc's malloc arenas. By default every thread that allocates may get its own (up to 8 per core), and
    memory freed by a request stays in the arena of the worker thread that ran it, so the server's resident memory
    creeps up under concurrent requests; two arenas keep it flat (benchmarks/load_app.py). False if not glibc."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    return bool(libc.mallopt(M_ARENA_MAX, arenas))


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # Gradio then closes the server, and the atexit clean-up runs


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    try:
        device = choose_device(args.device)
        auth = read_auth(args.auth_file, os.environ)
    except ValueError as e:
        sys.exit(f"error: {e}")
    warning = access_warning(args.host, auth)
    if warning:
        print(warning, file=sys.stderr, flush=True)
    limit_malloc_arenas()
    torch.set_num_threads(max(1, args.threads))
    ctx = AppContext(args.checkpoint_dir, args.assets_dir, device=device)
    atexit.register(shutil.rmtree, ctx.upload_dir, True)  # uploaded checkpoints do not outlive the server
    signal.signal(signal.SIGTERM, _interrupt)  # a service manager's stop is a clean stop, as Ctrl-C is
    demo = build_app(ctx)
    try:
        launch(demo, args.host, args.port, auth=auth)
    except KeyboardInterrupt:  # stopped while Gradio was still starting up (once it serves, Gradio handles it)
        demo.close()
