"""The Realtime protocol end to end: a real gateway, the unmodified openai SDK, real Silero VAD."""

from __future__ import annotations

import asyncio
import base64
import json
import time
import urllib.request

import numpy as np
import pytest
import soxr

from gateway.audio import ulaw_decode, ulaw_encode
from gateway.responders.echo import EchoResponder
from tests.conftest import audio_of, connect, load_pcm, silence, types

TURN_EVENTS_GA = [
    "input_audio_buffer.speech_started",
    "input_audio_buffer.speech_stopped",
    "input_audio_buffer.committed",
    "conversation.item.added",
    "conversation.item.done",
    "response.created",
    "rate_limits.updated",
    "response.output_item.added",
    "conversation.item.added",
    "response.content_part.added",
]
TURN_END_GA = [
    "response.output_audio.done",
    "response.output_audio_transcript.done",
    "response.content_part.done",
    "response.output_item.done",
    "conversation.item.done",
    "response.done",
]


def without_deltas(events):
    return [t for t in types(events) if not t.endswith(".delta")]


async def test_vad_turn_is_echoed_in_order(gateway):
    speech = load_pcm("one_sentence.wav")
    async with connect(gateway) as client:
        await client.append(speech + silence(800))
        events = await client.until("response.done")
    assert without_deltas(events) == TURN_EVENTS_GA + TURN_END_GA
    started, stopped = events[0], events[1]
    # The fixture speaks from 500 ms to 3148 ms; the start includes the 300 ms prefix padding.
    assert 100 <= started["audio_start_ms"] <= 300
    assert 3100 <= stopped["audio_end_ms"] <= 3300
    assert started["item_id"] == stopped["item_id"] == events[2]["item_id"]
    done = events[-1]["response"]
    assert done["status"] == "completed"
    assert done["output"][0]["role"] == "assistant" and done["output"][0]["status"] == "completed"
    # Echo: the reply is exactly the committed audio, prefix padding included.
    reply = audio_of(events)
    start_ms, end_ms = started["audio_start_ms"], stopped["audio_end_ms"]
    assert abs(len(reply) / 48 - (end_ms - start_ms)) <= 1
    assert reply == speech[start_ms * 48 : start_ms * 48 + len(reply)]


async def test_beta_shape(gateway):
    async with connect(gateway, beta=True) as client:
        assert (await client.recv())["type"] == "conversation.created"
        await client.send({"type": "session.update", "session": {"voice": "ash", "modalities": ["text", "audio"]}})
        updated = await client.until("session.updated")
        assert updated[-1]["session"]["voice"] == "ash"
        assert updated[-1]["session"]["input_audio_format"] == "pcm16"
        await client.append(load_pcm("one_sentence.wav") + silence(800))
        events = await client.until("response.done")
    names = without_deltas(events)
    assert names[:4] == [
        "input_audio_buffer.speech_started",
        "input_audio_buffer.speech_stopped",
        "input_audio_buffer.committed",
        "conversation.item.created",
    ]
    assert names[-5:] == [
        "response.audio.done",
        "response.audio_transcript.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.done",
    ]
    assert "response.audio.delta" in types(events)
    assert not any(t.startswith("conversation.item.added") or "output_audio" in t for t in names)
    assert events[-1]["response"]["modalities"] == ["text", "audio"]
    assert events[-1]["response"]["output"][0]["content"][0]["type"] == "audio"


async def test_two_turns_chain_items(gateway):
    async with connect(gateway) as client:
        await client.append(load_pcm("two_turns.wav") + silence(800))
        first = await client.until("response.done")
        second = await client.until("response.done")
    commits = [e for e in first + second if e["type"] == "input_audio_buffer.committed"]
    assert len(commits) == 2
    # The second user item follows the first reply in the conversation (a reply cut off by the second turn
    # before it produced anything has no item: the second turn then follows the first).
    output = first[-1]["response"]["output"]
    assert commits[1]["previous_item_id"] == (output[0]["id"] if output else commits[0]["item_id"])
    assert second[-1]["response"]["status"] == "completed"


async def test_chunk_size_and_pace_do_not_change_vad_events(gateway):
    speech = load_pcm("two_turns.wav") + silence(800)
    runs = []
    for chunk_ms in (20, 250):
        async with connect(gateway) as client:
            await client.send({"type": "session.update", "session": {
                "type": "realtime", "audio": {"input": {"turn_detection": {"type": "server_vad",
                                                                           "create_response": False}}}}})
            await client.until("session.updated")
            await client.append(speech, chunk_ms=chunk_ms)
            events = await client.until("input_audio_buffer.committed")
            events += await client.until("input_audio_buffer.committed")
            runs.append([(e["type"], e.get("audio_start_ms"), e.get("audio_end_ms"))
                         for e in events if "speech" in e["type"]])
    assert runs[0] == runs[1] and len(runs[0]) == 4


async def test_barge_in_cancels_the_response(start_gateway):
    gateway = await start_gateway(EchoResponder(pace=1.0))
    async with connect(gateway) as client:
        await client.append(load_pcm("one_sentence.wav") + silence(800))
        events = await client.until("response.output_audio.delta")
        response_id = events[-1]["response_id"]
        # The user speaks again while the ~3 s echo plays.
        await client.append(load_pcm("one_sentence.wav")[: 48 * 2500])
        events = await client.until("response.done")
        after = await client.quiet(0.5)
    names = without_deltas(events)
    assert names[0] == "input_audio_buffer.speech_started"
    assert names[1:] == TURN_END_GA
    done = events[-1]["response"]
    assert done["id"] == response_id and done["status"] == "cancelled"
    assert done["status_details"]["reason"] == "turn_detected"
    assert done["output"][0]["status"] == "incomplete"
    assert not [e for e in after if e.get("response_id") == response_id]


async def test_response_cancel_and_manual_commit(start_gateway):
    gateway = await start_gateway(EchoResponder(pace=1.0))
    async with connect(gateway) as client:
        await client.send({"type": "session.update",
                           "session": {"type": "realtime", "audio": {"input": {"turn_detection": None}}}})
        updated = await client.until("session.updated")
        assert updated[-1]["session"]["audio"]["input"]["turn_detection"] is None
        await client.append(load_pcm("one_sentence.wav"))
        await client.send({"type": "input_audio_buffer.commit"})
        events = await client.until("conversation.item.done")
        assert types(events) == ["input_audio_buffer.committed", "conversation.item.added", "conversation.item.done"]
        await client.send({"type": "response.create"})
        events = await client.until("response.output_audio.delta")
        response_id = events[-1]["response_id"]
        await client.send({"type": "response.cancel", "event_id": "evt_cancel_1"})
        events = await client.until("response.done")
        after = await client.quiet(0.5)
        assert events[-1]["response"]["status"] == "cancelled"
        assert events[-1]["response"]["status_details"]["reason"] == "client_cancelled"
        assert not [e for e in after if e.get("response_id") == response_id]
        await client.send({"type": "response.cancel", "event_id": "evt_cancel_2"})
        error = (await client.until("error"))[-1]["error"]
        assert error["code"] == "response_cancel_not_active" and error["event_id"] == "evt_cancel_2"
    assert "input_audio_buffer.speech_started" not in types(client.received)


async def test_truncate_cuts_the_assistant_audio(gateway):
    async with connect(gateway) as client:
        await client.append(load_pcm("one_sentence.wav") + silence(800))
        events = await client.until("response.done")
        user_id = events[2]["item_id"]
        item_id = events[-1]["response"]["output"][0]["id"]
        await client.send({"type": "conversation.item.truncate", "item_id": item_id, "content_index": 0,
                           "audio_end_ms": 1200})
        truncated = (await client.until("conversation.item.truncated"))[-1]
        assert (truncated["item_id"], truncated["audio_end_ms"]) == (item_id, 1200)
        await client.send({"type": "conversation.item.retrieve", "item_id": item_id})
        item = (await client.until("conversation.item.retrieved"))[-1]["item"]
        assert len(base64.b64decode(item["content"][0]["audio"])) == 1200 * 48
        # Past the end of what the item now holds, and a user item: both refused.
        await client.send({"type": "conversation.item.truncate", "item_id": item_id, "content_index": 0,
                           "audio_end_ms": 5000})
        error = (await client.until("error"))[-1]["error"]
        assert (error["code"], error["param"]) == ("invalid_value", "audio_end_ms")
        await client.send({"type": "conversation.item.truncate", "item_id": user_id, "content_index": 0,
                           "audio_end_ms": 10})
        assert (await client.until("error"))[-1]["error"]["code"] == "unsupported_content_type"


BAD_INPUTS = [
    ('{"type": "input_audio_buffer.commit", "event_id": "e1"}', "input_audio_buffer_commit_empty", None),
    ("this is not json", "invalid_json", None),
    ('["a list"]', "invalid_json", None),
    ('{"type": "input_audio_buffer.explode", "event_id": "e1"}', "invalid_event_type", "type"),
    ('{"event_id": "e1"}', "missing_required_parameter", "type"),
    ('{"type": "input_audio_buffer.append", "event_id": "e1"}', "missing_required_parameter", "audio"),
    ('{"type": "input_audio_buffer.append", "audio": 42, "event_id": "e1"}', "invalid_type", "audio"),
    ('{"type": "input_audio_buffer.append", "audio": "@@not base64@@", "event_id": "e1"}', "invalid_base64", "audio"),
    ('{"type": "input_audio_buffer.append", "audio": "' + "A" * 90000 + '", "event_id": "e1"}',
     "audio_too_large", "audio"),
    # OpenAI's codes, which clients match on (Pipecat's retrieve waits for item_retrieve_invalid_item_id).
    ('{"type": "conversation.item.retrieve", "item_id": "item_nope", "event_id": "e1"}',
     "item_retrieve_invalid_item_id", "item_id"),
    ('{"type": "conversation.item.delete", "item_id": "item_nope", "event_id": "e1"}',
     "item_delete_invalid_item_id", "item_id"),
    ('{"type": "conversation.item.truncate", "item_id": "item_nope", "content_index": 0, "audio_end_ms": 1, '
     '"event_id": "e1"}', "item_truncate_invalid_item_id", "item_id"),
    ('{"type": "response.cancel", "event_id": "e1"}', "response_cancel_not_active", None),
    ('{"type": "response.cancel", "response_id": "resp_nope", "event_id": "e1"}', "response_cancel_not_active",
     "response_id"),
    ('{"type": "session.update", "session": {"type": "realtime", "audio": {"input": {"turn_detection": '
     '{"type": "server_vad", "threshold": 2}}}}, "event_id": "e1"}', "invalid_value",
     "session.audio.input.turn_detection.threshold"),
    ('{"type": "session.update", "session": {"type": "realtime", "audio": {"output": {"format": '
     '{"type": "audio/mp3"}}}}, "event_id": "e1"}', "invalid_value", "session.audio.output.format.type"),
    ('{"type": "conversation.item.create", "item": {"type": "message", "role": "robot", "content": []}, '
     '"event_id": "e1"}', "invalid_value", "item.role"),
]


async def test_bad_input_gets_errors_and_keeps_the_session(start_gateway):
    gateway = await start_gateway(session__max_append_bytes=65536)
    speech = load_pcm("one_sentence.wav")[: 48 * 1000]
    async with connect(gateway) as client:
        await client.send({"type": "session.update",
                           "session": {"type": "realtime", "audio": {"input": {"turn_detection": None}}}})
        await client.until("session.updated")
        for text, code, param in BAD_INPUTS:
            await client.send_raw(text)
            event = (await client.until("error"))[-1]
            error = event["error"]
            assert (error["type"], error["code"], error["param"]) == ("invalid_request_error", code, param), text
            assert error["message"]
            if '"event_id": "e1"' in text:
                assert error["event_id"] == "e1"
            if code == "input_audio_buffer_commit_empty":
                continue
            # Valid audio interleaved with the bad input must all be kept.
            await client.append(speech[:4800])
        await client.send({"type": "input_audio_buffer.commit"})
        events = await client.until("conversation.item.done")
        item_id = events[0]["item_id"]
        await client.send({"type": "conversation.item.retrieve", "item_id": item_id})
        item = (await client.until("conversation.item.retrieved"))[-1]["item"]
        expected = speech[:4800] * (len(BAD_INPUTS) - 1)
        assert base64.b64decode(item["content"][0]["audio"]) == expected
        # A second response.create while one runs is refused; the first completes.
        await client.send({"type": "response.create"})
        await client.send({"type": "response.create", "event_id": "e2"})
        events = await client.until("response.done")
        errors = [e["error"] for e in events if e["type"] == "error"]
        assert [(e["code"], e["event_id"]) for e in errors] == [("conversation_already_has_active_response", "e2")]
        assert events[-1]["response"]["status"] == "completed"


async def test_an_append_over_the_real_limit_is_refused_and_the_session_goes_on(gateway):
    limit = gateway.config.session.max_append_bytes  # 15 MiB, as OpenAI's
    async with connect(gateway) as client:
        await client.append(silence(100))
        await client.send({"type": "input_audio_buffer.append", "event_id": "big",
                           "audio": base64.b64encode(bytes(limit + 48_000)).decode()})
        error = (await client.until("error", timeout=30))[-1]["error"]
        assert (error["code"], error["event_id"]) == ("audio_too_large", "big")
        await client.send({"type": "input_audio_buffer.clear"})
        assert (await client.until("input_audio_buffer.cleared"))[-1]["type"] == "input_audio_buffer.cleared"


async def test_client_items_and_text_response(gateway):
    async with connect(gateway) as client:
        await client.send({"type": "conversation.item.create", "item": {
            "type": "message", "role": "user", "content": [{"type": "input_text", "text": "hello there"}]}})
        added = (await client.until("conversation.item.done"))[0]
        assert added["type"] == "conversation.item.added"
        first_id = added["item"]["id"]
        await client.send({"type": "conversation.item.create", "previous_item_id": "root", "item": {
            "type": "message", "role": "system", "content": [{"type": "input_text", "text": "be brief"}]}})
        root = (await client.until("conversation.item.done"))[0]
        assert root["previous_item_id"] is None
        await client.send({"type": "response.create", "response": {"output_modalities": ["text"]}})
        events = await client.until("response.done")
        deltas = [e["delta"] for e in events if e["type"] == "response.output_text.delta"]
        assert "".join(deltas) == "hello there"
        assert events[-1]["response"]["output"][0]["content"][0] == {"type": "output_text", "text": "hello there"}
        await client.send({"type": "conversation.item.delete", "item_id": first_id})
        deleted = (await client.until("conversation.item.deleted"))[-1]
        assert deleted["item_id"] == first_id


async def test_g711_in_and_out(gateway):
    speech = load_pcm("one_sentence.wav")
    async with connect(gateway) as client:
        await client.send({"type": "session.update", "session": {"type": "realtime", "audio": {
            "input": {"format": {"type": "audio/pcmu"}}, "output": {"format": {"type": "audio/pcmu"}}}}})
        session = (await client.until("session.updated"))[-1]["session"]
        assert session["audio"]["output"]["format"] == {"type": "audio/pcmu"}
        samples = np.frombuffer(speech + silence(800), dtype=np.int16)
        ulaw = ulaw_encode(soxr.resample(samples, 24000, 8000))  # the codec is checked against audioop elsewhere
        await client.append(ulaw, chunk_ms=60)
        events = await client.until("response.done")
        # A retrieved item's audio is in the session's formats too: what the client sent, what it heard.
        retrieved = []
        for item_id in (events[2]["item_id"], events[-1]["response"]["output"][0]["id"]):
            await client.send({"type": "conversation.item.retrieve", "item_id": item_id})
            item = (await client.until("conversation.item.retrieved"))[-1]["item"]
            retrieved.append(base64.b64decode(item["content"][0]["audio"]))
    stopped = next(e for e in events if e["type"] == "input_audio_buffer.speech_stopped")
    assert 2900 <= stopped["audio_end_ms"] <= 3500
    reply = audio_of(events)
    heard, said = retrieved
    assert abs(len(heard) / 8 - (stopped["audio_end_ms"] - next(
        e for e in events if e["type"] == "input_audio_buffer.speech_started")["audio_start_ms"])) < 60
    assert abs(len(said) - len(reply)) < 8 * 30 and np.abs(ulaw_decode(said).astype(np.float32)).max() > 3000
    started = next(e for e in events if e["type"] == "input_audio_buffer.speech_started")
    expected_ms = stopped["audio_end_ms"] - started["audio_start_ms"]
    assert abs(len(reply) / 8 - expected_ms) < 60  # one byte per sample at 8 kHz
    assert np.abs(ulaw_decode(reply).astype(np.float32)).max() > 3000  # speech, not silence


async def test_turn_records_of_a_live_session(gateway):
    loop = asyncio.get_running_loop()
    async with connect(gateway) as client:
        session_id = client.received[0]["session"]["id"]
        sent_ms = time.monotonic() * 1000
        await client.append(load_pcm("one_sentence.wav") + silence(800))
        done = (await client.until("response.done"))[-1]
        url = f"http://127.0.0.1:{gateway.port}/v1/realtime/sessions/{session_id}/turns"
        with await loop.run_in_executor(None, urllib.request.urlopen, url) as response:
            turns = json.loads(response.read())["turns"]
    assert [t["response_id"] for t in turns] == [done["response"]["id"]]
    assert turns[0]["status"] == "completed" and 0 <= turns[0]["committed_ms"] <= turns[0]["first_delta_ms"]
    # where the turn ended in the audio, and when it was detected on the host's monotonic clock
    stopped = next(e for e in client.received if e["type"] == "input_audio_buffer.speech_stopped")
    assert turns[0]["audio_end_ms"] == stopped["audio_end_ms"]
    assert sent_ms < turns[0]["at_ms"] < time.monotonic() * 1000


@pytest.mark.parametrize("path", ["/healthz", "/metrics"])
async def test_http_endpoints(gateway, path):
    url = f"http://127.0.0.1:{gateway.port}{path}"
    loop = asyncio.get_running_loop()
    with await loop.run_in_executor(None, urllib.request.urlopen, url) as response:
        body = response.read().decode()
    assert response.status == 200
    if path == "/healthz":
        health = json.loads(body)
        assert health["status"] == "ok" and health["active_sessions"] == 0 and health["version"]
        assert health["active_sessions_by_worker"] == [0]
    else:
        assert "gateway_turn_stage_seconds" in body


PNG = "data:image/png;base64," + base64.b64encode(b"\x89PNG\r\n\x1a\n" + bytes(64)).decode()


async def test_a_picture_in_a_user_message_reaches_the_llm(start_pipeline):
    """input_image parts (what the Agents SDK's addImage sends) go to the LLM as chat image_url parts, after the
    message's text; a picture that is not a PNG or JPEG data URL is refused naming its part."""
    from bench.fake_openai import FakeOpenAI

    async with FakeOpenAI(reply="A small square.") as fake:
        gateway = await start_pipeline(fake, vad__enabled=False)
        async with connect(gateway) as client:
            await client.send({"type": "conversation.item.create", "item": {
                "type": "message", "role": "user", "content": [
                    {"type": "input_text", "text": "What is this?"},
                    {"type": "input_image", "image_url": "https://example.com/cat.png"}]}})
            error = (await client.until("error"))[-1]["error"]
            assert (error["code"], error["param"]) == ("invalid_value", "item.content[1].image_url")
            await client.send({"type": "conversation.item.create", "item": {
                "type": "message", "role": "user", "content": [
                    {"type": "input_text", "text": "What is this?"},
                    {"type": "input_image", "image_url": PNG, "detail": "low"}]}})
            added = (await client.until("conversation.item.added"))[-1]["item"]
            assert added["content"][1] == {"type": "input_image", "image_url": PNG, "detail": "low"}
            await client.send({"type": "response.create"})
            await client.until("response.done")
    (request,) = fake.chat_requests
    assert request.messages[-1] == {"role": "user", "content": [
        {"type": "text", "text": "What is this?"}, {"type": "image_url", "image_url": {"url": PNG, "detail": "low"}}]}


@pytest.mark.parametrize("modality", ["text", "audio"])
async def test_a_reply_cut_at_max_output_tokens_is_incomplete(start_pipeline, modality: str):
    """The LLM stopping at its token limit (finish_reason "length") makes OpenAI's incomplete response: status
    incomplete, reason max_output_tokens, the message item incomplete with the words it had."""
    from bench.fake_openai import FakeOpenAI

    async with FakeOpenAI(reply="Hello there, this is a rather long answer to your question.") as fake:
        gateway = await start_pipeline(fake, vad__enabled=False)
        async with connect(gateway) as client:
            await client.send({"type": "conversation.item.create", "item": {
                "type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi."}]}})
            await client.send({"type": "response.create", "response": {
                "max_output_tokens": 3, "output_modalities": [modality]}})
            done = (await client.until("response.done"))[-1]["response"]
            assert (done["status"], done["status_details"]["reason"]) == ("incomplete", "max_output_tokens")
            [message] = done["output"]
            assert message["status"] == "incomplete" and message["content"][0].get("text", message["content"][0].get(
                "transcript")).startswith("Hello")
            fake.reply = "Fine."
            await client.send({"type": "response.create"})
            assert (await client.until("response.done"))[-1]["response"]["status"] == "completed"


@pytest.mark.parametrize("how", ["clear", "commit"])
async def test_speech_cut_off_mid_word_leaves_no_turn_in_the_silence_after(gateway, how: str):
    """LiveKit clears the buffer when it drops a backchannel: cut mid-word at 1.0 s, the VAD model's memory of
    that word must not make the silence that follows a turn of its own (nor an answer to it)."""
    speech = load_pcm("one_sentence.wav")
    async with connect(gateway) as client:
        await client.append(speech[: 48 * 1000])
        await client.until("input_audio_buffer.speech_started")
        await client.send({"type": f"input_audio_buffer.{how}"})
        await client.until("input_audio_buffer.cleared" if how == "clear" else "input_audio_buffer.committed")
        await client.append(silence(2500))
        await asyncio.sleep(1.5)  # the VAD's events come as it hears the audio, not in order with later events
        await client.send({"type": "conversation.item.retrieve", "item_id": "item_none"})
        events = await client.until("error")
    assert "input_audio_buffer.speech_started" not in types(events), types(events)


async def test_a_reply_with_nothing_to_say_aloud_keeps_its_turn(start_pipeline):
    """An emoji reply makes no audio, but it is the assistant's turn all the same: its item holds the words, and
    the LLM's next prompt has it between the user's messages."""
    from bench.fake_openai import FakeOpenAI

    async with FakeOpenAI(reply="👍") as fake:
        gateway = await start_pipeline(fake, vad__enabled=False)
        async with connect(gateway) as client:
            for text in ("Reply with an emoji.", "And now?"):
                await client.send({"type": "conversation.item.create", "item": {
                    "type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}})
                await client.send({"type": "response.create"})
                done = (await client.until("response.done"))[-1]["response"]
                assert [p["transcript"] for p in done["output"][0]["content"]] == ["👍"]
    assert [(m["role"], m["content"]) for m in fake.chat_requests[-1].messages[-3:]] == [
        ("user", "Reply with an emoji."), ("assistant", "👍"), ("user", "And now?")]
