"""MCP tools end to end: the openai SDK (every event checked against its GA types) -> gateway (the MCP
client) -> a real MCP server from the ``mcp`` package on loopback, with the fake LLM calling its tools."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from bench.fake_openai import Call, FakeOpenAI, Script
from bench.launcher import free_port
from tests.conftest import audio_of, connect, types
from tests.mcp_server import McpTestServer
from tests.paths import ROOT


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


async def test_a_listed_tool_is_called_by_the_gateway_and_its_result_spoken(start, fake, mcp_server):
    gateway = await start()
    async with connect(gateway) as client:
        listing = await use(client, mcp_tool(mcp_server.url, require_approval="never", authorization="secret-token",
                                             allowed_tools=["get_weather", "slow_report"]))
        events = await ask(client)
    assert types(listing)[-4:] == ["conversation.item.added", "mcp_list_tools.in_progress", "conversation.item.done",
                                   "mcp_list_tools.completed"]
    item = listing[-2]["item"]
    assert item["type"] == "mcp_list_tools" and [t["name"] for t in item["tools"]] == ["get_weather", "slow_report"]
    assert item["tools"][0]["annotations"]["readOnlyHint"] is True
    assert set(mcp_server.app.authorization) == {"Bearer secret-token"}
    # One response: the call, run by the gateway, then the LLM's answer with its result, spoken.
    done = events[-1]["response"]
    call, message = done["output"]
    assert done["status"] == "completed"
    assert (call["type"], call["name"], call["server_label"]) == ("mcp_call", "get_weather", "weather")
    assert call["output"] == "sunny and 21 degrees in Paris" and call["error"] is None
    assert message["content"][0]["transcript"] == "Result: sunny and 21 degrees in Paris" and audio_of(events)
    names = [t for t in types(events) if t.startswith("response.mcp_call")]
    assert names[-3:] == ["response.mcp_call_arguments.done", "response.mcp_call.in_progress",
                          "response.mcp_call.completed"]
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
        await client.send({"type": "response.create"})
        events = await client.until("response.done", timeout=15)
    outputs = events[-1]["response"]["output"]
    if approve:
        call, message = outputs
        assert (call["type"], call["approval_request_id"]) == ("mcp_call", request["id"])
        assert call["output"] == "deleted the forecast of Oslo"
        assert message["content"][0]["transcript"] == "Result: deleted the forecast of Oslo"
    else:
        [message] = outputs
        assert message["content"][0]["transcript"] == "Result: The user did not approve this call."
    # The LLM saw its call as the approval request, answered by the call's output or the refusal.
    history = fake.chat_requests[1].messages
    assert history[-2]["tool_calls"][0]["id"] == request["id"]


async def test_a_slow_server_fails_the_call_with_a_clear_error(start, fake, mcp_server):
    fake.reply.call = ("slow_report", {"seconds": 5})
    gateway = await start(mcp__call_timeout_s=0.5)
    async with connect(gateway) as client:
        await use(client, mcp_tool(mcp_server.url, require_approval="never"))
        events = await ask(client)
    call, message = events[-1]["response"]["output"]
    assert "response.mcp_call.failed" in types(events)
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
            events = await client.until("response.done", timeout=15)
            call, message = events[-1]["response"]["output"]
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
        await client.send({"type": "response.create", "response": {
            "tools": [mcp_tool(mcp_server.url, require_approval={"never": {"read_only": True}})]}})
        events = await client.until("response.done", timeout=15)
    names = types(events)
    assert names.index("mcp_list_tools.completed") < names.index("response.mcp_call.in_progress")
    call, message = events[-1]["response"]["output"]
    assert call["output"] == "sunny and 21 degrees in Paris"  # read-only: no approval asked
    assert message["content"][0]["transcript"] == "Result: sunny and 21 degrees in Paris"
