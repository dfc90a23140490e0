"""The app's queues, so quick work never waits behind slow work.

- :data:`LIGHT`: one-image edits and previews (the Intervene tab's *Apply*), tens of milliseconds.
- :data:`HEAVY`: validation effects and head importance (the tab's *Evaluate* and *Run head importance*,
  ``/head_importance``), head fields and distillations (the geometry tab, ``/head_fields``, ``/distill``), seconds
  to minutes, and batch export (the Export tab's validation batch).
- :func:`may_wait`: requests that are light unless they need a heavy job's result: an export map against the
  validation control (the Export tab, ``/export_summary``), ``/intervene`` (one call, with or without validation
  images). Such a request may wait minutes for its heavy job, so it holds no worker of a bounded queue (a few of
  them waiting would make every export map wait behind them: benchmarks/load_app.py, p95 ×160–700 its alone
  figure at a person's pace); its light part takes one of :data:`LIGHT_LIMIT` light slots (:func:`light_slot`)
  once the heavy result is there.

:data:`LIGHT` and :data:`HEAVY` are Gradio concurrency groups (``concurrency_id``, ``concurrency_limit``), so
requests wait in Gradio's queue and the page shows their place in it. Work on the validation set also runs under
:data:`heavy_gate`, whichever queue it came from, so at most :data:`HEAVY_LIMIT` heavy computations run at once.
One user runs one heavy job at a time (:func:`one_per_user`); another is refused at once with the reason instead
of taking a second slot from everyone else, so the requests waiting for heavy work are at most one per user.

Heavy work leaves the serving process through :func:`engine` (:class:`ssog_core.runtime.jobs.Engine`): a local pool of
``HEAVY_LIMIT`` worker processes, started in the background when the app starts (:func:`start_engine`), or the
Dask scheduler given to ``python -m app --cluster``. The serving process then only waits for heavy jobs, so the
light queue's workers stay free for one-image work.
"""

from __future__ import annotations

import atexit
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import gradio as gr

from app.common import stoppable
from ssog_core.checkpoint.format import load_checkpoint
from ssog_core.interventions import heavy as heavy_jobs
from ssog_core.runtime import memory
from ssog_core.runtime.jobs import HEAVY_LIMIT, THREADS, Cancelled, Engine, Job

T = TypeVar("T")

LIGHT, LIGHT_LIMIT = "light", 8  # light computations at once, per queue and in the light slots
HEAVY = "heavy"  # validation, head importance, head fields, batch export: at most HEAVY_LIMIT at once
heavy_gate = threading.BoundedSemaphore(HEAVY_LIMIT)  # held while a heavy computation runs (app.interventions)
_light_slots = threading.BoundedSemaphore(LIGHT_LIMIT)  # the light part of a request that may wait (light_slot)

BUSY = (  # Busy's message
    "you already have a heavy job running (validation, head importance, head fields, a distillation or batch "
    "export); "
    "wait for it or stop it"
)
_running: Counter[str] = Counter()  # heavy jobs running per user
_lock = threading.Lock()
_engine: Engine | None = None  # where heavy jobs run (start_engine, else a local pool on first use)


def light(**events: Any) -> dict[str, Any]:
    """Event arguments for the light queue."""
    return {"concurrency_id": LIGHT, "concurrency_limit": LIGHT_LIMIT, **events}


def heavy(**events: Any) -> dict[str, Any]:
    """Event arguments for the heavy queue."""
    return {"concurrency_id": HEAVY, "concurrency_limit": HEAVY_LIMIT, **events}


def may_wait(**events: Any) -> dict[str, Any]:
    """Event arguments for a request that may wait for a heavy job's result: no worker limit (the handler takes a
    :func:`light_slot` for its light part)."""
    return {"concurrency_limit": None, **events}


@contextmanager
def light_slot() -> Iterator[None]:
    """One of :data:`LIGHT_LIMIT` slots for the light part of a :func:`may_wait` request, taken once its heavy
    result is there: bounded light work, unbounded waits."""
    with _light_slots:
        yield


def start_engine(cluster: str | None = None, threads: int = THREADS, on_cpu: bool = False) -> Engine:
    """Set where heavy jobs run: the Dask scheduler at ``cluster`` (``tcp://HOST:PORT``; a
    :class:`~ssog_core.runtime.jobs.JobError` naming it when it cannot be reached within seconds; each worker on its GPU
    if it has one), else a local pool of ``HEAVY_LIMIT`` worker processes with ``threads`` torch threads each, on
    this machine's GPU if it has one unless ``on_cpu`` (the app's ``--device cpu``), started now in the background
    (a worker's start imports torch: seconds that the first heavy job would otherwise wait)."""
    global _engine
    local = "cpu" if on_cpu else "auto"
    new = Engine.cluster(cluster, threads) if cluster else Engine.local(HEAVY_LIMIT, threads, device=local)
    with _lock:
        old, _engine = _engine, new
    if old is not None:
        old.close()
    if not cluster:
        threading.Thread(target=_start_workers, args=(new,), name="start-workers", daemon=True).start()
    return new


def start_workers(engine: Engine, workers: int = HEAVY_LIMIT) -> list[int]:
    """Start ``engine``'s worker processes (``workers`` no-op jobs at once) and wait for them; returns the
    process ids that ran them."""
    jobs = [engine.submit(heavy_jobs.warm) for _ in range(workers)]
    return [job.result() for job in jobs]


def _start_workers(engine: Engine) -> None:
    try:
        start_workers(engine)
    except Exception as e:  # the first heavy job meets the same fault and says it on the page
        print(f"heavy-job workers did not start: {type(e).__name__}: {e}", flush=True)


def engine() -> Engine:
    """Where heavy jobs run: the engine :func:`start_engine` set, else a local pool (its workers spawn on the first
    job)."""
    global _engine
    with _lock:
        if _engine is None:
            _engine = Engine.local(HEAVY_LIMIT)
            atexit.register(_engine.close)  # before the interpreter tears down what its pool needs to end
        return _engine


class Watch:
    """The heavy job a handler waits on, once it is submitted: its progress in words for the page."""

    def __init__(self) -> None:
        self.job: Job[Any] | None = None

    def note(self, unit: str = "images") -> str:
        """ "computing 120 of 500 images", or where the job waits."""
        return "waiting for a heavy slot" if self.job is None else self.job.note(unit)


def submitted(
    cache: Any,
    key: Any,
    fn: Callable[..., T],
    checkpoint: str,
    *args: Any,
    stop: Callable[[], bool] | None = None,
    watch: Watch | None = None,
) -> T:
    """:func:`ran`, its value kept in ``cache`` under ``key`` once complete (a stopped or failed job raises and
    keeps nothing)."""
    return cache.get(key, lambda: ran(fn, checkpoint, *args, stop=stop, watch=watch))


def ran(
    fn: Callable[..., T],
    checkpoint: str,
    *args: Any,
    stop: Callable[[], bool] | None = None,
    watch: Watch | None = None,
) -> T:
    """``fn((model, meta), *args)`` of the checkpoint at path ``checkpoint`` as a heavy job (under
    :data:`heavy_gate`); ``stop`` stops it, also while it waits for a slot; ``watch`` receives the job."""
    with heavy_gate:
        if stop is not None and stop():
            raise Cancelled("the job was stopped before it started")
        eng = engine()
        job = eng.submit(fn, eng.model(checkpoint, load_checkpoint), *args)
        if watch is not None:
            watch.job = job
        try:
            return job.result(stop=stop)
        finally:
            if not job.done():  # the wait ended in an error of its own: the worker is freed all the same
                job.stop()


def watched(
    request: Any, work: Callable[[Callable[[], bool], Watch], T], holds: bool = True, unit: str = "images"
) -> Iterator[tuple[T | None, str]]:
    """Run ``work(stop, watch)`` as the user's one heavy job (:func:`one_per_user`; ``holds=False`` for a job the
    page starts by itself), in a thread a closed page stops (:func:`app.common.stoppable`): yields
    ``(None, progress in words)`` while it runs (counted in ``unit``), then ``(result, "")``. A handler yields its
    own first value before calling this, so a job cancelled before it starts holds no slot."""
    watch = Watch()
    with one_per_user(request, holds):
        for result in stoppable(lambda stop: work(stop, watch)):
            yield result, watch.note(unit) if result is None else ""


def user_of(request: Any) -> str:
    """Who asks: the login's name, else the browser tab's or API client's session."""
    return str(getattr(request, "username", None) or getattr(request, "session_hash", None) or "anonymous")


class Busy(ValueError):
    """A user asked for a second heavy job while one of theirs runs (a ValueError: shown as is)."""


@contextmanager
def one_per_user(request: Any, holds: bool = True) -> Iterator[None]:
    """Run a heavy job for the user of ``request``, refused with :class:`Busy` while another of theirs runs. A job
    the page starts by itself (``holds=False``: the playground measuring a new model's heads) is refused alike but
    holds no turn, so a job the user asks for meanwhile is not refused because of it."""
    user = user_of(request)
    with _lock:
        if _running[user]:
            raise Busy(BUSY)
        _running[user] += holds
    try:
        yield
    finally:
        with _lock:
            _running[user] -= holds
            if not _running[user]:
                del _running[user]
        memory.return_free_memory()  # the job's activations, freed, leave the resident set


def waiting(request: Any, concurrency_id: str = HEAVY) -> tuple[int, int]:
    """(running, waiting) jobs of a queue, read from Gradio's queue of the app serving ``request``."""
    try:
        group = request.request.app.get_blocks()._queue.event_queue_per_concurrency_id[concurrency_id]
    except (AttributeError, KeyError):  # not served yet, or nothing ever queued there
        return 0, 0
    return int(group.current_concurrency), len(group.queue)


def busy_note(request: gr.Request) -> str:
    """What the page says on a heavy click: nothing when a slot is free, else how many jobs are ahead."""
    running, queued = waiting(request)
    if running < HEAVY_LIMIT and not queued:
        return ""
    return (
        f"⏳ Busy, {running + queued} ahead of you ({running} running, {queued} waiting) in the queue of validation "
        "and head-importance jobs: yours starts when a slot frees, its place shows on the panels."
    )
