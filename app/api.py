"""The app's typed API for scripts (``gradio_client``): the same computations the tabs draw, as JSON.

    from gradio_client import Client
    client = Client("http://127.0.0.1:7860/")
    client.predict("ssog_layouts.safetensors", "layouts_val0008_plus.png", 0.5, api_name="/export_summary")
    client.predict("ssog_layouts.safetensors", "layouts_val0008_plus.png", 0.5, "blank", api_name="/export_summary")

Endpoints: ``/checkpoints``, ``/head_field``, ``/geometry_summary``, ``/export_summary``, ``/history``,
``/upload_image``, ``/upload_checkpoint``, ``/intervene``, ``/head_importance``, ``/head_fields``, ``/distill``,
``/target_share``, ``/save_session``, ``/restore_session`` (docs/APP.md lists what each returns).
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

from app import distill as distilling
from app import fields, interventions, queues
from app import pictures as chooser
from app import session_protocol as session
from app import target_share as shares
from app.canvas import underlay_url
from app.common import EXPECTED_ERRORS, error_text
from app.export_maps import maps_with_control, validation_words
from app.history import history_of
from app.state import AppContext, AppError
from ssog_core.analysis import report
from ssog_core.analysis.controls import check_control, differences
from ssog_core.analysis.head_as_field import FIT_ATOMS
from ssog_core.analysis.head_spec import HeadSpec, evaluate
from ssog_core.analysis.measures import DEFAULT_IMAGES
from ssog_core.analysis.session import dumps, loads
from ssog_core.interventions.edit import edits_schema, ops_help


def register_api(ctx: AppContext, parts: Sequence[session.SessionPart]) -> None:
    """Typed endpoints for scripts (gradio_client): the methods of :class:`Endpoints`, each calling the app's
    services (never a tab). ``parts`` are the page's session sections (:meth:`app.layout.Page.session_parts`), which
    ``/restore_session`` runs."""
    api = Endpoints(ctx, parts)
    for fn in (api.checkpoints, api.head_field, api.geometry_summary, api.history, api.upload_image,
               api.upload_checkpoint, api.save_session, api.restore_session):  # fmt: skip
        gr.api(expected(fn), api_name=fn.__name__)
    gr.api(expected(api.export_summary), api_name="export_summary", **queues.may_wait())  # the control may wait
    edit = gr.api(api.intervene, api_name="intervene", **queues.may_wait())  # validation images may wait
    typed_parameter(edit, api.intervene, "edits", edits_schema())  # each op's fields, from the registry
    gr.api(api.head_importance, api_name="head_importance", **queues.heavy())
    gr.api(api.head_fields, api_name="head_fields", **queues.heavy())
    gr.api(api.distill, api_name="distill", **queues.heavy())
    gr.api(api.target_share, api_name="target_share", **queues.heavy())


def expected(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` with expected failures (a bad name, a path outside the folder, an unusable head) turned into a
    readable error message for the client."""

    @wraps(fn)
    def call(*args: Any) -> Any:
        try:
            return fn(*args)
        except EXPECTED_ERRORS as e:
            raise gr.Error(error_text(e)) from None

    return call


def heavy_answers(
    work: Callable[[Any, Any], Any], request: gr.Request | None, unit: str = "images"
) -> Iterator[tuple[Any, str | None]]:
    """A heavy endpoint's progress and result: first ``(None, "waiting for a heavy slot")``, then
    :func:`app.queues.watched`'s ``(None, progress)`` pairs (counted in ``unit``) and ``(result, None)``. Gradio can
    close (cancel) a generator only once its first value came back: that value comes before the user's slot is
    taken, so a job cancelled at any time gives the slot back."""
    yield None, "waiting for a heavy slot"
    yield from queues.watched(request, work, unit=unit)


class Endpoints:
    """The API's endpoints, one method each (its docstring is the endpoint's description); the generators are the
    heavy ones, which yield ``{"progress": …}`` while their job waits or runs."""

    def __init__(self, ctx: AppContext, parts: Sequence[session.SessionPart]) -> None:
        self.ctx, self.parts = ctx, parts

    def checkpoints(self) -> list[str]:
        """Checkpoint names the app can open."""
        return self.ctx.checkpoint_names()

    def head_field(self, head: dict, image: str = "") -> dict:
        """A playground head (JSON as in a session file) → its query's field, kernels and statistics; with an
        image (bundled name or SHA-256 from /upload_image) also the picture as the canvas draws it under the head."""
        spec = HeadSpec.from_dict({**head, "sel": 0} if isinstance(head, dict) else head)
        view = evaluate(spec)
        out = {
            "density": view.density.tolist(),
            "row": view.row_marginal.tolist(),
            "col": view.col_marginal.tolist(),
            "lambda": view.lam.tolist(),
            "entropy": view.entropy,
            "radius": view.radius,
        }
        if image:
            out["underlay"] = underlay_url(self.ctx, self.ctx.find_image(image).sha256, spec.to_dict())
        return out

    def geometry_summary(self, checkpoint: str) -> dict:
        """Model card, gate scales and τ per layer, and the atom table of a checkpoint."""
        loaded = self.ctx.model(checkpoint)
        return {
            "card": report.model_card(loaded.model, loaded.meta, flops=False),
            "layers": report.gate_rows(loaded.fields),
            "atoms": report.atom_rows(loaded.fields),
        }

    def export_summary(
        self, checkpoint: str, image: str, alpha: float = 0.5, control: str = "none", pictures: str = "",
        request: gr.Request | None = None,
    ) -> dict:  # fmt: skip
        """Export-map summary of a checkpoint on a bundled image (by name) or a seen one (by SHA-256), over patch
        tokens; ``prefix_share``: per layer, the attention patch queries put on prefix tokens (class, distillation,
        register), left out of the maps.
        ``accumulated`` is always the raw map; a ``control`` (``blank``: a blank image of the image's mean colour,
        ``validation``: the mean over validation images of the checkpoint's data, or over the bundled pictures for a
        model that records none, or over up to 64 ``pictures`` as for /intervene) adds ``accumulated_control`` and
        ``accumulated_difference`` (raw − control), ``control_images`` (how many) and, for ``validation``,
        ``control_pictures`` (which, in words)."""
        loaded, stored = self.ctx.model(checkpoint), self.ctx.find_image(image)
        chosen = chooser.chosen(self.ctx, pictures)
        maps, c = maps_with_control(self.ctx, loaded, stored, float(alpha), check_control(control), request, chosen)
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
            out["accumulated_difference"] = differences(maps, c)["accumulated_difference"][0].tolist()
        if control == "validation":
            out["control_pictures"] = validation_words(loaded, chosen, c.images)
        return out

    def upload_image(self, image: FileData) -> dict:
        """Send a picture (``gradio_client.handle_file(path)``); returns its SHA-256 for the other endpoints."""
        stored = self.ctx.open_upload(uploaded_path(image))
        return {"sha256": stored.sha256, "name": stored.name, "size": list(stored.image.size)}

    def upload_checkpoint(self, files: list[FileData]) -> str:
        """Send a ``.safetensors`` checkpoint, a ``.zip`` of a model folder (timm or transformers layout), or a
        upstream ``.pt`` with its config ``.json``; returns the name to pass to the other endpoints (it also
        appears in the page's picker)."""
        if not isinstance(files, list):
            files = [files]
        return self.ctx.add_upload([uploaded_path(f) for f in files])

    def history(self, checkpoint: str) -> dict:
        """The training history stored in a checkpoint: snapshot ``steps``, ``gates`` (per tap: per step, per layer),
        ``val_acc`` ([step, accuracy] at every evaluation), ``fields`` (per key mu / sigma / lambda / tau: per step,
        layer, head, atom), ``train`` ([step, loss, accuracy] between snapshots) and ``stages`` (first step of each)."""
        return history_of(self.ctx, checkpoint).to_json()

    def intervene(
        self, checkpoint: str, image: str, edits: list[dict], eval_images: int = 0, pictures: str = "",
        request: gr.Request | None = None,
    ) -> Iterator[dict]:  # fmt: skip
        """Apply edits (JSON objects with an "op", in order; the ops are listed below) to a checkpoint for this call
        only: class probabilities (the checkpoint's class order) and accumulated export maps unedited and edited on
        an image (bundled name or SHA-256); with ``eval_images`` > 0 also accuracy and log p(true) on the first
        that many validation images, each change with its paired bootstrap 95% interval, McNemar's p and per-class
        effects. ``pictures`` (as the page's chooser names them: "" or "the model's recorded data", "the bundled
        pictures", "uploaded: NAME") measures on pictures instead, as does a model without a validation set (the
        bundled pictures): agreement with its unedited prediction and log p of that class, "reference": "unedited
        prediction", ``validation.images`` naming them. While the validation work waits or runs it yields
        ``{"progress": …}`` (see :func:`running`); cancelling the job stops it."""
        try:
            if int(eval_images) <= 0:
                yield interventions.intervene(self.ctx, checkpoint, image, edits, 0, pictures=pictures)
                return
            work = lambda stop, watch: interventions.intervene(  # noqa: E731
                self.ctx, checkpoint, image, edits, int(eval_images), stop, watch=watch, pictures=pictures
            )
            for result, progress in heavy_answers(work, request):  # validation work: one job per user at a time
                yield running(progress) if result is None else result
        except EXPECTED_ERRORS as e:
            raise gr.Error(error_text(e)) from None

    intervene.__doc__ += "\n\nOps and their fields:\n" + ops_help()  # from the registry: a new op is listed

    def head_importance(
        self, checkpoint: str, eval_images: int = 500, mode: str = "zero", pictures: str = "",
        request: gr.Request | None = None,
    ) -> Iterator[dict]:  # fmt: skip
        """Every head ablated (mode zero or dataset_mean) and every layer's μ, σ, λ gates closed, one at a time,
        on the first ``eval_images`` validation images (a model without a validation set: the bundled pictures,
        against its unedited predictions, "reference": "unedited prediction"): drops (unedited − edited) of
        accuracy and log p(true), the interval of the log p drop and whether it is within noise; ``pictures`` as
        for /intervene. While it waits or runs it yields ``{"progress": "computing 120 of 500 images"}``;
        cancelling the job stops the sweep."""
        try:
            loaded, chosen = self.ctx.model(checkpoint), chooser.chosen(self.ctx, pictures)
            work = lambda stop, watch: interventions.importance(  # noqa: E731
                self.ctx, loaded, int(eval_images), mode, stop, watch, chosen
            )
            for result, progress in heavy_answers(work, request):
                yield running(progress) if result is None else result.to_dict()
        except EXPECTED_ERRORS as e:
            raise gr.Error(error_text(e)) from None

    def head_fields(
        self, checkpoint: str, images: int = DEFAULT_IMAGES, atoms: int = FIT_ATOMS, pictures: str = "",
        request: gr.Request | None = None,
    ) -> Iterator[dict]:  # fmt: skip
        """Every head of any checkpoint (SSOG, dot, RBF, a standard ViT folder) as a field over displacement, as
        ``python -m ssog_core fields`` writes it: which images (``images``: as their chooser describes them, with
        ``measured`` and ``size``; ``measured_on``: the same in words), ``grid``, ``patch_px``,
        ``num_prefix_tokens``, ``atoms_per_head``, ``method``, and ``heads``: per head its 0-based ``layer`` and
        ``head``, ``mean_distance_px``, ``share_fit`` and ``share_field`` (1 − mean TV to its fitted atoms and to
        its positional field), ``prefix_share`` and the ``atoms`` (``mu_y``, ``mu_x``, ``sigma_y``, ``sigma_x``,
        ``weight``; grid cells, μ as query − key); measured on the first ``images`` validation images, or up to
        that many bundled pictures for a model that records none, or up to that many ``pictures`` (as for
        /intervene). A heavy job: ``{"progress": …}`` while it waits or runs; cancelling it stops it."""
        try:
            loaded, chosen = self.ctx.model(checkpoint), chooser.chosen(self.ctx, pictures)
            work = lambda stop, watch: fields.measure(self.ctx, loaded, images, atoms, stop, watch, chosen)  # noqa: E731
            for stats, progress in heavy_answers(work, request):
                yield running(progress) if stats is None else fields.fields_json(checkpoint, stats)
        except EXPECTED_ERRORS as e:
            raise gr.Error(error_text(e)) from None

    def distill(
        self, checkpoint: str, images: int = DEFAULT_IMAGES, atoms: int = FIT_ATOMS, steer: str = "mu,sigma,lambda",
        steps: int = distilling.DEFAULT_STEPS, pictures: str = "", request: gr.Request | None = None,
    ) -> Iterator[dict]:  # fmt: skip
        """Distil a model with dot-product heads (a dot twin, a standard ViT folder) into an SSOG student, as
        ``python -m ssog_core distill`` does: each head's ``atoms``-atom fit on up to ``images`` pictures (those
        /head_fields measures with the same N and ``pictures``) steered by content (``steer``: mu or mu,sigma,lambda),
        trained for ``steps`` steps to match the model's outputs on them, and reported on up to ``images`` pictures
        after them, held out. The student is written into the checkpoint folder as ``NAME_distilled.safetensors``
        (``_2``, … when that exists: nothing is replaced) with its report beside it, and every picker offers it.
        Returns ``student`` (its name for the other endpoints), ``existed`` (the names that were already there) and
        ``report`` (the command's report JSON: ``step0`` and ``final`` agreement and KL on the held-out pictures,
        and per head ``share_fit``, ``share_steered``, ``share_uniform``, both normalised, ``difference``,
        ``steering_reach``). A model without dot heads is refused in words. A heavy job: ``{"progress": "computing
        40 of 300 steps: loss …"}`` while it waits or runs; cancelling it stops it, and nothing is written."""
        try:
            loaded = self.ctx.model(checkpoint)
            asked = distilling.request(self.ctx, loaded, images, atoms, steer, steps,
                                       chooser.chosen(self.ctx, pictures))  # fmt: skip
            work = lambda stop, watch: distilling.run(self.ctx, loaded, asked, stop, watch)  # noqa: E731
            for student, progress in heavy_answers(work, request, unit="steps"):
                yield running(progress) if student is None else student.to_dict()
        except EXPECTED_ERRORS as e:
            raise gr.Error(error_text(e)) from None

    def target_share(
        self, checkpoint: str, eval_images: int = shares.DEFAULT_IMAGES, request: gr.Request | None = None
    ) -> Iterator[dict]:
        """Where a ``pointer`` model's attention goes, as ``python -m ssog_core target-share --json`` writes it: of the
        attention patch queries put on the three discs' patches, the share on the disc the cue points at, per layer
        over the first ``eval_images`` validation images of its recorded data: ``chance`` (1/3: the discs not told
        apart), ``images``, ``layers`` (per layer its ``share``, ``ci95`` and each head's pooled share ``heads``) and
        ``closed_mu`` (for a model that steers μ: ``layers`` with every μ gate closed and the paired ``change``,
        closed − unedited, with its ``ci95``; else null). A model of other data is refused in words. A heavy job:
        ``{"progress": …}`` while it waits or runs; cancelling it stops it."""
        try:
            loaded = self.ctx.model(checkpoint)
            shares.scenes(loaded)  # refused in words before a heavy slot is taken
            work = lambda stop, watch: shares.readout(self.ctx, loaded, int(eval_images), stop, watch)  # noqa: E731
            for report, progress in heavy_answers(work, request):
                yield running(progress) if report is None else report
        except EXPECTED_ERRORS as e:
            raise gr.Error(error_text(e)) from None

    def save_session(self, checkpoint: str, image: str, sections: dict) -> str:
        """A session file's text, as the Session tab saves it: a checkpoint (a picker name, or "" for none), an
        image (bundled name or SHA-256, or "" for none) and the tabs' sections as a session file writes them
        (``{"playground": {"head": {…}}, "export": {"alpha": 0.3}, …}``; ``playground.head`` is required)."""
        if checkpoint and not self.ctx.offers(checkpoint):
            raise AppError(f"no checkpoint {checkpoint!r}: /checkpoints lists them")
        if not isinstance(sections, dict) or {"format", "checkpoint", "image"} & set(sections):
            raise AppError("sections: a JSON object of the tabs' sections (checkpoint and image are arguments)")
        sha = self.ctx.find_image(image).sha256 if image else None
        return dumps(session.session_of(self.ctx, checkpoint or None, sha, sections))

    def restore_session(self, text: str) -> dict:
        """What the Session tab restores from a session file's text: the checked ``session`` (defaults filled in),
        the ``checkpoint`` and ``image`` the page then shows, the ``notes`` of what could not be restored and the
        tab's ``status`` line."""
        s = loads(text if isinstance(text, str) else "", "the session")
        restoring, stored = session.restoring_of(self.ctx, s, None, None)
        session.restore_parts(self.parts, s, restoring)  # the page's updates are not needed here, only the notes
        return {
            "session": s.to_dict(),
            "checkpoint": restoring.checkpoint,
            "image": {"sha256": stored.sha256, "name": stored.name} if stored else None,
            "notes": restoring.notes,
            "status": session.restored_text(restoring.notes),
        }


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
