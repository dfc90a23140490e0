"""Load test of the app: many concurrent API clients on loopback, each its own logged-in user, sending the mix of
requests people send; errors, latency, the queue wait of heavy work and the server's memory and threads.

    python benchmarks/load_app.py [--clients 32] [--duration 300] [--pace 1 4] [--cluster local|tcp://HOST:PORT]
        [--warmup-mix 60] [--no-logins] [--eval-images 50 200] [--importance-images 100]
        [--checkpoint-dir checkpoints] [--assets-dir assets] [--out benchmarks/results/load_app_FORM]

Starts ``python -m app`` in a subprocess on a free loopback port, with ``--auth-file`` holding one login per client
(``--no-logins``: none), so the per-user cap on heavy work applies per client. Warm-up: the clients log in (one
Gradio session each) and upload, between them, every picture of a varied pool (1×1 to 1600×1200; PNG, JPEG, CMYK
JPEG, 16-bit, grayscale, RGBA, palette GIF, BMP, WebP, plus the bundled pictures); each sends one request of every
light kind of the mix, and a few one validation edit and one head-importance sweep per checkpoint, which loads every
model; then ``--warmup-mix`` seconds of the mix below fill the caches to their working size (the memory figure is
about growth under load, not about the caches filling once). One client then sends ``--alone`` requests of every
light kind of the mix (an export map with each control) while the others wait: the latency without a queue, each
light endpoint's *alone* figure. Then the server's resident memory (``VmRSS``) and thread count (``Threads``, both
of ``/proc/PID/status``) are recorded and all clients send requests one after another for ``--duration`` seconds
(``--pace FROM TO``: each waits a time drawn from FROM to TO seconds between two requests, a person's pace;
default 0 0, back to back), each drawn from :data:`MIX`: playground updates (``/head_field``), export maps with
each control (``/export_summary``, the controls in turn), ``/intervene`` on one image and on ``--eval-images``
validation images, ``/head_importance`` on about ``--importance-images`` images (varied, so most
sweeps are computed, not cached), picture uploads and a session saved and restored (``/save_session``,
``/restore_session``). A client waits for each answer before it sends the next request, so it never has two heavy
jobs of its own: a ``Busy`` refusal is counted apart from the errors. When the duration is over no request is sent
and those in flight are collected; then a burst: ``--burst`` requests submitted at once by every client.

For heavy work the client also records the queue wait: from submit until the server reports the job started (the
``process_starts`` message, ``Status.PROCESSING`` of ``gradio_client``'s ``Job.status()``, polled every 50 ms), and
the job time (latency minus queue wait).

Where heavy work runs: by default the app's local pool of worker processes; ``--cluster local`` starts a
``distributed.LocalCluster`` of two single-threaded worker processes (at the local pool's own niceness,
``ssog_core.runtime.jobs.NICE``, so both forms give the server the same priority) and passes its address to
``python -m app --cluster``; ``--cluster tcp://HOST:PORT`` uses a running scheduler.

Bounded: every request has a timeout and nothing is sent after the run's deadline; nothing leaves 127.0.0.1.
Writes ``OUT.json`` and ``OUT.md`` (paste-ready for docs/RELIABILITY.md); exits 1 when a request failed, the
server died, or memory after the load exceeds the warmed-up figure by more than ``--max-growth`` (10 %); at a
person's pace also when a light endpoint's p95 under load exceeds ``--max-slowdown`` (3) times its alone figure.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"  # gradio_client would otherwise phone home from every client

import numpy as np  # noqa: E402
from gradio_client import Client, handle_file  # noqa: E402
from gradio_client.utils import Status  # noqa: E402
from PIL import Image  # noqa: E402

from app import main as app_main  # the queue settings, reported with the figures
from app import queues
from ssog_core.analysis.controls import CONTROLS
from ssog_core.runtime.jobs import NICE
from ssog_core.testing.app_process import AppProcess

ROOT = Path(__file__).resolve().parents[1]

REQUEST_TIMEOUT = 300.0  # seconds one request may wait in the queue and run
# One HTTP exchange (a queue join, an upload): a browser waits for the server's answer; gradio_client's default of
# 5 s gave up once in a burst of 256 requests on a 2-core machine shared by the server and all clients.
HTTP_TIMEOUT = 60.0
POLL = 0.05  # seconds between two looks at a heavy job's status
STARTED = {Status.PROCESSING, Status.PROGRESS, Status.ITERATING}  # the server has started the job
# one client's next request: relative weights (a session is saved, then restored: two requests)
MIX = {"playground": 40, "export": 18, "intervene": 14, "upload": 8, "session": 6, "validation": 4, "importance": 2}
HEAVY = {"validation", "importance"}  # work on validation images: one job per user, the heavy slots
LIGHT = [kind for kind in MIX if kind not in HEAVY]  # answered by the serving process itself
# an export map against the validation control needs the batch of its checkpoint and α, a heavy job (the user's
# one) unless already computed: outside the light bar, like the other heavy work
BATCH_EXPORT = "/export_summary (validation)"


# ------------------------------------------------------------------------------------------ the workload


def picture_pool(folder: Path, assets: Path | None, seed: int = 0) -> list[Path]:
    """Pictures of many sizes and modes: the bundled ones (if any) plus generated photos-like textures."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)

    def texture(h: int, w: int) -> np.ndarray:
        yy, xx = np.mgrid[0:h, 0:w] / max(h, w)
        f = rng.uniform(3, 12, 3)
        base = np.stack([np.sin(f[0] * xx + f[1] * yy), np.cos(f[1] * xx), np.sin(f[2] * yy)], -1) * 0.4 + 0.5
        return (np.clip(base + 0.08 * rng.standard_normal((h, w, 3)), 0, 1) * 255).astype(np.uint8)

    made: list[tuple[str, Image.Image, dict[str, Any]]] = [
        ("big.jpg", Image.fromarray(texture(1200, 1600)), {"quality": 85}),
        ("tall.png", Image.fromarray(texture(900, 240)), {}),
        ("wide.webp", Image.fromarray(texture(200, 700)), {}),
        ("gray.png", Image.fromarray(texture(300, 300)).convert("L"), {}),
        ("cmyk.jpg", Image.fromarray(texture(256, 320)).convert("CMYK"), {"quality": 90}),
        ("palette.gif", Image.fromarray(texture(180, 180)).convert("P"), {}),
        ("screen.bmp", Image.fromarray(texture(120, 160)), {}),
        ("one_pixel.png", Image.new("RGB", (1, 1), (30, 160, 90)), {}),
    ]
    rgba = Image.fromarray(texture(240, 240)).convert("RGBA")
    alpha = np.zeros((240, 240), np.uint8)
    alpha[40:200, 60:180] = 255
    rgba.putalpha(Image.fromarray(alpha))
    made.append(("transparent.png", rgba, {}))
    g16 = (texture(200, 260)[..., 0].astype(np.uint16) * 257).astype(np.uint16)
    made.append(("gray16.png", Image.fromarray(g16), {}))
    paths = []
    for name, img, kw in made:
        img.save(folder / name, **kw)
        paths.append(folder / name)
    if assets and assets.is_dir():
        for p in sorted(assets.rglob("*")):
            if p.suffix.lower() in (".png", ".jpg", ".jpeg") and p.is_file():
                paths.append(p)
    return paths


def random_head(rng: random.Random) -> dict[str, Any]:
    """A playground head as the canvas sends it: 1-8 atoms anywhere on a 5-48 grid."""
    g = rng.randint(5, 48)
    q = (g - 1) // 2
    atoms = [
        {
            "y": rng.uniform(0, g - 1),
            "x": rng.uniform(0, g - 1),
            "sy": rng.uniform(0.3, g / 3),
            "sx": rng.uniform(0.3, g / 3),
            "w": rng.uniform(0.05, 1),
        }
        for _ in range(rng.randint(1, 8))
    ]
    mode = rng.choice(["factorized", "axial"])
    return {"grid": [g, g], "query": [q, q], "tau": rng.uniform(0.5, 5), "mode": mode, "atoms": atoms}


@dataclass(frozen=True)
class Model:
    """A checkpoint the clients ask about, with what its edits need."""

    name: str
    attention: str  # "ssog" or "dot"
    depth: int
    heads: int
    taps: tuple[str, ...]  # the steering taps whose gates an edit may close or scale (none on fixed fields)


def random_edits(rng: random.Random, model: Model) -> list[dict[str, Any]]:
    """One or two edits the model accepts: heads ablated and, where content steers, gates scaled."""
    edits = []
    for _ in range(rng.randint(1, 2)):
        layer = rng.randrange(model.depth)
        if not model.taps or rng.random() < 0.5:
            edits.append({"op": "ablate_head", "layer": layer, "head": rng.randrange(model.heads), "mode": "zero"})
        else:
            tap = rng.choice(model.taps)
            edits.append({"op": "scale_gate", "layer": layer, "tap": tap, "factor": round(rng.uniform(0, 2), 2)})
    return edits


@dataclass
class Record:
    endpoint: str
    seconds: float
    error: str | None = None
    refused: bool = False  # a Busy answer: the designed refusal of a second heavy job, not an error
    wait: float | None = None  # heavy work: seconds from submit until the server started it


@dataclass
class Load:
    """Clients of one server (each its own Gradio session and login), their pictures, and every outcome."""

    url: str
    models: list[Model]
    pool: list[Path]
    deadline: float  # time.monotonic() after which no new request is sent
    eval_images: tuple[int, int]  # validation images of an /intervene, from … to
    importance_images: int
    logins: list[tuple[str, str]] | None = None
    pace: tuple[float, float] = (0.0, 0.0)  # seconds a client waits between two requests, from … to
    clients: list[Client] = field(default_factory=list)
    images: list[list[str]] = field(default_factory=list)  # SHA-256 of each client's uploaded pictures
    records: list[Record] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def call(self, client: Client, endpoint: str, *args: Any, label: str = "", heavy: bool = False) -> Any:
        if time.monotonic() > self.deadline:
            with self.lock:
                self.records.append(Record(endpoint + label, 0.0, "not sent: the run's deadline passed"))
            return None
        t, submitted, wait = time.perf_counter(), datetime.now(), None
        try:
            job = client.submit(*args, api_name=endpoint)
            wait = started_after(job, submitted) if heavy else None
            out = job.result(timeout=REQUEST_TIMEOUT)
            rec = Record(endpoint + label, time.perf_counter() - t, wait=wait)
        except Exception as e:  # noqa: BLE001 (every failure is a result to report)
            refused = queues.BUSY in str(e)
            text = None if refused else f"{type(e).__name__}: {e}"[:300]
            out, rec = None, Record(endpoint + label, time.perf_counter() - t, text, refused, wait)
        with self.lock:
            self.records.append(rec)
        return out

    def connect(self, n: int, uploads: int) -> None:
        """Open ``n`` clients, each logged in as its own user; each uploads ``uploads`` pictures of the pool (in
        turn, so all of them get used)."""
        self.clients = [
            Client(
                self.url,
                auth=self.logins[i] if self.logins else None,
                verbose=False,
                download_files=False,
                httpx_kwargs={"timeout": HTTP_TIMEOUT},
            )
            for i in range(n)
        ]
        self.images = [[] for _ in range(n)]
        self.run(lambda i: self.upload(i, uploads))

    def upload(self, index: int, uploads: int) -> None:
        for k in range(uploads):
            picture = self.pool[(index * uploads + k) % len(self.pool)]
            out = self.call(self.clients[index], "/upload_image", handle_file(str(picture)))
            if out and out["sha256"] not in self.images[index]:
                self.images[index].append(out["sha256"])

    def send(self, index: int, kind: str, rng: random.Random, turn: int = 0) -> None:
        """One request (two for a session) of ``kind`` (a key of :data:`MIX`) from client ``index``; ``turn``
        picks the export-map control, so every control is asked in turn."""
        client, image, model = self.clients[index], rng.choice(self.images[index] or [""]), rng.choice(self.models)
        if kind == "playground":
            self.call(client, "/head_field", random_head(rng), image)
        elif kind == "export":
            control = CONTROLS[turn % len(CONTROLS)]
            alpha = round(rng.uniform(0.05, 1.0), 2)
            self.call(client, "/export_summary", model.name, image, alpha, control, label=f" ({control})")
        elif kind == "intervene":
            self.call(client, "/intervene", model.name, image, random_edits(rng, model), 0, label=" (one image)")
        elif kind == "validation":
            n = rng.randint(*self.eval_images)
            edits = random_edits(rng, model)
            self.call(client, "/intervene", model.name, image, edits, n, label=" (validation)", heavy=True)
        elif kind == "importance":
            n = rng.randint(math.ceil(self.importance_images / 2), self.importance_images)  # most not yet cached
            mode = rng.choice(["zero", "dataset_mean"])
            self.call(client, "/head_importance", model.name, n, mode, heavy=True)
        elif kind == "upload":
            self.call(client, "/upload_image", handle_file(str(rng.choice(self.pool))))
        elif kind == "session":
            sections = {"playground": {"head": random_head(rng)}, "export": {"alpha": round(rng.uniform(0, 1), 2)},
                        "intervene": {"edits": random_edits(rng, model)}}  # fmt: skip
            text = self.call(client, "/save_session", model.name, image, sections)
            if text is not None:
                self.call(client, "/restore_session", text)
        else:
            raise ValueError(f"unknown kind of request {kind!r}")

    def warm(self, index: int) -> None:
        """Every light kind of request once (each export-map control in turn across clients); the first clients
        also one validation edit and one sweep on a checkpoint each (models loaded, validation images cached)."""
        rng = random.Random(index)
        for kind in ("playground", "playground", "export", "intervene", "session"):
            self.send(index, kind, rng, turn=index)
        if index < len(self.models):
            model, client, image = self.models[index], self.clients[index], rng.choice(self.images[index] or [""])
            edits, n = random_edits(rng, model), self.eval_images[0]
            self.call(client, "/intervene", model.name, image, edits, n, label=" (validation)", heavy=True)
            self.call(client, "/head_importance", model.name, self.importance_images, "zero", heavy=True)

    def mixed(self, index: int, end: float, seed: int = 1) -> None:
        """Requests drawn from :data:`MIX`, one after another, until ``end`` (``time.monotonic()``)."""
        rng = random.Random(1000 * seed + index)
        kinds, weights = list(MIX), list(MIX.values())
        turn = index
        while time.monotonic() < min(end, self.deadline):
            kind = rng.choices(kinds, weights)[0]
            self.send(index, kind, rng, turn)
            turn += kind == "export"
            if self.pace[1] > 0:  # a person reads the answer before the next click
                time.sleep(max(0.0, min(rng.uniform(*self.pace), end - time.monotonic())))

    def alone(self, n: int) -> None:
        """``n`` requests of every light kind (every export-map control in turn) from one client while the others
        wait: the time a request takes without a queue, to read the loaded latencies against."""
        rng = random.Random(7)
        for _ in range(n):
            for kind in LIGHT:
                for turn in range(len(CONTROLS) if kind == "export" else 1):  # an export map with each control
                    self.send(0, kind, rng, turn)

    def burst(self, index: int, n: int, seed: int = 0) -> None:
        """``n`` requests submitted at once, not one after another (a page firing several events, a script's
        loop), then awaited: together with the other clients' bursts, more than the server computes at once."""
        rng = random.Random(1000 * seed + index)
        client, images = self.clients[index], self.images[index] or [""]
        pending = []
        for k in range(n):
            image = rng.choice(images)
            if k % 4 == 0:
                endpoint, args = "/export_summary", (rng.choice(self.models).name, image, rng.uniform(0.05, 1.0))
            else:
                endpoint, args = "/head_field", (random_head(rng), image)
            t, done = time.perf_counter(), []
            job = client.submit(*args, api_name=endpoint)
            job.future.add_done_callback(lambda _, done=done: done.append(time.perf_counter()))
            pending.append((endpoint, t, done, job))
        for endpoint, t, done, job in pending:
            try:
                job.result(timeout=REQUEST_TIMEOUT)
                rec = Record(endpoint + " (burst)", (done[0] if done else time.perf_counter()) - t)
            except Exception as e:  # noqa: BLE001 (every failure is a result to report)
                rec = Record(endpoint + " (burst)", time.perf_counter() - t, f"{type(e).__name__}: {e}"[:300])
            with self.lock:
                self.records.append(rec)

    def run(self, task) -> float:
        """``task(i)`` for every client at once; wall seconds."""
        t = time.perf_counter()
        with ThreadPoolExecutor(len(self.clients)) as pool:
            for f in [pool.submit(task, i) for i in range(len(self.clients))]:
                f.result()
        return time.perf_counter() - t

    def close(self) -> None:
        for c in self.clients:
            c.close()


def started_after(job: Any, submitted: datetime) -> float | None:
    """Seconds from ``submitted`` until the server reported that it started ``job`` (the status update's own
    arrival time, not the moment it was looked at); None when the job ended before a look saw it running."""
    stop = time.monotonic() + REQUEST_TIMEOUT
    while time.monotonic() < stop and not job.done():
        status = job.status()
        if status.code in STARTED:
            return max(0.0, (status.time - submitted).total_seconds())
        time.sleep(POLL)
    return None


# ------------------------------------------------------------------------------------------ the server


def proc_status(pid: int) -> dict[str, float]:
    """Resident memory (``VmRSS``, MB) and thread count (``Threads``) of a process, from ``/proc/PID/status``."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            out["rss_mb"] = int(line.split()[1]) / 1024
        elif line.startswith("Threads:"):
            out["threads"] = int(line.split()[1])
    if len(out) != 2:
        raise RuntimeError(f"no VmRSS or Threads for process {pid}")
    return out


class Sampler(threading.Thread):
    """The server's memory and threads every ``period`` seconds while the load runs: (seconds, MB, threads)."""

    def __init__(self, pid: int, period: float = 1.0):
        super().__init__(daemon=True)
        self.pid, self.period, self.samples = pid, period, []
        self._done = threading.Event()

    def run(self) -> None:
        t0 = time.monotonic()
        while not self._done.is_set():
            now = proc_status(self.pid)
            self.samples.append((time.monotonic() - t0, now["rss_mb"], now["threads"]))
            self._done.wait(self.period)

    def stop(self) -> list[tuple[float, float, int]]:
        self._done.set()
        self.join()
        return self.samples


def start_local_cluster(workers: int = 2) -> tuple[subprocess.Popen, str]:
    """A ``distributed.LocalCluster`` of ``workers`` single-threaded worker processes in a child process at the
    niceness of the app's local pool (:data:`ssog_core.runtime.jobs.NICE`); its scheduler's address."""
    code = (
        "import sys, time\n"
        "from distributed import LocalCluster\n"
        f"c = LocalCluster(n_workers={workers}, threads_per_worker=1, processes=True, dashboard_address=None)\n"
        "print(c.scheduler_address, flush=True)\n"
        "sys.stdin.read()\n"  # until the benchmark closes the pipe
        "c.close()\n"
    )
    proc = subprocess.Popen(["nice", "-n", str(NICE), sys.executable, "-c", code], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)  # fmt: skip
    address = proc.stdout.readline().strip()
    if not address.startswith("tcp://"):
        proc.kill()
        raise RuntimeError("the LocalCluster did not start (no scheduler address printed)")
    return proc, address


def stop_local_cluster(proc: subprocess.Popen) -> None:
    proc.stdin.close()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()


# ------------------------------------------------------------------------------------------ report


def quantiles(values: list[float], prefix: str = "") -> dict[str, float]:
    """p50, p95 and max of ``values`` (milliseconds), keys named with ``prefix``; empty for no values."""
    if not values:
        return {}
    ms = [v * 1e3 for v in values]
    return {f"{prefix}p50_ms": statistics.median(ms), f"{prefix}p95_ms": float(np.percentile(ms, 95)),
            f"{prefix}max_ms": max(ms)}  # fmt: skip


def latency_table(records: list[Record]) -> dict[str, dict[str, float]]:
    """Per endpoint: requests, errors, refusals, latency of the answered ones and, for heavy work, queue wait."""
    out = {}
    for endpoint in sorted({r.endpoint for r in records}):
        rows = [r for r in records if r.endpoint == endpoint]
        ok = [r.seconds for r in rows if r.error is None and not r.refused]
        waits = [r.wait for r in rows if r.wait is not None]
        runs = [r.seconds - r.wait for r in rows if r.wait is not None and r.error is None and not r.refused]
        row: dict[str, float] = {"requests": len(rows), "errors": sum(r.error is not None for r in rows),
                                 "refused": sum(r.refused for r in rows)}  # fmt: skip
        out[endpoint] = row | quantiles(ok) | quantiles(waits, "wait_") | quantiles(runs, "run_")
    return out


def slowdowns(loaded: dict[str, dict[str, float]], alone: dict[str, dict[str, float]]) -> dict[str, float]:
    """Per light endpoint measured both ways: its p95 under load over its p95 alone."""
    return {e: round(row["p95_ms"] / alone[e]["p95_ms"], 2) for e, row in loaded.items()
            if e in alone and "p95_ms" in row and alone[e].get("p95_ms")}  # fmt: skip


def run_benchmark(args: argparse.Namespace) -> dict[str, Any]:
    """Start the app, warm it up, load it; the figures as a dict (the server is always stopped)."""
    tmp = Path(tempfile.mkdtemp(prefix="ssog-load-"))
    pool = picture_pool(tmp / "pictures", args.assets_dir)
    logins = [(f"user{i:02d}", secrets.token_urlsafe(12)) for i in range(args.clients)] if args.logins else None
    extra, cluster = [], None
    if logins:
        auth_file = tmp / "logins.txt"
        auth_file.write_text("".join(f"{u}:{p}\n" for u, p in logins), encoding="utf-8")
        extra = ["--auth-file", str(auth_file)]
    address = args.cluster
    if args.cluster == "local":
        cluster, address = start_local_cluster()
    if address:
        extra += ["--cluster", address]
    server = AppProcess(args.checkpoint_dir, args.assets_dir, tmp / "server.log", startup_timeout=180.0, args=extra)
    try:
        server.start()
        start = proc_status(server.pid)
        probe = Client(server.url, auth=logins[0] if logins else None, verbose=False, download_files=False)
        found = []
        for name in probe.predict(api_name="/checkpoints"):
            card = probe.predict(name, api_name="/geometry_summary")["card"]
            _, depth, heads = (int(v) for v in card["dim / depth / heads"].split("/"))
            taps = tuple(t.strip() for t in (card.get("steering taps") or "").split(",") if t.strip())
            found.append(Model(name, card["attention"], depth, heads, taps))
        probe.close()
        if not found:
            raise RuntimeError(f"no checkpoint in {args.checkpoint_dir}: the requests need one")
        kinds = [(m.attention, bool(m.taps)) for m in found]  # one of each kind first: every kind of edit is sent
        firsts = [m for i, m in enumerate(found) if kinds[i] not in kinds[:i]]
        models = (firsts + [m for m in found if m not in firsts])[: args.max_checkpoints]
        eval_images = (args.eval_images[0], args.eval_images[1])
        load = Load(server.url, models, pool, time.monotonic() + args.deadline, eval_images, args.importance_images,
                    logins, tuple(args.pace))  # fmt: skip
        # warm-up: every client logs in (one Gradio session each) and uploads pictures, the pool between them,
        # then sends every light kind of request; a few also a validation edit and a sweep (models, caches)
        t = time.perf_counter()
        load.connect(args.clients, max(2, math.ceil(len(pool) / args.clients)))
        load.run(load.warm)
        settle = time.monotonic() + args.warmup_mix  # the mix itself fills the caches to their working size
        load.run(lambda i: load.mixed(i, settle, seed=2))
        warm_s, warm_records, load.records = time.perf_counter() - t, load.records, []
        load.alone(args.alone)
        alone_records, load.records = load.records, []
        time.sleep(1.0)
        warm = proc_status(server.pid)
        sampler = Sampler(server.pid)
        sampler.start()
        end = time.monotonic() + args.duration
        load_s = load.run(lambda i: load.mixed(i, end))
        samples = sampler.stop()
        time.sleep(1.0)
        after = proc_status(server.pid)
        mixed_records = len(load.records)
        burst = {}
        if args.burst:
            n0 = len(load.records)
            seconds = load.run(lambda i: load.burst(i, args.burst, seed=99))
            new = load.records[n0:]
            rss = round(proc_status(server.pid)["rss_mb"], 1)
            burst = {"requests": len(new), "errors": sum(rec.error is not None for rec in new),
                     "seconds": round(seconds, 1), "rss_after_mb": rss}  # fmt: skip
        load.close()
        alive = server.proc.poll() is None
        log_tail = server.log_tail(3000)
    finally:
        server.stop()
        if cluster:
            stop_local_cluster(cluster)
    shutil.rmtree(tmp, ignore_errors=True)  # pictures, logins and server log (its tail is in the result)
    records = load.records
    errors = [rec for rec in records + alone_records if rec.error is not None]
    latency, alone = latency_table(records), latency_table(alone_records)
    slowdown = slowdowns(latency, alone)
    paced = args.pace[1] > 0
    too_slow = {e: v for e, v in slowdown.items() if v > args.max_slowdown and e != BATCH_EXPORT} if paced else {}
    warm_errors = [rec for rec in warm_records if rec.error is not None]
    growth = (after["rss_mb"] - warm["rss_mb"]) / warm["rss_mb"]
    quarters = [max((s for s in samples if s[0] <= f * load_s), default=samples[0], key=lambda s: s[0])
                for f in (0.25, 0.5, 0.75)]  # fmt: skip
    result = {
        "when": time.strftime("%Y-%m-%d %H:%M"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "load_average_after": [round(v, 2) for v in os.getloadavg()],
        "command": " ".join(["python benchmarks/load_app.py", *sys.argv[1:]]),
        "clients": args.clients,
        "logins": bool(logins),
        "duration_s": args.duration,
        "pace_s": list(args.pace),
        "heavy_work": f"Dask: {args.cluster}" if args.cluster else "the app's local pool",
        "mix": MIX,
        "eval_images": list(eval_images),
        "importance_images": [math.ceil(args.importance_images / 2), args.importance_images],
        "checkpoints": [m.name for m in models],
        "pictures": [p.name for p in pool],
        "server_startup_s": round(server.startup_s, 1),
        "warmup_s": round(warm_s, 1),
        "warmup_requests": len(warm_records),
        "warmup_errors": len(warm_errors),
        "warmup_endpoints": sorted({rec.endpoint for rec in warm_records}),
        "load_s": round(load_s, 1),
        "requests": len(records),
        "mixed_requests": mixed_records,
        "errors": len(errors),
        "refused": sum(rec.refused for rec in records + warm_records),
        "error_examples": sorted({rec.error for rec in errors + warm_errors})[:5],
        "throughput_rps": round(mixed_records / max(load_s, 1e-9), 2),
        "latency": latency,
        "alone_requests": len(alone_records),
        "alone": alone,
        "slowdown": slowdown,
        "max_slowdown": args.max_slowdown if paced else None,
        "rss_mb": {
            "at_start": round(start["rss_mb"], 1),
            "after_warmup": round(warm["rss_mb"], 1),
            "at_quarters": [round(s[1], 1) for s in quarters],
            "max_during_load": round(max(s[1] for s in samples), 1),
            "at_end": round(after["rss_mb"], 1),
            "growth": round(growth, 4),
        },
        "threads": {
            "at_start": start["threads"],
            "after_warmup": warm["threads"],
            "max_during_load": max(s[2] for s in samples),
            "at_end": after["threads"],
        },
        "burst": burst,
        "queue": {
            "computed_at_once": app_main.CONCURRENCY,
            "max_waiting": app_main.QUEUE_SIZE,
            "light_at_once": queues.LIGHT_LIMIT,
            "heavy_at_once": queues.HEAVY_LIMIT,
        },
        "max_growth": args.max_growth,
        "server_alive_after": alive,
        "passed": not errors and not warm_errors and growth <= args.max_growth and alive and not too_slow,
    }
    if errors or warm_errors or not alive:
        result["server_log_tail"] = log_tail
    return result


def ms(row: dict[str, float], prefix: str = "") -> str:
    """The p50 | p95 | max cells of a table row."""
    if f"{prefix}p50_ms" not in row:
        return "– | – | –"
    return " | ".join(f"{row[prefix + k]:.0f} ms" for k in ("p50_ms", "p95_ms", "max_ms"))


def markdown(r: dict[str, Any]) -> str:
    """The figures as Markdown to paste under ``<!-- load-figures -->`` in docs/RELIABILITY.md."""
    rss, threads, q = r["rss_mb"], r["threads"], r["queue"]
    mix = ", ".join(f"{k} {v}" for k, v in r["mix"].items())
    lo, hi = r["pace_s"]
    pace = f"each client waiting {lo:g}-{hi:g} s between two requests" if hi > 0 else "back to back"
    bars = f"0 errors, memory growth after warm-up ≤ {r['max_growth']:.0%}"
    if r["max_slowdown"]:
        bars += f", every light endpoint's p95 ≤ {r['max_slowdown']:g}× alone (`{BATCH_EXPORT}` is heavy work)"
    lines = [
        f"Measured {r['when']} on {r['machine']}; load average after the run {r['load_average_after']}. "
        f"Command: `{r['command']}`.",
        "",
        f"{r['clients']} concurrent `gradio_client` clients on 127.0.0.1, "
        + ("each logged in as its own user" if r["logins"] else "without logins")
        + f", for {r['duration_s']} s of mixed requests, {pace} (weights: {mix}; validation edits on "
        f"{r['eval_images'][0]}-{r['eval_images'][1]} images, sweeps on {r['importance_images'][0]}-"
        f"{r['importance_images'][1]}), on {', '.join(r['checkpoints'])} and {len(r['pictures'])} pictures of "
        f"varied size and mode. The server computes {q['computed_at_once']} requests of an endpoint at once "
        f"({q['light_at_once']} one-image edits, {q['heavy_at_once']} heavy jobs); up to {q['max_waiting']} more wait. "
        f"Heavy work runs on {r['heavy_work']}.",
        "",
        f"**{r['mixed_requests']} requests in {r['load_s']} s ({r['throughput_rps']} requests/s), {r['errors']} "
        f"errors, {r['refused']} refused as busy**; warm-up {r['warmup_requests']} requests ({r['warmup_s']} s, "
        f"{r['warmup_errors']} errors). **{'PASSED' if r['passed'] else 'FAILED'}** (bars: {bars}).",
        "",
        "| endpoint | requests | errors | refused | p50 | p95 | max | alone p95 | p95 / alone "
        "| queue wait p50 | p95 | job time p50 | p95 |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for endpoint, row in r["latency"].items():
        counts = f"{row['requests']} | {row['errors']} | {row['refused']}"
        alone = r["alone"].get(endpoint, {})
        alone_p95 = f"{alone['p95_ms']:.0f} ms" if "p95_ms" in alone else "–"
        ratio = f"×{r['slowdown'][endpoint]:g}" if endpoint in r["slowdown"] else "–"
        heavy = " | ".join(ms(row, prefix).rsplit(" | ", 1)[0] for prefix in ("wait_", "run_"))
        lines.append(f"| `{endpoint}` | {counts} | {ms(row)} | {alone_p95} | {ratio} | {heavy} |")
    lines += [
        "",
        f"Server memory (VmRSS): {rss['at_start']} MB at start, **{rss['after_warmup']} MB after warm-up**, "
        f"{' / '.join(map(str, rss['at_quarters']))} MB at a quarter / half / three quarters of the load, max "
        f"{rss['max_during_load']} MB, **{rss['at_end']} MB at the end: {rss['growth']:+.1%}**.",
        "",
        f"Server threads: {threads['at_start']} at start, **{threads['after_warmup']} after warm-up**, max "
        f"{threads['max_during_load']}, **{threads['at_end']} at the end**.",
    ]
    if r["burst"]:
        b = r["burst"]
        lines += ["", f"Then a burst ({r['clients']} clients × {b['requests'] // r['clients']} requests submitted at "
                  f"once): {b['requests']} requests, {b['errors']} errors, {b['seconds']} s; memory after it "
                  f"{b['rss_after_mb']} MB."]  # fmt: skip
    lines += [
        "",
        "Latency: each client's, from submit to answer (queue included); *refused* answers (a second heavy job of "
        "the same user) are left out of it. Queue wait (heavy work): from submit until the server reported the job "
        "started (`Status.PROCESSING`); job time: latency minus queue wait. *Alone*: the same kind of request sent by "
        f"one client while the others wait ({r['alone_requests']} requests before the load).",
    ]
    if r.get("error_examples"):
        lines += ["", "Errors:", *[f"- `{e}`" for e in r["error_examples"]]]
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--duration", type=float, default=300.0, help="seconds of mixed requests after the warm-up")
    ap.add_argument(
        "--warmup-mix",
        type=float,
        default=60.0,
        help="seconds of the same mix ending the warm-up (caches filled before memory is measured)",
    )
    ap.add_argument("--logins", action=argparse.BooleanOptionalAction, default=True, help="one login per client")
    ap.add_argument("--eval-images", type=int, nargs=2, default=[50, 200], metavar=("FROM", "TO"),
                    help="validation images of an /intervene on the validation set")  # fmt: skip
    ap.add_argument("--importance-images", type=int, default=100, help="images of a sweep: from half this to this")
    ap.add_argument("--alone", type=int, default=10, help="requests of each light kind sent by one client alone")
    ap.add_argument(
        "--pace",
        type=float,
        nargs=2,
        default=[0.0, 0.0],
        metavar=("FROM", "TO"),
        help="seconds each client waits between two requests, drawn from FROM to TO (0 0: back to back)",
    )
    ap.add_argument("--cluster", default=None, metavar="local|tcp://HOST:PORT",
                    help="heavy work on Dask: 'local' starts a LocalCluster of 2 worker processes; default: the "
                    "app's local pool")  # fmt: skip
    ap.add_argument(
        "--max-slowdown",
        type=float,
        default=3.0,
        help="at a person's pace: bar on each light endpoint's p95 over its alone p95",
    )
    ap.add_argument("--burst", type=int, default=8, help="then requests each client submits at once (0: none)")
    ap.add_argument("--checkpoint-dir", type=Path, default=ROOT / "checkpoints")
    ap.add_argument("--assets-dir", type=Path, default=ROOT / "assets")
    ap.add_argument("--max-checkpoints", type=int, default=3, help="checkpoints asked about, one of each kind first")
    ap.add_argument("--max-growth", type=float, default=0.10)
    ap.add_argument("--deadline", type=float, default=1800.0, help="seconds after which no request is sent")
    ap.add_argument(
        "--out",
        type=Path,
        default=None,
        help="OUT.json, OUT.md (default: benchmarks/results/load_app_{paced|back_to_back}_{pool|cluster})",
    )
    args = ap.parse_args(argv)
    if args.clients < 1 or args.duration <= 0 or not 0 < args.eval_images[0] <= args.eval_images[1]:
        ap.error("--clients ≥ 1, --duration > 0 and 0 < FROM ≤ TO for --eval-images")
    if not 0 <= args.pace[0] <= args.pace[1]:
        ap.error("--pace FROM TO: 0 ≤ FROM ≤ TO")
    if args.cluster not in (None, "local") and not args.cluster.startswith("tcp://"):
        ap.error("--cluster: 'local' or a scheduler address tcp://HOST:PORT")
    if args.out is None:
        form = f"{'paced' if args.pace[1] > 0 else 'back_to_back'}_{'cluster' if args.cluster else 'pool'}"
        args.out = ROOT / "benchmarks" / "results" / f"load_app_{form}"
    return args


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result = run_benchmark(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(args.out.with_suffix(".json"), json.dumps(result, indent=2) + "\n")
    write_atomic(args.out.with_suffix(".md"), markdown(result))
    print(markdown(result))
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
