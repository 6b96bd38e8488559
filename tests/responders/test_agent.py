"""The voice agent end to end: Realtime client -> gateway (Silero VAD) -> fake STT/LLM over HTTP -> tone TTS."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest

from bench.fake_openai import FakeOpenAI
from gateway.responders.pipeline import BridgeSettings, PipelineResponder
from gateway.responders.remote import LlmClient
from gateway.responders.tone_tts import ToneEngine
from gateway.server.serve import GatewayServer
from tests.conftest import audio_of, connect, load_pcm, make_config, silence
from tests.paths import TINY_CHECKPOINT

REPLY = "Sure thing. Tomorrow looks sunny and warm, with a light breeze from the west all afternoon."
TRANSCRIPT = "What will the weather be tomorrow?"


@pytest.fixture
async def fake() -> AsyncIterator[FakeOpenAI]:
    async with FakeOpenAI(reply=REPLY, transcript=TRANSCRIPT) as server:
        yield server


@pytest.fixture
async def agent(fake: FakeOpenAI, start_gateway):
    """A gateway whose responder is the pipeline; the TTS speaks at real-time pace like a real engine."""
    responder = PipelineResponder(
        LlmClient(fake.base_url, "llm-test", timeout_s=5),
        ToneEngine(first_audio_ms=25, realtime=True),
        BridgeSettings(starter_chars=10, max_segment_chars=80),
    )
    yield await start_gateway(responder, stt__base_url=fake.base_url)
    await responder.aclose()


async def speak_turn(client) -> list[dict]:
    await client.append(load_pcm("one_sentence.wav") + silence(800), chunk_ms=100)
    return await client.until("response.output_audio.delta")


async def barge_in(client, response_id: str) -> tuple[list[dict], list[dict]]:
    await client.append(load_pcm("one_sentence.wav")[: 48 * 2000], chunk_ms=100)
    events = []
    while True:
        event = await client.recv()
        events.append(event)
        if event["type"] == "response.done" and event["response"]["id"] == response_id:
            break
    return events, await client.quiet(0.5)


async def test_barge_in_while_the_llm_streams_closes_its_stream(agent, fake: FakeOpenAI):
    fake.tokens_per_s = 8  # the LLM is still talking when the user cuts in
    async with connect(agent) as client:
        events = await speak_turn(client)
        response_id = events[-1]["response_id"]
        transcribed = next(e for e in client.received
                           if e["type"] == "conversation.item.input_audio_transcription.completed")
        assert transcribed["transcript"] == TRANSCRIPT
        events, after = await barge_in(client, response_id)
        done = events[-1]["response"]
        assert (done["status"], done["status_details"]["reason"]) == ("cancelled", "turn_detected")
        assert not [e for e in after if e.get("response_id") == response_id]
        chat = fake.chat_requests[0]
        await asyncio.wait_for(chat.done.wait(), 5)
        assert chat.closed_by_client and not chat.finished


async def test_barge_in_while_tts_plays_then_truncate_shortens_the_history(agent, fake: FakeOpenAI):
    async with connect(agent) as client:
        events = await speak_turn(client)
        response_id, item_id = events[-1]["response_id"], events[-1]["item_id"]
        while len(audio_of(events)) < 48 * 1500:  # let 1.5 s of the answer arrive before cutting in
            events.append(await client.recv())
        await asyncio.wait_for(fake.chat_requests[0].done.wait(), 5)
        assert fake.chat_requests[0].finished  # the LLM is done; only speech is left
        events, after = await barge_in(client, response_id)
        assert events[-1]["response"]["status"] == "cancelled"
        assert not [e for e in after if e.get("response_id") == response_id]
        heard_ms = 700
        await client.send({"type": "conversation.item.truncate", "item_id": item_id, "content_index": 0,
                           "audio_end_ms": heard_ms})
        await client.until("conversation.item.truncated")
        await client.append(silence(800), chunk_ms=100)  # the interrupting turn ends
        # Its response: the LLM now sees only what was heard of the first answer.
        await client.until("response.done")
    history = fake.chat_requests[1].messages
    assistant = [m["content"] for m in history if m["role"] == "assistant"]
    assert len(assistant) == 1
    assert assistant[0] and REPLY.startswith(assistant[0]) and len(assistant[0]) < len(REPLY) / 2


async def test_backend_failure_fails_one_response_and_the_next_turn_works(agent, fake: FakeOpenAI):
    fake.llm_failure = "break"
    fake.fail_after_tokens = 3
    async with connect(agent) as client:
        await client.append(load_pcm("one_sentence.wav") + silence(800), chunk_ms=100)
        events = await client.until("response.done")
        done = events[-1]["response"]
        assert done["status"] == "failed"
        errors = [e["error"] for e in events if e["type"] == "error"]
        assert errors and errors[0]["code"] == "llm_backend_error" and "llm" in errors[0]["message"]
        fake.llm_failure = None
        await client.append(load_pcm("one_sentence.wav") + silence(800), chunk_ms=100)
        events = await client.until("response.done")
        assert events[-1]["response"]["status"] == "completed"
        spoken = "".join(e["delta"] for e in events if e["type"] == "response.output_audio_transcript.delta")
        assert spoken == REPLY and audio_of(events)


async def test_latency_trace_records_every_stage(fake: FakeOpenAI, start_gateway, tmp_path):
    trace = tmp_path / "turns.jsonl"
    responder = PipelineResponder(
        LlmClient(fake.base_url, "llm-test", timeout_s=5),
        ToneEngine(first_audio_ms=25), BridgeSettings(starter_chars=10, max_segment_chars=80),
    )
    gateway = await start_gateway(responder, stt__base_url=fake.base_url, trace__jsonl_path=str(trace))
    async with connect(gateway) as client:
        await client.append(load_pcm("one_sentence.wav") + silence(800), chunk_ms=100)
        await client.until("response.done")
    await responder.aclose()
    record = json.loads(trace.read_text().splitlines()[0])
    stages = ["committed_ms", "stt_done_ms", "llm_first_token_ms", "llm_first_segment_ms", "tts_first_audio_ms",
              "first_delta_ms", "response_done_ms"]
    times = [record[s] for s in stages]
    assert times == sorted(times) and record["status"] == "completed"


async def test_a_turn_spoken_by_the_in_process_engine(fake: FakeOpenAI):
    """The configured checkpoint (the tiny parity fixture) is the pipeline's TTS, in its model thread."""
    fake.reply = "Hello there."
    config = make_config(
        responder__kind="pipeline", llm__base_url=fake.base_url, stt__base_url=fake.base_url,
        tts__engine="qwen3", engine__checkpoint=str(TINY_CHECKPOINT), engine__max_frames=24,
        engine__voices={"alloy": "vivian"},  # the tiny checkpoint has five of the real one's speakers
    )
    gateway = GatewayServer(config)
    await gateway.start()
    try:
        async with connect(gateway) as client:
            await client.append(load_pcm("one_sentence.wav") + silence(800), chunk_ms=100)
            events = await client.until("response.done", timeout=60)
    finally:
        await gateway.stop()
    assert events[-1]["response"]["status"] == "completed"
    spoken = "".join(e["delta"] for e in events if e["type"] == "response.output_audio_transcript.delta")
    assert spoken.strip() == fake.reply
    assert len(audio_of(events)) >= 48 * 80 * 4  # at least one packet of four 80 ms frames
