"""ssog_core.runtime.jobs: heavy jobs in worker processes, the same tests on a local pool and on a Dask LocalCluster.

Job functions live at module level here, so that spawned workers import them by name; files in ``tmp_path`` are
only the tests' own signals (the engine's progress and stop never use the file system).
"""

from __future__ import annotations

import os
import resource
import signal
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from ssog_core.checkpoint.format import load_checkpoint
from ssog_core.interventions.effects import outcomes
from ssog_core.interventions.validation import load_eval_set
from ssog_core.runtime import memory
from ssog_core.runtime.jobs import NICE, Cancelled, Engine, JobError, ModelRef

# Workers import this module for its job functions: what only the tests need (Gradio above all) is imported in them.

SHAPES = {"data": "shapes:train=4,val=40,classes=5", "class_names": ["circle", "square", "triangle", "star", "cross"]}
WAIT = 300  # seconds a test waits for a worker at most (a worker's start imports torch: long on a loaded machine)


# ------------------------------------------------------------------------------------------ job functions


def wait_for(path: Path, seconds: float = WAIT) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear")
        time.sleep(0.02)


def counted(total: int, acks: str, progress, stopped) -> int:
    """Reports each step and waits for the test to have seen it: progress is read, not guessed."""
    for i in range(1, total + 1):
        progress(i, total, *(["the last"] if i == total else []))  # a detail, once
        wait_for(Path(acks) / str(i))
    return os.getpid()


def until_stopped(started: str, progress, stopped) -> None:
    """Runs until stopped; ``STARTED.ended`` tells the test it left its worker."""
    Path(started).touch()
    deadline = time.monotonic() + WAIT
    try:
        while time.monotonic() < deadline:
            progress(1, 2)
            if stopped():
                raise Cancelled("stopped")
            time.sleep(0.05)
        raise AssertionError("the stop never arrived")
    finally:
        Path(started + ".ended").touch()


def seen(loaded, progress, stopped) -> tuple[int, int]:
    """(this worker, how many jobs this worker's copy of the model has served)."""
    model, _ = loaded
    model.jobs_served = getattr(model, "jobs_served", 0) + 1
    return os.getpid(), model.jobs_served


def settings(progress, stopped) -> tuple[int, int]:
    return os.nice(0), torch.get_num_threads()


def fails(progress, stopped) -> None:
    raise ValueError("a bad spec, said in words")


def validation_outcomes(loaded, n: int, edits: list[dict], progress, stopped) -> list[torch.Tensor]:
    """A real job: the unedited and edited outcomes on n validation images."""
    model, meta = loaded
    data = load_eval_set(meta, model.config.img_size, n)
    o0 = outcomes(model, data, stop=stopped)
    progress(1, 2)
    o1 = outcomes(model, data, edits, stop=stopped)
    progress(2, 2)
    return [o0.pred, o0.logp_true, o1.pred, o1.logp_true]


def burn(seconds: float, progress, stopped) -> float:
    """Compute for ``seconds`` of this process's CPU time and return the CPU time spent."""
    t0 = time.process_time()
    a = torch.randn(96, 96, dtype=torch.float64)
    while time.process_time() - t0 < seconds:
        a = torch.tanh(a @ a)
    return time.process_time() - t0


def dies_once(log: str, release: str, progress, stopped) -> int:
    """Writes its pid and waits: the test kills the first attempt; the second finishes."""
    with open(log, "a") as f:
        f.write(f"{os.getpid()}\n")
    progress(1, 2)
    wait_for(Path(release))
    return os.getpid()


_kept_blocks: list[bytearray] = []  # what a job leaves alive in its worker, between freed blocks


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def frees_most_of_what_it_allocates(progress, stopped) -> tuple[int, float]:
    """3,000 blocks of 64 KiB, nine in ten freed (the rest stay alive): (this worker, its resident MB at the end)."""
    blocks = [bytearray(os.urandom(16) * 4096) for _ in range(3000)]
    _kept_blocks.extend(blocks[::10])
    del blocks
    return os.getpid(), rss_mb()


def resident(progress, stopped) -> tuple[int, float]:
    time.sleep(1.0)  # two of these at once: one per worker
    return os.getpid(), rss_mb()


def dies_always(progress, stopped) -> None:
    os.kill(os.getpid(), signal.SIGKILL)


# ------------------------------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module", params=["local", "dask"])
def engine(request):
    """One engine per kind for the module: a local pool of 2 workers; a LocalCluster of 2 worker processes of
    one thread, whose scheduler gives up on a task after its worker died twice (a retry, as the pool does)."""
    if request.param == "local":
        eng = Engine.local(workers=2)
        yield eng
        eng.close()
        return
    import dask
    from distributed import LocalCluster

    with dask.config.set({"distributed.scheduler.allowed-failures": 1}):
        cluster = LocalCluster(
            n_workers=2, processes=True, threads_per_worker=1, dashboard_address=":0", silence_logs=40
        )
    eng = Engine.cluster(cluster.scheduler_address)
    yield eng
    eng.close()
    cluster.close()


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    from ssog_core import save_checkpoint
    from tests.app_fixtures import designed_ssog

    return save_checkpoint(tmp_path_factory.mktemp("jobs") / "ssog_shapes.safetensors", designed_ssog(depth=2), SHAPES)


# ------------------------------------------------------------------------------------------ tests


def test_progress_crosses_the_process_boundary(engine, tmp_path):
    job = engine.submit(counted, 3, str(tmp_path))
    for i in range(1, 4):
        deadline = time.monotonic() + WAIT
        while job.progress != (i, 3):
            assert time.monotonic() < deadline, f"progress stayed {job.progress}, expected ({i}, 3)"
            time.sleep(0.02)
        assert job.note() == f"computing {i} of 3 images" + (": the last" if i == 3 else "")
        (tmp_path / str(i)).touch()
    assert job.result(timeout=WAIT) != os.getpid()  # it ran in a worker process


def test_a_stop_reaches_a_running_job_and_one_not_yet_started(engine, tmp_path):
    job = engine.submit(until_stopped, str(tmp_path / "started"))
    assert job.note() in ("waiting for a worker", "computing 1 of 2 images")
    wait_for(tmp_path / "started")
    job.stop()  # Future.cancel() alone would leave it running
    with pytest.raises(Cancelled):
        job.result(timeout=WAIT)
    assert (tmp_path / "started.ended").exists()  # its worker is free when the result says it stopped
    asked = engine.submit(until_stopped, str(tmp_path / "asked"))
    wait_for(tmp_path / "asked")
    with pytest.raises(Cancelled):  # the app's stop callable, asked while waiting
        asked.result(timeout=WAIT, stop=lambda: True)
    early = engine.submit(until_stopped, str(tmp_path / "never"))
    early.stop()
    with pytest.raises(Cancelled):
        early.result(timeout=WAIT)


def test_workers_run_niced_with_the_thread_cap(engine):
    nice, threads = engine.submit(settings).result(timeout=WAIT)
    assert threads == engine.threads == 1
    if engine.where.startswith("a local pool"):
        assert nice == min(19, os.nice(0) + NICE)


@pytest.mark.skipif(memory._libc() is None, reason="not glibc")
def test_a_worker_gives_back_what_a_job_freed(engine):
    pid, at_end = engine.submit(frees_most_of_what_it_allocates).result(timeout=WAIT)
    after = dict(f.result(timeout=WAIT) for f in [engine.submit(resident) for _ in range(2)])
    assert after[pid] < at_end - 100  # ~170 MB of freed blocks left the worker's resident set when the job ended


def test_a_model_is_loaded_once_per_worker_by_path_or_by_bytes(engine, checkpoint):
    refs = [engine.model(checkpoint, load_checkpoint), ModelRef.of(checkpoint, load_checkpoint, with_bytes=True)]
    assert (refs[0].data is None) == engine.backend.shared_files and refs[1].data == checkpoint.read_bytes()
    stray = ModelRef("/nowhere/ssog_shapes.safetensors", refs[1].sha256, load_checkpoint, refs[1].data)  # bytes only
    served: dict[int, list[int]] = {}
    for ref in [*refs, stray] * 2:
        pid, count = engine.submit(seen, ref).result(timeout=WAIT)
        served.setdefault(pid, []).append(count)
    for counts in served.values():  # one model object per worker: its count goes up by one per job
        assert counts == list(range(counts[0], counts[0] + len(counts)))
    assert os.getpid() not in served


def test_a_checkpoint_that_differs_on_the_worker_is_refused(engine, tmp_path):
    from ssog_core import save_checkpoint
    from tests.app_fixtures import designed_ssog

    path = save_checkpoint(tmp_path / "changed.safetensors", designed_ssog(depth=1, seed=1), SHAPES)
    ref = ModelRef.of(path, load_checkpoint)
    save_checkpoint(path, designed_ssog(depth=1, seed=2), SHAPES)  # the worker's file is another model now
    with pytest.raises(JobError, match=r"changed\.safetensors: .* differ from the server's checkpoint"):
        engine.submit(seen, ref).result(timeout=WAIT)
    with pytest.raises(JobError, match="the bytes sent differ"):
        engine.submit(seen, ModelRef(ref.path, ref.sha256, load_checkpoint, b"not this model")).result(timeout=WAIT)
    with pytest.raises(JobError, match="cannot read /nowhere/x.safetensors"):
        engine.submit(seen, ModelRef("/nowhere/x.safetensors", ref.sha256, load_checkpoint)).result(timeout=WAIT)


def test_a_real_job_gives_the_same_numbers_bit_for_bit_on_a_worker_and_in_process(engine, checkpoint):
    edits = [{"op": "swap_axes", "layer": 1, "head": 1}, {"op": "ablate_head", "layer": 0, "head": 2}]
    ref = engine.model(checkpoint, load_checkpoint)
    remote = engine.submit(validation_outcomes, ref, 40, edits).result(timeout=WAIT)
    threads = torch.get_num_threads()
    torch.set_num_threads(engine.threads)
    try:
        model, meta = load_checkpoint(checkpoint)
        here = validation_outcomes((model, meta), 40, edits, lambda d, t: None, lambda: False)
    finally:
        torch.set_num_threads(threads)
    assert not torch.equal(here[1], here[3])  # the edits change something, so equality means something
    for a, b in zip(remote, here, strict=True):
        assert a.dtype == b.dtype and torch.equal(a, b)


def test_failures_cross_as_they_are_and_only_complete_results_are_cached(engine, tmp_path):
    from ssog_core.runtime.lru import LRU

    cache: LRU[float] = LRU(4)
    with pytest.raises(ValueError, match="a bad spec, said in words"):
        cache.get("failed", lambda: engine.submit(fails).result(timeout=WAIT))
    job = engine.submit(until_stopped, str(tmp_path / "started"))
    wait_for(tmp_path / "started")
    with pytest.raises(Cancelled):
        cache.get("stopped", lambda: job.result(timeout=WAIT, stop=lambda: True))
    assert "failed" not in cache and "stopped" not in cache
    assert cache.get("done", lambda: engine.submit(burn, 0.01).result(timeout=WAIT)) > 0 and "done" in cache


@pytest.mark.slow  # three worker starts (each imports torch): over 30 s
def test_a_worker_killed_mid_job_runs_the_job_again_once_and_no_slot_leaks(engine, tmp_path):
    from app import queues

    log, release = tmp_path / "pids", tmp_path / "release"
    request = SimpleNamespace(username="ada")
    with queues.one_per_user(request):
        job = engine.submit(dies_once, str(log), str(release))
        wait_for(log)
        killed = int(log.read_text().split()[0])
        os.kill(killed, signal.SIGKILL)
        deadline = time.monotonic() + WAIT
        while len(log.read_text().split()) < 2:  # the second attempt started
            assert time.monotonic() < deadline and not job.done(), "the job was not run again"
            time.sleep(0.05)
        release.touch()
        assert job.result(timeout=WAIT) not in (killed, os.getpid())
    assert "ada" not in queues._running
    with pytest.raises(JobError, match="died each time it ran"), queues.one_per_user(request):
        engine.submit(dies_always).result(timeout=WAIT)
    assert "ada" not in queues._running
    assert engine.submit(burn, 0.01).result(timeout=WAIT) > 0  # the engine still serves


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def test_the_servers_cpu_stays_flat_while_a_job_computes(engine):
    """The server's CPU while a job computes, over what it spends idle for as long (the LocalCluster's scheduler
    lives in this process, and keeps its workers' heartbeats)."""
    engine.submit(burn, 0.01).result(timeout=WAIT)  # workers started
    t0, cpu0 = time.monotonic(), cpu_seconds()
    job_cpu = engine.submit(burn, 2.0).result(timeout=WAIT)
    wall, server_cpu = time.monotonic() - t0, cpu_seconds() - cpu0
    cpu0 = cpu_seconds()
    time.sleep(wall)
    idle_cpu = cpu_seconds() - cpu0
    assert job_cpu >= 2.0
    assert server_cpu - idle_cpu < 0.15 * job_cpu, (
        f"the server spent {server_cpu:.2f} s of CPU on a {job_cpu:.2f} s job ({idle_cpu:.2f} s idle)"
    )


def test_an_unreachable_scheduler_is_named_within_seconds():
    from ssog_core.testing.app_process import free_port

    address = f"tcp://127.0.0.1:{free_port()}"
    t0 = time.monotonic()
    with pytest.raises(JobError, match=f"cannot reach the Dask scheduler at {address} within 2 s"):
        Engine.cluster(address, timeout=2)
    assert time.monotonic() - t0 < 15


@pytest.fixture
def torch_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_a_scheduler_lost_mid_job_ends_it_in_words_and_refuses_the_next(tmp_path, torch_threads):
    from distributed import LocalCluster

    cluster = LocalCluster(n_workers=1, processes=False, threads_per_worker=1, protocol="tcp",
                           dashboard_address=":0", silence_logs=50)  # fmt: skip
    address = cluster.scheduler_address
    eng = Engine.cluster(address, timeout=2)
    try:
        job = eng.submit(until_stopped, str(tmp_path / "started"))
        wait_for(tmp_path / "started")
        cluster.close()
        t0 = time.monotonic()
        with pytest.raises(JobError, match=f"lost the Dask scheduler at {address} while the job ran"):
            job.result(timeout=WAIT)
        assert time.monotonic() - t0 < 30
        with pytest.raises(JobError, match=f"cannot reach the Dask scheduler at {address}"):
            eng.submit(burn, 0.01)
    finally:
        eng.close()


def test_the_app_does_not_start_without_its_scheduler(tmp_path):
    from app.main import main
    from ssog_core.testing.app_process import free_port

    address = f"tcp://127.0.0.1:{free_port()}"
    with pytest.raises(SystemExit, match=f"error: --cluster: cannot reach the Dask scheduler at {address} within"):
        main(["--cluster", address, "--checkpoint-dir", str(tmp_path), "--port", str(free_port())])


# ------------------------------------------------------------------------------------------ worker devices


def test_moved_takes_every_tensor_of_a_result_to_the_device_and_leaves_the_rest():
    from typing import NamedTuple

    from ssog_core.analysis.head_as_field import AtomFit, HeadFieldStats
    from ssog_core.runtime.jobs import moved

    class Pair(NamedTuple):
        first: torch.Tensor
        label: str

    def rand(*shape: int) -> torch.Tensor:
        return torch.rand(*shape, dtype=torch.float64) + 0.1

    fit = AtomFit(rand(2, 3, 2), rand(2, 3, 2), rand(2, 3), rand(2))
    stats = HeadFieldStats((7, 5), (8.0, 8.0), 1, 12, rand(2, 2), rand(2, 2), rand(2, 2), rand(2, 2), rand(2, 2),
                           rand(2, 2), rand(2, 2, 13, 9), [fit, fit])  # fmt: skip
    value = {"stats": stats, "pairs": [Pair(rand(3), "a"), (rand(1), 4)], "note": "kept"}
    meta = torch.device("meta")
    out = moved(value, meta)

    def leaves(v):
        if isinstance(v, torch.Tensor):
            yield v
        elif isinstance(v, dict):
            for x in v.values():
                yield from leaves(x)
        elif isinstance(v, (list, tuple)):
            for x in v:
                yield from leaves(x)
        elif hasattr(v, "__dataclass_fields__"):
            for name in v.__dataclass_fields__:
                yield from leaves(getattr(v, name))

    moved_leaves, original = list(leaves(out)), list(leaves(value))
    assert len(moved_leaves) == len(original) == 7 + 2 * 4 + 2  # stats, its two fits, the pairs
    assert all(t.device == meta and t.dtype == torch.float64 for t in moved_leaves)
    assert all(t.device.type == "cpu" for t in original)  # the argument itself is left as it was
    assert type(out["stats"]) is HeadFieldStats and type(out["stats"].fits[1]) is AtomFit
    assert out["stats"].grid == (7, 5) and out["stats"].images == 12 and out["note"] == "kept"
    assert type(out["pairs"][0]) is Pair and out["pairs"][0].label == "a" and out["pairs"][1][1] == 4


def test_a_worker_computes_on_its_gpu_when_it_has_one_and_says_when_it_has_none(monkeypatch):
    from ssog_core.runtime.jobs import worker_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert worker_device("auto") == torch.device("cpu") and worker_device("cpu") == torch.device("cpu")
    with pytest.raises(JobError, match="has no CUDA GPU; the job asked for one"):
        worker_device("cuda")
    with pytest.raises(JobError, match="unknown worker device 'gpu': one of auto, cpu, cuda"):
        worker_device("gpu")
    with pytest.raises(ValueError, match="unknown worker device 'tpu'"):
        Engine(None, device="tpu")  # refused before any backend is touched
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    try:
        assert worker_device("auto") == torch.device("cuda")
        assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
        assert worker_device("cpu") == torch.device("cpu")
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


def test_the_apps_local_workers_compute_where_the_app_does(monkeypatch):
    from app import queues

    monkeypatch.setattr(queues, "_engine", None)  # put back after the test
    monkeypatch.setattr(queues, "_start_workers", lambda engine: None)  # no processes: only the choice is tested
    assert queues.start_engine(on_cpu=True).device == "cpu"  # python -m app --device cpu
    assert queues.start_engine().device == "auto"  # the first engine was closed by the second
    queues.engine().close()


def test_a_job_run_in_this_process_puts_its_thread_count_back():
    """A Dask worker may be threads of another process (``processes=False``): the job's thread cap must not stay."""
    from ssog_core.runtime.jobs import run_job

    before = torch.get_num_threads()
    cap = 1 if before != 1 else 2
    channel = SimpleNamespace(report=lambda done, total: None, stopped=lambda: False)
    assert run_job(settings, (), {}, channel, cap)[1] == cap  # the job ran with its cap
    assert torch.get_num_threads() == before
