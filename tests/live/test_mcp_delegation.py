"""Our MCP servers' tools in a Live session's Responses delegation: the gateway lists them for the backend, makes
their calls itself (an mcp_call item each, in a response.event) and the backend goes on with the outputs; the
client answers no call. A real MCP server on loopback, the backend a fake OpenAI server over real HTTP."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from bench.fake_openai import Call, FakeOpenAI, Script
from gateway.realtime.tools import McpServer, McpTool
from gateway.runtime.live_runner import mcp_functions
from tests.conftest import load_pcm
from tests.helpers.live import voice_model
from tests.live.conftest import Microphone, live, transcript
from tests.mcp_server import McpTestServer

pytestmark = pytest.mark.asyncio


@pytest.fixture(scope="module")
def mcp_server() -> Iterator[McpTestServer]:
    with McpTestServer() as server:
        yield server


def replies(body: dict[str, Any]) -> str | Script:
    if "input" not in body:
        return voice_model(body)
    outputs = [i["output"] for i in body["input"] if i.get("type") == "function_call_output"]
    if outputs:
        return f"It is {outputs[-1]}."
    assert [t["name"] for t in body["tools"]] == ["weather__get_weather"]  # delete_forecast needs approval
    return Script("", [Call("weather__get_weather", {"city": "Paris"})])


async def test_an_mcp_tool_is_called_by_the_gateway(start_pipeline: Any, mcp_server: McpTestServer) -> None:
    async with FakeOpenAI(reply=replies, transcript="What's the weather in Paris?") as fake:
        gateway = await start_pipeline(fake, llm__base_url=fake.base_url, mcp__allowed_hosts="127.0.0.1")
        weather = {"type": "mcp", "server_label": "weather", "server_url": mcp_server.url,
                   "require_approval": {"never": {"tool_names": ["get_weather"]}}, "authorization": "token"}
        delegation = {"type": "responses", "responses": {"model": "gpt-5.6-terra", "tools": [weather]}}
        async with live(gateway, delegation=delegation) as client, Microphone(client) as mic:
            echoed = client.received[0]["session"]["delegation"]["responses"]["tools"][0]
            assert "authorization" not in echoed  # never sent back
            mic.say(load_pcm("question_sky.wav"))
            events: list[dict[str, Any]] = []
            while "21 degrees" not in transcript(events):
                events += await client.until("session.output_transcript.delta", timeout=20)
            await client.send({"type": "session.close"})
            await client.until("session.closed")
    nested = [e["event"] for e in client.received if e["type"] == "response.event"]
    items = [e["item"] for e in nested if e["type"] == "response.output_item.done"]
    assert [i["type"] for i in items] == ["mcp_call", "message"]
    assert items[0]["output"] == "sunny and 21 degrees in Paris" and items[0]["status"] == "completed"
    assert "Bearer token" in mcp_server.app.authorization


async def test_a_tool_name_the_backend_would_refuse_or_that_is_taken_is_not_offered() -> None:
    """label__tool past 64 characters would be cut, and two tools could share the cut name: a call of one would
    run the other. Such a tool, one whose name is not a function name, or one a function took, is left out."""
    billing = McpServer("billing", "https://mcp.example.com/mcp", require_approval="never")
    long = "get_customer_account_balance_for_the_current_billing_period"
    tools = [McpTool(long, {}), McpTool(long + "_reset", {}), McpTool("weird.name/v1", {}), McpTool("refund", {}),
             McpTool("lookup", {})]
    routes, functions = mcp_functions([(billing, tools)], {"billing__lookup"})
    assert [f["name"] for f in functions] == list(routes) == ["billing__refund"]
    assert routes["billing__refund"].tool.name == "refund"
