"""SSOG Lab's web app from the command line: parse the flags, choose the device, read logins, and serve the page
(:mod:`app.layout`) with its API (:mod:`app.api`).

    python -m app [--host 127.0.0.1] [--port 7860] [--checkpoint-dir checkpoints/] [--assets-dir assets/]
                  [--threads 1] [--device cpu|cuda|cuda:N] [--auth-file users.txt] [--mcp]
                  [--cluster tcp://HOST:PORT]

The app is a thin layer: every number it shows comes from :mod:`ssog_core` (field, analysis, checkpoints,
images), drawn by :mod:`ssog_core.viz.figures` or :mod:`app.plots`.
"""

from __future__ import annotations

import argparse
import atexit
import base64
import hmac
import ipaddress
import os
import shutil
import signal
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import gradio as gr

    from app.state import AppContext

# Gradio, torch and the page are imported where they are used, not here: `python -m app --help` and a mistyped flag
# answer at once instead of after the seconds those imports take (tests/test_app_serve.py times it).

MAX_UPLOAD_BYTES = 64 * 1024**2  # any file sent to the server; checkpoints of the size this project trains fit
QUEUE_SIZE = 512  # requests waiting beyond this are told the server is busy (a class firing bursts at once fits)
CONCURRENCY = 2  # analysis requests computed at once (2 CPU cores); the rest wait in the queue
SESSIONS = 128  # browser tabs / API clients whose state Gradio keeps (~0.3-2 MB each); the least recent go first
AUTH_ENV = "SSOG_LAB_AUTH"  # user:password lines, as in an --auth-file (never a password on the command line)


def parser() -> argparse.ArgumentParser:
    """The command line of ``python -m app`` (README's "The app" lists every flag; a test checks it)."""
    ap = argparse.ArgumentParser(prog="python -m app", description="SSOG Lab web app")
    ap.add_argument("--host", default="127.0.0.1", help="interface to bind (default: this machine only)")
    ap.add_argument("--port", type=int, default=7860)
    ap.add_argument(
        "--checkpoint-dir",
        default="checkpoints",
        type=Path,
        help="folder of models: .safetensors checkpoints and model folders (timm or transformers layout: "
        "config.json + model.safetensors); a model in the local Hugging Face cache opens on the page as "
        "hf-hub:ORG/NAME",
    )
    ap.add_argument(
        "--assets-dir",
        default="assets",
        type=Path,
        help="folder of bundled images (also the pictures a model without a validation set is measured on; the page "
        "takes other pictures too)",
    )
    ap.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads per request (1 keeps concurrent requests from fighting over the cores)",
    )
    ap.add_argument(
        "--device",
        default=None,
        help="where models and their analysis run: cpu, cuda or cuda:N (default: CUDA when available, else CPU)",
    )
    ap.add_argument(
        "--auth-file",
        type=Path,
        default=None,
        help=f"file of user:password lines: the page and the API ask for a login (or set {AUTH_ENV})",
    )
    ap.add_argument(
        "--mcp",
        action="store_true",
        help="also serve the typed endpoints as MCP tools at /gradio_api/mcp/ (with a login: HTTP Basic required)",
    )
    ap.add_argument(
        "--cluster",
        metavar="tcp://HOST:PORT",
        default=None,
        help="run heavy jobs (validation, head importance) on this Dask scheduler's workers "
        "(default: a local pool of worker processes)",
    )
    return ap


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    return parser().parse_args(argv)


class MCPLogin:
    """ASGI guard: with logins configured, an MCP request (``/gradio_api/mcp…``) must carry HTTP Basic credentials
    of one of them. Gradio's MCP server does not ask for the page's login, so without this anyone could list and
    call the tools of a server that has one."""

    def __init__(self, app: Any, logins: Sequence[tuple[str, str]]):
        self.app = app
        self.allowed = {"Basic " + base64.b64encode(f"{u}:{p}".encode()).decode("ascii") for u, p in logins}

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and "/gradio_api/mcp" in scope.get("path", ""):
            from starlette.responses import PlainTextResponse

            given = dict(scope.get("headers") or []).get(b"authorization", b"").decode("latin-1")
            if not any(hmac.compare_digest(given, ok) for ok in self.allowed):
                refuse = PlainTextResponse("login required", status_code=401, headers={"WWW-Authenticate": "Basic"})
                await refuse(scope, receive, send)
                return
        await self.app(scope, receive, send)


def choose_device(requested: str | None) -> str:
    """The device models run on: the one asked for (refused with the reason if this machine lacks it), else
    the first GPU when there is one. On CUDA the models' SSOG layers run the fused Triton kernels through the
    same ``ssog_apply`` dispatch as training, so the app shows what those kernels compute."""
    import torch

    if requested is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        dev = torch.device(requested)
    except (RuntimeError, ValueError):
        raise ValueError(f"--device {requested!r}: use cpu, cuda or cuda:N") from None
    if dev.type == "cpu":
        return "cpu"
    if dev.type != "cuda":
        raise ValueError(f"--device {requested!r}: use cpu, cuda or cuda:N")
    if not torch.cuda.is_available():
        raise ValueError(f"--device {requested}: this machine has no CUDA GPU that torch can use")
    if dev.index is not None and dev.index >= torch.cuda.device_count():
        raise ValueError(f"--device {requested}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return str(dev)


def read_auth(path: Path | None, environ: Mapping[str, str]) -> list[tuple[str, str]] | None:
    """Logins from ``path`` or else the ``SSOG_LAB_AUTH`` variable: one ``user:password`` per line (blank lines
    and ``#`` comments skipped; the password may contain ``:``). None when neither is given."""
    if path is not None:
        try:
            text, source = path.read_text(encoding="utf-8"), str(path)
        except OSError as e:
            raise ValueError(f"--auth-file {path}: {e.strerror or e}") from None
    elif environ.get(AUTH_ENV):
        text, source = environ[AUTH_ENV], AUTH_ENV
    else:
        return None
    logins = []
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        user, sep, password = line.partition(":")
        if not sep or not user.strip() or not password:
            raise ValueError(f"{source}, line {n}: expected user:password")
        logins.append((user.strip(), password))
    if not logins:
        raise ValueError(f"{source} holds no user:password line")
    return logins


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve to any interface
        return False


def access_warning(host: str, auth: Sequence[tuple[str, str]] | None) -> str | None:
    """What to print at start when the app is reachable from other machines without a login."""
    if auth or is_loopback(host):
        return None
    return (
        f"WARNING: serving on {host} without a login: anyone who can reach this machine can use the app, "
        f"upload files and run models. Give users a login with --auth-file FILE (or {AUTH_ENV}), or bind "
        "--host 127.0.0.1."
    )


def launch(
    demo: gr.Blocks, host: str, port: int, prevent_thread_lock: bool = False, mcp: bool = False, **extra: Any
) -> None:
    """Queue (bursts wait rather than fail) and serve with the upload cap, a bound on the sessions kept in memory
    (Gradio keeps every session's state until it is evicted), the offline theme, no share link, and with ``auth``
    nothing but a login page without the API's description for strangers (:mod:`app.login`); ``mcp`` adds
    Gradio's built-in MCP server (off by default,
    :mod:`app.mcp_server`), behind :class:`MCPLogin` when ``auth`` holds logins. Gradio's
    own start-up lines are silenced (they suggest ``share=True``, which this app never uses); the address is
    printed here instead."""
    from starlette.middleware import Middleware

    from app.layout import CSS, theme
    from app.login import LoginRequired

    demo.queue(default_concurrency_limit=CONCURRENCY, max_size=QUEUE_SIZE)
    extra["mcp_server"] = mcp  # explicit: Gradio would otherwise read GRADIO_MCP_SERVER
    started, middleware = threading.Event(), []
    if extra.get("auth"):
        middleware.append(Middleware(LoginRequired, logins=extra["auth"], started=started))
    if mcp and extra.get("auth"):
        middleware.append(Middleware(MCPLogin, logins=extra["auth"]))
    demo.launch(
        server_name=host,
        server_port=port,
        share=False,
        max_file_size=MAX_UPLOAD_BYTES,
        state_session_capacity=SESSIONS,
        max_threads=SESSIONS + 40,  # Gradio's 40, plus a thread per session for a request waiting on its heavy job
        theme=theme(),
        css=CSS,
        show_error=False,
        footer_links=["api"],
        app_kwargs={"middleware": middleware},
        **{"quiet": True, **extra},
        prevent_thread_lock=True,
        # Gradio's launch() first waits (no time limit) for its own /startup-events request, which proves the server
        # answers on localhost, then probes the page once more and gives up after one 3 s request, which a busy
        # machine can miss ("When localhost is not accessible, a shareable link must be created"). That second
        # probe is all ``_frontend`` controls.
        _frontend=False,
    )
    if demo.local_url:  # the probe skipped above, with patience
        page_answers(demo.local_url)
    started.set()
    if mcp:
        from app.mcp_server import serve_mcp

        serve_mcp(demo, extra.get("auth"))
    print(f"SSOG Lab is serving on {demo.local_url}", flush=True)
    if not prevent_thread_lock:
        demo.block_thread()


def page_answers(url: str, seconds: float = 120.0) -> None:
    """Ask for the page as Gradio's own probe does (HEAD), retrying until it answers: the first page request also
    sets up part of Gradio's queue (without it, a page's waiting job left the queue while the page was still
    connected: tests/test_app_queues.py)."""
    import time

    import httpx

    deadline = time.monotonic() + seconds
    while True:
        try:
            if httpx.head(url, timeout=10).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{url} did not answer within {seconds:.0f} s of start")
        time.sleep(0.5)


def warm_up(ctx: AppContext) -> float:
    """Pay the process's one-time costs before the server says it is up, so that a user's first click costs what
    the second does: the first checkpoint load and the first forward pass of a process take seconds (imports, the
    kernels' first use), whichever checkpoint. Loads the checkpoint the page opens with (it stays cached) and runs
    it on the picture the page opens with. Returns the seconds spent; a checkpoint that fails to load is left for the
    page to report."""
    from time import perf_counter

    import torch

    from app.layout import default_checkpoint
    from app.state import AppError, default_image

    t0 = perf_counter()
    name = default_checkpoint(ctx, ctx.checkpoint_names())
    try:
        loaded = ctx.model(name) if name else None
    except AppError:
        return perf_counter() - t0
    image = default_image(ctx, name)
    if loaded is not None and image is not None:
        with torch.no_grad():
            loaded.model(loaded.input(image.image))
    return perf_counter() - t0


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # Gradio then closes the server, and the atexit clean-up runs


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    import torch

    from app import queues
    from app.layout import build_app
    from app.state import AppContext
    from ssog_core.runtime import memory
    from ssog_core.runtime.jobs import JobError

    try:
        device = choose_device(args.device)
        auth = read_auth(args.auth_file, os.environ)
    except ValueError as e:
        sys.exit(f"error: {e}")
    try:
        engine = queues.start_engine(args.cluster, max(1, args.threads), on_cpu=device == "cpu")
    except JobError as e:
        sys.exit(f"error: --cluster: {e}")
    atexit.register(engine.close)
    print(f"heavy jobs run on {engine.where}", flush=True)
    warning = access_warning(args.host, auth)
    if warning:
        print(warning, file=sys.stderr, flush=True)
    memory.limit_malloc_arenas()
    torch.set_num_threads(max(1, args.threads))
    ctx = AppContext(args.checkpoint_dir, args.assets_dir, device=device)
    atexit.register(shutil.rmtree, ctx.upload_dir, True)  # uploaded checkpoints do not outlive the server
    signal.signal(signal.SIGTERM, _interrupt)  # a service manager's stop is a clean stop, as Ctrl-C is
    demo = build_app(ctx, login=bool(auth))
    print(f"warmed up in {warm_up(ctx):.1f} s", flush=True)
    try:
        launch(demo, args.host, args.port, mcp=args.mcp, auth=auth)
    except KeyboardInterrupt:  # stopped while Gradio was still starting up (once it serves, Gradio handles it)
        demo.close()
