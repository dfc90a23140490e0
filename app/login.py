"""The login page a stranger sees shows a form and nothing else.

Gradio 6 builds its login page from the same HTML template as the app and embeds the API's description in it
(``window.gradio_api_info``: every endpoint and parameter name), although ``/gradio_api/info`` itself refuses a
visitor who has not logged in. :class:`LoginPageWithoutApi` is an ASGI middleware, handed to Gradio's FastAPI app
through ``launch(app_kwargs={"middleware": ...})``: on a page Gradio served as its login form (its config says
``auth_required``), it empties that description. Every other response passes through untouched.
"""

from __future__ import annotations

import re
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

EMPTY_API = b'window.gradio_api_info = {"named_endpoints": {}, "unnamed_endpoints": {}};</script>'
_API_INFO = re.compile(rb"window\.gradio_api_info = .*?;</script>", re.DOTALL)
_LOGIN_FORM = b'"auth_required":true'  # how Gradio's page config asks the browser for the login form


def strip_api_info(html: bytes) -> bytes:
    """The page without its API description when it is Gradio's login form; any other page as it is."""
    if _LOGIN_FORM not in html.replace(b" ", b""):
        return html
    return _API_INFO.sub(lambda _: EMPTY_API, html, count=1)


class LoginPageWithoutApi:
    """ASGI middleware: pages (GET, HTML) are buffered and passed through :func:`strip_api_info`."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "GET" or "/gradio_api/" in scope["path"]:
            await self.app(scope, receive, send)
            return
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

        await self.app(scope, receive, buffer)


def _is_html(start: dict[str, Any]) -> bool:
    return any(k.lower() == b"content-type" and v.startswith(b"text/html") for k, v in start.get("headers", []))
