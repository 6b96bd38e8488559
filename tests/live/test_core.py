"""The GPT-Live core as a core: no sockets, threads, models or clocks. Client events and audio in, scripted VAD
probabilities and Smart Turn verdicts, responder outputs and backend events fed back; the events and effects out
are checked."""

from __future__ import annotations

import base64
from typing import Any

import orjson
import pytest

from gateway.core.effects import (
    Mark,
    PrepareTranscript,
    RunSmartTurn,
    RunVad,
    SendEvent,
    StartResponse,
    StopResponse,
    Transcribe,
)
from gateway.core.responder import AudioOut, SpeechText, ToolCallArguments, ToolCallStart
from gateway.core.vad import WINDOW_MS
from gateway.live.effects import EndSession, Reflect, Reply, RunDelegation
from gateway.live.session import LiveSession
from gateway.live.timeline import spread
from tests.conftest import make_config

FRAME = 4800  # 100 ms of pcm16 24 kHz


def events(effects: list[Any], kind: str | None = None) -> list[dict[str, Any]]:
    out = [e.event for e in effects if isinstance(e, SendEvent | Reply)]
    return [e for e in out if kind is None or e["type"] == kind]


def send(session: LiveSession, event: dict[str, Any]) -> list[Any]:
    return session.handle(orjson.dumps(event))


def started(**session: Any) -> LiveSession:
    live = LiveSession(make_config(), now_s=1_000_000.0)
    out = send(live, {"type": "session.start", "session": {"model": "gpt-live-1", **session}})
    assert events(out)[0]["type"] == "session.started", out
    return live


def audio(session: LiveSession, ms: int, pcm: bytes | None = None) -> list[Any]:
    """``ms`` of input (silence unless ``pcm``), then every tick it made due."""
    effects: list[Any] = []
    data = pcm if pcm is not None else bytes(48 * ms)
    for i in range(0, len(data), FRAME):
        effects += send(session, {"type": "session.input_audio.append",
                                  "audio": base64.b64encode(data[i:i + FRAME]).decode()})
    while session.ticks_due:
        effects += session.tick()
    return effects


def vad(session: LiveSession, probabilities: list[float]) -> list[Any]:
    return session.vad_result(probabilities)


def windows(ms: int) -> int:
    return ms // WINDOW_MS


def speak_turn(session: LiveSession) -> list[Any]:
    """A turn: 1 s of speech by the VAD, a pause Smart Turn calls finished."""
    out = vad(session, [0.9] * windows(1000) + [0.0] * windows(400))
    check = next(e for e in out if isinstance(e, RunSmartTurn))
    return out + session.smart_turn_result(check.seq, 0.99)


def test_start_resolves_the_session() -> None:
    live = LiveSession(make_config(), now_s=1_000_000.0)
    out = send(live, {"type": "session.start", "event_id": "s", "session": {"model": "openai/gpt-live-1.1"}})
    (ev,) = events(out)
    assert ev["client_event_id"] == "s"
    session = ev["session"]
    assert session["id"].startswith("live_") and session["expires_at"] == 1_000_000 + 3600
    assert session["audio"] == {"output": {"voice": "marin"}, "format": {"type": "audio/pcm", "rate": 24000}}
    assert session["delegation"] == {"type": "client"} and session["input"] == [] and session["status"] == "active"
    assert session["model"] == "openai/gpt-live-1.1"


@pytest.mark.parametrize(("fmt", "size"), [({"type": "audio/pcm", "rate": 24000}, 4800),
                                           ({"type": "audio/pcm", "rate": 16000}, 3200),
                                           ({"type": "audio/pcmu", "rate": 8000}, 800),
                                           ({"type": "audio/pcma", "rate": 8000}, 800)])
def test_one_output_delta_per_100_ms_of_input_in_the_session_format(fmt: dict[str, Any], size: int) -> None:
    live = started(audio={"format": fmt})
    frame = base64.b64encode(bytes(size)).decode()
    out: list[Any] = []
    for _ in range(25):  # 2.5 s of input in the session's own format
        out += send(live, {"type": "session.input_audio.append", "audio": frame})
    assert live.timeline_ms == 2500
    while live.ticks_due:
        out += live.tick()
    deltas = events(out, "session.output_audio.delta")
    assert len(deltas) == 25 and {len(base64.b64decode(d["delta"])) for d in deltas} == {size}
    assert all("event_id" not in d for d in deltas)
    reflected = [e.wire() for e in out if isinstance(e, Reflect) and e.event["type"] == "session.output_audio.delta"]
    assert [base64.b64decode(r["delta"]) for r in reflected] == [bytes(4800)] * 25
    assert [(r["start_ms"], r["end_ms"]) for r in reflected] == [(i * 100, i * 100 + 100) for i in range(25)]


def test_no_audio_no_clock() -> None:
    live = started()
    send(live, {"type": "session.thinking.append", "event_id": "t", "delegation_id": None, "content": "x"})
    assert live.ticks_due == 0 and live.tick() == []
    out = live.close("expired")
    assert [e["type"] for e in events(out)] == ["error", "session.closed"]
    assert events(out)[0]["error"]["code"] == "context_injection_incomplete"
    assert isinstance(out[-1], EndSession)


def test_a_turn_is_transcribed_while_its_pause_is_judged_and_a_turn_that_goes_on_drops_that() -> None:
    """The transcription starts 100 ms into a pause ([live] early_transcription_ms), before the Smart Turn
    check at 200 ms, on the audio the turn commits if it is over; a pause that ends in speech drops it."""
    live = started()
    audio(live, 3000, b"\x10\x00" * 72000)
    out = vad(live, [0.9] * windows(1000) + [0.0] * windows(64))
    assert not [e for e in out if isinstance(e, PrepareTranscript | RunSmartTurn)]
    out = vad(live, [0.0] * windows(64))  # 128 ms into the pause: transcribed, not yet judged
    (early,) = [e for e in out if isinstance(e, PrepareTranscript)]
    assert early.pcm and not [e for e in out if isinstance(e, RunSmartTurn)]
    out = vad(live, [0.9] * windows(320))  # the user goes on
    assert [e.pcm for e in out if isinstance(e, PrepareTranscript)] == [None]
    out = vad(live, [0.0] * windows(400))
    check = next(e for e in out if isinstance(e, RunSmartTurn))
    out += live.smart_turn_result(check.seq, 0.99)
    (early,) = [e for e in out if isinstance(e, PrepareTranscript)]
    (transcribe,) = [e for e in out if isinstance(e, Transcribe)]
    assert out.index(early) < out.index(transcribe) and early.pcm == transcribe.pcm and early.pcm
    # A pause the model calls unfinished, then more speech: the early transcript is dropped.
    out = vad(live, [0.9] * windows(1000) + [0.0] * windows(400))
    check = next(e for e in out if isinstance(e, RunSmartTurn))
    assert [e.pcm is not None for e in out if isinstance(e, PrepareTranscript)] == [True]
    out = live.smart_turn_result(check.seq, 0.01) + vad(live, [0.9] * windows(500))
    assert [e.pcm for e in out if isinstance(e, PrepareTranscript)] == [None]
    assert not [e for e in out if isinstance(e, Transcribe)]


def test_a_turn_is_transcribed_answered_and_spoken_on_the_timeline() -> None:
    live = started()
    audio(live, 1500)
    out = speak_turn(live)
    (transcribe,) = [e for e in out if isinstance(e, Transcribe)]
    (start,) = [e for e in out if isinstance(e, StartResponse)]
    assert out.index(transcribe) < out.index(start)  # the responder finds the turn's transcription
    request = start.request
    assert [t["function"]["name"] for t in request.tools] == ["delegate"]
    assert request.messages[-1].item_id == transcribe.item_id and request.messages[-1].audio
    heard = live.input_transcribed(transcribe.item_id, "Why is the sky blue?")
    assert "".join(e["delta"] for e in events(heard)) == "Why is the sky blue?"
    assert all(e["start_ms"] % 200 == 0 for e in events(heard))
    rid = request.response_id
    live.response_output(rid, SpeechText("It scatters light."))
    live.response_output(rid, AudioOut(b"\x01\x00" * 24000))  # 1 s of speech
    live.response_finished(rid)
    out = audio(live, 1500)
    deltas = events(out, "session.output_audio.delta")
    spoken = [d for d in deltas if any(base64.b64decode(d["delta"]))]
    assert len(spoken) == 10
    said = events(out, "session.output_transcript.delta")
    assert "".join(e["delta"] for e in said) == "It scatters light."
    assert said[0]["start_ms"] == 1400  # the grid span the speech (from 1500 ms) starts in
    assert all(e["end_ms"] - e["start_ms"] == 200 for e in said)
    # The next turn's transcript continues the stream after a space, not glued to "blue?".
    (again,) = [e for e in speak_turn(live) if isinstance(e, Transcribe)]
    heard = live.input_transcribed(again.item_id, "And at sunset?")
    assert "".join(e["delta"] for e in events(heard)) == " And at sunset?"
    assert any(isinstance(e, Mark) and e.name == "first_delta" for e in out)


def test_barge_in_stops_our_speech_at_the_next_tick_without_an_event() -> None:
    live = started()
    audio(live, 1500)
    request = next(e for e in speak_turn(live) if isinstance(e, StartResponse)).request
    live.response_output(request.response_id, SpeechText("A long answer that goes on."))
    live.response_output(request.response_id, AudioOut(b"\x01\x00" * 24000 * 3))
    out = audio(live, 300)
    assert all(any(base64.b64decode(d["delta"])) for d in events(out, "session.output_audio.delta"))
    out = vad(live, [0.9] * windows(200))  # the user speaks over it
    assert StopResponse(request.response_id) in out and not events(out)
    out = audio(live, 200)
    assert not any(any(base64.b64decode(d["delta"])) for d in events(out, "session.output_audio.delta"))
    assert live.response_output(request.response_id, AudioOut(b"\x01\x00" * 100)) == []  # dropped


def test_mute_feeds_the_model_silence_and_keeps_the_clock() -> None:
    live = started()
    ack = send(live, {"type": "session.input_audio.mute", "event_id": "m"})
    assert events(ack)[0] == {**events(ack)[0], "type": "session.input_audio.muted", "client_event_id": "m"}
    out = audio(live, 200, b"\x10\x00" * 4800)
    assert all(not any(e.pcm) for e in out if isinstance(e, RunVad))
    assert [e for e in out if isinstance(e, Reflect) and e.event["type"] == "session.input_audio.append"]
    assert live.timeline_ms == 200 and len(events(out, "session.output_audio.delta")) == 2


def test_appends_are_acknowledged_when_the_timeline_passes_them() -> None:
    live = started()
    out = send(live, {"type": "session.instructions.append", "event_id": "i", "delegation_id": None,
                      "content": "Say hello."})
    assert out == []
    out = audio(live, 700)
    assert not events(out, "session.instructions.appended")
    out = audio(live, 100)
    (ack,) = events(out, "session.instructions.appended")
    assert (ack["client_event_id"], ack["start_ms"], ack["end_ms"]) == ("i", 600, 800)
    assert any(isinstance(e, StartResponse) for e in out)  # the voice model acts on it


def test_client_delegation() -> None:
    live = started()
    audio(live, 1500)
    request = next(e for e in speak_turn(live) if isinstance(e, StartResponse)).request
    out = live.response_output(request.response_id, ToolCallStart(0, "call_1", "delegate"))
    (created,) = events(out, "session.delegation.created")
    assert created["delegation"].keys() == {"id", "type", "target"} and created["offset_ms"] == 1500
    delegation_id = created["delegation"]["id"]
    live.response_output(request.response_id, ToolCallArguments(0, '{"task": "check staging"}'))
    assert live.response_finished(request.response_id) == []  # client mode: nothing runs here
    out = send(live, {"type": "session.commentary.append", "event_id": "c", "delegation_id": delegation_id,
                      "content": "Staging is healthy."})
    assert not events(out)
    out = audio(live, 1000)
    assert events(out, "session.commentary.appended")[0]["client_event_id"] == "c"
    prompt = next(e for e in out if isinstance(e, StartResponse)).request.messages[-1].text
    assert "Staging is healthy." in prompt


def test_responses_delegation_batches_the_outputs() -> None:
    live = started(delegation={"type": "responses", "responses": {"model": "gpt-5.6-terra", "tools": [
        {"type": "function", "name": "get_weather"}]}})
    audio(live, 1500)
    live.input_transcribed("nobody", "ignored")
    request = next(e for e in speak_turn(live) if isinstance(e, StartResponse)).request
    created = events(live.response_output(request.response_id, ToolCallStart(0, "c", "delegate")))[0]
    assert created["delegation"]["target"] == "responses" and created["delegation"]["response_id"]
    live.response_output(request.response_id, ToolCallArguments(0, '{"task": "weather in Paris"}'))
    (run,) = [e for e in live.response_finished(request.response_id) if isinstance(e, RunDelegation)]
    assert run.request.model == "gpt-5.6-terra" and run.request.input[-1]["content"] == "Task: weather in Paris"
    snapshot = {"id": "resp_1", "input": [1], "output": [2], "tools": [3], "instructions": "secret"}
    wrapped = events(live.backend_event(run.run_id, {"type": "response.created", "response": snapshot}))[0]
    assert wrapped["delegation_id"] == created["delegation"]["id"]
    assert wrapped["event"]["response"] == {"id": "resp_1", "output": [], "tools": [], "instructions": None}
    call = {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{}",
            "status": "in_progress"}
    done = events(live.backend_event(run.run_id, {"type": "response.output_item.done", "item": call}))[0]
    assert done["event"]["item"]["status"] == "completed"
    live.backend_event(run.run_id, {"type": "response.completed", "response": {"id": "resp_1"}})
    assert live.backend_finished(run.run_id) == []
    error = events(send(live, {"type": "response.create", "event_id": "r"}))[0]["error"]
    assert error["code"] == "function_call_outputs_required" and "call_1" in error["message"]
    error = events(send(live, {"type": "session.thinking.append", "delegation_id": created["delegation"]["id"],
                               "content": "x"}))[0]["error"]
    assert error["param"] == "delegation_id"  # named delegations are the client's, never the backend's
    send(live, {"type": "response.item.create", "item": {"type": "function_call_output", "call_id": "call_1",
                                                          "output": "sunny"}})
    (continued,) = send(live, {"type": "response.create"})
    assert isinstance(continued, RunDelegation)
    assert [i.get("type") for i in continued.request.input[-2:]] == ["function_call", "function_call_output"]
    live.backend_event(continued.run_id, {"type": "response.output_text.delta", "delta": "It is sunny."})
    live.backend_finished(continued.run_id)
    out = audio(live, 200)
    assert "It is sunny." in next(e for e in out if isinstance(e, StartResponse)).request.messages[-1].text


def test_a_cut_off_voice_still_runs_its_delegation() -> None:
    """An interruption cancels no delegated work: the voice is cut off after calling delegate, its run starts."""
    live = started(delegation={"type": "responses", "responses": {"model": "m"}})
    audio(live, 1500)
    request = next(e for e in speak_turn(live) if isinstance(e, StartResponse)).request
    live.response_output(request.response_id, ToolCallStart(0, "c", "delegate"))
    live.response_output(request.response_id, ToolCallArguments(0, '{"task": "book it"}'))
    out = vad(live, [0.9] * windows(200))  # barge-in before the response ended
    (run,) = [e for e in out if isinstance(e, RunDelegation)]
    assert run.request.input[-1]["content"] == "Task: book it"


def test_an_empty_allow_list_allows_no_client_event() -> None:
    live = LiveSession(make_config(), webrtc=True)
    live.start({"model": "gpt-live-1", "client": {"data_channel": {"allowed_client_events": []}}})
    (error,) = events(send(live, {"type": "session.close", "event_id": "x"}))
    assert error["error"]["code"] == "event_not_allowed" and not live.closed
    assert events(live.handle(orjson.dumps({"type": "session.close"}), sideband=True))[-1]["type"] == "session.closed"


def test_spread_puts_words_on_the_grid() -> None:
    assert spread("Please check the staging status.", 2600, 4600) == [
        (2600, 2800, "Please"), (2800, 3000, " check"), (3200, 3400, " the"), (3600, 3800, " staging"),
        (4000, 4200, " status.")]
