"""Heavy jobs against the real server (``python -m app``): its worker processes start with it, a head-importance
sweep computes on them (the server's own CPU stays low) with the numbers of this process, and workers killed with
SIGKILL mid-job are replaced: the job runs again, the server keeps serving and the user's slot is free."""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import pytest
import torch
from gradio_client import Client

from ssog_core import load_checkpoint, save_checkpoint
from ssog_core.interventions.importance import head_importance
from ssog_core.interventions.validation import load_eval_set
from ssog_core.runtime.jobs import NICE
from ssog_core.testing.app_process import AppProcess
from tests.app_fixtures import designed_ssog, write_images
from tests.test_app_heavy_jobs import BIG

pytestmark = pytest.mark.slow  # a real server and its workers: over a minute on a loaded machine
CKPT = "ssog_big.safetensors"
PROGRESS = re.compile(r"waiting for a (heavy slot|worker)|computing \d+ of \d+ images")


def stat(pid: int) -> list[str]:
    text = Path(f"/proc/{pid}/stat").read_text()
    return text[text.rindex(")") + 2 :].split()  # the fields after the command name, from "state" on


def cpu_s(pid: int) -> float:
    fields = stat(pid)
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def workers(server: int) -> list[int]:
    """The server's living niced children: its heavy-job workers (the multiprocessing manager runs at the server's
    priority)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = stat(int(entry.name))
            except (OSError, ValueError):
                continue
            if int(fields[1]) == server and int(fields[16]) == os.nice(0) + NICE and fields[0] != "Z":
                found.append(int(entry.name))
    return sorted(found)


def until(condition, seconds: float = 300.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The server, and the checkpoint it serves."""
    root = tmp_path_factory.mktemp("live")
    (root / "ckpt").mkdir()
    path = save_checkpoint(root / "ckpt" / CKPT, designed_ssog(depth=2), BIG)
    write_images(root / "assets")
    with AppProcess(root / "ckpt", root / "assets", root / "app.log", startup_timeout=300) as app:
        yield app, path


def here(path: Path, n: int) -> dict:
    """The sweep computed in this process, with one torch thread as a worker computes."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model, meta = load_checkpoint(path)
        return head_importance(model, load_eval_set(meta, model.config.img_size, n), "zero").to_dict()
    finally:
        torch.set_num_threads(threads)


def test_a_sweep_computes_on_the_servers_workers_which_start_with_it(served):
    app, path = served
    until(lambda: len(workers(app.pid)) == 2)  # started in the background at start, before any job
    pids = workers(app.pid)
    client = Client(app.url, verbose=False)
    server0, workers0, start = cpu_s(app.pid), sum(cpu_s(p) for p in pids), time.monotonic()
    job = client.submit(CKPT, 250, "zero", api_name="/head_importance")
    got = job.result(timeout=600)
    server_cpu, worker_cpu = cpu_s(app.pid) - server0, sum(cpu_s(p) for p in pids) - workers0
    seconds = time.monotonic() - start
    assert got == here(path, 250)
    notes = [out["progress"] for out in job.outputs()[:-1]]  # what an API client sees while the job runs
    assert notes[0] == "waiting for a heavy slot" and all(PROGRESS.fullmatch(n) for n in notes), notes
    assert any(n.startswith("computing") for n in notes), notes
    # the workers computed; the server only relayed progress: a small share of one core for as long as the job took
    # (0.39 s over 8.8 s on an idle machine), never the job's own core. Not a ratio to the workers' CPU: beside
    # CPU-bound processes the niced workers get little of the CPU, the job's wall time grows, and so does the relaying
    assert worker_cpu > 0.5 and server_cpu < 0.2 * seconds, (server_cpu, worker_cpu, seconds)


def test_workers_killed_mid_job_are_replaced_and_the_job_runs_again(served):
    app, path = served
    until(lambda: len(workers(app.pid)) == 2)
    client = Client(app.url, verbose=False)
    job = client.submit(CKPT, 240, "zero", api_name="/head_importance")  # not cached: N differs
    busy = workers(app.pid)
    start = {p: cpu_s(p) for p in busy}
    until(lambda: any(cpu_s(p) > start[p] + 0.05 for p in busy))  # computing
    for pid in busy:
        os.kill(pid, signal.SIGKILL)
    assert job.result(timeout=300) == here(path, 240)
    assert set(workers(app.pid)).isdisjoint(busy)  # a fresh pool ran it
    assert CKPT in str(client.predict(api_name="/checkpoints"))  # the server kept serving
    assert client.predict(CKPT, 230, "zero", api_name="/head_importance")["n"] == 230  # the user's slot is free
