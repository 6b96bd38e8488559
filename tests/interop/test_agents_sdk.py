"""The OpenAI Agents SDKs (Python's agents.realtime, and @openai/agents-realtime under Node; unmodified)
against a real gateway in pipeline mode: their function tools run and their results reach the LLM (the
fake server, which calls the tools), the answer is spoken; a handoff between two agents works. Every
event the gateway sends passes each SDK's own validation (Python: an invalid one surfaces as an ``error``
event; JS: tests/js/agent_tools.mjs checks each against the SDK's zod schema)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from agents import function_tool
from agents.realtime import RealtimeAgent, RealtimeRunner

from bench.fake_openai import Call, FakeOpenAI, Script
from tests.paths import JS, NODE

calls: list[str] = []


@function_tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    calls.append(city)
    return f"sunny and 21 degrees in {city}"


WEATHER_AGENT = RealtimeAgent(name="Weather agent", instructions="You tell the weather.", tools=[get_weather])
GREETER = RealtimeAgent(name="Greeter", instructions="You greet, then hand over.", handoffs=[WEATHER_AGENT])


def llm(body: dict[str, Any]) -> str | Script:
    """An LLM that hands over to the weather agent when it can, calls get_weather when it can, and then
    says what the tool returned."""
    names = [t["function"]["name"] for t in body.get("tools", [])]
    results = [m["content"] for m in body["messages"] if m["role"] == "tool"]
    handoff = next((n for n in names if n.startswith("transfer_to_")), None)
    if handoff is not None:
        return Script(calls=[Call(handoff)])
    if "get_weather" in names and not any("degrees" in r for r in results):
        return Script(calls=[Call("get_weather", {"city": "Paris"})])
    return f"It is {results[-1]}."


@pytest.fixture
async def fake() -> AsyncIterator[FakeOpenAI]:
    async with FakeOpenAI(reply=llm) as server:
        yield server


@pytest.fixture
async def gateway(fake: FakeOpenAI, start_pipeline):
    return await start_pipeline(fake)


async def run_until_spoken(agent: RealtimeAgent, port: int) -> tuple[list[Any], bytes]:
    """Ask for the weather; the events until the answer after the tool call has been spoken, and its audio."""
    runner = RealtimeRunner(agent)
    model_config = {"url": f"ws://127.0.0.1:{port}/v1/realtime?model=gpt-realtime", "api_key": "unused"}
    events: list[Any] = []
    audio = bytearray()
    async with await runner.run(model_config=model_config) as session:
        await session.send_message("What is the weather in Paris?")
        async with asyncio.timeout(15):
            async for event in session:
                events.append(event)
                assert event.type != "error", event
                if event.type == "audio" and any(e.type == "tool_end" for e in events):
                    audio += event.audio.data
                if event.type == "audio_end" and audio:
                    return events, bytes(audio)
    raise AssertionError("the session ended early")


async def test_a_function_tool_runs_and_its_answer_is_spoken(gateway, fake: FakeOpenAI):
    calls.clear()
    events, audio = await run_until_spoken(WEATHER_AGENT, gateway.port)
    assert calls == ["Paris"]
    end = next(e for e in events if e.type == "tool_end")
    assert end.tool.name == "get_weather" and end.output == "sunny and 21 degrees in Paris"
    # The tool's result reached the LLM as the result of its call, and the answer was spoken.
    first, second = fake.chat_requests
    assert [t["function"]["name"] for t in first.body["tools"]] == ["get_weather"]
    call_id = second.messages[-2]["tool_calls"][0]["id"]
    assert second.messages[-1] == {"role": "tool", "tool_call_id": call_id, "content": end.output}
    assert json.loads(second.messages[-2]["tool_calls"][0]["function"]["arguments"]) == {"city": "Paris"}
    assert len(audio) > 48 * 500  # the tone engine's speech of the answer


async def test_a_handoff_moves_the_session_to_the_other_agent(gateway, fake: FakeOpenAI):
    calls.clear()
    events, audio = await run_until_spoken(GREETER, gateway.port)
    handoff = next(e for e in events if e.type == "handoff")
    assert (handoff.from_agent.name, handoff.to_agent.name) == ("Greeter", "Weather agent")
    assert calls == ["Paris"] and audio
    # After the handoff the LLM gets the weather agent's instructions and tools, and the transfer's result.
    after = fake.chat_requests[1]
    assert after.messages[0] == {"role": "system", "content": "You tell the weather."}
    assert [t["function"]["name"] for t in after.body["tools"]] == ["get_weather"]
    assert after.messages[-1]["role"] == "tool" and "Weather agent" in after.messages[-1]["content"]


JS_DIR = JS


@pytest.mark.parametrize("scenario", ["tool", "handoff"])
async def test_the_js_agents_sdk_runs_a_tool_and_hands_off(gateway, fake: FakeOpenAI, scenario: str):
    """@openai/agents-realtime under Node: its own WebSocket transport (the ws package) takes a ws:// URL."""
    node = NODE
    if node is None or not (JS_DIR / "node_modules" / "@openai" / "agents-realtime").is_dir():
        pytest.skip("needs node and tests/js/node_modules (make test runs npm ci there)")
    url = f"ws://127.0.0.1:{gateway.port}/v1/realtime?model=gpt-realtime"
    proc = await asyncio.create_subprocess_exec(node, "agent_tools.mjs", url, scenario, cwd=JS_DIR,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()[-2000:]
    report = json.loads(out.decode().strip().splitlines()[-1])
    assert report["invalid"] == [] and report["errors"] == []
    assert report["calls"] == ["Paris"]
    assert report["toolResults"] == [["get_weather", "sunny and 21 degrees in Paris"]]
    assert report["audioBytesAfterTool"] > 48 * 500
    if scenario == "handoff":
        assert report["handoffs"] == [["Greeter", "Weather agent"]]
        assert fake.chat_requests[1].messages[0] == {"role": "system", "content": "You tell the weather."}
    last = fake.chat_requests[-1].messages
    assert last[-1]["role"] == "tool" and last[-1]["content"] == "sunny and 21 degrees in Paris"
