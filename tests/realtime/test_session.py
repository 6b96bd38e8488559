"""The session as a core, in the way h11's test_connection.py tests its connection: client events, scripted VAD
probabilities and Smart Turn verdicts, and responder outputs in; server events and effects out. No socket,
thread, model or clock: every test here drives a ``Session`` by hand, and every event it sends is checked against
the openai SDK's own types."""

from __future__ import annotations

import base64
from typing import Any

import orjson
import pytest

from gateway.core.responder import AudioOut, BackendError, SpeechText
from gateway.core.vad import WINDOW_MS
from gateway.realtime.effects import (
    ClearPlayout,
    Effect,
    Play,
    RunSmartTurn,
    RunVad,
    SendEvent,
    StartResponse,
    StopResponse,
    Transcribe,
)
from gateway.realtime.events import Dialect
from gateway.realtime.session import Phase, Session
from gateway.realtime.settings import session_wire
from tests.conftest import BETA_EVENTS, GA_EVENTS, check_beta_transcription_session, make_config, types
from tests.helpers.session import SECOND, events_of, send, speak, start_response


def test_truncate_keeps_only_the_words_heard_and_the_llm_sees_that():
    session = Session(make_config(vad__enabled=False))
    start = start_response(session)
    item_id = speak(session, start)
    done = events_of(session.response_finished(start.request.response_id))
    assert done[-1]["response"]["output"][0]["content"][0]["transcript"] == "Hello there. How are you today?"

    events = events_of(send(session, type="conversation.item.truncate", item_id=item_id, content_index=0,
                            audio_end_ms=1500))
    assert events[-1]["type"] == "conversation.item.truncated"
    # Half of the second sentence's audio was heard: its first words, whole words only.
    next_request = start_response(session).request
    assert next_request.messages[-1].role == "assistant"
    assert next_request.messages[-1].text == "Hello there. How are"


def test_truncate_before_any_speech_leaves_no_text():
    session = Session(make_config(vad__enabled=False))
    start = start_response(session)
    item_id = speak(session, start)
    session.response_finished(start.request.response_id)
    send(session, type="conversation.item.truncate", item_id=item_id, content_index=0, audio_end_ms=0)
    assert start_response(session).request.messages[-1].text is None


def test_barge_in_walks_the_duplex_phases():
    session = Session(make_config())
    assert session.phase is Phase.LISTENING
    start = start_response(session)
    assert session.phase is Phase.THINKING
    session.response_output(start.request.response_id, AudioOut(SECOND))
    assert session.phase is Phase.SPEAKING
    # Speech appears in the input: the response is cancelled in the same call.
    effects = send(session, type="input_audio_buffer.append", audio=base64.b64encode(SECOND).decode())
    assert isinstance(effects[0], RunVad)
    effects = session.vad_result([0.9] * 10)
    names = [e["type"] for e in events_of(effects)]
    assert names[0] == "input_audio_buffer.speech_started" and names[-1] == "response.done"
    assert any(isinstance(e, StopResponse) for e in effects)
    assert session.phase is Phase.INTERRUPTED
    # Output of the cancelled response that still arrives is dropped.
    assert session.response_output(start.request.response_id, AudioOut(SECOND)) == []
    effects = session.vad_result([0.0] * 20)
    assert "input_audio_buffer.speech_stopped" in [e["type"] for e in events_of(effects)]
    assert session.phase is Phase.THINKING  # the new turn's response started


def test_backend_failure_fails_the_response_and_names_the_backend():
    session = Session(make_config(vad__enabled=False))
    start = start_response(session)
    events = events_of(session.response_finished(start.request.response_id, BackendError("llm", "HTTP 503")))
    done = next(e for e in events if e["type"] == "response.done")["response"]
    assert done["status"] == "failed"
    assert done["status_details"]["error"]["code"] == "llm_backend_error"
    error = events[0]["error"]
    assert error["code"] == "llm_backend_error" and "llm" in error["message"] and "HTTP 503" in error["message"]
    assert session.phase is Phase.LISTENING
    assert isinstance(start_response(session), StartResponse)  # the next turn works


def test_server_playout_plays_clears_and_truncates_at_the_heard_point():
    session = Session(make_config(), server_playout=True)
    start = start_response(session)
    rid = start.request.response_id
    effects = session.response_output(rid, SpeechText("Hello there. "))
    effects = session.response_output(rid, AudioOut(SECOND))
    assert [type(e) for e in effects if not isinstance(e, SendEvent)] == [type(effects[0]), Play]
    assert not [e for e in events_of(effects) if e["type"].endswith("audio.delta")]
    session.response_output(rid, SpeechText("How are you today?"))
    session.response_output(rid, AudioOut(SECOND))
    session.response_finished(rid)
    # The reply is still playing when the user cuts in.
    send(session, type="input_audio_buffer.append", audio=base64.b64encode(SECOND).decode())
    effects = session.vad_result([0.9] * 10)
    assert any(isinstance(e, ClearPlayout) for e in effects)
    events = events_of(session.playout_cleared(start.request.item_id, 1500))
    assert [e["type"] for e in events] == ["output_audio_buffer.cleared", "conversation.item.truncated"]
    assert events[0]["response_id"] == rid and events[1]["audio_end_ms"] == 1500


def test_barge_in_after_all_audio_was_heard_still_truncates_the_transcript():
    """Over WebRTC the listener may have heard every sample made so far while the transcript already holds
    text whose speech was never made: the item is truncated at the heard point either way."""
    session = Session(make_config(), server_playout=True)
    start = start_response(session)
    rid = start.request.response_id
    session.response_output(rid, SpeechText("Hello there. "))
    session.response_output(rid, AudioOut(SECOND))
    session.response_output(rid, SpeechText("How are you today?"))  # its audio never came
    send(session, type="input_audio_buffer.append", audio=base64.b64encode(SECOND).decode())
    session.vad_result([0.9] * 10)
    events = events_of(session.playout_cleared(start.request.item_id, 1000))
    assert [e["type"] for e in events] == ["output_audio_buffer.cleared", "conversation.item.truncated"]
    assert events[1]["audio_end_ms"] == 1000
    assert start_response(session).request.messages[-1].text == "Hello there."


def test_manual_commit_with_vad_on_commits_the_buffer():
    """A client may commit by hand with server VAD on: it gets the audio it appended (up to
    [session] idle_buffer_seconds), not just the prefix padding VAD turns keep."""
    session = Session(make_config(session__idle_buffer_seconds=4.0))
    for _ in range(5):
        send(session, type="input_audio_buffer.append", audio=base64.b64encode(SECOND).decode())
        session.vad_result([0.0] * 31)
    effects = send(session, type="input_audio_buffer.commit")
    item_id = next(e for e in events_of(effects) if e["type"] == "input_audio_buffer.committed")["item_id"]
    retrieved = events_of(send(session, type="conversation.item.retrieve", item_id=item_id))[0]
    audio = base64.b64decode(retrieved["item"]["content"][0]["audio"])
    assert len(audio) == 4 * len(SECOND)


def test_g711_in_and_out_lose_nothing_and_send_no_empty_deltas():
    session = Session(make_config(vad__enabled=False))
    send(session, type="session.update", session={"type": "realtime", "audio": {
        "input": {"format": {"type": "audio/pcmu"}}, "output": {"format": {"type": "audio/pcmu"}}}})
    ulaw_second = bytes([0xFF]) * 8000  # mu-law silence, 8 kHz
    for _ in range(3):
        send(session, type="input_audio_buffer.append", audio=base64.b64encode(ulaw_second).decode())
    effects = send(session, type="input_audio_buffer.commit")
    # The decoder's held-back tail is part of the commit: all 3 s arrive, and go through VAD.
    assert any(isinstance(e, RunVad) for e in effects)
    item_id = next(e for e in events_of(effects) if e["type"] == "input_audio_buffer.committed")["item_id"]
    item = events_of(send(session, type="conversation.item.retrieve", item_id=item_id))[0]["item"]
    assert base64.b64decode(item["content"][0]["audio"]) == ulaw_second * 3  # in the session's own format

    start = start_response(session)
    deltas = []
    for _ in range(50):  # 10 ms chunks: the resampler holds some back entirely
        deltas += [e for e in events_of(session.response_output(start.request.response_id, AudioOut(bytes(480))))
                   if e["type"] == "response.output_audio.delta"]
    deltas += [e for e in events_of(session.response_finished(start.request.response_id))
               if e["type"] == "response.output_audio.delta"]
    sizes = [len(base64.b64decode(e["delta"])) for e in deltas]
    assert all(sizes) and sum(sizes) == 50 * 80  # 8 kHz mu-law: 80 bytes per 10 ms


def test_settings_a_client_sends_come_back_in_session_updated():
    session = Session(make_config())
    sent = {
        "type": "realtime",
        "tools": [{"type": "function", "name": "lookup", "description": "Look a word up.",
                   "parameters": {"type": "object", "properties": {"word": {"type": "string"}}}}],
        "tool_choice": {"type": "function", "name": "lookup"},
        "tracing": {"workflow_name": "support"},
        "truncation": {"type": "retention_ratio", "retention_ratio": 0.5},
        "prompt": {"id": "pmpt_1"},
        "include": ["item.input_audio_transcription.logprobs"],
        "audio": {"input": {"turn_detection": {"type": "semantic_vad", "eagerness": "high"}}},
    }
    got = events_of(send(session, type="session.update", session=sent))[0]["session"]
    for key in ("tools", "tool_choice", "tracing", "truncation", "prompt", "include"):
        assert got[key] == sent[key]
    assert got["audio"]["input"]["turn_detection"] == {
        "type": "semantic_vad", "eagerness": "high", "create_response": True, "interrupt_response": True}
    error = events_of(send(session, type="session.update", session={"type": "realtime", "tool_choice": "sometimes"}))
    assert error[0]["type"] == "error" and error[0]["error"]["param"] == "session.tool_choice"


def test_turn_detection_switched_back_on_starts_from_the_configured_defaults():
    session = Session(make_config(vad__silence_duration_ms=800, vad__threshold=0.7))
    off = {"type": "realtime", "audio": {"input": {"turn_detection": None}}}
    on = {"type": "realtime", "audio": {"input": {"turn_detection": {"type": "server_vad"}}}}
    send(session, type="session.update", session=off)
    td = events_of(send(session, type="session.update", session=on))[0]["session"]["audio"]["input"]["turn_detection"]
    assert td["silence_duration_ms"] == 800 and td["threshold"] == 0.7


def test_voices_the_engine_lacks_are_refused():
    session = Session(make_config(vad__enabled=False))
    session.voices = frozenset({"alloy", "vivian"})
    error = events_of(send(session, type="session.update", session={
        "type": "realtime", "audio": {"output": {"voice": "nosuchvoice"}}}))[0]
    assert error["type"] == "error" and "alloy, vivian" in error["error"]["message"]
    assert session.settings.voice == "alloy"
    error = events_of(send(session, type="response.create", response={"audio": {"output": {"voice": "nope"}}}))[0]
    assert error["error"]["param"] == "response.audio.output.voice"
    assert isinstance(start_response(session), StartResponse)


def test_a_response_may_set_its_own_format_and_context():
    session = Session(make_config(vad__enabled=False, llm__temperature=0.3))
    send(session, type="conversation.item.create",
         item={"id": "item_a", "type": "message", "role": "user", "content": [{"type": "input_text", "text": "A"}]})
    send(session, type="conversation.item.create",
         item={"id": "item_b", "type": "message", "role": "user", "content": [{"type": "input_text", "text": "B"}]})
    effects = send(session, type="response.create", response={
        "conversation": "none",
        "audio": {"output": {"format": {"type": "audio/pcma"}}},
        "input": [{"type": "item_reference", "id": "item_a"},
                  {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Out of band"}]}],
    })
    request = next(e for e in effects if isinstance(e, StartResponse)).request
    assert [m.text for m in request.messages] == ["A", "Out of band"]
    assert request.temperature is None  # the backend's configured temperature, unless a beta client sets one
    created = next(e for e in events_of(effects) if e["type"] == "response.created")["response"]
    assert created["audio"]["output"]["format"] == {"type": "audio/pcma"}
    delta = next(e for e in events_of(session.response_output(request.response_id, AudioOut(SECOND)))
                 if e["type"] == "response.output_audio.delta")
    assert len(base64.b64decode(delta["delta"])) < 8000  # 8 kHz A-law, not 24 kHz pcm16
    # An out-of-band response is cancelled by its id (without one, response.cancel means the conversation's).
    assert events_of(send(session, type="response.cancel"))[0]["error"]["code"] == "response_cancel_not_active"
    done = events_of(send(session, type="response.cancel", response_id=request.response_id))
    assert done[-1]["type"] == "response.done" and done[-1]["response"]["status"] == "cancelled"
    error = events_of(send(session, type="response.create", response={"input": [{"type": "item_reference",
                                                                                "id": "item_zzz"}]}))
    assert error[0]["error"]["code"] == "item_not_found"


# --- driving the core as its runner would ---------------------------------------------------------------------


def checked(session: Session, effects: list[Effect]) -> list[dict[str, Any]]:
    """The events among ``effects``, each valid for the session's dialect by the openai SDK's own types."""
    events = events_of(effects)
    for event in events:
        if event["type"].startswith("transcription_session."):
            check_beta_transcription_session(event)
        else:
            (BETA_EVENTS if session.dialect is Dialect.BETA else GA_EVENTS).validate_python(event)
    return events


class Mic:
    """A client streaming audio in 32 ms appends, and the VAD's verdict on it: each whole 32 ms window of input
    gets the scripted speech probability, as the runner would feed Silero's."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.windows = 0

    def __call__(self, ms: int, p: float) -> list[Effect]:
        effects: list[Effect] = []
        for _ in range(ms // WINDOW_MS):
            effects += send(self.session, type="input_audio_buffer.append",
                            audio=base64.b64encode(bytes(48 * WINDOW_MS)).decode())
            due = int(self.session.input.received_ms // WINDOW_MS) - self.windows
            self.windows += due
            effects += self.session.vad_result([p] * due)
        return effects


def of_type(effects: list[Effect], kind: type) -> list[Any]:
    return [e for e in effects if isinstance(e, kind)]


TURN_GA = ["input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped", "input_audio_buffer.committed",
           "conversation.item.added", "conversation.item.done", "response.created", "rate_limits.updated"]
REPLY_GA = ["response.output_item.added", "conversation.item.added", "response.content_part.added",
            "response.output_audio_transcript.delta", "response.output_audio.delta"]
END_GA = ["response.output_audio.done", "response.output_audio_transcript.done", "response.content_part.done",
          "response.output_item.done", "conversation.item.done", "response.done"]
TURN_BETA = ["input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped", "input_audio_buffer.committed",
             "conversation.item.created", "response.created", "rate_limits.updated"]
REPLY_BETA = ["response.output_item.added", "conversation.item.created", "response.content_part.added",
              "response.audio_transcript.delta", "response.audio.delta"]
END_BETA = ["response.audio.done", "response.audio_transcript.done", "response.content_part.done",
            "response.output_item.done", "response.done"]


@pytest.mark.parametrize("dialect", [Dialect.GA, Dialect.BETA])
def test_a_server_vad_turn_is_committed_answered_and_done(dialect: Dialect):
    """Speech, then silence_duration_ms of silence: the turn is committed and its response starts in the same
    call; what the responder yields becomes deltas, and its end closes the item. The beta dialect names the
    same steps its own way."""
    session = Session(make_config(), dialect)
    mic = Mic(session)
    opened = checked(session, session.open())
    assert types(opened) == (["session.created"] if dialect is Dialect.GA
                             else ["session.created", "conversation.created"])
    assert checked(session, mic(512, 0.0)) == []
    speech = mic(1024, 0.9)
    started = checked(session, speech)
    # The onset is at 512 ms; the start includes the 300 ms prefix padding.
    assert types(started) == ["input_audio_buffer.speech_started"] and started[0]["audio_start_ms"] == 212
    assert of_type(speech, RunVad) and session.phase is Phase.LISTENING
    effects = mic(512, 0.0)
    events = checked(session, effects)
    assert types(started + events) == (TURN_GA if dialect is Dialect.GA else TURN_BETA)
    stopped, committed = events[0], events[1]
    assert stopped["audio_end_ms"] == 1536  # where the silence began
    assert started[0]["item_id"] == stopped["item_id"] == committed["item_id"]
    (start,) = of_type(effects, StartResponse)
    assert session.phase is Phase.THINKING
    user = start.request.messages[-1]
    assert (user.role, user.item_id, len(user.audio)) == ("user", committed["item_id"], (1536 - 212) * 48)

    rid = start.request.response_id
    reply = checked(session, session.response_output(rid, SpeechText("Hello there.")))
    reply += checked(session, session.response_output(rid, AudioOut(SECOND)))
    assert types(reply) == (REPLY_GA if dialect is Dialect.GA else REPLY_BETA)
    assert base64.b64decode(reply[-1]["delta"]) == SECOND and session.phase is Phase.SPEAKING
    end = checked(session, session.response_finished(rid))
    assert types(end) == (END_GA if dialect is Dialect.GA else END_BETA)
    done = end[-1]["response"]
    assert done["status"] == "completed" and done["output"][0]["status"] == "completed"
    part = done["output"][0]["content"][0]
    assert part["type"] == ("output_audio" if dialect is Dialect.GA else "audio")
    assert part["transcript"] == "Hello there."
    if dialect is Dialect.BETA:
        assert done["modalities"] == ["text", "audio"]
    assert session.phase is Phase.LISTENING


def test_barge_in_cancels_the_response_in_the_same_call():
    """Over WebSocket the client plays the reply: the server cancels it (turn_detected), stops its producer and
    leaves the truncation to the client."""
    session = Session(make_config(vad__enabled=False))
    send(session, type="session.update", session={"type": "realtime", "audio": {"input": {
        "turn_detection": {"type": "server_vad"}}}})
    mic = Mic(session)
    start = start_response(session)
    rid = start.request.response_id
    speak(session, start)
    effects = mic(512, 0.9)
    events = checked(session, effects)
    assert types(events) == ["input_audio_buffer.speech_started", *END_GA]
    done = events[-1]["response"]
    assert (done["id"], done["status"], done["status_details"]["reason"]) == (rid, "cancelled", "turn_detected")
    assert done["output"][0]["status"] == "incomplete"
    assert [e.response_id for e in of_type(effects, StopResponse)] == [rid]
    assert not of_type(effects, ClearPlayout)  # the client owns the playback
    assert session.conversation.get(start.request.item_id).audio == bytearray(2 * SECOND)  # not truncated here
    assert session.response_output(rid, AudioOut(SECOND)) == [] and session.response_finished(rid) == []


def test_response_cancel_ends_the_response_and_a_second_finds_none():
    session = Session(make_config(vad__enabled=False))
    start = start_response(session)
    rid = start.request.response_id
    session.response_output(rid, AudioOut(SECOND))
    effects = send(session, type="response.cancel", event_id="evt_cancel_1")
    events = checked(session, effects)
    assert "error" not in types(events) and events[-1]["type"] == "response.done"
    assert events[-1]["response"]["status"] == "cancelled"
    assert events[-1]["response"]["status_details"]["reason"] == "client_cancelled"
    assert [e.response_id for e in of_type(effects, StopResponse)] == [rid]
    assert session.response_output(rid, AudioOut(SECOND)) == []
    error = checked(session, send(session, type="response.cancel", event_id="evt_cancel_2"))[0]["error"]
    assert (error["code"], error["event_id"]) == ("response_cancel_not_active", "evt_cancel_2")


def test_with_interrupt_response_false_the_turn_is_answered_after_the_response():
    session = Session(make_config(vad__interrupt_response=False))
    mic = Mic(session)
    start = start_response(session)
    rid = start.request.response_id
    session.response_output(rid, AudioOut(SECOND))
    effects = mic(512, 0.9) + mic(544, 0.0)
    events = checked(session, effects)
    assert types(events) == TURN_GA[:5]  # committed, and nothing cancelled or started
    assert not of_type(effects, StopResponse) and not of_type(effects, StartResponse)
    assert session.responses.active is not None and session.responses.active.id == rid
    turn = events[2]["item_id"]
    effects = session.response_finished(rid)
    events = checked(session, effects)
    assert types(events)[-3:] == ["response.done", "response.created", "rate_limits.updated"]
    assert events[-3]["response"]["status"] == "completed"
    (answer,) = of_type(effects, StartResponse)
    assert answer.request.response_id != rid
    assert (answer.request.messages[-1].role, answer.request.messages[-1].item_id) == ("user", turn)


def test_the_idle_timeout_commits_the_silence_and_answers_it():
    session = Session(make_config())
    mic = Mic(session)
    updated = checked(session, send(session, type="session.update", session={"type": "realtime", "audio": {
        "input": {"turn_detection": {"type": "server_vad", "idle_timeout_ms": 5000}}}}))
    assert updated[0]["session"]["audio"]["input"]["turn_detection"]["idle_timeout_ms"] == 5000
    assert checked(session, mic(4960, 0.0)) == []
    effects = mic(64, 0.0)
    events = checked(session, effects)
    assert types(events)[:2] == ["input_audio_buffer.timeout_triggered", "input_audio_buffer.committed"]
    assert events[0]["audio_end_ms"] - events[0]["audio_start_ms"] >= 5000
    assert "response.created" in types(events) and of_type(effects, StartResponse)


def test_a_manual_commit_takes_the_buffer_and_an_empty_one_is_refused():
    session = Session(make_config(vad__enabled=False))
    send(session, type="input_audio_buffer.append", audio=base64.b64encode(bytes(48 * 90)).decode())
    error = checked(session, send(session, type="input_audio_buffer.commit"))[0]["error"]
    assert error["code"] == "input_audio_buffer_commit_empty" and "90.00ms" in error["message"]
    send(session, type="input_audio_buffer.append", audio=base64.b64encode(SECOND).decode())
    effects = send(session, type="input_audio_buffer.commit")
    events = checked(session, effects)
    assert types(events) == ["input_audio_buffer.committed", "conversation.item.added", "conversation.item.done"]
    assert not of_type(effects, StartResponse)  # a manual commit asks for no response
    assert len(session.conversation.get(events[0]["item_id"]).audio) == 48 * 90 + len(SECOND)
    assert session.input.buffered_ms == 0
    assert checked(session, send(session, type="input_audio_buffer.commit"))[0]["error"]["code"] == (
        "input_audio_buffer_commit_empty")


def semantic(eagerness: str) -> Session:
    session = Session(make_config())
    send(session, type="session.update", session={"type": "realtime", "audio": {"input": {
        "turn_detection": {"type": "semantic_vad", "eagerness": eagerness}}}})
    return session


def test_semantic_vad_asks_at_each_pause_and_an_incomplete_verdict_keeps_the_turn_open():
    session = semantic("low")  # ends at P(complete) >= 0.7
    mic = Mic(session)
    started = checked(session, mic(512, 0.0) + mic(1024, 0.9))
    assert types(started) == ["input_audio_buffer.speech_started"]
    effects = mic(256, 0.0)  # past [semantic_vad] pause_ms (200): the model is asked, nothing else
    (check,) = of_type(effects, RunSmartTurn)
    # The turn so far: from its start (padding included) to where it is asked, 7 windows into the pause.
    assert events_of(effects) == [] and len(check.pcm) == (1536 + 7 * WINDOW_MS - 212) * 48
    assert checked(session, session.smart_turn_result(check.seq, 0.4)) == []
    assert checked(session, mic(512, 0.9)) == []  # the user goes on: the same turn, no second start
    effects = mic(256, 0.0)
    (again,) = of_type(effects, RunSmartTurn)
    assert again.seq != check.seq and len(again.pcm) == (2304 + 7 * WINDOW_MS - 212) * 48
    assert session.smart_turn_result(check.seq, 0.99) == []  # a stale verdict does nothing
    effects = session.smart_turn_result(again.seq, 0.9)
    events = checked(session, effects)
    assert types(events) == TURN_GA[1:]
    assert events[0]["audio_end_ms"] == 2304 and events[0]["item_id"] == started[0]["item_id"]
    assert of_type(effects, StartResponse)


def test_semantic_vad_ends_a_turn_after_the_eagerness_longest_wait_whatever_the_model_said():
    session = semantic("high")  # waits at most [semantic_vad] high_max_wait_ms (2000) after an incomplete verdict
    mic = Mic(session)
    mic(512, 0.0)
    mic(1024, 0.9)
    (check,) = of_type(mic(256, 0.0), RunSmartTurn)
    assert session.smart_turn_result(check.seq, None) == []  # the model failed: the wait decides
    assert checked(session, mic(1664, 0.0)) == []
    events = checked(session, mic(128, 0.0))
    assert types(events) == TURN_GA[1:] and events[0]["audio_end_ms"] == 1536


@pytest.mark.parametrize("dialect", [Dialect.GA, Dialect.BETA])
def test_a_transcription_session_transcribes_turns_and_never_responds(dialect: Dialect):
    session = Session(make_config(), dialect, session_type="transcription")
    session.transcription.available = True  # the runner has a transcriber
    mic = Mic(session)
    created = checked(session, session.open())
    assert types(created) == (["session.created"] if dialect is Dialect.GA else ["transcription_session.created"])
    assert created[0]["session"]["object"] == "realtime.transcription_session"
    effects = mic(512, 0.0) + mic(1024, 0.9) + mic(544, 0.0)
    events = checked(session, effects)
    assert types(events) == ["input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped",
                             "input_audio_buffer.committed",
                             *(["conversation.item.added", "conversation.item.done"] if dialect is Dialect.GA
                               else ["conversation.item.created"])]
    assert not of_type(effects, StartResponse) and session.responses.active is None
    item_id = events[2]["item_id"]
    (transcribe,) = of_type(effects, Transcribe)
    assert transcribe.item_id == item_id and len(transcribe.pcm) == (1536 - 212) * 48
    delta = checked(session, session.input_transcript_delta(item_id, "Hello"))
    assert types(delta) == ["conversation.item.input_audio_transcription.delta"] and delta[0]["delta"] == "Hello"
    completed = checked(session, session.input_transcribed(item_id, "Hello there."))
    assert types(completed) == ["conversation.item.input_audio_transcription.completed"]
    assert completed[0]["transcript"] == "Hello there."
    error = checked(session, send(session, type="response.create"))[0]["error"]
    assert (error["code"], error["param"]) == ("unsupported_event", "type")


def test_a_transcription_session_without_stt_says_why_instead_of_silence():
    session = Session(make_config(vad__enabled=False), session_type="transcription")
    send(session, type="input_audio_buffer.append", audio=base64.b64encode(SECOND).decode())
    effects = send(session, type="input_audio_buffer.commit")
    failed = checked(session, effects)[-1]
    assert failed["type"] == "conversation.item.input_audio_transcription.failed"
    assert failed["error"]["code"] == "stt_unavailable" and not of_type(effects, Transcribe)


def state(session: Session) -> bytes:
    """Everything a client event may change, as one value."""
    return orjson.dumps({
        "settings": session_wire(session.settings, session.dialect),
        "items": [[i.data, base64.b64encode(bytes(i.audio)).decode()] for i in session.conversation.items()],
        "buffer": base64.b64encode(session.input.buffer.get(0, len(session.input.buffer))).decode(),
        "phase": session.phase.value,
        "responses": [r.id for r in session.responses.all_running()],
        "voice_locked": session.responses.voice_locked,
    })


REFUSED = [
    {"type": "input_audio_buffer.append", "audio": "@@not base64@@"},
    {"type": "input_audio_buffer.append", "audio": 42},
    {"type": "input_audio_buffer.explode"},
    {"type": "session.update", "session": {"type": "realtime", "audio": {"input": {
        "turn_detection": {"type": "server_vad", "threshold": 2}}}}},
    {"type": "session.update", "session": {"type": "realtime", "instructions": "new", "output_modalities": ["smell"]}},
    {"type": "session.update", "session": {"type": "realtime", "audio": {"output": {"voice": "ash"}}}},
    {"type": "session.update", "session": {"type": "transcription"}},
    {"type": "response.create"},
    {"type": "response.create", "response": {"conversation": "none", "output_modalities": ["smell"]}},
    {"type": "response.create", "response": {"conversation": "none", "input": [{"type": "item_reference",
                                                                              "id": "item_nope"}]}},
    {"type": "conversation.item.create", "item": {"type": "message", "role": "robot", "content": []}},
    {"type": "conversation.item.create", "item": {"id": "item_a", "type": "message", "role": "user",
                                                  "content": [{"type": "input_text", "text": "again"}]}},
    {"type": "conversation.item.create", "previous_item_id": "item_nope", "item": {
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}},
    {"type": "conversation.item.truncate", "item_id": "item_a", "content_index": 0, "audio_end_ms": 10},
    {"type": "conversation.item.delete", "item_id": "item_nope"},
    {"type": "response.cancel", "response_id": "resp_nope"},
    {"type": "output_audio_buffer.clear"},
]


@pytest.mark.parametrize("event", REFUSED, ids=lambda e: e["type"])
def test_a_refused_event_changes_nothing(event: dict[str, Any]):
    """Every handler checks its whole input before it changes anything: an error, and the session as it was."""
    session = Session(make_config(vad__enabled=False))
    send(session, type="conversation.item.create", item={"id": "item_a", "type": "message", "role": "user",
                                                         "content": [{"type": "input_text", "text": "A"}]})
    start = start_response(session)
    speak(session, start)  # a response running, its audio out: the voice is locked
    send(session, type="input_audio_buffer.append", audio=base64.b64encode(SECOND).decode())
    before = state(session)
    effects = send(session, **event, event_id="evt_bad")
    events = checked(session, effects)
    assert [e for e in effects if not isinstance(e, SendEvent)] == []
    assert types(events) == ["error"] and events[0]["error"]["event_id"] == "evt_bad"
    assert state(session) == before


def test_a_truncate_at_the_whole_ms_above_or_below_what_was_sent_is_taken_whole():
    """A client counts whole ms of the audio it got (the Agents SDK rounds up): 1428.04 ms of reply may be cut at
    1429 or at 1428, and either way every word was heard; 1430 is past it."""
    session = Session(make_config(vad__enabled=False))
    start = start_response(session)
    rid = start.request.response_id
    session.response_output(rid, SpeechText("What's on your mind?"))
    session.response_output(rid, AudioOut(bytes(68546)))  # 1428.04 ms
    session.response_finished(rid)
    item_id = start.request.item_id
    past = events_of(send(session, type="conversation.item.truncate", item_id=item_id, content_index=0,
                          audio_end_ms=1430))
    assert past[-1]["type"] == "error" and past[-1]["error"]["param"] == "audio_end_ms"
    for end_ms in (1429, 1428):
        events = events_of(send(session, type="conversation.item.truncate", item_id=item_id, content_index=0,
                                audio_end_ms=end_ms))
        assert events[-1]["type"] == "conversation.item.truncated"
    assert start_response(session).request.messages[-1].text == "What's on your mind?"


def test_the_sessions_speed_reaches_the_responder():
    session = Session(make_config(vad__enabled=False))
    send(session, type="session.update", session={"type": "realtime", "audio": {"output": {"speed": 1.25}}})
    assert start_response(session).request.speed == 1.25
