"""Function calling end to end: the unmodified openai SDK (GA and beta, every event checked against its
types) -> gateway -> pipeline -> the fake LLM server, which streams tool calls as vLLM and OpenAI do."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest

from bench.fake_openai import Call, FakeOpenAI, Script, tokenize
from gateway.core.responder import ToolCallArguments, ToolCallStart
from gateway.realtime.effects import CallMcp, ListMcpTools, SendEvent, StartResponse, StopResponse
from gateway.realtime.session import Session
from gateway.realtime.tools import McpTool
from tests.conftest import audio_of, connect, make_config, types

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                   "additionalProperties": False, "$schema": "http://json-schema.org/draft-07/schema#"},
}
TIME = {"type": "function", "name": "get_time", "parameters": {"type": "object", "properties": {}}}


def weather_agent(body: dict[str, Any]) -> str | Script:
    """Calls get_weather for the user's question; once it has the result, says it."""
    last = body["messages"][-1]
    if last["role"] == "tool":
        return f"It is {json.loads(last['content'])['sky']} in Paris."
    return Script(calls=[Call("get_weather", {"city": "Paris"})])


@pytest.fixture
async def fake() -> AsyncIterator[FakeOpenAI]:
    async with FakeOpenAI(reply=weather_agent) as server:
        yield server


@pytest.fixture
async def gateway(fake: FakeOpenAI, start_pipeline):
    return await start_pipeline(fake, vad__enabled=False)


async def ask(client, text: str = "What is the weather in Paris?", **response: Any) -> list[dict]:
    await client.send({"type": "conversation.item.create", "item": {
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}})
    await client.send({"type": "response.create", "response": response})
    return await client.until("response.done")


async def use_tools(client, *tools: dict, beta: bool = False, **session: Any) -> dict:
    body = {"tools": list(tools), **session} if beta else {"type": "realtime", "tools": list(tools), **session}
    await client.send({"type": "session.update", "session": body})
    return (await client.until("session.updated"))[-1]["session"]


def outputs(events: list[dict]) -> list[dict]:
    return events[-1]["response"]["output"]


@pytest.mark.parametrize("beta", [False, True])
async def test_a_function_call_and_its_output_continue_the_conversation(gateway, fake: FakeOpenAI, beta: bool):
    async with connect(gateway, beta=beta) as client:
        session = await use_tools(client, WEATHER, beta=beta)
        assert session["tools"][0]["name"] == "get_weather" and session["tool_choice"] == "auto"
        events = await ask(client)
        [call] = outputs(events)
        assert (call["type"], call["name"], call["status"]) == ("function_call", "get_weather", "completed")
        assert json.loads(call["arguments"]) == {"city": "Paris"}
        deltas = [e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta"]
        assert len(deltas) > 1 and "".join(deltas) == call["arguments"]
        done = next(e for e in events if e["type"] == "response.function_call_arguments.done")
        assert (done["call_id"], done["name"], done["arguments"]) == (call["call_id"], "get_weather",
                                                                       call["arguments"])
        added = next(e for e in events if e["type"] == "response.output_item.added")["item"]
        assert (added["call_id"], added["name"], added["status"]) == (call["call_id"], "get_weather", "in_progress")
        # The LLM got the tool as a chat-completions tool, schema untouched.
        request = fake.chat_requests[0].body
        assert request["tools"] == [{"type": "function", "function": {
            "name": "get_weather", "description": WEATHER["description"], "parameters": WEATHER["parameters"]}}]
        assert request["tool_choice"] == "auto"

        await client.send({"type": "conversation.item.create", "item": {
            "type": "function_call_output", "call_id": call["call_id"], "output": json.dumps({"sky": "sunny"})}})
        await client.send({"type": "response.create"})
        events = await client.until("response.done")
    [message] = outputs(events)
    assert message["content"][0]["transcript"] == "It is sunny in Paris." and audio_of(events)
    # The LLM saw its own call and the client's result, paired as chat completions require.
    history = fake.chat_requests[1].messages
    assert history[-2] == {"role": "assistant", "content": None, "tool_calls": [{
        "id": call["call_id"], "type": "function", "function": {"name": "get_weather",
                                                                "arguments": call["arguments"]}}]}
    assert history[-1] == {"role": "tool", "tool_call_id": call["call_id"], "content": '{"sky": "sunny"}'}
    usage = events[-1]["response"]["usage"]
    assert usage["output_token_details"]["text_tokens"] == len(tokenize("It is sunny in Paris."))
    assert usage["output_token_details"]["audio_tokens"] > 0  # the spoken answer, 1 token per 50 ms
    assert usage["input_tokens"] == usage["input_token_details"]["text_tokens"] > 0


async def test_parallel_calls_are_items_in_order_and_each_result_goes_back(gateway, fake: FakeOpenAI):
    fake.reply = Script(calls=[Call("get_weather", {"city": "Paris"}), Call("get_time")])
    async with connect(gateway) as client:
        await use_tools(client, WEATHER, TIME)
        events = await ask(client)
        calls = outputs(events)
        assert [(c["name"], c["status"]) for c in calls] == [("get_weather", "completed"), ("get_time", "completed")]
        # Each call's item ends before the next one's begins, as OpenAI's do.
        order = [(e["type"].rsplit(".", 1)[1], e["output_index"]) for e in events
                 if e["type"] in ("response.output_item.added", "response.output_item.done")]
        assert order == [("added", 0), ("done", 0), ("added", 1), ("done", 1)]
        fake.reply = "It is sunny and noon."
        for call, output in zip(calls, ["sunny", "noon"], strict=True):
            await client.send({"type": "conversation.item.create", "item": {
                "type": "function_call_output", "call_id": call["call_id"], "output": output}})
        await client.send({"type": "response.create"})
        await client.until("response.done")
    history = fake.chat_requests[1].messages
    assert [c["id"] for c in history[-3]["tool_calls"]] == [c["call_id"] for c in calls]
    assert [(m["role"], m["content"]) for m in history[-2:]] == [("tool", "sunny"), ("tool", "noon")]


async def test_parallel_tool_calls_false_asks_the_llm_and_keeps_one_call_a_round(gateway, fake: FakeOpenAI):
    """The LLM here makes two calls regardless (as a server that ignores the flag would): one is kept."""
    fake.reply = Script(calls=[Call("get_weather", {"city": "Paris"}), Call("get_time")])
    async with connect(gateway) as client:
        session = await use_tools(client, WEATHER, TIME, parallel_tool_calls=False)
        assert session["parallel_tool_calls"] is False
        events = await ask(client)
        assert [c["name"] for c in outputs(events)] == ["get_weather"]
        events = await ask(client, parallel_tool_calls=True)  # a response may allow them again
        assert [c["name"] for c in outputs(events)] == ["get_weather", "get_time"]
    assert [r.body.get("parallel_tool_calls") for r in fake.chat_requests] == [False, True]


async def test_speech_before_a_call_is_spoken_and_kept(gateway, fake: FakeOpenAI):
    fake.reply = Script("Let me check that for you.", [Call("get_weather", {"city": "Paris"})])
    async with connect(gateway) as client:
        await use_tools(client, WEATHER)
        events = await ask(client)
    message, call = outputs(events)
    assert message["content"][0]["transcript"] == "Let me check that for you." and audio_of(events)
    assert call["type"] == "function_call" and call["status"] == "completed"
    # The message ends before the call begins: its audio all comes first.
    order = [(e["type"], e.get("output_index")) for e in events if e["type"].startswith("response.output_item")]
    assert order == [("response.output_item.added", 0), ("response.output_item.done", 0),
                     ("response.output_item.added", 1), ("response.output_item.done", 1)]
    last_audio = max(i for i, e in enumerate(events) if e["type"] == "response.output_audio.delta")
    assert last_audio < types(events).index("response.function_call_arguments.delta")


async def test_the_words_before_a_call_are_spoken_while_its_arguments_stream(gateway, fake: FakeOpenAI):
    """"Let me check." ends in a full stop the text bridge cannot yet call final (more may follow); the call
    that follows says it is whole. Its audio must not wait for the LLM's slow arguments to end."""
    fake.reply = Script("Let me check.", [Call("get_weather", {"city": "Paris", "detail": "hourly for a week"})])
    fake.tokens_per_s = 10
    async with connect(gateway) as client:
        await use_tools(client, WEATHER)
        await client.send({"type": "conversation.item.create", "item": {
            "type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather?"}]}})
        await client.send({"type": "response.create"})
        await client.until("response.output_audio.delta")
        assert not fake.chat_requests[-1].finished  # the arguments are still coming
        events = await client.until("response.done")
    message, call = outputs(events)
    assert message["content"][0]["transcript"] == "Let me check." and call["status"] == "completed"


async def test_cancel_during_a_call_ends_it_incomplete_and_nothing_follows(gateway, fake: FakeOpenAI):
    fake.reply = Script(calls=[Call("get_weather", {"city": "Paris", "detail": "hourly forecast for a week"})])
    fake.tokens_per_s = 20  # the call's arguments take a while to stream
    async with connect(gateway) as client:
        await use_tools(client, WEATHER, output_modalities=["text"])
        await client.send({"type": "conversation.item.create", "item": {
            "type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather?"}]}})
        await client.send({"type": "response.create"})
        events = await client.until("response.function_call_arguments.delta")
        response_id = events[-1]["response_id"]
        await client.send({"type": "response.cancel"})
        events = await client.until("response.done")
        after = await client.quiet(0.5)
    [call] = outputs(events)
    assert events[-1]["response"]["status"] == "cancelled" and call["status"] == "incomplete"
    done = next(e for e in events if e["type"] == "response.function_call_arguments.done")
    assert done["arguments"] == call["arguments"] and len(call["arguments"]) < 40
    assert not [e for e in after if e.get("response_id") == response_id]
    chat = fake.chat_requests[0]
    await asyncio.wait_for(chat.done.wait(), 5)
    assert chat.closed_by_client and not chat.finished


async def test_tool_choice_reaches_the_llm(gateway, fake: FakeOpenAI):
    async with connect(gateway) as client:
        await use_tools(client, WEATHER, TIME, tool_choice={"type": "function", "name": "get_weather"})
        await ask(client)
        fake.reply = "Fine."
        await ask(client, tool_choice="none")
        await ask(client, tools=[], tool_choice="auto")  # this response offers no tools at all
    first, second, third = (r.body for r in fake.chat_requests)
    assert first["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert second["tool_choice"] == "none" and len(second["tools"]) == 2
    assert "tools" not in third and "tool_choice" not in third


BAD_TOOLS = [
    ([{"type": "function"}], "session.tools[0].name"),
    ([{"type": "function", "name": "has space"}], "session.tools[0].name"),
    ([{"type": "retrieval", "name": "x"}], "session.tools[0].type"),
    ([{"name": "x"}], "session.tools[0].type"),
    ([{"type": "function", "name": "x", "parameters": {"type": "string"}}], "session.tools[0].parameters"),
    ([{"type": "function", "name": "x", "parameters": "{}"}], "session.tools[0].parameters"),
    ([WEATHER, WEATHER], "session.tools[1]"),
    (["get_weather"], "session.tools[0]"),
    ([{"type": "mcp", "server_label": "x"}], "session.tools[0].server_url"),
    ([{"type": "mcp", "server_label": "x", "server_url": "ftp://example.com/"}], "session.tools[0].server_url"),
    ([{"type": "mcp", "server_label": "x", "server_url": "https://example.com/", "require_approval": "sometimes"}],
     "session.tools[0].require_approval"),
    ([{"type": "mcp", "server_label": "x", "server_url": "https://example.com/", "headers": {"a": 1}}],
     "session.tools[0].headers.a"),
    ([{"type": "mcp", "server_label": "x", "connector_id": "connector_gmail"}], "session.tools[0].connector_id"),
    ([{"type": "mcp", "server_label": f"s{i}", "server_url": "https://example.com/"} for i in range(9)],
     "session.tools[8]"),  # [mcp] max_servers
]


@pytest.mark.parametrize(("tools", "param"), BAD_TOOLS)
async def test_bad_tools_are_refused_naming_the_field(gateway, tools, param):
    async with connect(gateway) as client:
        await client.send({"type": "session.update", "session": {"type": "realtime", "tools": tools}})
        [error] = await client.until("error")
        assert error["error"]["type"] == "invalid_request_error" and error["error"]["param"] == param
        # Nothing of the refused update was kept.
        await client.send({"type": "session.update", "session": {"type": "realtime"}})
        assert (await client.until("session.updated"))[-1]["session"]["tools"] == []


@pytest.mark.parametrize(("choice", "param"), [
    ("sometimes", "session.tool_choice"),
    ({"type": "function", "name": "get_time"}, "session.tool_choice.name"),
    ({"type": "function"}, "session.tool_choice.name"),
    ({"type": "mcp", "server_label": "nowhere"}, "session.tool_choice.server_label"),
    ({"type": "file_search"}, "session.tool_choice.type"),
])
async def test_bad_tool_choices_are_refused_naming_the_field(gateway, choice, param):
    async with connect(gateway) as client:
        await client.send({"type": "session.update", "session": {
            "type": "realtime", "tools": [WEATHER], "tool_choice": choice}})
        [error] = await client.until("error")
        assert error["error"]["param"] == param


async def test_beta_names_a_function_by_its_name_and_has_no_mcp(gateway, fake: FakeOpenAI):
    async with connect(gateway, beta=True) as client:
        session = await use_tools(client, WEATHER, beta=True, tool_choice="get_weather")
        assert session["tool_choice"] == "get_weather"
        await ask(client)
        await client.send({"type": "session.update", "session": {"tools": [
            {"type": "mcp", "server_label": "x", "server_url": "https://example.com/mcp"}]}})
        [error] = await client.until("error")
    assert fake.chat_requests[0].body["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert error["error"]["param"] == "session.tools[0].type" and "GA" in error["error"]["message"]


async def test_usage_counts_audio_and_does_without_the_llms_counts(gateway, fake: FakeOpenAI):
    fake.reply, fake.usage = "Hello there.", False  # a server that reports no token counts
    async with connect(gateway) as client:
        await client.send({"type": "conversation.item.create", "item": {
            "type": "message", "role": "user", "content": [{"type": "input_audio", "audio": base64.b64encode(
                bytes(48 * 1000)).decode(), "transcript": "Hi."}]}})
        events = await ask(client)
    assert fake.chat_requests[0].body["stream_options"] == {"include_usage": True}
    usage = events[-1]["response"]["usage"]
    audio_out = round(len(audio_of(events)) / 48 / 50)  # 1 token per 50 ms of the reply's audio
    assert usage["input_token_details"] == {"audio_tokens": 10, "cached_tokens": 0}  # 1 s of user audio
    assert usage["output_token_details"] == {"audio_tokens": audio_out} and audio_out > 0
    assert (usage["input_tokens"], usage["output_tokens"], usage["total_tokens"]) == (10, audio_out, 10 + audio_out)


def test_an_mcp_call_outlives_its_response_and_the_next_response_waits_for_its_result():
    """Sans-I/O, OpenAI's order: the response that started an MCP call ends with it (response.done lists the call,
    no output yet); barge-in does not stop it; its result comes as response.mcp_call.completed and
    conversation.item.done; a response.create meanwhile makes its LLM call once the result is in."""
    session = Session(make_config(mcp__allowed_hosts="mcp.test"))
    server = {"type": "mcp", "server_label": "w", "server_url": "http://mcp.test/mcp", "require_approval": "never"}
    effects = session.handle(orjson.dumps({"type": "session.update", "session": {"type": "realtime",
                                                                               "tools": [server]}}))
    listing = next(e for e in effects if isinstance(e, ListMcpTools))
    session.mcp_tools_listed(listing.item_id, [McpTool("get_weather", {"type": "object"})])
    start = next(e for e in session.handle(b'{"type": "response.create"}') if isinstance(e, StartResponse))
    rid = start.request.response_id
    assert [t["function"]["name"] for t in start.request.tools] == ["get_weather"]
    session.response_output(rid, ToolCallStart(0, "call_1", "get_weather"))
    session.response_output(rid, ToolCallArguments(0, '{"city": "Oslo"}'))
    effects = session.response_finished(rid)
    call = next(e for e in effects if isinstance(e, CallMcp))
    assert (call.name, call.arguments) == ("get_weather", '{"city": "Oslo"}')
    names = [e.event["type"] for e in effects if isinstance(e, SendEvent)]
    assert names.index("response.mcp_call.in_progress") < names.index("response.output_item.done") \
        < names.index("response.done")
    done = next(e.event for e in effects if isinstance(e, SendEvent) and e.event["type"] == "response.done")
    assert done["response"]["status"] == "completed"
    assert [(o["type"], o["output"]) for o in done["response"]["output"]] == [("mcp_call", None)]
    session.handle(orjson.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(
        bytes(48_000)).decode()}))
    assert not any(isinstance(e, StopResponse) for e in session.vad_result([0.9] * 10))
    waiting = session.handle(b'{"type": "response.create"}')
    assert any(isinstance(e, SendEvent) and e.event["type"] == "response.created" for e in waiting)
    assert not any(isinstance(e, StartResponse) for e in waiting)  # its LLM would not see the result yet
    effects = session.mcp_call_finished(call.item_id, "12 degrees")
    names = [e.event["type"] for e in effects if isinstance(e, SendEvent)]
    assert names[:2] == ["response.mcp_call.completed", "conversation.item.done"]
    item = next(e.event["item"] for e in effects if isinstance(e, SendEvent) and e.event["type"] ==
                "conversation.item.done")
    assert (item["id"], item["output"]) == (call.item_id, "12 degrees")
    (llm,) = [e for e in effects if isinstance(e, StartResponse)]
    assert any("12 degrees" in str(m) for m in llm.request.messages)
    assert session.mcp_call_finished(call.item_id, "again") == []


async def test_a_server_that_numbers_its_calls_anew_each_turn_still_gets_each_result(gateway, fake: FakeOpenAI):
    """Some servers call every turn's first call "call_0": each call gets its own call_id all the same, so the
    second turn's call is not taken as answered by the first turn's output."""
    fake.reply = lambda body: Script(calls=[Call("get_time", {}, id="call_0")])
    async with connect(gateway) as client:
        await use_tools(client, TIME)
        ids = []
        for answer in ("09:00", "12:00"):
            [call] = outputs(await ask(client, "What time is it?"))
            ids.append(call["call_id"])
            await client.send({"type": "conversation.item.create", "item": {
                "type": "function_call_output", "call_id": call["call_id"], "output": answer}})
        await ask(client, "And now?")
    assert len(set(ids)) == 2 and "call_0" not in ids
    last = fake.chat_requests[-1].messages
    assert [m["content"] for m in last if m["role"] == "tool"] == ["09:00", "12:00"]
    assert len({m["tool_call_id"] for m in last if m["role"] == "tool"}) == 2
