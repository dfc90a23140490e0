"""Child runs (training, evaluation) that never outlive the script that started them.

A run starts in a session of its own (so a terminal's Ctrl-C reaches the driver, not the run) under a small
watchdog, this file run as a script: ``python child_runs.py FD CMD...``. The watchdog runs ``CMD`` in its own
process group and holds the read end ``FD`` of a pipe whose only write end stays in the driver. However the driver
ends (Ctrl-C, SIGTERM, an exception, SIGKILL), the kernel closes that write end; the watchdog reads end-of-file and
kills its whole group with SIGKILL: the run and anything the run started. A driver stopped politely, within
:func:`stop_children_on_signal`, first sends each run SIGTERM and waits for it (a training run saves, then ends).

This file imports only the standard library, so the watchdog starts in milliseconds (``ssog_core`` imports torch).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import IO

_running: set[int] = set()  # the process group of each run now running (its watchdog's pid)
_running_lock = threading.RLock()  # re-entrant: the signal handler takes it in a thread that may hold it
_stopping = threading.Event()  # set by a stop signal: no run starts any more


class Stopped(BaseException):
    """The driver is stopping (a signal within :func:`stop_children_on_signal`): no run starts. A BaseException,
    as SystemExit, so that a loop that carries on past a failed run does not carry on past this."""


def refuse_if_stopping() -> None:
    """Raise :class:`Stopped` once the driver is stopping; a driver may call it before it records a start."""
    if _stopping.is_set():
        raise Stopped("stopping: no new run starts")


def run_child(
    cmd: Sequence[str], log: IO, cwd: Path | str | None = None, env: Mapping[str, str] | None = None
) -> tuple[int, float]:
    """Run ``cmd`` to its end under the watchdog, its output appended to ``log``; its exit code (128 + N when
    signal N ended it) and the CPU seconds (user + system) it and everything it waited for used.

    Safe from many threads at once: nothing runs in the forked child before exec (no ``preexec_fn``).
    """
    refuse_if_stopping()
    read, write = os.pipe()  # neither end is inheritable; pass_fds hands the watchdog the read end only
    try:
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", __file__, str(read), *cmd],
            cwd=cwd,
            env=None if env is None else dict(env),
            stdout=log,
            stderr=subprocess.STDOUT,
            pass_fds=(read,),
            start_new_session=True,
        )
    except BaseException:
        os.close(write)
        raise
    finally:
        os.close(read)
    with _running_lock:
        _running.add(proc.pid)
        late = _stopping.is_set()  # a stop came while it started: it missed the SIGTERM the others had
    try:
        if late:
            with suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        except BaseException:
            if _stopping.is_set():  # the stop handler ran in this thread: the run has its SIGTERM, let it end
                os.wait4(proc.pid, 0)
            raise
        proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait for it again
    finally:
        with _running_lock:
            _running.discard(proc.pid)
        os.close(write)  # were the wait interrupted, the watchdog now ends the run
    return proc.returncode, usage.ru_utime + usage.ru_stime


@contextmanager
def stop_children_on_signal() -> Iterator[None]:
    """Within this block (entered in the main thread) SIGTERM and SIGINT send SIGTERM to every running child run's
    group, refuse new runs (:class:`Stopped`) and end the driver as they would have (``SystemExit(143)``,
    ``KeyboardInterrupt``), while the threads waiting for the runs see them end. Enter it before the pool of threads
    that start runs, so that it is left after them. Without it a signal still ends the runs, by SIGKILL."""

    def stop(signum: int, frame: object) -> None:
        with _running_lock:
            _stopping.set()
            groups = list(_running)
        for group in groups:
            with suppress(ProcessLookupError):
                os.killpg(group, signal.SIGTERM)
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise SystemExit(128 + signum)

    previous = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        _stopping.clear()


def _watch(fd: int, argv: list[str]) -> int:
    """The watchdog: run ``argv`` in this process's group; at end-of-file on ``fd`` (the driver is gone) kill the
    group, this process included. A SIGTERM to the group is the run's to handle: the watchdog waits for it."""
    signal.signal(signal.SIGTERM, lambda signum, frame: None)  # a handler, not SIG_IGN: exec resets it for the run
    run = subprocess.Popen(argv)

    def watch() -> None:
        while os.read(fd, 1):  # nothing is ever written: this returns only at end-of-file
            pass
        os.killpg(0, signal.SIGKILL)

    threading.Thread(target=watch, daemon=True).start()
    code = run.wait()
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    sys.exit(_watch(int(sys.argv[1]), sys.argv[2:]))
