"""Serving the app to a lab: the device models run on, logins (Gradio's own auth) and the start-up warning."""

from __future__ import annotations

import http.cookiejar
import re
import signal
import urllib.error
import urllib.parse
import urllib.request

import gradio as gr
import httpx
import pytest
import torch
from gradio_client import Client, handle_file
from starlette.routing import Mount, WebSocketRoute

from app import main as app_main
from app import state
from app.layout import HEADER, build_app
from app.login import is_public
from app.main import launch
from app.state import AppContext
from ssog_core import ViT
from ssog_core.testing.app_process import READY_LINE, free_port
from tests.app_fixtures import write_checkpoints, write_images

LOGIN = ("ana", "pa:ss word")


def fake_gpus(monkeypatch, n: int) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: n > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: n)


def test_device_defaults_to_a_gpu_when_there_is_one(monkeypatch):
    fake_gpus(monkeypatch, 0)
    assert app_main.choose_device(None) == "cpu" and app_main.choose_device("cpu") == "cpu"
    with pytest.raises(ValueError, match="no CUDA GPU"):
        app_main.choose_device("cuda")
    fake_gpus(monkeypatch, 2)
    assert app_main.choose_device(None) == "cuda" and app_main.choose_device("cuda:1") == "cuda:1"
    assert app_main.choose_device("cpu") == "cpu"
    for bad, message in (("cuda:2", "has 2 CUDA"), ("tpu", "use cpu, cuda"), ("mps", "use cpu, cuda")):
        with pytest.raises(ValueError, match=message):
            app_main.choose_device(bad)
    with pytest.raises(SystemExit, match="error: --device 'tpu'"):
        app_main.main(["--device", "tpu"])


def test_models_load_on_the_chosen_device(tmp_path, monkeypatch):
    """The checkpoint is loaded onto the app's device (a fake one here: the loader records where it was asked
    to put the model), and every model input follows the model to its device."""
    write_checkpoints(tmp_path / "ckpt", depth=1)
    write_images(tmp_path / "assets")
    asked = []
    real = state.load_checkpoint

    def recording(path, device="cpu"):
        asked.append(device)
        return real(path, "cpu")

    monkeypatch.setattr(state, "load_checkpoint", recording)
    ctx = AppContext(tmp_path / "ckpt", tmp_path / "assets", upload_dir=tmp_path / "up", device="cuda:3")
    loaded = ctx.model("ssog_test.safetensors")
    assert asked == ["cuda:3"] and loaded.device == torch.device("cpu")
    x = loaded.input(ctx.open_bundled("scene.png").image)
    assert x.shape == (1, 3, 32, 32) and x.device == loaded.device
    assert "models run on **cuda:3**" in HEADER.format(device=ctx.device)


def test_logins_from_a_file_or_the_environment(tmp_path):
    f = tmp_path / "users.txt"
    f.write_text("# lab\nana:pa:ss word\n\n bob : x\n")
    assert app_main.read_auth(f, {}) == [("ana", "pa:ss word"), ("bob", " x")]
    assert app_main.read_auth(None, {app_main.AUTH_ENV: "eve:secret"}) == [("eve", "secret")]
    assert app_main.read_auth(None, {}) is None
    f.write_text("ana\n")
    with pytest.raises(ValueError, match="line 1: expected user:password"):
        app_main.read_auth(f, {})
    f.write_text("# nobody\n")
    with pytest.raises(ValueError, match="no user:password"):
        app_main.read_auth(f, {})
    with pytest.raises(ValueError, match="--auth-file"):
        app_main.read_auth(tmp_path / "missing.txt", {})
    assert not any("pass" in k for k in vars(app_main.parse_args([])))  # no password on the command line


def test_a_non_loopback_address_without_a_login_is_warned_about():
    for host in ("127.0.0.1", "localhost", "::1", "127.0.0.2"):
        assert app_main.access_warning(host, None) is None
    for host in ("0.0.0.0", "192.168.1.5", "lab-server"):
        warning = app_main.access_warning(host, None)
        assert warning and "without a login" in warning and "--auth-file" in warning
        assert app_main.access_warning(host, [LOGIN]) is None


@pytest.fixture(scope="module")
def guarded(tmp_path_factory):
    root = tmp_path_factory.mktemp("auth")
    write_checkpoints(root / "ckpt", depth=1)
    write_images(root / "assets")
    demo = build_app(AppContext(root / "ckpt", root / "assets", upload_dir=tmp_path_factory.mktemp("up")), login=True)
    launch(demo, "127.0.0.1", free_port(), auth=[LOGIN], mcp=True, prevent_thread_lock=True)
    try:
        yield demo.local_url
    finally:
        demo.close()


def served_routes(routes: list, prefix: str = "") -> list[tuple[str, frozenset[str]]]:
    """Every (path, methods) the app answers, read from its routes: Gradio's, its included routers' and mounted
    apps' (the MCP server) at any depth; a mount without routes as its own path."""
    found = []
    for r in routes:
        if isinstance(r, Mount):
            inner = getattr(r.app, "routes", None)
            found += served_routes(inner, prefix + r.path) if inner else [(prefix + r.path, frozenset({"GET", "POST"}))]
        elif hasattr(r, "original_router"):  # FastAPI's include_router
            found += served_routes(r.original_router.routes, prefix + r.include_context.prefix)
        elif isinstance(r, WebSocketRoute):
            found.append((prefix + r.path, frozenset({"WEBSOCKET"})))
        else:
            found.append((prefix + r.path, frozenset(r.methods or {"GET"})))
    return found


def test_a_stranger_reaches_the_login_page_and_nothing_else(guarded):
    """Every route of the server (walked from the FastAPI app, the MCP server's included), asked without
    credentials, says 401, 403 or 404 (or is the login page or one of its assets) and never opens a stream; no
    answer names an endpoint."""
    demo = next(b for b in gr.Blocks.get_instances() if b.local_url == guarded)
    names = sorted({fn.api_name for fn in demo.fns.values() if fn.api_name})
    assert "checkpoints" in names
    routes = served_routes(demo.app.routes)
    paths = {p for p, _ in routes}
    assert {"/gradio_api/runs", "/gradio_api/heartbeat/{session_hash}", "/openapi.json", "/gradio_api/upload"} <= paths
    assert "/gradio_api/queue/join" in paths and any(p.startswith("/gradio_api/mcp") for p in paths)
    extra = ["/docs", "/redoc", "/gradio_api/mcp/sse", "/gradio_api/mcp/http/", "/gradio_api/mcp/schema"]
    asked, answered = 0, []
    with httpx.Client(base_url=guarded.rstrip("/"), timeout=httpx.Timeout(10, read=5)) as client:
        for path, methods in [*routes, *((p, frozenset({"GET", "POST"})) for p in extra)]:
            url = re.sub(r"\{(\w+)(:\w+)?\}", lambda m: "checkpoints" if m[1] == "api_name" else "x1", path)
            for method in sorted(methods - {"HEAD", "WEBSOCKET"}):
                asked += 1
                with client.stream(method, url, json={} if method == "POST" else None) as r:
                    kind = r.headers.get("content-type", "")
                    assert "event-stream" not in kind, f"{method} {path} opened a stream"
                    body = r.read().decode("utf-8", "replace")
                named = [n for n in names if f"/{n}" in body or f'"{n}"' in body]
                assert not named, f"{method} {path} ({r.status_code}) names {named}"
                if r.status_code not in (401, 403, 404):
                    answered.append(f"{method} {url} {r.status_code}")
                    assert is_public(url), f"{method} {path}: {r.status_code} without credentials"
    assert asked > 60 and "GET / 200" in answered  # the login page itself


def test_with_a_login_the_page_and_the_api_refuse_strangers(guarded, tmp_path):
    for path in ("config", "gradio_api/info"):  # what the page is built from, and the API's description
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(guarded + path, timeout=30)
        assert refused.value.code == 401, path
    browser = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))
    form = urllib.parse.urlencode({"username": LOGIN[0], "password": LOGIN[1]}).encode()
    browser.open(guarded + "login", data=form, timeout=30).close()  # the login form's post: a session cookie
    with browser.open(guarded + "config", timeout=30) as config:
        assert "pg-canvas" in config.read().decode("utf-8", "replace")
    with pytest.raises(Exception):  # noqa: B017 (gradio_client raises a plain ValueError here)
        Client(guarded, verbose=False)
    with pytest.raises(Exception, match="(?i)login|credentials|incorrect"):
        Client(guarded, auth=("ana", "wrong"), verbose=False)
    client = Client(guarded, auth=LOGIN, verbose=False)
    assert client.predict(api_name="/checkpoints") == ["dot_test.safetensors", "ssog_test.safetensors"]
    picture = write_images(tmp_path)["rgb"]  # an upload, then work on it: every route a client uses lets it in
    sha = client.predict(handle_file(str(picture)), api_name="/upload_image")["sha256"]
    assert client.predict("ssog_test.safetensors", sha, 0.5, api_name="/export_summary")["grid"] == [8, 8]


ENDPOINTS = ("/checkpoints", "/head_field", "/geometry_summary", "/export_summary", "/upload_image")


def test_the_login_page_names_no_endpoint_and_users_can_log_out(guarded):
    """Gradio embeds the API's description in its login page; a stranger sees the form and nothing else."""
    page = urllib.request.urlopen(guarded, timeout=30).read().decode("utf-8", "replace")
    assert "auth_required" in page
    assert not [name for name in (*ENDPOINTS, "parameter_name") if name in page]
    browser = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))
    form = urllib.parse.urlencode({"username": LOGIN[0], "password": LOGIN[1]}).encode()
    browser.open(guarded + "login", data=form, timeout=30).close()
    with browser.open(guarded, timeout=30) as logged_in:  # a user's page still describes the API
        text = logged_in.read().decode("utf-8", "replace")
    assert all(name in text for name in ENDPOINTS) and '"elem_id":"logout"' in text.replace(" ", "")
    browser.open(guarded + "logout", timeout=30).close()
    with pytest.raises(urllib.error.HTTPError):
        browser.open(guarded + "config", timeout=30)


@pytest.mark.slow
def test_the_log_names_the_address_and_suggests_no_share_link(tmp_path, capfd):
    write_checkpoints(tmp_path / "ckpt", depth=1)
    write_images(tmp_path / "assets")
    demo = build_app(AppContext(tmp_path / "ckpt", tmp_path / "assets", upload_dir=tmp_path / "up"))
    launch(demo, "127.0.0.1", free_port(), prevent_thread_lock=True)
    try:
        said = capfd.readouterr()
    finally:
        demo.close()
    assert "share" not in said.out + said.err and f"{READY_LINE} {demo.local_url}" in said.out
    assert "logout" not in str(demo.get_config_file())  # no log-out button without a login


def test_the_first_load_and_forward_are_paid_before_the_server_is_up(tmp_path, monkeypatch):
    """A user's first click must not pay the process's one-time costs: ``main`` loads the checkpoint the page opens
    with and runs it once before ``launch``, and the model stays cached for that click."""
    write_checkpoints(tmp_path / "ckpt", depth=1)
    write_images(tmp_path / "assets")
    events, real_load, real_forward = [], state.load_checkpoint, ViT.forward
    monkeypatch.setattr(state, "load_checkpoint", lambda *a, **k: events.append("load") or real_load(*a, **k))
    monkeypatch.setattr(ViT, "forward", lambda self, x, *a, **k: events.append("forward") or real_forward(self, x))

    def launched(demo, host, port, **kwargs):
        events.append("launch")
        demo.close()

    monkeypatch.setattr(app_main, "launch", launched)
    threads, on_term = torch.get_num_threads(), signal.getsignal(signal.SIGTERM)
    try:
        app_main.main(["--checkpoint-dir", str(tmp_path / "ckpt"), "--assets-dir", str(tmp_path / "assets")])
    finally:
        torch.set_num_threads(threads)
        signal.signal(signal.SIGTERM, on_term)
    assert events[-1] == "launch" and "load" in events and events.index("forward") < events.index("launch")
