"""Training faults. A SIGKILL in the middle of a checkpoint save (made deterministic: the save is held,
half-written, until the test kills the process) leaves the previous checkpoint loadable, and ``--resume`` ends with
the weights of an uninterrupted run; a disk that fills up mid-run stops with a clear message and loses nothing; a
full disk or an unusable output folder is refused before training starts.
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from ssog_core.checkpoint import weights as checkpoint
from ssog_core.checkpoint.format import load_checkpoint, read_checkpoint
from ssog_core.cli import train
from ssog_core.train import trainer
from tests.helpers import assert_same_weights

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--dim", "16", "--depth", "1", "--heads", "2", "--atoms", "2", "--batch-size", "8", "--no-progress"]
RUN = ["--data", "shapes:size=16,train=48,val=16,classes=3", *TINY, "--epochs", "2", "--ckpt-every", "2"]
# 6 steps per epoch; save() at steps 2, 4, 6, 8, 10, 12 (last.safetensors, then train_state.pt), then the final pair.

# Runs training with one writer held: on its N-th call the file is written, cut to half (a save interrupted part
# way), its temporary name is written to MARKER, and the process sleeps until the test kills it.
HOLD_SAVE = """
import sys, time
from pathlib import Path
import torch
from ssog_core.checkpoint import weights as checkpoint
from ssog_core.cli import train

which, nth, marker = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
calls = 0

def held(real):
    def write(obj, tmp, *args, **kwargs):
        global calls
        calls += 1
        real(obj, tmp, *args, **kwargs)
        if calls == nth:
            data = Path(tmp).read_bytes()
            Path(tmp).write_bytes(data[: len(data) // 2])
            marker.write_text(str(tmp))
            time.sleep(600)
    return write

if which == "last.safetensors":
    checkpoint.save_file = held(checkpoint.save_file)
else:
    torch.save = held(torch.save)
sys.exit(train.main(sys.argv[4:]))
"""


THREADS = 2  # torch threads of every training here, in this process and in its children: sums depend on them


@contextmanager
def pinned_threads() -> Iterator[None]:
    """Train with :data:`THREADS` threads whatever an earlier test in this worker process left set."""
    before = torch.get_num_threads()
    torch.set_num_threads(THREADS)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@pytest.fixture(autouse=True)
def _pinned() -> Iterator[None]:
    with pinned_threads():
        yield


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("uninterrupted") / "run"
    with pinned_threads():
        assert train.main([*RUN, "--out", str(out)]) == 0
    return out


def leftovers(out: Path) -> list[str]:
    return sorted(p.name for p in out.iterdir() if p.name.endswith(".tmp"))


@pytest.mark.slow
@pytest.mark.parametrize("which", ["last.safetensors", "train_state.pt"])
def test_sigkill_during_a_save_keeps_the_previous_checkpoint_and_resume_finishes_the_same(
    which, uninterrupted, tmp_path, capsys
):
    out, marker = tmp_path / "run", tmp_path / "held"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": str(THREADS)}  # as the runs in this process
    cmd = [sys.executable, "-c", HOLD_SAVE, which, "2", str(marker), *RUN, "--out", str(out)]
    with subprocess.Popen(cmd, cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True) as proc:
        deadline = time.monotonic() + 180
        while not marker.exists():
            assert proc.poll() is None, proc.stderr.read()[-3000:]
            assert time.monotonic() < deadline, "the second save never started"
            time.sleep(0.1)
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
    partial = Path(marker.read_text())
    assert partial.parent == out and partial.stat().st_size > 0 and leftovers(out) == [partial.name]
    # the checkpoint on disk is a complete one: step 2 (killed while writing step 4's), or step 4 when the kill
    # came after last.safetensors was replaced, while train_state.pt (step 2) was being written
    model, meta = load_checkpoint(out / "last.safetensors")
    assert meta["step"] == (2 if which == "last.safetensors" else 4) and meta["finished"] is False
    assert torch.load(out / "train_state.pt", weights_only=True)["step"] == 2
    assert train.main(["--out", str(out), "--resume", "--no-progress"]) == 0
    assert "removed 1 unfinished temporary file(s)" in capsys.readouterr().err
    assert leftovers(out) == []
    assert_same_weights(uninterrupted / "last.safetensors", out / "last.safetensors")
    assert_same_weights(uninterrupted / "model.safetensors", out / "model.safetensors")
    assert read_checkpoint(out / "last.safetensors")[2]["step"] == 12


def enospc() -> OSError:
    """A real ENOSPC from the kernel (writing to /dev/full), or a made one where that device is missing."""
    try:
        with open("/dev/full", "wb") as f:
            f.write(b"x")
            f.flush()
    except OSError as e:
        return e
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


@pytest.mark.slow
def test_disk_full_mid_run_stops_clearly_and_loses_nothing(uninterrupted, tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    real, calls = checkpoint.save_file, {"n": 0}
    error = enospc()
    assert error.errno == errno.ENOSPC

    def fills_up(state, tmp, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:  # step 6's save: half the bytes land, then the disk is full
            Path(tmp).write_bytes(b"\0" * 4096)
            raise error
        real(state, tmp, **kwargs)

    monkeypatch.setattr(checkpoint, "save_file", fills_up)
    assert train.main([*RUN, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "could not write the checkpoint at step 6: No space left on device" in err, err[-2000:]
    assert f"the last complete checkpoint, {out / 'last.safetensors'}, is intact" in err and "--resume" in err
    assert "Traceback" not in err and leftovers(out) == []  # the temporary file was removed
    assert read_checkpoint(out / "last.safetensors")[2]["step"] == 4
    monkeypatch.setattr(checkpoint, "save_file", real)  # space freed: continue
    assert train.main(["--out", str(out), "--resume", "--no-progress"]) == 0
    assert_same_weights(uninterrupted / "last.safetensors", out / "last.safetensors")


def test_disk_full_while_writing_the_training_state(tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    error = enospc()

    def full(obj, f, *args, **kwargs):
        raise error

    monkeypatch.setattr(torch, "save", full)
    assert train.main([*RUN, "--out", str(out), "--epochs", "1"]) == 2
    err = capsys.readouterr().err
    assert "could not write the checkpoint at step 2: No space left on device" in err and "Traceback" not in err
    assert leftovers(out) == []


def test_space_check_estimate_covers_what_a_run_writes(uninterrupted, tmp_path, monkeypatch, capsys):
    """The free-space check before training asks for at least what the run's files and their temporary copies take."""
    asked = []
    monkeypatch.setattr(trainer, "check_space", lambda out, need_bytes: asked.append(need_bytes))
    assert train.main([*RUN, "--out", str(tmp_path / "r"), "--epochs", "1", "--stop-after", "1"]) == 0
    written = sum(p.stat().st_size for p in uninterrupted.iterdir() if p.suffix in (".safetensors", ".pt"))
    assert asked and asked[0] >= written + (uninterrupted / "train_state.pt").stat().st_size


@pytest.mark.parametrize("kind", ["file", "under_a_file"])
def test_unusable_output_folder_fails_before_training(kind, tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    out = blocker if kind == "file" else blocker / "run"
    t = time.perf_counter()
    assert train.main([*RUN, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"cannot write to --out {out}" in err and "epoch" not in err and "Traceback" not in err
    assert time.perf_counter() - t < 5  # before the data is even opened


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_read_only_output_folder_fails_before_training(tmp_path, capsys):
    out = tmp_path / "ro"
    out.mkdir()
    out.chmod(0o500)
    try:
        assert train.main([*RUN, "--out", str(out)]) == 2
        assert "cannot write to --out" in capsys.readouterr().err
    finally:
        out.chmod(0o700)
