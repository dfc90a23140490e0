"""The app's side of every head as a field: a model's heads measured as a heavy job
(:func:`ssog_core.interventions.heavy.head_fields`, on :func:`app.queues.engine`), kept in ``ctx.cache.head_fields``
per (model, N, K), and their JSON (:func:`ssog_core.analysis.report.fields_json`, the CLI's too). The geometry tab
draws what :func:`measure` returns; ``/head_fields`` returns :func:`fields_json`.

What the heads are measured on is the page's pictures chooser (:mod:`app.pictures`), made the core's choice
(:class:`ssog_core.interventions.validation.Pictures`): up to N of a chosen folder's pictures, else the first N
validation images of the model's recorded data, else up to N of the bundled pictures for a model that records none;
the worker loads them, and the result names them (``HeadFieldStats.pictures`` and ``measured_on``), as every chart and
note made from them does.
"""

from __future__ import annotations

from typing import Any

from app import pictures as chooser
from app import queues
from app.state import AppContext, AppError, LoadedModel
from ssog_core.analysis import report
from ssog_core.analysis.head_as_field import HeadFieldStats, check_atoms
from ssog_core.interventions import heavy
from ssog_core.interventions.validation import MAX_EVAL_IMAGES, Pictures

Stop = Any  # a stop callable (or None) as app.queues.submitted takes it


def measure(
    ctx: AppContext, loaded: LoadedModel, n: int, atoms: int, stop: Stop = None, watch: queues.Watch | None = None,
    pictures: Pictures | None = None,
) -> HeadFieldStats:  # fmt: skip
    """Every head of ``loaded`` as a field with ``atoms`` fitted atoms, measured on ``n`` of ``pictures`` (default:
    the recorded data) as a heavy job (kept per model, N, K and pictures); ``stop`` cancels it, also while it waits
    for a heavy slot."""
    n = int(n)
    if not 1 <= n <= MAX_EVAL_IMAGES:
        raise AppError(f"measure on 1 to {MAX_EVAL_IMAGES} images, not {n}")
    try:
        atoms = check_atoms(atoms)
    except ValueError as e:
        raise AppError(str(e)) from None
    pictures = pictures or chooser.chosen(ctx, None)
    key = (loaded.name, loaded.key, n, atoms, pictures)
    stats = ctx.cache.head_fields.peek(key)
    if stats is None:
        stats = queues.submitted(ctx.cache.head_fields, key, heavy.head_fields, loaded.key[0], n, pictures,
                                 atoms, stop=stop, watch=watch)  # fmt: skip
    return stats


def measured(
    ctx: AppContext, loaded: LoadedModel, n: int, atoms: int, pictures: Pictures | None = None
) -> HeadFieldStats:
    """The head fields :func:`measure` made for ``loaded`` with ``n``, ``atoms`` and ``pictures``; a clear error
    once they left the cache."""
    key = (loaded.name, loaded.key, int(n), int(atoms), pictures or chooser.chosen(ctx, None))
    stats = ctx.cache.head_fields.peek(key)
    if stats is None:
        raise AppError("these head fields are no longer in memory: measure them again")
    return stats


def measured_alike(ctx: AppContext, n: int, atoms: int) -> list[tuple[str, HeadFieldStats]]:
    """Every model this server has measured with the same N and K (each on its own pictures, which its stats name),
    by name: the charts draw them together."""
    return [(name, stats) for (name, _, kn, ka, _), stats in ctx.cache.head_fields.items() if (kn, ka) == (n, atoms)]


def fields_json(checkpoint: str, stats: HeadFieldStats) -> dict[str, Any]:
    """The ``/head_fields`` answer: :func:`ssog_core.analysis.report.fields_json`, as the fields command writes it."""
    return report.fields_json(stats, checkpoint)
