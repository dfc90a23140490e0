"""Queues that fit the work (app/queues.py), against a live server: one-image edits never wait behind validation
or head-importance work; heavy work runs at most HEAVY_LIMIT at once and one job per user; the page's note says
how many are ahead; a client that disconnects gives its place and its worker back."""

from __future__ import annotations

import time
import uuid
from types import SimpleNamespace

import httpx
import pytest
from gradio_client import Client

from app import queues
from app.layout import build_app
from app.main import launch
from app.state import AppContext
from ssog_core import save_checkpoint
from ssog_core.testing.app_process import free_port
from tests.app_fixtures import designed_ssog, write_images

pytestmark = pytest.mark.slow  # live servers and many rounds: the full suite only

SHAPES = {"data": "shapes:train=4,val=40,classes=5", "class_names": ["circle", "square", "triangle", "star", "cross"]}
CKPT = "ssog_shapes.safetensors"
EDITS = [{"op": "close_gate", "layer": 1, "tap": "mu"}]


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    root = tmp_path_factory.mktemp("queues")
    (root / "ckpt").mkdir()
    save_checkpoint(root / "ckpt" / CKPT, designed_ssog(depth=2), SHAPES)
    write_images(root / "assets")
    demo = build_app(AppContext(root / "ckpt", root / "assets", upload_dir=tmp_path_factory.mktemp("uploads")))
    launch(demo, "127.0.0.1", free_port(), prevent_thread_lock=True, quiet=True)
    try:
        yield demo
    finally:
        demo.close()


def heavy_state(demo) -> tuple[int, int]:
    """(running, waiting) in the heavy queue, as the page's note reads it."""
    return queues.waiting(SimpleNamespace(request=SimpleNamespace(app=demo.app)))


def until(condition, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def join_and_leave(demo, api_name: str, data: list, expect: tuple[int, int]) -> None:
    """Join the queue as a browser does (one event stream per session), see the heavy queue reach ``expect``
    (running, waiting) while the job is in it, read one message, then disconnect."""
    fn_index = next(i for i, fn in demo.fns.items() if fn.api_name == api_name)
    session = uuid.uuid4().hex
    body = {"data": data, "fn_index": fn_index, "session_hash": session, "event_data": None, "trigger_id": None}
    httpx.post(demo.local_url + "gradio_api/queue/join", json=body).raise_for_status()
    until(lambda: heavy_state(demo) == expect)
    with httpx.stream("GET", demo.local_url + f"gradio_api/queue/data?session_hash={session}", timeout=30) as r:
        next(line for line in r.iter_lines() if line.startswith("data:"))


def test_light_work_passes_heavy_work_which_is_capped_per_queue_and_per_user(demo):
    for _ in range(queues.HEAVY_LIMIT):  # every heavy computation now blocks until the test lets it go
        queues.heavy_gate.acquire()
    released = False
    try:
        ada, grace, eve = (Client(demo.local_url, verbose=False) for _ in range(3))
        sweeps = [c.submit(CKPT, 20, "zero", api_name="/head_importance") for c in (ada, grace)]
        until(lambda: heavy_state(demo) == (queues.HEAVY_LIMIT, 0))  # ada's and grace's run (blocked)
        sweeps.append(eve.submit(CKPT, 20, "zero", api_name="/head_importance"))
        until(lambda: heavy_state(demo) == (queues.HEAVY_LIMIT, 1))  # eve's waits
        note = queues.busy_note(SimpleNamespace(request=SimpleNamespace(app=demo.app)))
        assert note.startswith("⏳ Busy, 3 ahead of you (2 running, 1 waiting)")

        one = eve.submit(CKPT, "scene.png", EDITS, 0, api_name="/intervene").result(timeout=20)  # not behind them
        assert one["edited"]["probs"] != one["unedited"]["probs"]
        with pytest.raises(Exception, match="already have a heavy job running"):
            ada.submit(CKPT, "scene.png", EDITS, 8, api_name="/intervene").result(timeout=20)  # ada's sweep runs
        with pytest.raises(Exception, match="already have a heavy job running"):  # batch export is heavy too
            ada.predict(CKPT, "scene.png", 0.5, "validation", api_name="/export_summary")

        join_and_leave(demo, "head_importance", [CKPT, 20, "zero", ""], (queues.HEAVY_LIMIT, 2))  # waits behind eve
        until(lambda: heavy_state(demo) == (queues.HEAVY_LIMIT, 1))  # the page that left gave its place back
        grace_sweep = sweeps[1]
        grace_sweep.cancel()  # a running sweep stops and frees its worker: eve's waiting sweep starts
        until(lambda: heavy_state(demo) == (queues.HEAVY_LIMIT, 0))
        for _ in range(queues.HEAVY_LIMIT):
            queues.heavy_gate.release()
        released = True
        results = [sweeps[0].result(timeout=120), sweeps[2].result(timeout=120)]
        assert results[0] == results[1] and results[0]["n"] == 20
        assert heavy_state(demo) == (0, 0)
        batch = ada.predict(CKPT, "scene.png", 0.5, "validation", api_name="/export_summary")  # ada's slot is free
        assert batch["control_images"] > 0 and len(batch["accumulated_control"]) == len(batch["accumulated"])

        for _ in range(queues.HEAVY_LIMIT):
            queues.heavy_gate.acquire()
        released = False
        join_and_leave(demo, "head_importance", [CKPT, 16, "zero", ""], (1, 0))  # runs (N 16: not cached)
        until(lambda: heavy_state(demo) == (0, 0))  # Gradio closed the sweep's generator: its worker is free
    finally:
        if not released:
            for _ in range(queues.HEAVY_LIMIT):
                queues.heavy_gate.release()


def test_export_maps_never_wait_behind_export_maps_waiting_for_their_batch(demo):
    """Three users' export maps against the validation control wait for its batch (the heavy slots are held); a
    fourth user's plain export map answers at once all the same: a request waiting for heavy work holds no worker
    of a bounded queue (queues.may_wait)."""
    for _ in range(queues.HEAVY_LIMIT):
        queues.heavy_gate.acquire()
    released = False
    try:
        users = [Client(demo.local_url, verbose=False) for _ in range(3)]
        waiting = [c.submit(CKPT, "scene.png", 0.31 + k / 100, "validation", api_name="/export_summary")
                   for k, c in enumerate(users)]  # fmt: skip
        until(lambda: len(queues._running) == 3)  # each is its user's heavy job, waiting for a slot
        plain = Client(demo.local_url, verbose=False).submit(CKPT, "scene.png", 0.3, "none", api_name="/export_summary")
        assert plain.result(timeout=20)["control"] == "none" and not any(w.done() for w in waiting)
        for _ in range(queues.HEAVY_LIMIT):
            queues.heavy_gate.release()
        released = True
        assert all(w.result(timeout=120)["control_images"] > 0 for w in waiting)
    finally:
        if not released:
            for _ in range(queues.HEAVY_LIMIT):
                queues.heavy_gate.release()


def test_one_heavy_job_per_user_is_released_whatever_happens():
    request = SimpleNamespace(username="ada", session_hash="s1")
    with queues.one_per_user(request):
        with pytest.raises(queues.Busy), queues.one_per_user(SimpleNamespace(username="ada", session_hash="s2")):
            pass
        with queues.one_per_user(SimpleNamespace(username=None, session_hash="s1")):  # another user: runs
            pass
    with pytest.raises(RuntimeError), queues.one_per_user(request):
        raise RuntimeError("the job failed")
    with queues.one_per_user(request):  # a failed job gave its turn back
        pass


def test_a_job_the_page_starts_holds_no_turn_but_waits_for_the_users_own():
    """The playground measuring a new model's heads by itself never refuses the measurement the user then asks for
    (the browser test's race: a busy machine kept the page's job running when the user clicked *Measure*)."""
    request = SimpleNamespace(username=None, session_hash="s9")
    with queues.one_per_user(request, holds=False):
        # the user's job runs beside the page's, and while it runs the page's next one waits
        with queues.one_per_user(request), pytest.raises(queues.Busy), queues.one_per_user(request, holds=False):
            pass
        assert queues.user_of(request) not in queues._running
    with queues.one_per_user(request), pytest.raises(queues.Busy), queues.one_per_user(request):
        pass


def test_a_cancelled_heavy_job_frees_its_worker_and_its_users_slot(demo):
    """A client that cancels (or drops) a running validation edit or sweep gives back its worker and its user's
    heavy slot at once, and its computation stops: the user's next heavy job is not refused."""
    group = next(fn for fn in demo.fns.values() if fn.api_name == "intervene").concurrency_id  # queues.may_wait
    light = lambda: queues.waiting(SimpleNamespace(request=SimpleNamespace(app=demo.app)), group)  # noqa: E731
    for _ in range(queues.HEAVY_LIMIT):  # the jobs then wait for a heavy slot, with their user's slot taken
        queues.heavy_gate.acquire()
    released = False
    try:
        ada = Client(demo.local_url, verbose=False)
        jobs = [("/intervene", (CKPT, "scene.png", EDITS, 24), light),  # its own queue, holds a heavy slot
                ("/head_importance", (CKPT, 14, "zero"), lambda: heavy_state(demo))]  # fmt: skip
        for api_name, args, state in jobs:
            job = ada.submit(*args, api_name=api_name)
            until(lambda state=state: state() == (1, 0) and len(queues._running) == 1)
            job.cancel()
            until(lambda state=state: state() == (0, 0) and not queues._running)
        for _ in range(queues.HEAVY_LIMIT):
            queues.heavy_gate.release()
        released = True
        until(lambda: queues.heavy_gate._value == queues.HEAVY_LIMIT)  # the cancelled computations stopped
        edit = ada.submit(CKPT, "scene.png", EDITS, 24, api_name="/intervene").result(timeout=60)
        assert edit["validation"]["n"] == 24
        assert ada.submit(CKPT, 14, "zero", api_name="/head_importance").result(timeout=60)["n"] == 14
    finally:
        if not released:
            for _ in range(queues.HEAVY_LIMIT):
                queues.heavy_gate.release()
