"""MCP tools behind the login, callable.

``python -m app --mcp`` serves Gradio's built-in MCP server: its tools, their descriptions and input schemas are the
typed API's (:mod:`app.api`, read from the same declarations by Gradio), at ``/gradio_api/mcp/sse``,
``/gradio_api/mcp/http/`` and ``/gradio_api/mcp/schema``. With a login, :class:`app.main.MCPLogin` refuses every
MCP request without valid HTTP Basic credentials.

Gradio 6 runs a queued tool by calling the app back through one ``gradio_client.Client`` that it makes without
credentials, so behind a login every call failed ("credentials were not provided"). :func:`call_back_as_caller`
gives the server one client per login instead, logged in as the caller, so an MCP call waits in the same queue,
under the same concurrency limits, and gets the same result as the page's and the Gradio client's.
:func:`json_results` makes a tool's text that result as JSON (Gradio writes Python's ``repr`` of it).
"""

from __future__ import annotations

import base64
import binascii
import json
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import gradio as gr


def basic_login(header: str, logins: Sequence[tuple[str, str]]) -> tuple[str, str] | None:
    """The login an ``Authorization: Basic …`` header names, if it is one of ``logins``; else None."""
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        user, sep, password = base64.b64decode(token, validate=True).decode("utf-8").partition(":")
    except (binascii.Error, UnicodeDecodeError):
        return None
    return (user, password) if sep and (user, password) in logins else None


def serve_mcp(demo: gr.Blocks, logins: Sequence[tuple[str, str]] | None) -> None:
    """Adapt the running MCP server of ``demo``: JSON results; with ``logins``, call-backs as the caller."""
    if demo.mcp_server_obj is None:
        raise RuntimeError(f"the MCP server is not running: {getattr(demo, 'mcp_error', None) or 'launch it first'}")
    json_results(demo)
    if logins:
        call_back_as_caller(demo, logins)


def json_results(demo: gr.Blocks) -> None:
    """A tool's JSON value (a dict, list, number or null) comes back as JSON text, what ``gradio_client`` parses;
    text, files and images keep Gradio's own content."""
    from gradio_client.utils import is_file_obj_with_meta
    from mcp.types import TextContent

    server = demo.mcp_server_obj
    gradio_content = server.postprocess_output_data

    def content(data: Any, root_url: str) -> list[Any]:
        out: list[Any] = []
        for value in data:
            if value is None or isinstance(value, (dict, list, int, float)) and not is_file_obj_with_meta(value):
                out.append(TextContent(type="text", text=json.dumps(value)))
            else:
                out.extend(gradio_content([value], root_url))
        return out

    server.postprocess_output_data = content  # Gradio's hook for a tool's result content (gradio/mcp.py)


def call_back_as_caller(demo: gr.Blocks, logins: Sequence[tuple[str, str]]) -> None:
    """Make the running MCP server of ``demo`` call queued tools back with the caller's login (one client per
    login, made at its first call and kept: their number is bounded by the auth file)."""
    from gradio_client import Client

    server = demo.mcp_server_obj
    allowed = [tuple(login) for login in logins]
    clients: dict[tuple[str, str], Client] = {}
    lock = threading.Lock()

    def client() -> Client:
        request: Any = server.mcp_server.request_context.request
        login = basic_login(request.headers.get("authorization", "") if request else "", allowed)
        if login is None:  # MCPLogin refused the request already; never call back without a login
            raise PermissionError("an MCP call needs the HTTP Basic credentials of a login")
        with lock:
            if login not in clients:
                clients[login] = Client(  # as Gradio makes its own, plus the login
                    server.local_url,
                    auth=login,
                    download_files=False,
                    verbose=False,
                    analytics_enabled=False,
                    ssl_verify=False,
                    _skip_components=False,
                    headers={"x-gradio-user": "mcp"},
                )
            return clients[login]

    server._get_or_create_client = client  # Gradio's one hook for the call-back client (gradio/mcp.py)
