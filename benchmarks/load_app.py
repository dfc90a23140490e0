"""Load test of the app: many concurrent API clients on loopback; errors, latency and the server's memory.

    nice -n 10 python benchmarks/load_app.py [--clients 16] [--exports 5] [--playground 20] [--uploads 2]
        [--rounds 3] [--checkpoint-dir checkpoints] [--assets-dir assets] [--out benchmarks/results/load_app]

Starts ``python -m app`` in a subprocess on a free loopback port. Warm-up: ``--clients`` ``gradio_client``
clients connect (one Gradio session each) and upload, between them, every picture of a varied pool (1×1 to
1600×1200; PNG, JPEG, CMYK JPEG, 16-bit, grayscale, RGBA, palette GIF, BMP, WebP, plus the bundled pictures),
and each sends one export-map and two playground requests, which loads every model and fills the caches. Then
the server's resident memory (``VmRSS`` of ``/proc/PID/status``) is recorded and the same clients, all at once,
run ``--rounds`` rounds: in each, every client sends ``--uploads`` picture uploads, ``--exports`` export-map
requests (``/export_summary`` on the SSOG and dot checkpoints, varied α and pictures) and ``--playground``
playground updates (``/head_field``: 1-8 atoms, 5-48 grid, both field modes, the picture drawn under the head),
shuffled. Every request must succeed, and the memory after the last round may exceed the warmed-up figure by
at most ``--max-growth`` (10 %); the memory after each round shows whether it levels off.

Bounded: a fixed number of requests, each with a timeout, and a deadline after which nothing more is sent;
nothing leaves 127.0.0.1. Writes ``OUT.json`` and ``OUT.md``; exits 1 when a request failed or memory grew
too much.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"  # gradio_client would otherwise phone home from every client

import numpy as np  # noqa: E402
from gradio_client import Client, handle_file  # noqa: E402
from PIL import Image  # noqa: E402

from app import main as app_main  # the queue settings, reported with the figures
from ssog_core.testing.app_process import AppProcess

ROOT = Path(__file__).resolve().parents[1]

REQUEST_TIMEOUT = 300.0  # seconds one request may wait in the queue and run


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


@dataclass
class Record:
    endpoint: str
    seconds: float
    error: str | None = None


@dataclass
class Load:
    """Clients of one server (each its own Gradio session), their pictures, and every request's outcome."""

    url: str
    checkpoints: list[str]
    pool: list[Path]
    deadline: float  # time.monotonic() after which no new request is sent
    clients: list[Client] = field(default_factory=list)
    images: list[list[str]] = field(default_factory=list)  # SHA-256 of each client's uploaded pictures
    records: list[Record] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def call(self, client: Client, endpoint: str, *args: Any, label: str = "") -> Any:
        if time.monotonic() > self.deadline:
            with self.lock:
                self.records.append(Record(endpoint + label, 0.0, "not sent: the run's deadline passed"))
            return None
        t = time.perf_counter()
        try:
            out = client.submit(*args, api_name=endpoint).result(timeout=REQUEST_TIMEOUT)
            rec = Record(endpoint + label, time.perf_counter() - t)
        except Exception as e:  # noqa: BLE001 (every failure is a result to report)
            out, rec = None, Record(endpoint + label, time.perf_counter() - t, f"{type(e).__name__}: {e}"[:300])
        with self.lock:
            self.records.append(rec)
        return out

    def connect(self, n: int, uploads: int) -> None:
        """Open ``n`` clients; each uploads ``uploads`` pictures of the pool (in turn, so all of them get used)."""
        self.clients = [Client(self.url, verbose=False, download_files=False) for _ in range(n)]
        self.images = [[] for _ in range(n)]
        self.run(lambda i: self.upload(i, uploads))

    def upload(self, index: int, uploads: int) -> None:
        for k in range(uploads):
            picture = self.pool[(index * uploads + k) % len(self.pool)]
            out = self.call(self.clients[index], "/upload_image", handle_file(str(picture)))
            if out and out["sha256"] not in self.images[index]:
                self.images[index].append(out["sha256"])

    def work(self, index: int, uploads: int, exports: int, playground: int, seed: int = 0) -> None:
        """One user's requests: re-uploads, export maps and playground updates in a shuffled order."""
        rng = random.Random(1000 * seed + index)
        client, images = self.clients[index], self.images[index] or [""]
        plan = ["/upload_image"] * uploads + ["/export_summary"] * exports + ["/head_field"] * playground
        rng.shuffle(plan)
        for endpoint in plan:
            image = rng.choice(images)
            if endpoint == "/upload_image":
                self.call(client, endpoint, handle_file(str(rng.choice(self.pool))))
            elif endpoint == "/export_summary":
                ckpt = rng.choice(self.checkpoints)
                self.call(client, endpoint, ckpt, image, round(rng.uniform(0.05, 1.0), 2))
            else:
                self.call(client, endpoint, random_head(rng), image)

    def alone(self, n: int) -> None:
        """``n`` export-map and ``n`` playground requests from one client while the others wait: the time a
        request takes without a queue, to read the loaded latencies against."""
        rng, client, images = random.Random(7), self.clients[0], self.images[0] or [""]
        for _ in range(n):
            image = rng.choice(images)
            self.call(
                client, "/export_summary", rng.choice(self.checkpoints), image, rng.uniform(0.05, 1), label=" (alone)"
            )
            self.call(client, "/head_field", random_head(rng), image, label=" (alone)")

    def burst(self, index: int, n: int, seed: int = 0) -> None:
        """``n`` requests submitted at once, not one after another (a page firing several events, a script's
        loop), then awaited: together with the other clients' bursts, more than the server computes at once."""
        rng = random.Random(1000 * seed + index)
        client, images = self.clients[index], self.images[index] or [""]
        pending = []
        for k in range(n):
            image = rng.choice(images)
            if k % 4 == 0:
                endpoint, args = "/export_summary", (rng.choice(self.checkpoints), image, rng.uniform(0.05, 1.0))
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


# ------------------------------------------------------------------------------------------ the server


def rss_mb(pid: int) -> float:
    """Resident memory of a process (``VmRSS``), in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


class RssSampler(threading.Thread):
    """The server's resident memory every ``period`` seconds while the load runs."""

    def __init__(self, pid: int, period: float = 0.25):
        super().__init__(daemon=True)
        self.pid, self.period, self.samples = pid, period, []
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.is_set():
            self.samples.append(rss_mb(self.pid))
            self._done.wait(self.period)

    def stop(self) -> list[float]:
        self._done.set()
        self.join()
        return self.samples


# ------------------------------------------------------------------------------------------ report


def latency_table(records: list[Record]) -> dict[str, dict[str, float]]:
    out = {}
    for endpoint in sorted({r.endpoint for r in records}):
        ok = [r.seconds * 1e3 for r in records if r.endpoint == endpoint and r.error is None]
        failed = sum(1 for r in records if r.endpoint == endpoint and r.error is not None)
        row: dict[str, float] = {"requests": len(ok) + failed, "errors": failed}
        if ok:
            row |= {
                "p50_ms": statistics.median(ok),
                "p95_ms": float(np.percentile(ok, 95)),
                "max_ms": max(ok),
            }
        out[endpoint] = row
    return out


def run_benchmark(args: argparse.Namespace) -> dict[str, Any]:
    """Start the app, warm it up, load it; the figures as a dict (the server is always stopped)."""
    tmp = Path(tempfile.mkdtemp(prefix="ssog-load-"))
    pool = picture_pool(tmp / "pictures", args.assets_dir)
    server = AppProcess(args.checkpoint_dir, args.assets_dir, tmp / "server.log", startup_timeout=180.0).start()
    try:
        rss_start = rss_mb(server.pid)
        probe = Client(server.url, verbose=False, download_files=False)
        checkpoints = probe.predict(api_name="/checkpoints")[: args.max_checkpoints]
        probe.close()
        if not checkpoints:
            raise RuntimeError(f"no checkpoint in {args.checkpoint_dir}: the export-map requests need one")
        load = Load(server.url, checkpoints, pool, time.monotonic() + args.deadline)
        # warm-up: every client connects (one Gradio session each) and uploads pictures, the pool between them;
        # one export and two playground requests each load every model and fill the caches
        t = time.perf_counter()
        load.connect(args.clients, max(args.uploads, math.ceil(len(pool) / args.clients)))
        load.run(lambda i: load.work(i, 0, 1, 2))
        warm_s, warm_records, load.records = time.perf_counter() - t, load.records, []
        load.alone(args.alone)
        time.sleep(1.0)
        rss_before = rss_mb(server.pid)
        rounds = []
        for r in range(args.rounds):
            sampler = RssSampler(server.pid)
            sampler.start()
            n0 = len(load.records)
            seconds = load.run(lambda i, r=r: load.work(i, args.uploads, args.exports, args.playground, seed=r + 1))
            samples = sampler.stop()
            time.sleep(1.0)
            new = load.records[n0:]
            rounds.append(
                {
                    "requests": len(new),
                    "errors": sum(rec.error is not None for rec in new),
                    "seconds": round(seconds, 1),
                    "rss_peak_mb": round(max(samples, default=0.0), 1),
                    "rss_after_mb": round(rss_mb(server.pid), 1),
                }
            )
        burst = {}
        if args.burst:
            n0 = len(load.records)
            seconds = load.run(lambda i: load.burst(i, args.burst, seed=99))
            new = load.records[n0:]
            burst = {"requests": len(new), "errors": sum(rec.error is not None for rec in new),
                     "seconds": round(seconds, 1), "rss_after_mb": round(rss_mb(server.pid), 1)}  # fmt: skip
        load.close()
        alive = server.proc.poll() is None
        log_tail = server.log_tail(3000)
    finally:
        server.stop()
    shutil.rmtree(tmp, ignore_errors=True)  # pictures and server log (its tail is in the result); kept on a crash
    records = load.records
    errors = [rec for rec in records if rec.error is not None]
    warm_errors = [rec for rec in warm_records if rec.error is not None]
    rss_after = rounds[-1]["rss_after_mb"]
    growth = (rss_after - rss_before) / rss_before
    load_s = sum(r["seconds"] for r in rounds)
    result = {
        "when": time.strftime("%Y-%m-%d %H:%M"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "load_average_after": [round(v, 2) for v in os.getloadavg()],
        "command": " ".join(["python benchmarks/load_app.py", *sys.argv[1:]]),
        "clients": args.clients,
        "rounds": args.rounds,
        "per_client_per_round": {
            "upload_image": args.uploads,
            "export_summary": args.exports,
            "head_field": args.playground,
        },
        "checkpoints": checkpoints,
        "pictures": [p.name for p in pool],
        "server_startup_s": round(server.startup_s, 1),
        "warmup_s": round(warm_s, 1),
        "warmup_requests": len(warm_records),
        "warmup_errors": len(warm_errors),
        "load_s": round(load_s, 1),
        "requests": len(records),
        "errors": len(errors),
        "error_examples": sorted({rec.error for rec in errors + warm_errors})[:5],
        "throughput_rps": round(sum(r["requests"] for r in rounds) / max(load_s, 1e-9), 2),
        "latency": latency_table(records),
        "rss_mb": {
            "at_start": round(rss_start, 1),
            "after_warmup": round(rss_before, 1),
            "peak_during_load": max(r["rss_peak_mb"] for r in rounds),
            "after_load": rss_after,
            "growth": round(growth, 4),
        },
        "per_round": rounds,
        "burst": burst,
        "queue": {"computed_at_once": app_main.CONCURRENCY, "max_waiting": app_main.QUEUE_SIZE},
        "max_growth": args.max_growth,
        "server_alive_after": alive,
        "passed": not errors and not warm_errors and growth <= args.max_growth and alive,
    }
    if errors or warm_errors or not alive:
        result["server_log_tail"] = log_tail
    return result


def markdown(r: dict[str, Any]) -> str:
    rss, per = r["rss_mb"], r["per_client_per_round"]
    lines = [
        "# App under load",
        "",
        f"Measured {r['when']} on {r['machine']}; load average after the run {r['load_average_after']} "
        "(a shared 2-core box: other jobs ran too). Command: `" + r["command"] + "`.",
        "",
        f"{r['clients']} concurrent `gradio_client` clients on 127.0.0.1 (one Gradio session each), {r['rounds']} "
        f"round(s); in each round every client sends {per['upload_image']} picture uploads, "
        f"{per['export_summary']} export-map requests and {per['head_field']} playground updates (the picture drawn "
        f"under the head), shuffled, on {', '.join(r['checkpoints'])} and {len(r['pictures'])} pictures of varied "
        "size and mode (1×1 to 1600×1200; PNG, JPEG, CMYK JPEG, 16-bit, grayscale, RGBA, GIF, BMP, WebP). "
        f"The server computes {r['queue']['computed_at_once']} requests at once; up to "
        f"{r['queue']['max_waiting']} more wait in its queue.",
        "",
        f"**{r['requests']} requests, {r['errors']} errors** (rounds: {r['load_s']} s, {r['throughput_rps']} "
        f"requests/s; plus the requests sent alone and the burst), after a warm-up of {r['warmup_requests']} "
        f"requests ({r['warmup_s']} s, {r['warmup_errors']} errors). "
        f"**{'PASSED' if r['passed'] else 'FAILED'}** (bars: 0 errors, memory growth after warm-up ≤ "
        f"{r['max_growth']:.0%}).",
        "",
        "| endpoint | requests | errors | p50 | p95 | max |",
        "|---|---|---|---|---|---|",
    ]
    for endpoint, row in r["latency"].items():
        if "p50_ms" in row:
            timing = f"{row['p50_ms']:.0f} ms | {row['p95_ms']:.0f} ms | {row['max_ms']:.0f} ms"
        else:
            timing = "– | – | –"
        lines.append(f"| `{endpoint}` | {row['requests']} | {row['errors']} | {timing} |")
    lines += [
        "",
        "| server memory (VmRSS of the app's process) | MB |",
        "|---|---|",
        f"| at start | {rss['at_start']} |",
        f"| after warm-up | {rss['after_warmup']} |",
    ]
    for i, rnd in enumerate(r["per_round"]):
        lines.append(
            f"| after round {i + 1} ({rnd['requests']} requests, {rnd['errors']} errors, {rnd['seconds']} s; "
            f"peak {rnd['rss_peak_mb']}) | {rnd['rss_after_mb']} |"
        )
    if r["burst"]:
        b = r["burst"]
        lines.append(
            f"| after a burst ({r['clients']} clients × {b['requests'] // r['clients']} requests submitted at once: "
            f"{b['requests']} requests, {b['errors']} errors, {b['seconds']} s) | {b['rss_after_mb']} |"
        )
    lines += [
        f"| **growth after warm-up** (to the end of the rounds) | **{rss['growth']:+.1%}** |",
        "",
        "Latency is measured by each client from submit to result: it includes the wait in the queue, which is "
        "where a burst goes. The rows marked *alone* are one client's requests while the others wait, before the "
        "rounds: the time a request takes without a queue.",
    ]
    if r.get("error_examples"):
        lines += ["", "Errors:", *[f"- `{e}`" for e in r["error_examples"]]]
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--uploads", type=int, default=2, help="pictures each client uploads per round")
    ap.add_argument("--exports", type=int, default=5, help="export-map requests per client")
    ap.add_argument("--playground", type=int, default=20, help="playground updates per client")
    ap.add_argument("--rounds", type=int, default=3, help="load rounds by the same clients (memory must stay flat)")
    ap.add_argument("--alone", type=int, default=10, help="requests of each kind sent by one client alone first")
    ap.add_argument("--burst", type=int, default=8, help="then requests each client submits at once (0: none)")
    ap.add_argument("--checkpoint-dir", type=Path, default=ROOT / "checkpoints")
    ap.add_argument("--assets-dir", type=Path, default=ROOT / "assets")
    ap.add_argument("--max-checkpoints", type=int, default=2)
    ap.add_argument("--max-growth", type=float, default=0.10)
    ap.add_argument("--deadline", type=float, default=900.0, help="seconds after which no request is sent")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "load_app", help="OUT.json, OUT.md")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result = run_benchmark(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    args.out.with_suffix(".md").write_text(markdown(result))
    print(markdown(result))
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
