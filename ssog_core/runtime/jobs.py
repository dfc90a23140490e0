"""Heavy jobs out of the serving process: one :class:`Engine` runs them in worker processes, either a local pool
(``concurrent.futures.ProcessPoolExecutor``, spawned, niced, torch threads capped) or a Dask cluster
(``distributed.Client(address).get_executor()``), behind one submit API.

A job is a module-level function ``fn(*args, progress, stopped, **kwargs)``: it calls ``progress(done, total)``
(or ``progress(done, total, detail)``, a few words on where it is: "loss 0.12") as it goes and returns soon after
``stopped()`` turns true (raising :class:`Cancelled`). Both callables cross the process boundary: a multiprocessing
manager's objects for the local pool, the scheduler's ``Variable`` and ``Event`` for Dask (remote workers share no
file system and no memory with the server). A :class:`ModelRef` among the
arguments arrives on the worker as the ``(model, meta)`` its loader opens (the caller's, e.g.
``ssog_core.checkpoint.format.load_checkpoint``: this module imports no domain module), found by path or sent as
bytes, checked against its SHA-256 and cached per worker by it.

A worker computes on its GPU when it has one (``device="auto"``, :func:`worker_device`): the model and the job's
tensors go there, TF32 off so the numbers differ from a CPU worker's by float32 rounding only, and the result comes
back on the CPU (the server may have no GPU).

Faults end in words, never in a hang: a worker killed mid-job runs the job again once (the local pool; Dask's
scheduler retries by itself), then :class:`JobError`; a scheduler unreachable at start or lost later gives a
:class:`JobError` naming its address.
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import hashlib
import multiprocessing
import os
import tempfile
import threading
import uuid
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from time import monotonic
from typing import Any, Generic, TypeVar

import torch
from torch import nn

from ssog_core.runtime import memory
from ssog_core.runtime.folders import FolderError, fingerprint, pack, unpack
from ssog_core.runtime.lru import LRU

HEAVY_LIMIT = 2  # heavy jobs at once on the serving machine: the local pool's workers, the app's heavy slots
THREADS = 1  # torch threads per job, on every worker: a job's numbers depend on it, so it travels with the job
# Local workers' niceness: when both want a core, the serving process weighs 28 times a worker (Linux's weights
# 1024 and 36), so light work keeps nearly both cores; at 5 (a third of the server's weight) light p95 under 32
# clients at a person's pace was ×3–4 its alone figure (docs/RELIABILITY.md §1). Idle cores still go to the jobs.
NICE = 15
CONNECT_TIMEOUT = 5.0  # seconds to reach a Dask scheduler, at start and when reconnecting
POLL = 0.2  # seconds between looks at a running job (stop asked? scheduler still there?)
WORKER_MODELS = 4  # models a worker keeps in memory, by content hash
DEVICES = ("auto", "cpu", "cuda")  # where a worker computes: its GPU if it has one, or the one named
CPU = torch.device("cpu")

T = TypeVar("T")
Loaded = tuple[nn.Module, dict[str, Any]]
Loader = Callable[[Path], Loaded]  # opens a checkpoint file or model folder; module level, as it crosses by name


class JobError(RuntimeError):
    """A heavy job that could not run or finish, with a sentence that says why (never cached: it raises)."""


class Cancelled(RuntimeError):
    """A computation stopped by its caller (its ``stop()`` or ``stopped()`` returned true): a job, or a pass over
    validation images."""


# ------------------------------------------------------------------------------------------------- models


@lru_cache(maxsize=64)
def _hash_file(path: str, mtime_ns: int, size: int) -> str:
    try:
        return hashlib.sha256(pack(path)).hexdigest()
    except FolderError as e:
        raise JobError(f"{e}, not a model") from None


def file_sha256(path: str | Path) -> str:
    """SHA-256 of a file's contents (a model folder's: of :func:`~ssog_core.runtime.folders.pack`), hashed once
    per :func:`~ssog_core.runtime.folders.fingerprint`."""
    return _hash_file(*fingerprint(path))


@dataclass(frozen=True)
class ModelRef:
    """A checkpoint as a job's argument: its path, content hash and the ``loader`` that opens it on the worker,
    plus its bytes when the worker may not share the server's files. The worker refuses a file whose content is not
    ``sha256``."""

    path: str
    sha256: str
    loader: Loader
    data: bytes | None = field(default=None, repr=False)
    folder: bool = False  # a model folder (timm / transformers): its bytes are pack()'s

    @classmethod
    def of(cls, path: str | Path, loader: Loader, with_bytes: bool = False) -> ModelRef:
        path = Path(path).resolve()
        if not with_bytes:
            return cls(str(path), file_sha256(path), loader, folder=path.is_dir())
        try:
            data = pack(path)
        except FolderError as e:
            raise JobError(f"{e}, not a model") from None
        return cls(str(path), hashlib.sha256(data).hexdigest(), loader, data, path.is_dir())

    @property
    def name(self) -> str:
        return Path(self.path).name


_models: LRU[Loaded] = LRU(WORKER_MODELS)  # this worker's models by content hash, loader and device


def load_ref(ref: ModelRef, device: torch.device = CPU) -> Loaded:
    """The model behind ``ref`` in this process, on ``device``: from the cache by hash, else from the bytes sent or
    the file at its path, whose content must hash to ``ref.sha256`` (a file that differs here is refused, never
    used)."""
    return _models.get((ref.sha256, ref.loader, str(device)), lambda: _load(ref, device))


def _load(ref: ModelRef, device: torch.device) -> Loaded:
    where = f"worker {os.uname().nodename} (pid {os.getpid()})"
    if ref.data is not None:
        data = ref.data
    else:
        try:
            data = pack(ref.path)
        except OSError as e:
            raise JobError(f"{ref.name}: {where} cannot read {ref.path} ({e.strerror or e}); send the checkpoint "
                           "as bytes (workers that do not share the server's files)") from None  # fmt: skip
        except FolderError as e:
            raise JobError(f"{ref.name}: {e} on {where}") from None
    got = hashlib.sha256(data).hexdigest()
    if got != ref.sha256:
        source = "the bytes sent" if ref.data is not None else f"{ref.path} on {where}"
        raise JobError(f"{ref.name}: {source} differ from the server's checkpoint (SHA-256 {got[:12]}… instead of "
                       f"{ref.sha256[:12]}…): refused rather than computed on another model")  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="ssog-job-") as tmp:  # the file as verified, under its own name
        verified = Path(tmp) / ref.name
        if ref.folder:  # names are the packer's own (files of one folder), checked all the same
            verified.mkdir()
            try:
                unpack(data, verified, cap=len(data))  # stored, not compressed: never more than the archive
            except FolderError as e:
                raise JobError(f"{ref.name}: refused packed folder: {e}") from None
        else:
            verified.write_bytes(data)
        model, meta = ref.loader(verified)
    model.requires_grad_(False).to(device)
    return model, meta


# ------------------------------------------------------------------------------------------------ channels


class Channel:
    """A job's progress and stop flag, shared by the server and the worker that runs it."""

    def report(self, done: int, total: int, detail: str = "") -> None:
        raise NotImplementedError

    def read(self) -> tuple[int, int, str]:
        """(done, total, detail) as the job last reported them."""
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def stopped(self) -> bool:
        raise NotImplementedError

    def close(self) -> None:
        """Release what the channel holds outside this process (after the job ended)."""


class PoolChannel(Channel):
    """Through a multiprocessing manager's objects: its proxies reach the pool's workers (same machine, same
    authentication key)."""

    def __init__(self, manager: Any) -> None:
        self._stop = manager.Event()
        self._state = manager.list([0, 0, ""])

    def report(self, done: int, total: int, detail: str = "") -> None:
        self._state[:] = [int(done), int(total), str(detail)]

    def read(self) -> tuple[int, int, str]:
        done, total, detail = self._state._getvalue()
        return done, total, detail

    def stop(self) -> None:
        self._stop.set()

    def stopped(self) -> bool:
        return self._stop.is_set()


class DaskChannel(Channel):
    """Through the scheduler's ``Variable`` and ``Event``, which every worker of the cluster reaches."""

    def __init__(self, client: Any) -> None:
        from distributed import Event, Variable

        name = f"ssog-job-{uuid.uuid4().hex}"
        self._stop, self._state = Event(name, client), Variable(name, client)
        self._state.set([0, 0, ""])
        self._last = (0, 0, "")

    def report(self, done: int, total: int, detail: str = "") -> None:
        self._state.set([int(done), int(total), str(detail)])

    def read(self) -> tuple[int, int, str]:
        try:
            done, total, detail = self._state.get(timeout=1)
            self._last = (done, total, detail)
        except Exception:  # the scheduler is gone: the last figure seen (the job itself ends in words)
            pass
        return self._last

    def stop(self) -> None:
        with suppress(Exception):  # no scheduler, no job left to stop
            self._stop.set()

    def stopped(self) -> bool:
        return bool(self._stop.is_set())

    def close(self) -> None:
        with suppress(Exception):  # the scheduler is gone, and what it held with it
            self._state.delete()
            self._stop.clear()


def worker_device(choice: str) -> torch.device:
    """Where this worker computes: ``auto`` its first GPU if it has one, else its CPU; ``cpu``; ``cuda`` (refused in
    words on a worker without one). On a GPU, TF32 is turned off for this process (a worker's own), so the numbers
    differ from a CPU worker's by float32 rounding, not by TF32's 10-bit mantissa."""
    if choice not in DEVICES:
        raise JobError(f"unknown worker device {choice!r}: one of {', '.join(DEVICES)}")
    if choice == "cpu" or (choice == "auto" and not torch.cuda.is_available()):
        return CPU
    if not torch.cuda.is_available():
        raise JobError(f"worker {os.uname().nodename} (pid {os.getpid()}) has no CUDA GPU; the job asked for one")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    return torch.device("cuda")


def moved(value: T, device: torch.device) -> T:
    """``value`` with every tensor in it on ``device``: through dicts, lists, tuples and dataclasses (a job's
    arguments and results); other objects as they are."""
    if isinstance(value, torch.Tensor):
        return value.to(device)  # type: ignore[return-value]
    if isinstance(value, dict):
        return {k: moved(v, device) for k, v in value.items()}  # type: ignore[return-value]
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a named tuple takes its fields one by one
        return type(value)(*(moved(v, device) for v in value))  # type: ignore[return-value]
    if isinstance(value, (list, tuple)):
        return type(value)(moved(v, device) for v in value)  # type: ignore[return-value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: moved(getattr(value, f.name), device) for f in dataclasses.fields(value) if f.init}
        return dataclasses.replace(value, **fields)
    return value


def run_job(
    fn: Callable[..., T], args: tuple, kwargs: dict[str, Any], channel: Channel, threads: int, device: str = "auto"
) -> T:
    """What a worker runs: the thread cap, then ``fn`` with its models loaded on the worker's device
    (:func:`worker_device`) and its channel's two callables; on a GPU the job's tensors go there and its result
    comes back on the CPU. The memory the job freed goes back to the system when it ends (a worker otherwise keeps
    its largest job's size), and the process's thread count is put back (a Dask worker may be threads of another
    process, whose later sums would otherwise change)."""
    before = torch.get_num_threads()
    if before != threads:
        torch.set_num_threads(threads)
    try:
        if channel.stopped():
            raise Cancelled("the job was stopped before it started")
        where = worker_device(device)
        on_gpu = where.type != "cpu"

        def arrived(value: Any) -> Any:
            """An argument as the job takes it: a model loaded, tensors on the worker's device."""
            if isinstance(value, ModelRef):
                return load_ref(value, where)
            return moved(value, where) if on_gpu else value

        args = tuple(arrived(a) for a in args)
        kwargs = {k: arrived(v) for k, v in kwargs.items()}
        out = fn(*args, progress=channel.report, stopped=channel.stopped, **kwargs)
        return moved(out, CPU) if on_gpu else out
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)
        memory.return_free_memory()


def _init_worker(threads: int, nice: int) -> None:
    """A local worker's start: lower CPU priority, capped torch threads, two malloc arenas."""
    os.nice(nice)
    torch.set_num_threads(threads)
    memory.limit_malloc_arenas()


# ------------------------------------------------------------------------------------------------ backends


class Backend:
    """Where jobs run: the executor, the channel kind, and how a lost worker or scheduler shows."""

    where = ""
    shared_files = True  # workers read checkpoints by path (else they are sent as bytes)
    resubmits = 0  # times a job whose worker died is submitted again (0 where the scheduler retries by itself)

    def executor(self) -> cf.Executor:
        raise NotImplementedError

    def channel(self) -> Channel:
        raise NotImplementedError

    def worker_lost(self, error: BaseException) -> bool:
        raise NotImplementedError

    def recover(self, broken: cf.Executor) -> None:
        """Replace an executor that a lost worker broke (no-op where the scheduler copes by itself)."""

    def lost(self) -> str | None:
        """Why no job can finish now (the scheduler is gone), or None."""
        return None

    def close(self) -> None:
        raise NotImplementedError


class LocalPool(Backend):
    """Spawned worker processes on this machine (spawn: the server has threads, and fork would copy their
    locks), niced and with capped torch threads; a pool broken by a killed worker is replaced and its jobs
    submitted once more."""

    resubmits = 1

    def __init__(self, workers: int = HEAVY_LIMIT, threads: int = THREADS, nice: int = NICE) -> None:
        self._context = multiprocessing.get_context("spawn")
        self._workers, self._threads, self._nice = workers, threads, nice
        self._lock = threading.Lock()
        self._pool: cf.ProcessPoolExecutor | None = None
        self._manager: Any = None
        self.where = f"a local pool of {workers} worker process{'es' if workers != 1 else ''}"

    def _new_pool(self) -> cf.ProcessPoolExecutor:
        init = (self._threads, self._nice)
        return cf.ProcessPoolExecutor(self._workers, self._context, initializer=_init_worker, initargs=init)

    def executor(self) -> cf.Executor:
        with self._lock:
            if self._pool is None:
                self._pool = self._new_pool()
            return self._pool

    def channel(self) -> Channel:
        with self._lock:
            if self._manager is None:
                self._manager = self._context.Manager()
        return PoolChannel(self._manager)

    def worker_lost(self, error: BaseException) -> bool:
        from concurrent.futures.process import BrokenProcessPool

        return isinstance(error, BrokenProcessPool)

    def recover(self, broken: cf.Executor) -> None:
        with self._lock:
            if self._pool is broken:  # the first job to notice replaces it; the others find the new one
                self._pool = self._new_pool()
        broken.shutdown(wait=False)  # its jobs have all failed with it, each submitted again once

    def close(self) -> None:
        with self._lock:
            pool, manager, self._pool, self._manager = self._pool, self._manager, None, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
        if manager is not None:
            manager.shutdown()


class DaskCluster(Backend):
    """A Dask scheduler's workers, through ``distributed.Client(address).get_executor()``. Unreachable at start:
    :class:`JobError`; lost later: running jobs end in words, and new ones reconnect or are refused. A job whose
    worker died runs again on another (the scheduler's ``distributed.scheduler.allowed-failures`` times)."""

    def __init__(self, address: str, shared_files: bool = False, timeout: float = CONNECT_TIMEOUT) -> None:
        self.address, self.shared_files, self._timeout = address, shared_files, timeout
        self.where = f"the Dask scheduler at {address}"
        self._lock = threading.Lock()
        self._client = self._connect()
        self._executor = self._client.get_executor(pure=False)

    def _connect(self) -> Any:
        from distributed import Client

        try:
            return Client(self.address, timeout=self._timeout, set_as_default=False)
        except (OSError, TimeoutError, ValueError) as e:
            raise JobError(f"cannot reach the Dask scheduler at {self.address} within {self._timeout:g} s "
                           f"({type(e).__name__}: {e}); heavy jobs were not started") from None  # fmt: skip

    def executor(self) -> cf.Executor:
        with self._lock:
            if self._client.status != "running":
                with suppress(Exception):  # closing a client whose scheduler is gone can fail inside
                    self._client.close()  # distributed ("Cannot change state of expiring Timeout"): it is gone anyway
                self._client = self._connect()
                self._executor = self._client.get_executor(pure=False)
            return self._executor

    def channel(self) -> Channel:
        try:
            return DaskChannel(self._client)
        except OSError as e:  # lost between connecting and now
            raise JobError(f"cannot reach the Dask scheduler at {self.address} ({type(e).__name__}: {e}); "
                           "the job was not started") from None  # fmt: skip

    def worker_lost(self, error: BaseException) -> bool:
        from distributed.scheduler import KilledWorker

        return isinstance(error, KilledWorker)

    def lost(self) -> str | None:
        if self._client.status == "running":
            return None
        return f"lost the Dask scheduler at {self.address} while the job ran; it did not finish"

    def close(self) -> None:
        self._client.close()


# ------------------------------------------------------------------------------------------------ jobs


class Job(Generic[T]):
    """One submitted job: its progress, a stop that reaches the worker, and its result or the reason it has none.
    A job whose worker died is submitted again as soon as that shows (``Backend.resubmits``), whether or not
    anyone waits for it yet."""

    def __init__(self, engine: Engine, fn: Callable[..., T], args: tuple, kwargs: dict[str, Any]) -> None:
        self._backend, self._threads, self._device = engine.backend, engine.threads, engine.device
        self._call = (fn, args, kwargs)
        self._backend.executor()  # connected (or refused in words) before the channel is made on it
        self._channel = self._backend.channel()
        self._stop_asked = False
        self._attempts = 0
        self._ended = threading.Event()
        self._last: cf.Future[T] | None = None  # the attempt that ended the job
        self._submit()

    def _submit(self) -> None:
        fn, args, kwargs = self._call
        self._attempts += 1
        self._executor = self._backend.executor()
        try:
            future = self._executor.submit(run_job, fn, args, kwargs, self._channel, self._threads, self._device)
        except Exception as e:  # a pool found broken at submission: replaced, and the job submitted again
            if not self._backend.worker_lost(e) or self._attempts > self._backend.resubmits:
                raise
            self._backend.recover(self._executor)
            return self._submit()
        future.add_done_callback(self._attempt_ended)

    def _attempt_ended(self, future: cf.Future[T]) -> None:
        error = None if future.cancelled() else future.exception()
        if (error is not None and self._backend.worker_lost(error) and not self._stop_asked
                and self._attempts <= self._backend.resubmits):  # fmt: skip
            try:
                self._backend.recover(self._executor)
                self._submit()
                return
            except Exception:  # cannot submit again: the job ends with its worker's death
                pass
        self._last = future
        self._ended.set()

    @property
    def progress(self) -> tuple[int, int]:
        """(done, total) as the job last reported it; (0, 0) before it started."""
        return self._channel.read()[:2]

    def note(self, unit: str = "images") -> str:
        """The job's state in words, e.g. "computing 120 of 500 images", and its detail when it gave one
        ("computing 40 of 300 steps: loss 0.12")."""
        done, total, detail = self._channel.read()
        if not total:
            return "waiting for a worker"
        return f"computing {done} of {total} {unit}" + (f": {detail}" if detail else "")

    def stop(self) -> None:
        """Ask the job to stop: a waiting one ends as it starts, a running one at its next ``stopped()`` check.
        Its future is not cancelled: a cancelled task would keep its worker busy, unseen, until it ended."""
        self._stop_asked = True
        self._channel.stop()

    def done(self) -> bool:
        return self._ended.is_set()

    def result(self, timeout: float | None = None, stop: Callable[[], bool] | None = None) -> T:
        """The job's value; its own exception if it failed, :class:`Cancelled` if stopped (``stop()`` is asked
        while waiting), :class:`JobError` if its worker died each time or the scheduler was lost,
        ``TimeoutError`` after ``timeout`` seconds (the job keeps running)."""
        deadline = None if timeout is None else monotonic() + timeout
        while not self._ended.wait(POLL):
            if stop is not None and not self._stop_asked and stop():
                self.stop()
            why = self._backend.lost()
            if why:
                raise JobError(why)
            if deadline is not None and monotonic() > deadline:
                raise TimeoutError(f"the job did not finish within {timeout:g} s")
        self._channel.close()
        future = self._last
        assert future is not None
        if future.cancelled():
            if self._stop_asked:
                raise Cancelled("the job was stopped")
            raise JobError(self._backend.lost() or f"{self._backend.where} cancelled the job")
        error = future.exception()
        if error is not None and self._backend.worker_lost(error):
            raise JobError(
                f"the worker running this job died each time it ran (killed, or out of memory) on "
                f"{self._backend.where}; the job did not finish"
            )
        return future.result()


class Engine:
    """The one way heavy work leaves the serving process (module docstring). ``Engine.local()`` by default,
    ``Engine.cluster("tcp://HOST:PORT")`` for a Dask scheduler; both take the same :meth:`submit`."""

    def __init__(self, backend: Backend, threads: int = THREADS, device: str = "auto") -> None:
        if device not in DEVICES:
            raise ValueError(f"unknown worker device {device!r}: one of {', '.join(DEVICES)}")
        self.backend, self.threads, self.device = backend, threads, device

    @classmethod
    def local(
        cls, workers: int = HEAVY_LIMIT, threads: int = THREADS, nice: int = NICE, device: str = "auto"
    ) -> Engine:
        return cls(LocalPool(workers, threads, nice), threads, device)

    @classmethod
    def cluster(
        cls,
        address: str,
        threads: int = THREADS,
        shared_files: bool = False,
        timeout: float = CONNECT_TIMEOUT,
        device: str = "auto",
    ) -> Engine:
        """Jobs on the Dask scheduler at ``address`` (:class:`JobError` naming it if unreachable within ``timeout``
        seconds); ``shared_files``: workers read checkpoints at the server's paths instead of receiving them;
        ``device``: where each worker computes (:func:`worker_device`)."""
        return cls(DaskCluster(address, shared_files, timeout), threads, device)

    @property
    def where(self) -> str:
        return self.backend.where

    def model(self, path: str | Path, loader: Loader) -> ModelRef:
        """A checkpoint as a job argument that ``loader`` opens on the worker: by path where the workers share this
        machine's files, else as bytes."""
        return ModelRef.of(path, loader, with_bytes=not self.backend.shared_files)

    def submit(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> Job[T]:
        """Run ``fn(*args, progress=..., stopped=..., **kwargs)`` on a worker (``fn`` defined at module level)."""
        return Job(self, fn, args, kwargs)

    def close(self) -> None:
        self.backend.close()
