"""A run stopped at any moment, by SIGKILL or by a full disk, and continued with the obvious next command ends with
the weights of a run never stopped. The obvious command: ``--resume`` when a ``*.safetensors`` is visible in the
run folder, else the run's own command again.

The kills land at random moments (seeded) and, on purpose, between the two writes of a save (``last.safetensors``
is replaced, ``train_state.pt`` not yet), once at the first save (no state exists yet) and once later. To fit many
kills in little time the runs are forked from one warm process (``SERVER``): a start costs milliseconds, not an
interpreter and a torch import.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from fnmatch import fnmatch
from pathlib import Path

import pytest

from ssog_core.checkpoint.format import read_checkpoint
from ssog_core.cli import train
from tests.helpers import assert_same_weights

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--dim", "16", "--depth", "1", "--heads", "2", "--atoms", "2", "--batch-size", "8", "--no-progress"]
RUN = ["--data", "shapes:size=16,train=48,val=16,classes=3", *TINY, "--epochs", "2", "--ckpt-every", "2"]
# 6 steps per epoch; saves at steps 2, 4, 6, 8, 10, 12, then the final checkpoints and their transfer curve.
KILLS = 20

# One line of JSON per run on stdin: {"argv", "log", "hold", "marker", "kill_after", "here"}; answers the run's exit
# code (-9: killed). A run is forked, logs to "log" and is killed "kill_after" seconds after its start (None: never)
# or once "marker" appears: "hold" (the N-th save) makes it write the marker and wait just before train_state.pt, so
# after last.safetensors was replaced. "here": run in the server itself (the first run: it pays the one-time costs
# before any fork; logs to the server's stderr). "full_at": the N-th file synced finds the disk full after the
# fraction "part" of it was written. One thread: no OpenMP pool and no tqdm monitor, so forking is safe (checked
# before each fork), and every run alike.
SERVER = """
import errno, json, os, sys, threading, time
from pathlib import Path
import torch
import tqdm
torch.set_num_threads(1)
tqdm.tqdm.monitor_interval = 0  # no monitor thread: a fork while it held tqdm's lock left a child hung on it
from ssog_core.cli import train
from ssog_core.train import trainer

real_write = trainer.atomic_write

for line in sys.stdin:
    job = json.loads(line)
    if job["here"]:  # in this process (the first run: it pays the one-time costs before any fork)
        print(train.main(job["argv"]), flush=True)
        continue
    if threading.active_count() != 1:  # a fork copies another thread's locks held, never released in the child
        sys.exit(f"fork server: threads besides the main one: {[t.name for t in threading.enumerate()]}")
    pid = os.fork()
    if pid == 0:
        log = os.open(job["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(log, 1)
        os.dup2(log, 2)
        saves = [0]

        def held(path, write):
            if Path(path).name == "train_state.pt":
                saves[0] += 1
                if saves[0] == job["hold"]:
                    Path(job["marker"]).write_text("between the two writes")
                    time.sleep(600)
            return real_write(path, write)

        real_fsync, fsyncs = os.fsync, [0]

        def fills_up(fd):  # atomic_write syncs every file before its rename: the disk fills up there
            fsyncs[0] += 1
            if fsyncs[0] == job["full_at"]:
                path = os.readlink(f"/proc/self/fd/{fd}")
                os.truncate(path, int(os.path.getsize(path) * job["part"]))
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            real_fsync(fd)

        trainer.atomic_write, os.fsync = held, fills_up
        code = train.main(job["argv"])
        print(f"files synced: {fsyncs[0]}")
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    start, marker = time.monotonic(), Path(job["marker"])
    while True:  # the child is ours until reaped, so its pid cannot name another process when we kill it
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        held, late = marker.exists(), job["kill_after"] is not None and time.monotonic() - start >= job["kill_after"]
        if held or late:
            os.kill(pid, 9)
            status = os.waitpid(pid, 0)[1]
            break
        time.sleep(0.002)
    print(os.waitstatus_to_exitcode(status), flush=True)
"""


class Runs:
    """The fork server: :meth:`run` runs one training run (killed when asked) and returns its exit code and log."""

    def __init__(self, tmp: Path):
        env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
        self.tmp, self.n = tmp, 0
        self.proc = subprocess.Popen(
            [sys.executable, "-c", SERVER],
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,  # the server and every run it forked form one group, stopped together
        )

    def run(
        self,
        argv: list[str | Path],
        kill_after: float | None = None,
        hold: int = 0,
        here: bool = False,
        full_at: int = 0,
        part: float = 0.5,
    ) -> tuple[int, str]:
        self.n += 1
        log, marker = self.tmp / f"run{self.n}.log", self.tmp / f"held{self.n}"
        job = {"argv": [str(a) for a in argv], "log": str(log), "hold": hold, "marker": str(marker), "here": here}
        job.update(kill_after=kill_after, full_at=full_at, part=part)
        self.proc.stdin.write(json.dumps(job) + "\n")
        self.proc.stdin.flush()
        code = int(self.proc.stdout.readline())
        return code, log.read_text() if log.exists() else ""

    def close(self) -> None:
        """Ends the server; a run still going (a test stopped half-way) is killed with it, forked runs included."""
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Iterator[Runs]:
    server = Runs(tmp_path_factory.mktemp("logs"))
    yield server
    server.close()


def next_command(out: Path) -> list[str | Path]:
    """What a person would type after the run in ``out`` stopped."""
    if any(out.glob("*.safetensors")):
        return ["--out", out, "--resume", "--no-progress"]
    return [*RUN, "--out", out]


@pytest.mark.timeout(1800)  # 20 kills and their resumes: minutes on a quiet machine, many more beside busy ones
def test_sigkill_at_random_moments_then_the_obvious_command_ends_with_the_uninterrupted_weights(runs, tmp_path):
    reference = tmp_path / "uninterrupted"
    assert runs.run([*RUN, "--out", reference], here=True)[0] == 0
    t = time.monotonic()  # a forked run, as every run below: its duration is the span the kills land in
    assert runs.run([*RUN, "--out", tmp_path / "forked"])[0] == 0
    duration = time.monotonic() - t
    assert_same_weights(reference / "model.safetensors", tmp_path / "forked" / "model.safetensors")
    rng = random.Random(29)
    kills, chains, afresh = 0, 0, 0
    holds = [1, 3]  # the first chains start with a kill between the two writes of save 1 (no state yet), save 3
    budget = max(240.0, 60 * duration)  # a stuck chain, not a slow machine, should fail: scaled by one run's time
    deadline = time.monotonic() + budget
    while kills < KILLS:
        assert time.monotonic() < deadline, f"only {kills} kills in {budget:.0f} s (one run takes {duration:.1f} s)"
        chains += 1
        out, kills_here = tmp_path / f"chain{chains}", rng.randint(1, 4)
        hold = holds.pop(0) if holds else 0
        while True:
            argv = next_command(out)
            had_state = (out / "train_state.pt").exists()
            kill_after = None if kills_here == 0 or hold else rng.uniform(0, duration)
            code, text = runs.run(argv, kill_after, hold if kills_here else 0)
            hold = 0
            if "--resume" in argv and not had_state:  # stopped during its first save: started afresh, saying so
                assert "no complete training state yet" in text and "starting it afresh" in text, text[-2000:]
                afresh += 1
            if code == -signal.SIGKILL:
                kills, kills_here = kills + 1, kills_here - 1
                continue
            assert code == 0 and "Traceback" not in text, text[-3000:]
            break  # finished (a kill that came too late ends the chain early)
        assert_same_weights(reference / "last.safetensors", out / "last.safetensors")
        assert_same_weights(reference / "model.safetensors", out / "model.safetensors")
        # nothing of ours half-written; a library's own ".tmp??????" file from a kill at the very end may remain
        # (seen once in three runs; the next run's start removes it)
        assert [p.name for p in out.iterdir() if p.name.startswith(".") and not fnmatch(p.name, ".tmp??????")] == []
    assert afresh >= 1


def test_a_run_without_a_checkpoint_is_replaced_by_its_command_and_resume_says_what_to_do(tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    for name in ("train_state.pt", "metrics.jsonl"):  # left by some earlier run that never wrote a checkpoint
        (out / name).write_text("stale")
    assert train.main(["--out", str(out), "--resume"]) == 2
    assert "is not a readable training state" in capsys.readouterr().err
    (out / "train_state.pt").unlink()
    assert train.main(["--out", str(out), "--resume"]) == 2
    assert "no checkpoint was written there yet; start the run without --resume" in capsys.readouterr().err
    (out / "train_state.pt").write_text("stale")
    assert train.main([*RUN, "--out", str(out), "--epochs", "1", "--stop-after", "2"]) == 0
    err = capsys.readouterr().err
    assert "replacing the leftovers of a run" in err and "train_state.pt, metrics.jsonl" in err
    assert read_checkpoint(out / "last.safetensors")[2]["step"] == 2
    assert train.main([*RUN, "--out", str(out)]) == 2  # a checkpoint is visible: never overwritten silently
    assert "pass --resume" in capsys.readouterr().err


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="finds the file being saved through /proc")
@pytest.mark.timeout(1800)  # 13 runs
def test_disk_full_during_any_save_stops_clearly_and_the_obvious_command_finishes_the_same(runs, tmp_path):
    reference = tmp_path / "uninterrupted"
    code, text = runs.run([*RUN, "--out", reference])
    assert code == 0
    writes = int(re.search(r"files synced: (\d+)", text).group(1))
    rng = random.Random(5)
    for i, full_at in enumerate(sorted(rng.sample(range(1, writes + 1), 6))):
        out = tmp_path / f"run{i}"
        code, text = runs.run([*RUN, "--out", out], full_at=full_at, part=rng.random())
        assert code == 2 and "No space left on device" in text and "Traceback" not in text, text[-2000:]
        assert [p.name for p in out.iterdir() if p.name.endswith(".tmp")] == []  # nothing half-written
        for p in out.glob("*.safetensors"):
            read_checkpoint(p)  # every checkpoint there is complete
        code, text = runs.run(next_command(out))  # space freed
        assert code == 0, text[-2000:]
        assert_same_weights(reference / "last.safetensors", out / "last.safetensors")
        assert_same_weights(reference / "model.safetensors", out / "model.safetensors")


def test_the_next_run_removes_a_librarys_temporary_file_and_nothing_else(tmp_path):
    from ssog_core.train.output import remove_unfinished

    for name in (".tmpAbC123", ".tmpLonger12", "notes.tmp", ".last.safetensors.x1.tmp", "last.safetensors"):
        (tmp_path / name).write_bytes(b"x")
    removed = sorted(p.name for p in remove_unfinished(tmp_path))
    assert removed == [".last.safetensors.x1.tmp", ".tmpAbC123"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [".tmpLonger12", "last.safetensors", "notes.tmp"]
