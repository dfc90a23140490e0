"""``python -m app --mcp``: the typed endpoints as MCP tools (Gradio's built-in server), used with the ``mcp``
package's client over both transports. With a login configured, a client with its HTTP Basic credentials lists and
calls the tools, light and heavy ones (all queued), and gets what ``gradio_client`` gets; no MCP route answers a client
without them, or with a wrong password, with anything but a 401 that names no tool."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
from gradio_client import Client

from app.layout import build_app
from app.main import launch, parse_args
from app.mcp_server import basic_login
from app.state import AppContext
from ssog_core import save_checkpoint
from ssog_core.interventions.edit import EDITS as OPS
from ssog_core.testing.app_process import free_port
from tests.app_fixtures import designed_ssog, write_checkpoints, write_images

mcp = pytest.importorskip("mcp")
from mcp.client.sse import sse_client  # noqa: E402
from mcp.client.streamable_http import streamable_http_client  # noqa: E402

LOGIN = ("ada", "s3cret:pass")
OTHER = ("grace", "äö ü")  # a second login, non-ASCII password
SHAPES = {"data": "shapes:train=4,val=60,classes=5", "class_names": ["circle", "square", "triangle", "star", "cross"]}
EDITS = [{"op": "close_gate", "layer": 1, "tap": "mu"}, {"op": "ablate_head", "layer": 0, "head": 1}]
MCP_ROUTES = ("gradio_api/mcp/sse", "gradio_api/mcp/http/", "gradio_api/mcp/schema", "gradio_api/mcp/",
              "gradio_api/mcp/http", "gradio_api/mcp/messages/")  # fmt: skip


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def serve(tmp_path_factory, auth):
    root = tmp_path_factory.mktemp("mcp")
    write_checkpoints(root / "ckpt", depth=1)
    save_checkpoint(root / "ckpt" / "ssog_shapes.safetensors", designed_ssog(depth=2), SHAPES)
    write_images(root / "assets")
    demo = build_app(AppContext(root / "ckpt", root / "assets", upload_dir=tmp_path_factory.mktemp("uploads")))
    launch(demo, "127.0.0.1", free_port(), mcp=True, auth=auth, prevent_thread_lock=True, quiet=True)
    return demo


@asynccontextmanager
async def transport(url: str, kind: str, headers: dict | None) -> AsyncIterator[tuple[Any, Any]]:
    """The (read, write) streams of an MCP connection over SSE or streamable HTTP, sending ``headers``."""
    if kind == "sse":
        async with sse_client(url + "gradio_api/mcp/sse", headers=headers) as (read, write):
            yield read, write
        return
    async with (
        httpx.AsyncClient(headers=headers, timeout=httpx.Timeout(30, read=300)) as http,
        streamable_http_client(url + "gradio_api/mcp/http/", http_client=http) as (read, write, _),
    ):
        yield read, write


def session_run(url: str, kind: str, headers: dict | None, calls: list[tuple[str, dict]]) -> tuple[list, list]:
    """Tool names, then each call's JSON result (or its error text), over one MCP session."""

    async def go() -> tuple[list, list]:
        async with transport(url, kind, headers) as streams, mcp.ClientSession(streams[0], streams[1]) as session:
            await session.initialize()
            names = [t.name for t in (await session.list_tools()).tools]
            results = []
            for name, args in calls:
                r = await session.call_tool(name, args)
                text = r.content[0].text if r.content else ""
                results.append(("error", text) if r.isError else json.loads(text))
            return names, results

    return asyncio.run(go())


def input_schemas(url: str, kind: str, headers: dict | None) -> dict[str, dict]:
    """Each tool's input schema, as an MCP client lists them."""

    async def go() -> dict[str, dict]:
        async with transport(url, kind, headers) as streams, mcp.ClientSession(streams[0], streams[1]) as session:
            await session.initialize()
            return {t.name: t.inputSchema for t in (await session.list_tools()).tools}

    return asyncio.run(go())


def check_edits_schema(edits: dict[str, Any]) -> None:
    """``edits`` as the registry declares it: every op, each field with its kind and choices, and per op the
    fields it takes and needs."""
    items = edits["items"]
    assert edits["type"] == "array" and items["properties"]["op"]["enum"] == list(OPS)
    assert items["properties"]["tap"]["enum"] == ["mu", "sigma", "lambda", "all"]
    assert items["properties"]["mode"]["enum"] == ["zero", "dataset_mean"]
    assert items["properties"]["dy"]["type"] == "number"
    by_op = {s["if"]["properties"]["op"]["const"]: s["then"] for s in items["allOf"]}
    assert list(by_op) == list(OPS)
    for op, cls in OPS.items():
        assert set(by_op[op]["properties"]) == set(cls.params()), op
    assert by_op["drop_atom"]["required"] == ["layer", "head", "atom"]


@pytest.fixture(scope="module")
def with_login(tmp_path_factory):
    demo = serve(tmp_path_factory, [LOGIN, OTHER])
    try:
        yield demo
    finally:
        demo.close()


@pytest.mark.slow
def test_mcp_is_off_by_default_and_lists_the_typed_endpoints(tmp_path_factory):
    assert parse_args([]).mcp is False and parse_args(["--mcp"]).mcp is True
    demo = serve(tmp_path_factory, None)
    try:
        names, _ = session_run(demo.local_url, "http", None, [])
        assert {"checkpoints", "intervene", "head_importance", "geometry_summary", "target_share", "distill"} <= set(
            names
        )
    finally:
        demo.close()


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["http", "sse"])
def test_a_logged_in_client_calls_light_and_heavy_tools_as_the_gradio_client_does(with_login, kind):
    url = with_login.local_url
    intervene = {"checkpoint": "ssog_shapes.safetensors", "image": "scene.png", "edits": EDITS, "eval_images": 12}
    sweep = {"checkpoint": "ssog_shapes.safetensors", "eval_images": 12, "mode": "zero"}
    deep = [{"op": "close_gate", "layer": 9}]  # fits the schema; the model has no layer 9
    calls = [("checkpoints", {}), ("intervene", intervene), ("intervene", {**intervene, "edits": [{"op": "x"}]}),
             ("intervene", {**intervene, "edits": deep}), ("head_importance", sweep)]  # fmt: skip
    names, (listed, edited, refused, checked, importance) = session_run(url, kind, basic(*LOGIN), calls)
    assert {"checkpoints", "intervene", "head_importance", "upload_image"} <= set(names)
    gradio = Client(url, auth=OTHER, verbose=False)
    assert listed == gradio.predict(api_name="/checkpoints") and "ssog_shapes.safetensors" in listed
    assert edited == gradio.predict(*intervene.values(), api_name="/intervene")
    assert edited["validation"]["n"] == 12 and edited["edited"]["probs"] != edited["unedited"]["probs"]
    assert refused[0] == "error" and "'x' is not one of ['close_gate'" in refused[1]  # by the schema, in words
    assert checked[0] == "error" and "layer 9 does not exist" in checked[1]  # by the server, which serves on
    assert importance == gradio.predict(*sweep.values(), api_name="/head_importance") and importance["n"] == 12
    _, (again,) = session_run(url, kind, basic(*OTHER), [("checkpoints", {})])
    assert again == listed


@pytest.mark.slow
@pytest.mark.parametrize("headers", [None, basic(LOGIN[0], "wrong"), basic("eve", LOGIN[1]), {"Authorization": "x"}])
def test_without_a_valid_login_no_mcp_route_answers_or_names_a_tool(with_login, headers):
    url = with_login.local_url
    for route in MCP_ROUTES:
        for method, accept in (("GET", "text/event-stream"), ("GET", "text/html"), ("POST", "application/json")):
            r = httpx.request(method, url + route, headers={**(headers or {}), "Accept": accept})
            assert r.status_code == 401, (route, method, r.status_code)
            assert "intervene" not in r.text and "checkpoints" not in r.text
    for kind in ("http", "sse"):
        with pytest.raises(BaseException):  # noqa: B017 (the client wraps the 401 in an exception group)
            session_run(url, kind, headers, [])


@pytest.mark.slow
def test_the_schema_route_describes_the_tools_to_a_logged_in_client(with_login):
    r = httpx.get(with_login.local_url + "gradio_api/mcp/schema", headers=basic(*LOGIN))
    tools: dict[str, Any] = {t["name"]: t for t in r.raise_for_status().json()}
    assert set(tools["intervene"]["inputSchema"]["properties"]) == {
        "checkpoint",
        "image",
        "edits",
        "eval_images",
        "pictures",
    }
    check_edits_schema(tools["intervene"]["inputSchema"]["properties"]["edits"])


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["http", "sse"])
def test_an_mcp_client_sees_each_op_and_its_fields_in_the_edits_schema(with_login, kind):
    """The schema of ``edits`` comes from the registry of ops, not a bare list of objects."""
    schema = input_schemas(with_login.local_url, kind, basic(*LOGIN))["intervene"]
    check_edits_schema(schema["properties"]["edits"])


def test_basic_login_accepts_only_a_listed_login():
    logins = [LOGIN, OTHER]
    assert basic_login(basic(*LOGIN)["Authorization"], logins) == LOGIN
    assert basic_login(basic(*OTHER)["Authorization"], logins) == OTHER
    for bad in ("", "Basic", "Basic !!", basic("ada", "nope")["Authorization"], "Bearer " + LOGIN[1]):
        assert basic_login(bad, logins) is None
