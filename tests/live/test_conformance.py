"""The digest's conformance transcript (client delegation over WebSocket, pcm 24 kHz) replayed by the openai SDK at
real-time pace against a real gateway, its assertions and its negative probes; and its Responses-mode variant with
a function tool, through the Responses API and through a server that has only chat completions.

The voice model is the pipeline on a fake OpenAI server (real HTTP: STT and LLM), the tone engine its TTS."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from bench.fake_openai import FakeOpenAI
from tests.conftest import load_pcm
from tests.helpers.live import SYSTEM, WEATHER, backend, voice_model
from tests.live.conftest import Microphone, audio_of, live, transcript

pytestmark = pytest.mark.asyncio

def grid(events: list[dict[str, Any]]) -> None:
    for e in events:
        if "start_ms" in e and e["type"] != "session.output_audio.delta":
            assert e["start_ms"] % 200 == 0 and e["end_ms"] >= e["start_ms"], e


async def test_client_delegation_transcript(start_pipeline: Any, tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    async with FakeOpenAI(reply=voice_model, transcript="Please check the staging status.") as fake:
        gateway = await start_pipeline(fake, live__usage_interval_s=3.0, trace__jsonl_path=str(trace))
        async with live(gateway, instructions=SYSTEM, audio={"format": {"type": "audio/pcm", "rate": 24000},
                                                              "output": {"voice": "marin"}},
                        delegation={"type": "client"}) as client, Microphone(client) as mic:
            started = client.received[0]
            session = started["session"]
            assert started["client_event_id"] == "start"
            assert session["id"].startswith("live_") and session["status"] == "active" and session["input"] == []
            assert session["delegation"] == {"type": "client"} and isinstance(session["expires_at"], int)
            assert session["audio"] == {"output": {"voice": "marin"}, "format": {"type": "audio/pcm", "rate": 24000}}
            await client.send({"type": "session.instructions.append", "event_id": "greet", "delegation_id": None,
                               "content": "Say hello briefly, then listen."})
            events = await client.until("session.instructions.appended")
            ack = events[-1]
            assert ack["client_event_id"] == "greet" and 600 <= ack["start_ms"] <= 1000
            events += await client.until("session.output_transcript.delta")
            assert transcript(events) == "Hi!"
            await asyncio.sleep(1.0)
            mic.say(load_pcm("question_sky.wav"))
            events += await client.until("session.delegation.created", timeout=20)
            created = events[-1]
            assert created["delegation"].keys() == {"id", "type", "target"}  # metadata, never the task's text
            assert created["delegation"]["target"] == "client" and created["delegation"]["type"] == "delegation"
            assert created["offset_ms"] > 2000
            delegation_id = created["delegation"]["id"]
            # Negative probes while the delegation runs.
            await client.send_raw('{"type": "session.input_audio.commit", "event_id": "probe1"}')
            error = (await client.until("error"))[-1]["error"]
            assert error["type"] == "invalid_request_error" and error["client_event_id"] == "probe1"
            assert "'session.start'" in error["message"] and "'session.commentary.append'" in error["message"]
            await client.send({"type": "response.item.create", "event_id": "probe2", "item": {
                "type": "function_call_output", "call_id": "x", "output": "{}"}})
            error = (await client.until("error"))[-1]["error"]
            assert error["message"] == "response.item.create requires Responses delegation."
            await client.send({"type": "session.thinking.append", "event_id": "t1", "delegation_id": delegation_id,
                               "content": "Checking staging; nothing changed yet."})
            await client.send({"type": "session.commentary.append", "event_id": "c1", "delegation_id": delegation_id,
                               "content": "Staging is healthy."})
            events += await client.until("session.commentary.appended", timeout=5)
            acks = {e["client_event_id"]: e for e in events if e["type"].endswith(".appended")}
            assert acks["t1"]["start_ms"] == acks["c1"]["start_ms"]
            heard = await client.until("session.output_transcript.delta", timeout=10)
            while "healthy" not in transcript(heard):
                heard += await client.until("session.output_transcript.delta", timeout=10)
            events += heard
            await client.send({"type": "session.commentary.append", "event_id": "late", "delegation_id": None,
                               "content": "One more thing."})
            await client.send({"type": "session.close", "event_id": "close"})
            events += await client.until("session.closed", timeout=10)
        received = client.received
    said = transcript(received)
    assert said.startswith("Hi! Okay, checking now.") and "Staging is healthy." in said
    assert transcript(received, "session.input_transcript.delta") == "Please check the staging status."
    # session.started first, session.closed last (after the refused append's error).
    assert received[0]["type"] == "session.started" and received[-1]["type"] == "session.closed"
    refused = received[-2]
    assert refused["error"]["code"] == "context_injection_incomplete" and refused["client_event_id"] == "late"
    closed = received[-1]
    assert closed["reason"] == "close_requested" and closed["client_event_id"] == "close"
    assert closed["session"]["status"] == "active"
    # Output is continuous: one 100 ms delta per 100 ms of timeline, silence included.
    deltas = [e for e in received if e["type"] == "session.output_audio.delta"]
    timeline_ms = mic.sent_ms
    assert abs(len(deltas) * 100 - timeline_ms) <= 300, (len(deltas), timeline_ms)
    assert all(len(audio_of([d])) == 4800 for d in deltas)
    grid(received)
    usage = [e["usage"]["seconds"] for e in received if e["type"] in ("session.usage.updated", "session.closed")]
    assert len(usage) >= 3 and usage == sorted(usage)
    # The voice model heard the user's words and was given one tool.
    turn = next(r for r in fake.chat_requests if any("staging" in (m.get("content") or "") for m in r.messages))
    assert [t["function"]["name"] for t in turn.body["tools"]] == ["delegate"]
    # The trace has what the benchmark needs: end of speech to first audio, and the delegation's round trip.
    records = [json.loads(line) for line in trace.read_text().splitlines()]
    answer = next(r for r in records if "speech_stopped" not in r and "stt_done_ms" in r)
    assert 0 < answer["first_delta_ms"] and answer["stt_done_ms"] <= answer["first_delta_ms"]
    moments = [r["event"] for r in records if "event" in r]
    assert moments == ["delegation_created", "commentary_appended", "commentary_spoken", "commentary_appended"]


@pytest.mark.parametrize("api", ["responses", "chat"])
async def test_responses_delegation_with_a_function_tool(start_pipeline: Any, api: str) -> None:
    async with FakeOpenAI(reply=backend, transcript="What's the weather in Paris?",
                          responses_api=api == "responses") as fake:
        gateway = await start_pipeline(fake, llm__base_url=fake.base_url)
        delegation = {"type": "responses", "responses": {
            "model": "gpt-5.6-terra", "instructions": "You answer weather questions.", "tools": [WEATHER]}}
        async with live(gateway, delegation=delegation) as client, Microphone(client) as mic:
            assert client.received[0]["session"]["delegation"] == delegation
            await client.send({"type": "session.update", "event_id": "u0", "session": {"delegation": None}})
            error = (await client.until("error"))[-1]["error"]
            assert (error["code"], error["param"]) == ("immutable_field_update", "session.delegation.type")
            # The Vercel AI SDK patches the backend without the type.
            await client.send({"type": "session.update", "event_id": "u1", "session": {
                "delegation": {"responses": {"instructions": "You answer weather questions briefly."}}}})
            updated = (await client.until("session.updated"))[-1]
            assert updated["session"]["delegation"]["responses"]["instructions"].endswith("briefly.")
            assert updated["session"]["delegation"]["responses"]["tools"] == [WEATHER]
            mic.say(load_pcm("question_sky.wav"))
            events = await client.until("session.delegation.created", timeout=20)
            created = events[-1]["delegation"]
            assert created["target"] == "responses" and created["response_id"].startswith("resp_")
            events += await client.until("response.event", timeout=10)
            first = events[-1]
            assert first["delegation_id"] == created["id"] and first["event"]["type"] == "response.created"
            snapshot = first["event"]["response"]
            assert snapshot["output"] == [] and snapshot["tools"] == [] and snapshot["instructions"] is None
            assert "input" not in snapshot
            while True:
                event = (await client.until("response.event", timeout=10))[-1]["event"]
                if event["type"] == "response.output_item.done" and event["item"]["type"] == "function_call":
                    call = event["item"]
                if event["type"] == "response.completed":
                    break
            assert call["status"] == "completed" and call["name"] == "get_weather"
            await client.send({"type": "response.create", "event_id": "early"})
            error = (await client.until("error"))[-1]["error"]
            assert error["code"] == "function_call_outputs_required" and error["client_event_id"] == "early"
            await client.send({"type": "response.item.create", "item": {
                "type": "function_call_output", "call_id": call["call_id"], "output": '{"sky": "sunny"}'}})
            await client.send({"type": "response.create"})
            continued = []
            while not continued or continued[-1]["event"]["type"] != "response.completed":
                continued.append((await client.until("response.event", timeout=10))[-1])
            assert {e["delegation_id"] for e in continued} == {created["id"]}
            assert "".join(e["event"].get("delta", "") for e in continued
                           if e["event"]["type"] == "response.output_text.delta") == "It is sunny in Paris."
            assert all("sequence_number" in e["event"] for e in continued)
            heard = []
            while "Paris." not in transcript(heard):
                heard += await client.until("session.output_transcript.delta", timeout=10)
            await client.send({"type": "session.close"})
            await client.until("session.closed", timeout=10)
        assert mic.sent_ms
    backend_calls = fake.responses_requests if api == "responses" else [
        r for r in fake.chat_requests if r.body["model"] == "gpt-5.6-terra"]
    assert len(backend_calls) == 2
    first_call = backend_calls[0].body
    if api == "responses":
        assert first_call["instructions"] == "You answer weather questions briefly."
        assert first_call["tools"] == [WEATHER] and first_call["stream"] is True
        assert any("What's the weather in Paris?" in str(i.get("content")) for i in first_call["input"])
    else:
        assert first_call["messages"][0] == {"role": "system", "content": "You answer weather questions briefly."}
        assert first_call["tools"][0]["function"]["name"] == "get_weather"
