"""Responses that run beside the conversation's, and turns that end while one runs, as OpenAI documents them.

Out-of-band responses (``conversation: "none"``) may run while the conversation has its own, and user
speech (``interrupt_response``) cancels only the conversation's. With ``interrupt_response: false`` the
running response is left alone and a turn that ends meanwhile is answered after it. A beta session
reports OpenAI's default temperature (0.8) until the client sets one.
"""

from __future__ import annotations

import base64

import orjson

from gateway.core.responder import AudioOut, SpeechText
from gateway.realtime.effects import SendEvent, StartResponse, StopResponse
from gateway.realtime.events import Dialect
from gateway.realtime.session import Session
from gateway.responders.echo import EchoResponder
from tests.conftest import StartGateway, connect, load_pcm, make_config, silence, types

SECOND = bytes(48_000)  # one second of pcm16 24 kHz
OUT_OF_BAND = {"conversation": "none", "output_modalities": ["text"], "metadata": {"purpose": "summary"}}


def send(target: Session, **event) -> list:
    return target.handle(orjson.dumps(event))


def events_of(effects: list) -> list[dict]:
    return [e.event for e in effects if isinstance(e, SendEvent)]


def started(effects: list) -> StartResponse:
    return next(e for e in effects if isinstance(e, StartResponse))


def speech(target: Session, probability: float, windows: int) -> list:
    """``windows`` VAD windows (32 ms) of input, heard with ``probability`` of speech."""
    send(target, type="input_audio_buffer.append", audio=base64.b64encode(bytes(1536 * windows)).decode())
    return target.vad_result([probability] * windows)


def test_an_out_of_band_response_runs_beside_the_conversations_and_each_ends_on_its_own():
    session = Session(make_config(vad__enabled=False))
    conversation = started(send(session, type="response.create")).request
    side = started(send(session, type="response.create", response=OUT_OF_BAND)).request
    assert {conversation.response_id, side.response_id} == {r.id for r in session.responses.all_running()}
    # Another response in the conversation is still refused (the code Pipecat tolerates).
    error = events_of(send(session, type="response.create"))[0]["error"]
    assert error["code"] == "conversation_already_has_active_response"

    # Each one's output goes to its own items; the out-of-band one joins no conversation.
    side_events = events_of(session.response_output(side.response_id, SpeechText("A summary.")))
    assert {e.get("response_id") for e in side_events if "response_id" in e} == {side.response_id}
    session.response_output(conversation.response_id, AudioOut(SECOND))
    done = events_of(session.response_finished(side.response_id))[-1]["response"]
    assert done["status"] == "completed" and done["conversation_id"] is None
    assert done["metadata"] == {"purpose": "summary"} and done["output"][0]["content"][0]["text"] == "A summary."
    assert session.responses.active is not None and session.responses.active.id == conversation.response_id
    assert side.messages == conversation.messages  # it saw the conversation, and added nothing to it
    done = events_of(session.response_finished(conversation.response_id))[-1]["response"]
    assert done["status"] == "completed" and done["conversation_id"] == session.conversation.id
    assert [m.role for m in started(send(session, type="response.create")).request.messages] == ["assistant"]


def test_out_of_band_responses_are_bounded_per_session():
    session = Session(make_config(vad__enabled=False, session__max_out_of_band_responses=2))
    for _ in range(2):
        started(send(session, type="response.create", response=OUT_OF_BAND))
    error = events_of(send(session, type="response.create", response=OUT_OF_BAND))[0]["error"]
    assert (error["code"], error["param"]) == ("too_many_active_responses", "response.conversation")
    assert len(session.responses.out_of_band) == 2
    started(send(session, type="response.create"))  # the conversation's own is not among them


def test_user_speech_cancels_the_conversations_response_but_not_an_out_of_band_one():
    session = Session(make_config())
    conversation = started(send(session, type="response.create")).request
    side = started(send(session, type="response.create", response=OUT_OF_BAND)).request
    effects = speech(session, 0.9, 10)
    assert [e.response_id for e in effects if isinstance(e, StopResponse)] == [conversation.response_id]
    done = [e["response"] for e in events_of(effects) if e["type"] == "response.done"]
    assert [(d["id"], d["status"], d["status_details"]["reason"]) for d in done] == [
        (conversation.response_id, "cancelled", "turn_detected")]
    # The out-of-band response goes on and finishes in its own time.
    assert events_of(session.response_output(side.response_id, SpeechText("Still here.")))
    assert events_of(session.response_finished(side.response_id))[-1]["response"]["status"] == "completed"
    # response.cancel without an id means the conversation's response; with one, any running response.
    other = started(send(session, type="response.create", response=OUT_OF_BAND)).request
    cancelled = events_of(send(session, type="response.cancel", response_id=other.response_id))[-1]
    assert cancelled["response"]["id"] == other.response_id and cancelled["response"]["status"] == "cancelled"


def test_without_interrupt_response_a_turn_that_ends_during_a_response_is_answered_after_it():
    session = Session(make_config(vad__interrupt_response=False))
    first = started(send(session, type="response.create")).request
    session.response_output(first.response_id, SpeechText("A long answer."))
    session.response_output(first.response_id, AudioOut(SECOND))
    # The user speaks while it runs: their turn is detected and committed, the response is left alone.
    effects = speech(session, 0.9, 10) + speech(session, 0.0, 20)
    names = types(events_of(effects))
    assert "input_audio_buffer.speech_started" in names and "input_audio_buffer.committed" in names
    assert "response.done" not in names and not any(isinstance(e, StopResponse | StartResponse) for e in effects)
    assert events_of(session.response_output(first.response_id, AudioOut(SECOND)))  # still speaking
    # Its end starts the answer to that turn, which sees the whole conversation.
    effects = session.response_finished(first.response_id)
    names = types(events_of(effects))
    assert names.index("response.done") < names.index("response.created")
    second = started(effects).request
    assert [m.role for m in second.messages] == ["assistant", "user"]
    assert events_of(session.response_finished(second.response_id))[-1]["response"]["status"] == "completed"
    assert not any(isinstance(e, StartResponse) for e in speech(session, 0.0, 20))  # one answer per turn


def test_a_beta_session_reports_openais_default_temperature_and_the_llm_keeps_its_own():
    session = Session(make_config(vad__enabled=False, llm__temperature=0.3), Dialect.BETA)
    created = events_of(session.open())[0]["session"]
    assert created["temperature"] == 0.8
    assert started(send(session, type="response.create")).request.temperature is None  # [llm] temperature
    session.response_finished(session.responses.active.id)
    updated = events_of(send(session, type="session.update", session={"temperature": 1.0}))[0]["session"]
    assert updated["temperature"] == 1.0
    assert started(send(session, type="response.create")).request.temperature == 1.0


async def test_out_of_band_beside_a_spoken_reply_through_the_sdk(start_gateway: StartGateway):
    """The same through a gateway and the openai SDK: an out-of-band spoken response created while the
    conversation's reply speaks runs to its end; the user's next turn cuts the reply, not it."""
    gateway = await start_gateway(EchoResponder(pace=1.0))
    async with connect(gateway) as client:
        await client.append(load_pcm("one_sentence.wav") + silence(700))
        reply = (await client.until("response.output_audio.delta", timeout=20))[-1]["response_id"]
        turn = next(e for e in client.received if e["type"] == "input_audio_buffer.committed")["item_id"]
        await client.send({"type": "response.create", "response": {
            "conversation": "none", "input": [{"type": "item_reference", "id": turn}]}})
        side = (await client.until("response.created"))[-1]["response"]
        assert side["id"] != reply and side["conversation_id"] is None
        await client.until("response.output_audio.delta", response_id=side["id"])
        await client.append(load_pcm("one_sentence.wav")[:48_000])  # the user speaks again: barge-in
        done: dict[str, dict] = {}
        while len(done) < 2:
            event = await client.recv(20)
            if event["type"] == "response.done":
                done[event["response"]["id"]] = event["response"]
        assert (done[reply]["status"], done[reply]["status_details"]["reason"]) == ("cancelled", "turn_detected")
        assert done[side["id"]]["status"] == "completed"
        assert "input_audio_buffer.speech_started" in types(client.received)
