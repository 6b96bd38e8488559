"""The session as a pure state machine: events and probabilities in, events and effects out."""

from __future__ import annotations

import asyncio
import base64
import time
from concurrent.futures import ThreadPoolExecutor

import orjson

from gateway.core.responder import AudioOut, BackendError, SpeechText
from gateway.realtime.effects import ClearPlayout, Play, RunVad, SendEvent, StartResponse, StopResponse
from gateway.realtime.session import Phase, Session
from gateway.responders.echo import EchoResponder
from gateway.runtime.session_runner import SessionRunner
from gateway.runtime.silero import SileroModel, SileroVAD, VadBatcher
from tests.conftest import load_pcm, make_config, silence

SECOND = bytes(48_000)  # one second of pcm16 24 kHz


def send(target: Session, **event) -> list:
    return target.handle(orjson.dumps(event))


def events_of(effects: list) -> list[dict]:
    return [e.event for e in effects if isinstance(e, SendEvent)]


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
    assert len(base64.b64decode(item["content"][0]["audio"])) == 3 * len(SECOND)

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


async def test_a_failed_response_sends_all_its_closing_events_over_a_slow_connection():
    """The response's own task sends its last events when its responder fails: stopping the response must
    not cancel that task while a send waits on a slow connection."""

    class Failing:
        reads_transcripts = False
        voices = None

        async def respond(self, request, transcripts):
            yield AudioOut(SECOND)
            raise BackendError("llm", "stream broken")

    sent: list[dict] = []

    async def slow_send(message: str) -> None:
        await asyncio.sleep(0.002)  # the socket's buffer is full: every send yields to the loop
        sent.append(orjson.loads(message))

    runner = SessionRunner(Session(make_config(vad__enabled=False)), Failing(), None, slow_send)
    await runner.start()
    await runner.receive(orjson.dumps({"type": "response.create"}))
    for _ in range(200):
        if sent and sent[-1]["type"] == "response.done":
            break
        await asyncio.sleep(0.01)
    assert sent[-1]["type"] == "response.done" and sent[-1]["response"]["status"] == "failed"
    await runner.close()


class SlowExecutor(ThreadPoolExecutor):
    """The VAD's thread, 150 ms late with every batch: a GPU box busy with TTS, or a small CPU."""

    def __init__(self) -> None:
        super().__init__(max_workers=1)
        self.calls = 0

    def submit(self, fn, /, *args, **kwargs):  # type: ignore[override]
        self.calls += 1

        def late():
            time.sleep(0.15)
            return fn(*args, **kwargs)

        return super().submit(late)


async def run_turn(executor: SlowExecutor | None, commit_early: bool = False) -> tuple[list[dict], float]:
    """The session runner fed a spoken sentence and silence as 20 ms appends, as fast as it takes them.

    Returns the events sent and the seconds the appends took."""
    sent: list[dict] = []

    async def record(message: str) -> None:
        sent.append(orjson.loads(message))

    session = Session(make_config())
    batcher = VadBatcher(executor) if executor else None
    runner = SessionRunner(session, EchoResponder(pace=0), SileroVAD(SileroModel()), record, batcher)
    await runner.start()
    audio = load_pcm("one_sentence.wav")
    start = time.perf_counter()
    for i in range(0, len(audio), 960):
        await runner.receive(append(audio[i : i + 960]))
    if commit_early:
        await runner.receive(orjson.dumps({"type": "input_audio_buffer.commit"}))
    for _ in range(75):  # 1.5 s
        await runner.receive(append(silence(20)))
    took = time.perf_counter() - start
    for _ in range(400):
        if any(e["type"] in ("input_audio_buffer.speech_stopped", "response.done") for e in sent[-3:]):
            break
        await asyncio.sleep(0.025)
    await asyncio.sleep(0.5)  # anything late would show up now
    await runner.close()
    if executor:
        executor.shutdown()
    return sent, took


def append(pcm: bytes) -> bytes:
    return orjson.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm).decode()})


def turn_times(sent: list[dict]) -> list[tuple[str, int]]:
    return [(e["type"], e.get("audio_start_ms", e.get("audio_end_ms"))) for e in sent
            if e["type"] in ("input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped")]


async def test_a_slow_vad_holds_up_no_append_and_finds_the_same_turn():
    """Appends are taken without waiting for the VAD; audio that arrives during a VAD call goes into the
    next one, so the session catches up, and its turn events carry the same input-audio times."""
    reference, _ = await run_turn(None)
    executor = SlowExecutor()
    sent, took = await run_turn(executor)
    assert turn_times(reference) == turn_times(sent) and len(turn_times(sent)) == 2
    # One call per append would take 115 x 150 ms; these took a handful of calls.
    assert took < 1.0 and executor.calls <= 10


async def test_a_commit_ahead_of_the_vad_takes_the_speech_with_it():
    """Speech the VAD had not reached when the client committed starts no second turn afterwards."""
    sent, _ = await run_turn(SlowExecutor(), commit_early=True)
    assert "input_audio_buffer.committed" in [e["type"] for e in sent]
    assert turn_times(sent) == []
