"""The app's real command line (``python -m app``) in a subprocess, waited for until it answers.

What the browser tests, the reliability tests, the screenshots and the latency and load benchmarks drive, so
that they all exercise the server a user starts, not an in-process stand-in.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType

ROOT = Path(__file__).resolve().parents[2]
READY_LINE = "SSOG Lab is serving on"  # printed by app.main.launch once Gradio's own start-up requests are done


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until_answering(url: str, timeout: float = 120.0, ready: Callable[[], bool] = lambda: True) -> float:
    """Wait until ``ready()`` holds (it is asked first, every 0.3 s, and may raise to give up) and ``url`` answers
    (200, or 401 behind a login), however slowly the machine responds: each request may take 10 s, and only
    ``timeout`` seconds in all end the wait (``TimeoutError``). Returns the seconds waited."""
    t0 = time.monotonic()
    while True:
        try:
            if ready():
                with urllib.request.urlopen(url, timeout=10) as r:
                    if r.status == 200:
                        return time.monotonic() - t0
        except urllib.error.HTTPError as e:
            if e.code == 401:
                return time.monotonic() - t0
        except OSError:
            pass
        if time.monotonic() - t0 > timeout:
            raise TimeoutError(f"{url} did not answer within {timeout:.0f} s")
        time.sleep(0.3)


class AppProcess:
    """``with AppProcess(ckpts, assets, log) as app: ... app.url ...`` (or ``start()`` … ``stop()``): started on a
    free port, with ``args`` added to its command line (``["--auth-file", FILE]``), its output in ``log`` (a file,
    not a pipe: a full pipe would block the server), stopped with SIGTERM on exit."""

    def __init__(
        self,
        checkpoint_dir: Path,
        assets_dir: Path,
        log_path: Path,
        *,
        env: dict[str, str] | None = None,
        startup_timeout: float = 120.0,
        args: Sequence[str] = (),
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        self.log_path = Path(log_path)
        self.cmd = [sys.executable, "-m", "app", "--port", str(self.port), "--checkpoint-dir", str(checkpoint_dir),
                    "--assets-dir", str(assets_dir), *args]  # fmt: skip
        self.env = {**os.environ, "PYTHONPATH": str(ROOT), "GRADIO_ANALYTICS_ENABLED": "False", **(env or {})}
        self.startup_timeout = startup_timeout
        self.startup_s = float("nan")
        self.returncode: int | None = None

    def __enter__(self) -> AppProcess:
        return self.start()

    def start(self) -> AppProcess:
        """Launch and wait until the page answers and the app has printed its address (the page answers while
        Gradio's launch() is still making start-up requests of its own); raises with the log's tail if the app
        exits or times out."""
        self._log = open(self.log_path, "w")  # noqa: SIM115 (closed in stop())
        self.proc = subprocess.Popen(self.cmd, cwd=ROOT, stdout=self._log, stderr=subprocess.STDOUT, env=self.env)

        def ready() -> bool:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the app exited with code {self.proc.returncode}")
            return READY_LINE in self.log_tail(n=None)

        try:
            self.startup_s = wait_until_answering(self.url, self.startup_timeout, ready)
        except (RuntimeError, TimeoutError) as e:
            self.stop()
            raise RuntimeError(f"{e}:\n{self.log_tail()}") from None
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log_tail(self, n: int | None = 4000) -> str:
        """The last ``n`` characters of the app's output so far (all of it for ``None``)."""
        if not self._log.closed:
            self._log.flush()
        text = self.log_path.read_text(errors="replace")
        return text if n is None else text[-n:]

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM (the app's clean stop), SIGKILL if it has not exited within ``timeout``; the exit code."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        self.returncode = self.proc.returncode
        return self.returncode
