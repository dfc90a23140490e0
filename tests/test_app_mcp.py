"""``python -m app --mcp``: the typed endpoints as MCP tools (Gradio's built-in server), listed with the ``mcp``
package's client; with a login configured, no MCP request is answered without its credentials."""

from __future__ import annotations

import asyncio
import base64

import pytest

from app.layout import build_app
from app.main import launch, parse_args
from app.state import AppContext
from ssog_core.testing.app_process import free_port
from tests.app_fixtures import write_checkpoints, write_images

mcp = pytest.importorskip("mcp")
from mcp.client.streamable_http import streamablehttp_client  # noqa: E402

LOGIN = ("ada", "s3cret:pass")


def serve(tmp_path_factory, auth):
    root = tmp_path_factory.mktemp("mcp")
    write_checkpoints(root / "ckpt", depth=1)
    write_images(root / "assets")
    demo = build_app(AppContext(root / "ckpt", root / "assets", upload_dir=tmp_path_factory.mktemp("uploads")))
    launch(demo, "127.0.0.1", free_port(), mcp=True, auth=auth, prevent_thread_lock=True, quiet=True)
    return demo


def tools(url: str, headers: dict | None = None) -> list[str]:
    async def go() -> list[str]:
        async with (
            streamablehttp_client(url + "gradio_api/mcp/", headers=headers) as (r, w, _),
            mcp.ClientSession(r, w) as session,
        ):
            await session.initialize()
            return [t.name for t in (await session.list_tools()).tools]

    return asyncio.run(go())


def test_mcp_is_off_by_default_and_lists_the_typed_endpoints(tmp_path_factory):
    assert parse_args([]).mcp is False and parse_args(["--mcp"]).mcp is True
    demo = serve(tmp_path_factory, None)
    try:
        names = tools(demo.local_url)
        assert any("intervene" in n for n in names) and any("head_importance" in n for n in names)
        assert any("geometry_summary" in n for n in names)
    finally:
        demo.close()


@pytest.mark.slow
def test_with_a_login_no_mcp_request_is_answered_without_it(tmp_path_factory):
    demo = serve(tmp_path_factory, [LOGIN])
    try:
        with pytest.raises(BaseException):  # noqa: B017 (the client wraps the 401 in an exception group)
            tools(demo.local_url)
        with pytest.raises(BaseException):  # noqa: B017
            tools(demo.local_url, {"Authorization": "Basic " + base64.b64encode(b"ada:wrong").decode()})
        token = base64.b64encode(f"{LOGIN[0]}:{LOGIN[1]}".encode()).decode()
        assert any("intervene" in n for n in tools(demo.local_url, {"Authorization": f"Basic {token}"}))
    finally:
        demo.close()
