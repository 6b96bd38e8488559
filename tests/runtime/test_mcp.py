"""MCP tools end to end: the openai SDK (every event checked against its GA types) -> gateway (the MCP
client) -> a real MCP server from the ``mcp`` package on loopback, with the fake LLM calling its tools."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from bench.fake_openai import Call, FakeOpenAI, Script
from bench.launcher import free_port
from tests.conftest import audio_of, connect, types
from tests.mcp_server import McpTestServer
from tests.paths import JS, NODE, ROOT


class Llm:
    """Calls ``call`` (a tool name and its arguments); once it has a result, says it."""

    def __init__(self) -> None:
        self.call: tuple[str, dict[str, Any]] = ("get_weather", {"city": "Paris"})

    def __call__(self, body: dict[str, Any]) -> str | Script:
        results = [m["content"] for m in body["messages"] if m["role"] == "tool"]
        if results:
            return f"Result: {results[-1]}"
        return Script(calls=[Call(*self.call)])


@pytest.fixture(scope="module")
def mcp_server() -> Iterator[McpTestServer]:
    with McpTestServer() as server:
        yield server


@pytest.fixture
async def fake() -> AsyncIterator[FakeOpenAI]:
    async with FakeOpenAI(reply=Llm()) as server:
        yield server


@pytest.fixture
async def start(fake: FakeOpenAI, start_pipeline):
    """Starts a gateway in pipeline mode that may reach MCP servers on loopback (unless told otherwise)."""

    async def run(**overrides: Any):
        return await start_pipeline(fake, **{"vad__enabled": False, "mcp__allowed_hosts": "127.0.0.1", **overrides})

    return run


def mcp_tool(url: str, **fields: Any) -> dict[str, Any]:
    return {"type": "mcp", "server_label": "weather", "server_url": url, **fields}


async def use(client, *tools: dict[str, Any]) -> list[dict]:
    """session.update with these tools; the events up to the end of their listing."""
    await client.send({"type": "session.update", "session": {"type": "realtime", "tools": list(tools)}})
    events = await client.until("session.updated")
    return events + await client.until("mcp_list_tools.completed", timeout=15)


async def ask(client, text: str = "What is the weather in Paris?") -> list[dict]:
    await client.send({"type": "conversation.item.create", "item": {
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}})
    await client.send({"type": "response.create"})
    return await client.until("response.done", timeout=15)


async def result_then_answer(client, response: dict[str, Any] | None = None) -> tuple[dict, list[dict]]:
    """The call's result, which follows the response.done of the response that started it (OpenAI's order), then
    the answer to the response.create that an OpenAI client sends on it (the Agents SDK does so by itself)."""
    events = await client.until("conversation.item.done", timeout=15)
    assert types(events)[-2] in ("response.mcp_call.completed", "response.mcp_call.failed")
    await client.send({"type": "response.create", **({"response": response} if response else {})})
    return events[-1]["item"], await client.until("response.done", timeout=15)


async def test_a_listed_tool_is_called_by_the_gateway_and_its_result_spoken(start, fake, mcp_server):
    gateway = await start()
    async with connect(gateway) as client:
        listing = await use(client, mcp_tool(mcp_server.url, require_approval="never", authorization="secret-token",
                                             allowed_tools=["get_weather", "slow_report"]))
        events = await ask(client)
        call, answer = await result_then_answer(client)
    assert types(listing)[-4:] == ["conversation.item.added", "mcp_list_tools.in_progress", "conversation.item.done",
                                   "mcp_list_tools.completed"]
    item = listing[-2]["item"]
    assert item["type"] == "mcp_list_tools" and [t["name"] for t in item["tools"]] == ["get_weather", "slow_report"]
    assert item["tools"][0]["annotations"]["readOnlyHint"] is True
    assert set(mcp_server.app.authorization) == {"Bearer secret-token"}
    # The response ends with the call, which the gateway runs; its result follows, and the next response
    # speaks it.
    done = events[-1]["response"]
    [started] = done["output"]
    assert done["status"] == "completed"
    assert (started["type"], started["name"], started["server_label"]) == ("mcp_call", "get_weather", "weather")
    assert started["output"] is None and call["id"] == started["id"]
    assert call["output"] == "sunny and 21 degrees in Paris" and call["error"] is None
    [message] = answer[-1]["response"]["output"]
    assert message["content"][0]["transcript"] == "Result: sunny and 21 degrees in Paris" and audio_of(answer)
    names = [t for t in types(events) if t.startswith("response.mcp_call")]
    assert names[-2:] == ["response.mcp_call_arguments.done", "response.mcp_call.in_progress"]
    first, second = fake.chat_requests
    assert [t["function"]["name"] for t in first.body["tools"]] == ["get_weather", "slow_report"]
    assert first.body["tools"][0]["function"]["parameters"] == item["tools"][0]["input_schema"]
    assert second.messages[-2]["tool_calls"][0]["id"] == call["id"]
    assert second.messages[-1] == {"role": "tool", "tool_call_id": call["id"], "content": call["output"]}


@pytest.mark.parametrize("approve", [True, False])
async def test_a_call_waits_for_the_clients_approval(start, fake, mcp_server, approve: bool):
    fake.reply.call = ("delete_forecast", {"city": "Oslo"})
    gateway = await start()
    async with connect(gateway) as client:
        await use(client, mcp_tool(mcp_server.url))  # require_approval: "always" by default
        events = await ask(client, "Delete the Oslo forecast.")
        [request] = events[-1]["response"]["output"]
        assert (request["type"], request["name"], request["arguments"]) == (
            "mcp_approval_request", "delete_forecast", '{"city":"Oslo"}')
        assert len(fake.chat_requests) == 1  # nothing ran: the client decides first
        await client.send({"type": "conversation.item.create", "item": {
            "type": "mcp_approval_response", "approval_request_id": request["id"], "approve": approve}})
        if approve:
            # The approved call runs at once, in a response of its own (the Agents SDK sends nothing more).
            ran = (await client.until("response.done", timeout=15))[-1]["response"]
            assert [(o["type"], o["approval_request_id"]) for o in ran["output"]] == [("mcp_call", request["id"])]
            call, events = await result_then_answer(client)
            assert call["output"] == "deleted the forecast of Oslo"
        else:
            await client.send({"type": "response.create"})
            events = await client.until("response.done", timeout=15)
    [message] = events[-1]["response"]["output"]
    if approve:
        assert message["content"][0]["transcript"] == "Result: deleted the forecast of Oslo"
    else:
        assert message["content"][0]["transcript"] == "Result: The user did not approve this call."
    # The LLM saw its call as the approval request, answered by the call's output or the refusal.
    history = fake.chat_requests[1].messages
    assert history[-2]["tool_calls"][0]["id"] == request["id"]


async def test_a_slow_server_fails_the_call_with_a_clear_error(start, fake, mcp_server):
    fake.reply.call = ("slow_report", {"seconds": 5})
    gateway = await start(mcp__call_timeout_s=0.5)
    async with connect(gateway) as client:
        await use(client, mcp_tool(mcp_server.url, require_approval="never"))
        await ask(client)
        call, events = await result_then_answer(client)
    [message] = events[-1]["response"]["output"]
    assert call["output"] is None and call["error"]["type"] == "protocol_error"
    assert call["error"]["message"] == "MCP server 'weather' did not answer within 0.5 s while calling 'slow_report'."
    # The LLM is told, and the turn ends with its answer.
    assert message["content"][0]["transcript"] == f"Result: Error: {call['error']['message']}"


async def test_the_server_going_down_mid_call_fails_that_call_not_the_session(start, fake):
    port = free_port()
    server = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.mcp_server", "--port", str(port), cwd=ROOT, stdout=asyncio.subprocess.PIPE)
    try:
        assert server.stdout is not None
        url = (await asyncio.wait_for(server.stdout.readline(), 60)).decode().split()[-1]
        fake.reply.call = ("slow_report", {"seconds": 30})
        gateway = await start()
        async with connect(gateway) as client:
            await use(client, mcp_tool(url, require_approval="never"))
            await client.send({"type": "conversation.item.create", "item": {
                "type": "message", "role": "user", "content": [{"type": "input_text", "text": "Report?"}]}})
            await client.send({"type": "response.create"})
            await client.until("response.mcp_call.in_progress", timeout=15)
            server.kill()
            await client.until("response.done", timeout=15)  # the response ends with the call started
            call, events = await result_then_answer(client)
            [message] = events[-1]["response"]["output"]
            assert events[-1]["response"]["status"] == "completed"
            assert call["error"]["type"] == "protocol_error" and "MCP server 'weather'" in call["error"]["message"]
            assert message["content"][0]["transcript"].startswith("Result: Error: MCP server 'weather'")
            # Listing the dead server fails with a reason; the session goes on.
            await client.send({"type": "session.update", "session": {"type": "realtime", "tools": [
                mcp_tool(url, server_label="again")]}})
            events = await client.until("mcp_list_tools.failed", timeout=15)
            error = (await client.until("error"))[-1]["error"]
            assert error["code"] == "mcp_list_tools_failed" and "'again'" in error["message"]
            fake.reply = "Still here."
            assert (await ask(client))[-1]["response"]["status"] == "completed"
    finally:
        if server.returncode is None:
            server.kill()
        await server.wait()


async def test_what_a_client_may_make_the_gateway_connect_to(start, mcp_server):
    public_only = await start(mcp__allowed_hosts="")
    requests = len(mcp_server.app.authorization)
    async with connect(public_only) as client:
        await client.send({"type": "session.update", "session": {"type": "realtime", "tools": [
            mcp_tool(mcp_server.url)]}})
        await client.until("mcp_list_tools.failed")
        error = (await client.until("error"))[-1]["error"]
        assert "127.0.0.1" in error["message"] and "not a public address" in error["message"]
    assert len(mcp_server.app.authorization) == requests  # nothing reached the server
    for overrides, code, param in (({"mcp__enabled": False}, "mcp_disabled", "session.tools[0].type"),
                                   ({"mcp__allowed_hosts": "mcp.example.com"}, "mcp_host_not_allowed",
                                    "session.tools[0].server_url")):
        gateway = await start(**overrides)
        async with connect(gateway) as client:
            await client.send({"type": "session.update", "session": {"type": "realtime", "tools": [
                mcp_tool(mcp_server.url)]}})
            error = (await client.until("error"))[-1]["error"]
            assert (error["code"], error["param"]) == (code, param)


async def test_a_response_may_bring_its_own_server_and_waits_for_its_listing(start, fake, mcp_server):
    gateway = await start()
    async with connect(gateway) as client:
        await client.send({"type": "conversation.item.create", "item": {
            "type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather?"}]}})
        tools = [mcp_tool(mcp_server.url, require_approval={"never": {"read_only": True}})]
        await client.send({"type": "response.create", "response": {"tools": tools}})
        events = await client.until("response.done", timeout=15)
        call, answer = await result_then_answer(client, {"tools": tools})
    names = types(events)
    assert names.index("mcp_list_tools.completed") < names.index("response.mcp_call.in_progress")
    [message] = answer[-1]["response"]["output"]
    assert call["output"] == "sunny and 21 degrees in Paris"  # read-only: no approval asked
    assert message["content"][0]["transcript"] == "Result: sunny and 21 degrees in Paris"


@pytest.mark.slow  # Node
@pytest.mark.parametrize("approval", ["never", "always"])
async def test_the_js_agents_sdk_hears_one_answer_after_a_hosted_mcp_call(start, fake, mcp_server, approval: str):
    """@openai/agents-realtime's hostedMcpTool: the SDK sends response.create when a call's item is done, and
    approves with nothing more than the mcp_approval_response. One question gets one call and one answer."""
    if NODE is None or not (JS / "node_modules" / "@openai" / "agents-realtime").is_dir():
        pytest.skip("needs node and tests/js/node_modules (make test runs npm ci there)")
    gateway = await start()
    url = f"ws://127.0.0.1:{gateway.port}/v1/realtime?model=gpt-realtime"
    proc = await asyncio.create_subprocess_exec(NODE, "agent_mcp.mjs", url, mcp_server.url, approval, cwd=JS,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()[-2000:]
    report = json.loads(out.decode().strip().splitlines()[-1])
    assert report["invalid"] == [] and report["errors"] == []
    asked = [["mcp_approval_request"]] if approval == "always" else []
    assert report["responses"] == [*asked, ["mcp_call"], ["message"]]
    assert report["approvals"] == (["get_weather"] if approval == "always" else [])
    assert report["completed"] == [["get_weather", "sunny and 21 degrees in Paris"]]
    assert report["audioBytesAfterCall"] > 0 and len(fake.chat_requests) == 2


async def test_a_server_answering_http_errors_or_html_fails_its_listing_cleanly(start):
    """The HTTP status a server refused with is the failure's (the mcp package would make it a JSON-RPC error),
    and a malformed answer costs no ERROR line or traceback (the autouse check): a client named the server."""
    from aiohttp import web

    async def answer(request: web.Request) -> web.Response:
        if request.match_info["mode"] == "503":
            return web.Response(status=503, text="busy")
        return web.Response(text="<html>not MCP</html>", content_type="text/html")

    app = web.Application()
    app.router.add_route("*", "/{mode}", answer)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        gateway = await start()
        async with connect(gateway) as client:
            for mode, words in (("503", "MCP server '503' answered HTTP 503 while listing its tools."),
                                ("html", "MCP server 'html' failed while listing its tools")):
                await client.send({"type": "session.update", "session": {"type": "realtime", "tools": [
                    mcp_tool(f"http://127.0.0.1:{port}/{mode}", server_label=mode)]}})
                await client.until("mcp_list_tools.failed", timeout=15)
                error = (await client.until("error"))[-1]["error"]
                assert error["code"] == "mcp_list_tools_failed" and words in error["message"], error
    finally:
        await runner.cleanup()
