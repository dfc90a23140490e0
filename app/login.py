"""With a login configured, a stranger reaches the login form and nothing else.

Gradio 6 guards its API routes one by one, and not all of them: ``/openapi.json`` lists every route,
``/gradio_api/runs`` serves the page template with the API's description (every endpoint and parameter name),
``/gradio_api/heartbeat/…`` opens an event stream. It also embeds that description in the login page itself
(``window.gradio_api_info``). :class:`LoginRequired`, an ASGI middleware handed to Gradio's FastAPI app through
``launch(app_kwargs={"middleware": ...})``, turns that around: a request without a logged-in session (Gradio's
cookie) or a login as HTTP Basic credentials (how API and MCP clients may send it) gets 401, unless it asks for the
login page, the form's post or a static asset of the page; and the login page goes out without the description.
"""

from __future__ import annotations

import base64
import hmac
import re
import threading
from collections.abc import Sequence
from typing import Any

from starlette.requests import HTTPConnection
from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

EMPTY_API = b'window.gradio_api_info = {"named_endpoints": {}, "unnamed_endpoints": {}};</script>'
_API_INFO = re.compile(rb"window\.gradio_api_info = .*?;</script>", re.DOTALL)
_LOGIN_FORM = b'"auth_required":true'  # how Gradio's page config asks the browser for the login form
LOGIN_PAGE = ("/", "/login", "/login/", "/logout")  # the form, its post, and leaving
ASSETS = ("/favicon.ico", "/theme.css", "/gradio_api/theme.css", "/robots.txt", "/manifest.json", "/pwa_icon")
ASSET_FOLDERS = ("/assets/", "/static/", "/svelte/", "/pwa_icon/")  # the page's scripts, styles, fonts, icons
STARTUP = "/gradio_api/startup-events"  # Gradio's launch() calls it without credentials before it returns


def strip_api_info(html: bytes) -> bytes:
    """The page without its API description when it is Gradio's login form; any other page as it is."""
    if _LOGIN_FORM not in html.replace(b" ", b""):
        return html
    return _API_INFO.sub(lambda _: EMPTY_API, html, count=1)


def is_public(path: str) -> bool:
    """Whether a stranger may fetch ``path``: the login page and what it is drawn with."""
    return path in LOGIN_PAGE or path in ASSETS or path.startswith(ASSET_FOLDERS)


class LoginRequired:
    """ASGI middleware: refuses (401) every request of a stranger but :func:`is_public` ones and, until ``started``
    is set, Gradio's own start-up request; strips the API description from the login page."""

    def __init__(self, app: ASGIApp, logins: Sequence[tuple[str, str]], started: threading.Event) -> None:
        self.app = app
        self.basic = {"Basic " + base64.b64encode(f"{u}:{p}".encode()).decode("ascii") for u, p in logins}
        self.started = started

    def logged_in(self, scope: Scope) -> bool:
        """A session of Gradio's login form (its cookie names a token Gradio issued) or a login as HTTP Basic."""
        conn = HTTPConnection(scope)
        given = conn.headers.get("authorization", "")
        if any(hmac.compare_digest(given, ok) for ok in self.basic):
            return True
        gradio = scope.get("app")
        cookie_id, tokens = getattr(gradio, "cookie_id", None), getattr(gradio, "tokens", {})
        names = (f"access-token-{cookie_id}", f"access-token-unsecure-{cookie_id}")
        return any(conn.cookies.get(n) in tokens for n in names if conn.cookies.get(n))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or self.logged_in(scope):
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
        elif path == STARTUP and not self.started.is_set():
            await self.app(scope, receive, send)
        elif not is_public(path):
            await PlainTextResponse("login required", status_code=401)(scope, receive, send)
        elif scope["method"] == "GET":
            await self.app(scope, receive, _without_api_info(send))
        else:
            await self.app(scope, receive, send)


def _without_api_info(send: Send) -> Send:
    """``send`` with an HTML page buffered and passed through :func:`strip_api_info`; anything else untouched."""
    start: dict[str, Any] = {}
    body = bytearray()

    async def buffer(message: Message) -> None:
        if message["type"] == "http.response.start":
            start.update(message)
            return
        if message["type"] != "http.response.body" or not _is_html(start):
            if start:  # a copy: a middleware further out may keep the start message it was sent
                first = dict(start)
                start.clear()
                await send(first)
            await send(message)
            return
        body.extend(message.get("body", b""))
        if not message.get("more_body", False):
            page = strip_api_info(bytes(body))
            headers = [(k, v) for k, v in start.get("headers", []) if k.lower() != b"content-length"]
            await send({**start, "headers": [*headers, (b"content-length", str(len(page)).encode())]})
            await send({"type": "http.response.body", "body": page})

    return buffer


def _is_html(start: dict[str, Any]) -> bool:
    return any(k.lower() == b"content-type" and v.startswith(b"text/html") for k, v in start.get("headers", []))
