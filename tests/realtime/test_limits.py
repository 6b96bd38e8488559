"""Session hardening: what one session may hold, deep JSON, oversized item audio, a full input buffer,
and a handler that fails; plus what a truncate does to a response still running."""

from __future__ import annotations

import base64
import logging

import orjson
import pytest

from gateway.core.responder import AudioOut, SpeechText
from gateway.core.values import MAX_JSON_DEPTH
from gateway.realtime.session import Session
from gateway.responders.echo import EchoResponder
from tests.conftest import StartGateway, connect, load_pcm, make_config, silence, types
from tests.helpers.session import SECOND, events_of, send, start_response


def audio_item(seconds: float, item_id: str | None = None) -> dict:
    part = {"type": "input_audio", "audio": base64.b64encode(bytes(int(48_000 * seconds))).decode()}
    item = {"type": "message", "role": "user", "content": [part]}
    return {**item, "id": item_id} if item_id else item


def text_item(text: str) -> dict:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def commit(session: Session, seconds: float) -> list[dict]:
    send(session, type="input_audio_buffer.append", audio=base64.b64encode(bytes(int(48_000 * seconds))).decode())
    return events_of(send(session, type="input_audio_buffer.commit"))


def item_ids(session: Session) -> list[str]:
    return [item.id for item in session.conversation.items()]


def test_past_max_items_a_client_item_is_refused_and_a_turn_drops_the_oldest():
    session = Session(make_config(vad__enabled=False, session__max_items=3))
    for n in range(3):
        send(session, type="conversation.item.create", item=text_item(f"hello {n}"))
    kept = item_ids(session)
    error = events_of(send(session, type="conversation.item.create", item=text_item("one more")))[0]["error"]
    assert (error["code"], error["param"]) == ("conversation_full", "item")
    assert "[session] max_items" in error["message"] and item_ids(session) == kept
    # A committed turn is the session's own: it makes room, telling the client what went.
    events = commit(session, 0.5)
    assert [e["item_id"] for e in events if e["type"] == "conversation.item.deleted"] == kept[:1]
    assert item_ids(session) == [*kept[1:], events[0]["item_id"]]


def test_stored_audio_is_bounded_and_a_response_makes_room_for_its_own():
    session = Session(make_config(vad__enabled=False, session__max_audio_seconds=3.0))
    error = events_of(send(session, type="conversation.item.create", item=audio_item(3.5)))[0]["error"]
    assert error["code"] == "conversation_full" and "max_audio_seconds" in error["message"]
    first = commit(session, 1.5)[0]["item_id"]
    second = commit(session, 1.0)[0]["item_id"]
    start = start_response(session)
    rid = start.request.response_id
    assert events_of(session.response_output(rid, AudioOut(SECOND[: 24_000]))) != []
    deleted = [e for e in events_of(session.response_output(rid, AudioOut(SECOND))) if e["type"].endswith("deleted")]
    assert [e["item_id"] for e in deleted] == [first]
    assert item_ids(session) == [second, start.request.item_id]
    assert session.conversation.audio_bytes <= 3 * 48_000


def test_text_is_bounded_with_the_session_configuration_in_it():
    session = Session(make_config(vad__enabled=False, session__max_text_bytes=20_000))
    error = events_of(send(session, type="session.update", session={"type": "realtime",
                                                                     "instructions": "x" * 20_000}))[0]["error"]
    assert (error["code"], error["param"]) == ("session_too_large", "session")
    assert session.settings.instructions != "x" * 20_000
    send(session, type="session.update", session={"type": "realtime", "instructions": "x" * 10_000})
    error = events_of(send(session, type="conversation.item.create", item=text_item("y" * 10_000)))[0]["error"]
    assert error["code"] == "conversation_full" and "max_text_bytes" in error["message"]
    assert send(session, type="conversation.item.create", item=text_item("y" * 5_000))[0].event["type"] == (
        "conversation.item.added")


def test_item_audio_is_limited_like_an_append():
    session = Session(make_config(session__max_append_bytes=48_000))
    error = events_of(send(session, type="conversation.item.create", item=audio_item(1.5)))[0]["error"]
    assert (error["code"], error["param"]) == ("audio_too_large", "item.content[0].audio")
    assert session.conversation.items() == []
    assert send(session, type="conversation.item.create", item=audio_item(1.0))[0].event["type"] == (
        "conversation.item.added")


def test_a_full_input_buffer_tells_the_client_what_it_dropped():
    """With VAD off, audio past [session] max_buffer_seconds is dropped from the front with an error
    naming it; with VAD listening and nobody speaking, dropping old idle audio is the normal case."""
    session = Session(make_config(vad__enabled=False, session__max_buffer_seconds=2.0))
    errors = []
    for _ in range(4):
        errors += [e["error"] for e in events_of(send(
            session, type="input_audio_buffer.append", audio=base64.b64encode(SECOND).decode()))]
    # Trimmed a second at a time: each drop is told, with the input-audio times it covered.
    assert [e["code"] for e in errors] == ["input_audio_buffer_overflow"] * 2
    assert "1000 ms of uncommitted audio were dropped" in errors[0]["message"]
    assert ["0-1000 ms" in errors[0]["message"], "1000-2000 ms" in errors[1]["message"]] == [True, True]
    assert commit(session, 0)[0]["type"] == "input_audio_buffer.committed"
    assert len(session.conversation.items()[0].audio) == 2 * len(SECOND)

    listening = Session(make_config(session__idle_buffer_seconds=1.0))
    for _ in range(4):
        effects = send(listening, type="input_audio_buffer.append", audio=base64.b64encode(SECOND).decode())
        assert events_of(effects) == []
        listening.vad_result([0.0] * 31)


def nested(depth: int) -> str:
    """A JSON object ``depth`` levels deep (as text: orjson writes at most 254 levels)."""
    return '{"a": ' * (depth - 1) + "{}" + "}" * (depth - 1)


@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 1, 300])
def test_deeply_nested_json_is_refused(depth: int):
    """Echoed back in response.done, 300 levels used to close the connection (1011)."""
    session = Session(make_config())
    # The event and its response are two levels; the metadata value is the rest.
    event = '{"type": "response.create", "response": {"metadata": ' + nested(depth - 2) + "}}"
    error = events_of(session.handle(event))[0]["error"]
    assert (error["type"], error["code"]) == ("invalid_request_error", "invalid_json")
    assert f"deeper than {MAX_JSON_DEPTH}" in error["message"] and session.responses.active is None


async def test_deep_json_leaves_the_connection_open(gateway):
    async with connect(gateway) as client:
        await client.send_raw('{"type": "response.create", "response": {"metadata": ' + nested(300) + "}}")
        assert (await client.until("error"))[-1]["error"]["code"] == "invalid_json"
        await client.send({"type": "response.create", "response": {"output_modalities": ["text"]}})
        assert (await client.until("response.done"))[-1]["response"]["status"] == "completed"


def test_json_at_the_depth_limit_is_read():
    session = Session(make_config())
    tool = {"type": "function", "name": "f", "parameters": orjson.loads(nested(MAX_JSON_DEPTH - 4))}
    events = events_of(send(session, type="session.update", session={"type": "realtime", "tools": [tool]}))
    assert events[0]["type"] == "session.updated"


def test_truncate_leaves_the_response_running_and_the_item_keeps_what_was_heard():
    """The SDKs' interrupt is truncate, then (maybe) response.cancel. What the response makes after the
    truncate still goes out as deltas, but the item holds only the heard part."""
    session = Session(make_config(vad__enabled=False))
    start = start_response(session)
    rid, item_id = start.request.response_id, start.request.item_id
    session.response_output(rid, SpeechText("Hello there. "))
    session.response_output(rid, AudioOut(SECOND))
    events = events_of(send(session, type="conversation.item.truncate", item_id=item_id, content_index=0,
                            audio_end_ms=500))
    assert types(events) == ["conversation.item.truncated"] and session.responses.active is not None
    later = events_of(session.response_output(rid, SpeechText("How are you?")))
    later += events_of(session.response_output(rid, AudioOut(SECOND)))
    assert types(later) == ["response.output_audio_transcript.delta", "response.output_audio.delta"]
    done = events_of(send(session, type="response.cancel"))[-1]["response"]
    assert (done["status"], done["status_details"]["reason"]) == ("cancelled", "client_cancelled")
    assert done["output"][0]["content"][0]["transcript"] == "Hello"
    assert len(session.conversation.get(item_id).audio) == 500 * 48
    assert start_response(session).request.messages[-1].text == "Hello"


async def test_truncate_then_cancel_gets_no_error(start_gateway: StartGateway):
    """The Agents SDK's interrupt over WebSocket: truncate at what was played, then response.cancel."""
    gateway = await start_gateway(EchoResponder(pace=1.0))
    async with connect(gateway) as client:
        await client.send({"type": "session.update",
                           "session": {"type": "realtime", "audio": {"input": {"turn_detection": None}}}})
        await client.until("session.updated")
        await client.append(load_pcm("one_sentence.wav"))
        await client.send({"type": "input_audio_buffer.commit"})
        await client.send({"type": "response.create"})
        played = 0
        while played < 300 * 48:
            event = (await client.until("response.output_audio.delta"))[-1]
            played += len(base64.b64decode(event["delta"]))
        await client.send({"type": "conversation.item.truncate", "item_id": event["item_id"], "content_index": 0,
                           "audio_end_ms": 300})
        await client.send({"type": "response.cancel"})
        events = await client.until("response.done")
        assert "error" not in types(events) and "conversation.item.truncated" in types(events)
        assert events[-1]["response"]["status_details"]["reason"] == "client_cancelled"
        await client.send({"type": "conversation.item.retrieve", "item_id": event["item_id"]})
        item = (await client.until("conversation.item.retrieved"))[-1]["item"]
        assert len(base64.b64decode(item["content"][0]["audio"])) == 300 * 48


@pytest.mark.error_logs_expected("a handler made to fail: the bug is logged in full, once")
async def test_a_failing_handler_costs_one_event_not_the_session(
    start_gateway: StartGateway, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
):
    def broken(self, event):
        raise RuntimeError("a bug")

    monkeypatch.setattr(Session, "_on_conversation_item_retrieve", broken)
    caplog.set_level(logging.DEBUG, logger="gateway.realtime.session")
    gateway = await start_gateway()
    async with connect(gateway) as client:
        for event_id in ("e1", "e2"):
            await client.send({"type": "conversation.item.retrieve", "item_id": "item_x", "event_id": event_id})
            error = (await client.until("error"))[-1]["error"]
            assert (error["type"], error["code"], error["event_id"]) == ("server_error", "server_error", event_id)
        await client.append(load_pcm("one_sentence.wav") + silence(800))
        assert (await client.until("response.done"))[-1]["response"]["status"] == "completed"
    logged = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(logged) == 1 and logged[0].exc_info is not None and "RuntimeError: a bug" in caplog.text


async def test_a_scalar_message_is_refused_and_the_session_goes_on(gateway, caplog):
    """A message that is JSON but no object (it crashed the depth check: server_error and a traceback)."""
    async with connect(gateway) as client:
        for text in ("5", "-1.5e3", "true", "false", "null", '"response.create"'):
            await client.send_raw(text)
            error = (await client.until("error"))[-1]["error"]
            assert (error["type"], error["code"]) == ("invalid_request_error", "invalid_json"), text
            assert error["message"] == "A client event must be a JSON object.", text
        await client.send({"type": "response.create", "response": {"output_modalities": ["text"]}})
        assert (await client.until("response.done"))[-1]["response"]["status"] == "completed"
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
