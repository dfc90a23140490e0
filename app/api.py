"""The app's typed API for scripts (``gradio_client``): the same computations the tabs draw, as JSON.

    from gradio_client import Client
    client = Client("http://127.0.0.1:7860/")
    client.predict("ssog_layouts.safetensors", "layouts_val0008_plus.png", 0.5, api_name="/export_summary")
    client.predict("ssog_layouts.safetensors", "layouts_val0008_plus.png", 0.5, "blank", api_name="/export_summary")

Endpoints: ``/checkpoints``, ``/head_field``, ``/geometry_summary``, ``/export_summary``, ``/history``,
``/upload_image``, ``/upload_checkpoint``, ``/intervene``, ``/head_importance``, ``/head_fields``, ``/save_session``,
``/restore_session`` (docs/APP.md lists what each returns).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from functools import wraps
from pathlib import Path
from typing import Any

import gradio as gr
from gradio.context import get_blocks_context
from gradio.data_classes import FileData
from gradio.events import Dependency
from gradio.utils import get_function_params, get_upload_folder

from app import interventions, queues
from app import session_protocol as session
from app.common import EXPECTED_ERRORS, error_text
from app.export_maps import maps_with_control
from app.state import AppContext, AppError
from app.tabs import geometry, playground, training
from ssog_core.analysis import report
from ssog_core.analysis.controls import check_control
from ssog_core.analysis.session import dumps, loads
from ssog_core.interventions.edit import edits_schema, ops_help


def register_api(ctx: AppContext, parts: Sequence[session.SessionPart]) -> None:
    """Typed endpoints for scripts (gradio_client): the same computations the tabs draw. Expected failures
    (a bad name, a path outside the folder, an unusable head) come back as a readable error message. ``parts``
    are the page's session sections (:meth:`app.layout.Page.session_parts`), which ``/restore_session`` runs."""

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
        loaded = ctx.model(checkpoint)
        return {
            "card": report.model_card(loaded.model, loaded.meta, flops=False),
            "layers": report.gate_rows(loaded.fields),
            "atoms": report.atom_rows(loaded.fields),
        }

    @api
    def export_summary(
        checkpoint: str, image: str, alpha: float = 0.5, control: str = "none", request: gr.Request | None = None
    ) -> dict:
        """Export-map summary of a checkpoint on a bundled image (by name) or a seen one (by SHA-256), over patch
        tokens; ``prefix_share``: per layer, the attention patch queries put on prefix tokens (class, distillation,
        register), left out of the maps.
        ``accumulated`` is always the raw map; a ``control`` (``blank``: a blank image of the image's mean colour,
        ``validation``: the mean over validation images of the checkpoint's data, or over the bundled pictures for a
        model that records none) adds ``accumulated_control`` and
        ``accumulated_difference`` (raw − control)."""
        loaded, stored = ctx.model(checkpoint), ctx.find_image(image)
        maps, c = maps_with_control(ctx, loaded, stored, float(alpha), check_control(control), request)
        out = {
            **maps.summary(),
            "alpha": maps.alpha,
            "grid": list(maps.grid),
            "accumulated": maps.accumulated[0].tolist(),
            "prefix_share": maps.prefix_share[0].tolist(),
            "control": control,
        }
        if c is not None:
            out["control_images"] = c.images
            out["accumulated_control"] = c.accumulated[0].tolist()
            out["accumulated_difference"] = (maps.accumulated[0] - c.accumulated[0]).tolist()
        return out

    @api
    def upload_image(image: FileData) -> dict:
        """Send a picture (``gradio_client.handle_file(path)``); returns its SHA-256 for the other endpoints."""
        stored = ctx.open_upload(uploaded_path(image))
        return {"sha256": stored.sha256, "name": stored.name, "size": list(stored.image.size)}

    @api
    def upload_checkpoint(files: list[FileData]) -> str:
        """Send a ``.safetensors`` checkpoint, a ``.zip`` of a model folder (timm or transformers layout), or a
        upstream ``.pt`` with its config ``.json``; returns the name to pass to the other endpoints (it also
        appears in the page's picker)."""
        if not isinstance(files, list):
            files = [files]
        return ctx.add_upload([uploaded_path(f) for f in files])

    @api
    def history(checkpoint: str) -> dict:
        """The training history stored in a checkpoint: snapshot ``steps``, ``gates`` (per tap: per step, per layer),
        ``val_acc`` ([step, accuracy] at every evaluation), ``fields`` (per key mu / sigma / lambda / tau: per step,
        layer, head, atom), ``train`` ([step, loss, accuracy] between snapshots) and ``stages`` (first step of each)."""
        return training.history_of(ctx, checkpoint).to_json()

    def intervene(
        checkpoint: str, image: str, edits: list[dict], eval_images: int = 0, request: gr.Request | None = None
    ) -> Iterator[dict]:
        """Apply edits (JSON objects with an "op", in order; the ops are listed below) to a checkpoint for this call
        only: class probabilities (the checkpoint's class order) and accumulated export maps unedited and edited on
        an image (bundled name or SHA-256); with ``eval_images`` > 0 also accuracy and log p(true) on the first
        that many validation images, each change with its paired bootstrap 95% interval, McNemar's p and per-class
        effects (a model without a validation set: on the bundled pictures, agreement with its unedited prediction
        and log p of that class, "reference": "unedited prediction"). While the validation work waits or runs it
        yields ``{"progress": …}`` (see :func:`running`); cancelling the job stops it."""
        try:
            if int(eval_images) <= 0:
                yield interventions.intervene(ctx, checkpoint, image, edits, 0)
                return
            yield running("waiting for a heavy slot")  # see head_importance
            for result, progress in queues.watched(  # validation work: one job per user at a time
                request,
                lambda stop, watch: interventions.intervene(
                    ctx, checkpoint, image, edits, int(eval_images), stop, watch=watch
                ),
            ):
                yield running(progress) if result is None else result
        except EXPECTED_ERRORS as e:
            raise gr.Error(error_text(e)) from None

    intervene.__doc__ += "\n\nOps and their fields:\n" + ops_help()  # from the registry: a new op is listed

    def head_importance(
        checkpoint: str, eval_images: int = 500, mode: str = "zero", request: gr.Request | None = None
    ) -> Iterator[dict]:
        """Every head ablated (mode zero or dataset_mean) and every layer's μ, σ, λ gates closed, one at a time,
        on the first ``eval_images`` validation images (a model without a validation set: the bundled pictures,
        against its unedited predictions, "reference": "unedited prediction"): drops (unedited − edited) of
        accuracy and log p(true), the interval of the log p drop and whether it is within noise. While it waits or
        runs it yields ``{"progress": "computing 120 of 500 images"}``; cancelling the job stops the sweep."""
        try:
            loaded = ctx.model(checkpoint)
            # Gradio can close (cancel) a generator only once its first value came back: that value comes before
            # the user's slot is taken, so a job cancelled at any time gives the slot back
            yield running("waiting for a heavy slot")
            for result, progress in queues.watched(
                request, lambda stop, watch: interventions.importance(ctx, loaded, int(eval_images), mode, stop, watch)
            ):
                yield running(progress) if result is None else result.to_dict()
        except EXPECTED_ERRORS as e:
            raise gr.Error(error_text(e)) from None

    def head_fields(
        checkpoint: str, images: int = 64, atoms: int = 4, request: gr.Request | None = None
    ) -> Iterator[dict]:
        """Every head of any checkpoint (SSOG, dot, RBF, a standard ViT folder) as a field over displacement: per
        head its 0-based ``layer`` and ``head``, ``mean_distance_px``, ``share_fit`` and ``share_field`` (1 − mean
        TV to its fitted atoms and to its positional field), ``prefix_share`` and the ``atoms`` (``mu_y``, ``mu_x``,
        ``sigma_y``, ``sigma_x``, ``weight``; grid cells, μ as query − key); measured on the first ``images``
        validation images, or the bundled pictures for a model that records none (``measured_on`` says which).
        A heavy job: ``{"progress": …}`` while it waits or runs; cancelling it stops it."""
        try:
            loaded = ctx.model(checkpoint)
            yield running("waiting for a heavy slot")  # see head_importance
            for done, progress in queues.watched(
                request, lambda stop, watch: geometry.head_fields_of(ctx, loaded, images, atoms, stop, watch)
            ):
                if done is None:
                    yield running(progress)
                    continue
                stats, about = done
                yield {"checkpoint": checkpoint, "measured_on": about, "images": stats.images,
                       "grid": list(stats.grid), "num_prefix_tokens": stats.num_prefix,
                       "atoms_per_head": int(atoms), "heads": report.heads_json(stats)}  # fmt: skip
        except EXPECTED_ERRORS as e:
            raise gr.Error(error_text(e)) from None

    @api
    def save_session(checkpoint: str, image: str, sections: dict) -> str:
        """A session file's text, as the Session tab saves it: a checkpoint (a picker name, or "" for none), an
        image (bundled name or SHA-256, or "" for none) and the tabs' sections as a session file writes them
        (``{"playground": {"head": {…}}, "export": {"alpha": 0.3}, …}``; ``playground.head`` is required)."""
        if checkpoint and not ctx.offers(checkpoint):
            raise AppError(f"no checkpoint {checkpoint!r}: /checkpoints lists them")
        if not isinstance(sections, dict) or {"format", "checkpoint", "image"} & set(sections):
            raise AppError("sections: a JSON object of the tabs' sections (checkpoint and image are arguments)")
        sha = ctx.find_image(image).sha256 if image else None
        return dumps(session.session_of(ctx, checkpoint or None, sha, sections))

    @api
    def restore_session(text: str) -> dict:
        """What the Session tab restores from a session file's text: the checked ``session`` (defaults filled in),
        the ``checkpoint`` and ``image`` the page then shows, the ``notes`` of what could not be restored and the
        tab's ``status`` line."""
        s = loads(text if isinstance(text, str) else "", "the session")
        restoring, stored = session.restoring_of(ctx, s, None, None)
        session.restore_parts(parts, s, restoring)  # the page's updates are not needed here, only the notes
        return {
            "session": s.to_dict(),
            "checkpoint": restoring.checkpoint,
            "image": {"sha256": stored.sha256, "name": stored.name} if stored else None,
            "notes": restoring.notes,
            "status": session.restored_text(restoring.notes),
        }

    for fn in (checkpoints, head_field, geometry_summary, history, upload_image, upload_checkpoint, save_session,
               restore_session):  # fmt: skip
        gr.api(fn, api_name=fn.__name__)
    gr.api(export_summary, api_name="export_summary", **queues.may_wait())  # the validation control may wait
    edit = gr.api(intervene, api_name="intervene", **queues.may_wait())  # validation images may wait
    typed_parameter(edit, intervene, "edits", edits_schema())  # each op's fields, from the registry
    gr.api(head_importance, api_name="head_importance", **queues.heavy())
    gr.api(head_fields, api_name="head_fields", **queues.heavy())


def running(progress: str) -> dict[str, str]:
    """What a heavy endpoint yields while its job waits or runs (``{"progress": "computing 120 of 500 images"}``):
    ``client.submit(...)``'s outputs show it, ``client.predict`` returns only the final value."""
    return {"progress": progress}


def typed_parameter(endpoint: Dependency, fn: Callable[..., Any], name: str, schema: dict[str, Any]) -> None:
    """Give parameter ``name`` of ``endpoint`` (``fn``'s, made by ``gr.api``) the JSON Schema ``schema``, which the
    API page, ``gradio_client`` and MCP clients then show. Gradio derives a parameter's schema from its type hint, and
    no hint says which fields each op takes."""
    position = [p[0] for p in get_function_params(fn)].index(name)  # gr.api's inputs, gr.Request left out
    component = get_blocks_context().blocks[endpoint["inputs"][position]]
    component._api_info = schema  # what gr.Api serves as its schema (gradio/components/api_component.py)


def uploaded_path(file: Any) -> str:
    """The server-side path of a file sent with the request. Only files Gradio received in an upload are read:
    a plain path string, or a file path pointing anywhere else, is refused."""
    path = file.get("path") if isinstance(file, dict) else None
    if not isinstance(path, str) or not path:
        raise AppError("send the file itself (gradio_client.handle_file(path)), not a path on the server")
    real = Path(path).resolve()
    if not real.is_relative_to(Path(get_upload_folder()).resolve()) or not real.is_file():
        raise AppError(f"refused file {Path(path).name!r}: the API reads only files uploaded with the request")
    return str(real)
