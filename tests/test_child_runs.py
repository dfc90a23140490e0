"""Child runs never outlive their driver (``ssog_core.train.child_runs``): a driver running two real child
processes (each with a grandchild, as a training run has data-loader workers) is stopped by SIGTERM, SIGINT or
SIGKILL, and no process of the runs is left; a polite stop reaches the run first (a training run saves), SIGKILL
does not wait."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from ssog_core.train import child_runs

ROOT = Path(__file__).resolve().parents[1]
# The driver loads child_runs by its path (as the watchdog does): no torch import, so it starts in a blink.
DRIVER = """
import importlib.util, sys
from concurrent.futures import ThreadPoolExecutor
spec = importlib.util.spec_from_file_location("child_runs", sys.argv[1])
cr = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cr)
child = [sys.executable, sys.argv[2]]
with open(sys.argv[3], "a") as log, cr.stop_children_on_signal(), ThreadPoolExecutor(2) as pool:
    runs = [pool.submit(cr.run_child, [*child, f"{sys.argv[4]}/run{i}"], log) for i in range(2)]
    print([r.result() for r in runs], flush=True)
"""
# A run: starts a grandchild, records both pids, and on SIGTERM records that it stopped politely (a save).
CHILD = """
import os, signal, subprocess, sys, time
stem = sys.argv[1]
grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
def polite(signum, frame):
    open(stem + ".saved", "w").close()
    sys.exit(0)
signal.signal(signal.SIGTERM, polite)
with open(stem + ".pids.tmp", "w") as f:
    f.write(f"{os.getpid()} {grandchild.pid}")
os.replace(stem + ".pids.tmp", stem + ".pids")
while True:
    time.sleep(1)
"""


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not yet reaped by its new parent, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError):
        return False


def wait_until(condition, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.fixture
def driver(tmp_path):
    """A started driver with both runs up: (process, run pids with their grandchildren, watchdog pids, folder)."""
    (tmp_path / "child.py").write_text(CHILD)
    proc = subprocess.Popen(
        [sys.executable, "-c", DRIVER, child_runs.__file__, tmp_path / "child.py", tmp_path / "log", tmp_path],
        stdout=subprocess.PIPE,
        text=True,
    )
    stems, pids = [tmp_path / f"run{i}" for i in range(2)], []
    try:
        assert wait_until(lambda: all(s.with_suffix(".pids").exists() for s in stems), 60), (
            tmp_path / "log"
        ).read_text()
        pids = [int(p) for s in stems for p in s.with_suffix(".pids").read_text().split()]
        watchdogs = children_of(proc.pid)
        assert len(watchdogs) == 2 and all(os.getpgid(w) == w for w in watchdogs)  # each its own group and session
        assert all(os.getpgid(p) in watchdogs for p in pids) and all(os.getsid(w) == w for w in watchdogs)
        yield proc, pids, watchdogs, tmp_path
    finally:
        proc.kill()
        proc.wait()
        for pid in pids:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def children_of(pid: int) -> list[int]:
    """The live processes whose parent is ``pid``."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] not in ("Z", "X"):
            found.append(int(stat.parent.name))
    return found


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stopped_driver_stops_its_runs_politely_and_waits_for_them(driver, stop):
    proc, pids, watchdogs, folder = driver
    proc.send_signal(stop)
    proc.wait(timeout=30)
    assert proc.returncode in ((143,) if stop == signal.SIGTERM else (-signal.SIGINT, 130))
    assert [s.name for s in sorted(folder.glob("*.saved"))] == ["run0.saved", "run1.saved"]  # each run saved
    assert wait_until(lambda: not any(map(alive, [*pids, *watchdogs])), 5), [p for p in pids if alive(p)]


def test_a_driver_killed_outright_takes_its_runs_with_it(driver):
    proc, pids, watchdogs, folder = driver
    proc.kill()
    proc.wait(timeout=10)
    assert wait_until(lambda: not any(map(alive, [*pids, *watchdogs])), 10), [p for p in pids if alive(p)]
    assert not list(folder.glob("*.saved"))  # nothing was asked politely: the watchdog killed the group at once


def test_run_child_reports_exit_code_and_cpu_time(tmp_path):
    busy = "import sys, time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\nsys.exit(3)"
    with open(tmp_path / "log", "a") as log:
        log.write("before\n")
        log.flush()
        code, cpu = child_runs.run_child([sys.executable, "-c", busy + "\n"], log, cwd=tmp_path)
        assert code == 3 and 0.3 <= cpu < 5
        code, _ = child_runs.run_child([sys.executable, "-c", "import os; print('x', flush=True); os.abort()"], log)
        assert code == 128 + signal.SIGABRT
        env = {**os.environ, "CHILD_RUNS_TEST": "seen"}
        cmd = [sys.executable, "-c", "import os; print(os.environ['CHILD_RUNS_TEST'], os.getcwd())"]
        assert child_runs.run_child(cmd, log, cwd=tmp_path, env=env)[0] == 0
    assert (tmp_path / "log").read_text().splitlines() == ["before", "x", f"seen {tmp_path}"]


def test_no_run_starts_once_the_driver_is_stopping(tmp_path):
    before = signal.getsignal(signal.SIGTERM)
    with open(tmp_path / "log", "a") as log:
        with child_runs.stop_children_on_signal():
            with pytest.raises(SystemExit) as e:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(5)  # the handler runs before this ends
            assert e.value.code == 143
            with pytest.raises(child_runs.Stopped):
                child_runs.run_child([sys.executable, "-c", "open('started', 'w')"], log, cwd=tmp_path)
            assert not (tmp_path / "started").exists()
        assert signal.getsignal(signal.SIGTERM) is before  # the block left: handlers as they were, runs start again
        assert child_runs.run_child([sys.executable, "-c", "open('started', 'w')"], log, cwd=tmp_path)[0] == 0
    assert (tmp_path / "started").exists()


def processes_naming(text: str) -> list[int]:
    """Live processes whose command line holds ``text``."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if text.encode() in cmdline.read_bytes() and alive(int(cmdline.parent.name)):
                found.append(int(cmdline.parent.name))
        except OSError:
            pass
    return found


@pytest.mark.slow
def test_a_training_run_under_a_stopped_driver_saves_and_resumes(tmp_path):
    """A real training run started through the launcher: SIGTERM to the driver makes it save and end, and the
    obvious ``--resume`` continues it."""
    out = tmp_path / "run"
    argv = ["-m", "ssog_core.train", "--data", "shapes:size=16,train=48,val=16,classes=3", "--dim", "16"]
    argv += ["--depth", "1", "--heads", "2", "--atoms", "2", "--batch-size", "8", "--no-progress", "--epochs", "400"]
    argv += ["--transfer-sizes", "none", "--out", str(out)]
    driver = textwrap.dedent(f"""
        import sys
        from ssog_core.train import child_runs
        with child_runs.stop_children_on_signal(), open({str(tmp_path / "log")!r}, "a") as log:
            print(child_runs.run_child([sys.executable, *{argv!r}], log, cwd={str(ROOT)!r}), flush=True)
    """)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-c", driver], env=env, cwd=ROOT)
    try:
        assert wait_until(lambda: (out / "metrics.jsonl").exists(), 120), (tmp_path / "log").read_text()
        proc.terminate()
        proc.wait(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 143
    log = (tmp_path / "log").read_text()
    assert "continue with --resume" in log and not processes_naming(str(out))
    resumed = [sys.executable, "-m", "ssog_core.train", "--out", str(out), "--resume", "--no-progress", "--stop-after"]
    step = int(log.rsplit(" at step ", 1)[1].split(";")[0])
    done = subprocess.run([*resumed, str(step + 1)], env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and f"resuming at step {step}" in done.stdout + done.stderr, done.stderr[-2000:]
