"""The session as a pure state machine: events and probabilities in, events and effects out."""

from __future__ import annotations

import base64

import orjson

from gateway.responder import AudioOut, BackendError, SpeechText
from gateway.session import ClearPlayout, Phase, Play, RunVad, Session, StartResponse, StopResponse
from tests.conftest import make_config

SECOND = bytes(48_000)  # one second of pcm16 24 kHz


def send(session: Session, **event) -> list:
    return session.handle(orjson.dumps(event))


def events_of(effects: list) -> list[dict]:
    return [e for e in effects if isinstance(e, dict) and e]


def start_response(session: Session) -> StartResponse:
    effects = send(session, type="response.create")
    return next(e for e in effects if isinstance(e, StartResponse))


def speak(session: Session, start: StartResponse) -> str:
    """A reply of two sentences, one second of audio each; returns the assistant item id."""
    rid = start.request.response_id
    session.response_output(rid, SpeechText("Hello there. "))
    session.response_output(rid, AudioOut(SECOND))
    session.response_output(rid, SpeechText("How are you today?"))
    session.response_output(rid, AudioOut(SECOND))
    return start.request.item_id


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
    assert [type(e) for e in effects if not isinstance(e, dict)] == [type(effects[0]), Play]
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
