"""A checkpoint's training history for the app: read once per checkpoint (``ctx.cache.figures``), for the Training
tab, which draws it, and ``/history``, which returns it as JSON."""

from __future__ import annotations

from app.state import AppContext, AppError, LoadedModel
from ssog_core.checkpoint.format import read_history
from ssog_core.checkpoint.history import History


def read(ctx: AppContext, loaded: LoadedModel) -> History | None:
    """The history stored in ``loaded``'s checkpoint, or None when it has none (kept per checkpoint)."""
    return ctx.cache.figures.get(("history", loaded.key), lambda: read_history(ctx.resolve(loaded.name)))


def history_of(ctx: AppContext, ckpt: str) -> History:
    """The training history of a checkpoint, or a readable error when it has none."""
    history = read(ctx, ctx.model(ckpt))
    if history is None:
        why = (
            "a model folder records none"
            if ctx.resolve(ckpt).is_dir()
            else "trained before histories were recorded, or converted"
        )
        raise AppError(f"{ckpt} has no training history ({why})")
    return history
