"""Input transcription end to end: transcription sessions (GA and beta) through the unmodified openai
SDK, transcripts streamed from an STT server that streams (or whole from one that does not), and the
reason a session hears when there is no STT at all."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator

import orjson
import pytest

from bench.fake_openai import FakeOpenAI, tokenize
from gateway.realtime.effects import PrepareTranscript, Transcribe
from gateway.realtime.events import Dialect
from gateway.realtime.session import Session
from gateway.responders.echo import EchoResponder
from gateway.responders.pipeline import PipelineResponder
from gateway.responders.remote import LlmClient
from gateway.responders.tone_tts import ToneEngine
from gateway.runtime.gateway import Gateway
from gateway.runtime.session_runner import SessionRunner
from gateway.runtime.silero import SileroModel, SileroVAD
from tests.conftest import StartGateway, connect, load_pcm, make_config, silence, types

TRANSCRIPT = "Turn on the lights in the kitchen, please."
SPEECH = load_pcm("one_sentence.wav")
DELTA = "conversation.item.input_audio_transcription.delta"
COMPLETED = "conversation.item.input_audio_transcription.completed"
FAILED = "conversation.item.input_audio_transcription.failed"


@pytest.fixture
async def fake() -> AsyncIterator[FakeOpenAI]:
    async with FakeOpenAI(transcript=TRANSCRIPT, stt_streams=True) as server:
        yield server


async def start(start_gateway: StartGateway, fake: FakeOpenAI, stream: bool) -> Gateway:
    """The pipeline on the fake server, whose STT is the gateway's transcriber."""
    return await start_gateway(PipelineResponder(LlmClient(fake.base_url, "llm-test"), ToneEngine()),
                               stt__base_url=fake.base_url, stt__model="whisper-test", stt__stream=stream)


def no_responses(events: list[dict]) -> bool:
    return not any(t.startswith("response.") for t in types(events))


@pytest.mark.parametrize("stream", [True, False], ids=["streaming-stt", "whole-stt"])
async def test_ga_transcription_session(fake: FakeOpenAI, start_gateway: StartGateway, stream: bool):
    gateway = await start(start_gateway, fake, stream)
    async with connect(gateway, transcription=True) as client:
        assert client.received[0]["session"]["type"] == "transcription"
        await client.send({"type": "session.update", "session": {"type": "transcription", "audio": {"input": {
            "transcription": {"model": "gpt-4o-transcribe", "language": "en"},
            "turn_detection": {"type": "server_vad", "silence_duration_ms": 400}}}}})
        session = (await client.until("session.updated"))[-1]["session"]
        assert (session["object"], session["audio"]["input"]["transcription"]["model"]) == (
            "realtime.transcription_session", "gpt-4o-transcribe")
        await client.append(SPEECH + silence(800))
        events = await client.until(COMPLETED)
        assert types(events)[:3] == ["input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped",
                                     "input_audio_buffer.committed"]
        item_id = events[2]["item_id"]
        deltas = [e["delta"] for e in events if e["type"] == DELTA and e["item_id"] == item_id]
        # A streaming server's words as they come; a whole answer as one delta.
        assert deltas == (tokenize(TRANSCRIPT) if stream else [TRANSCRIPT])
        assert "".join(deltas) == events[-1]["transcript"] == TRANSCRIPT
        assert events[-1]["usage"]["type"] == "duration" and events[-1]["usage"]["seconds"] > 2
        await client.send({"type": "conversation.item.retrieve", "item_id": item_id})
        item = (await client.until("conversation.item.retrieved"))[-1]["item"]
        assert item["content"][0]["transcript"] == TRANSCRIPT

        await client.send({"type": "response.create", "event_id": "r1"})
        error = (await client.until("error"))[-1]["error"]
        assert (error["code"], error["event_id"]) == ("unsupported_event", "r1")
        await client.quiet(0.3)
    assert no_responses(client.received) and fake.chat_requests == []
    (request,) = fake.stt_requests
    assert request.body.get("stream") == ("true" if stream else None) and request.body["language"] == "en"


async def test_beta_transcription_session(fake: FakeOpenAI, start_gateway: StartGateway):
    gateway = await start(start_gateway, fake, stream=True)
    async with connect(gateway, beta=True, transcription=True) as client:
        await client.send({"type": "transcription_session.update", "session": {
            "input_audio_transcription": {"model": "gpt-4o-transcribe", "prompt": "lights, kitchen"},
            "turn_detection": {"type": "server_vad", "silence_duration_ms": 400},
            "input_audio_noise_reduction": {"type": "near_field"}}})
        session = (await client.until("transcription_session.updated"))[-1]["session"]
        assert session["input_audio_transcription"]["prompt"] == "lights, kitchen"
        assert session["turn_detection"] == {"type": "server_vad", "threshold": 0.5, "prefix_padding_ms": 300,
                                             "silence_duration_ms": 400}
        await client.append(SPEECH + silence(800))
        events = await client.until(COMPLETED)
        assert "".join(e["delta"] for e in events if e["type"] == DELTA) == TRANSCRIPT
        await client.quiet(0.3)
    assert no_responses(client.received) and "conversation.created" not in types(client.received)
    assert fake.stt_requests[0].body["prompt"] == "lights, kitchen" and fake.chat_requests == []


async def test_without_stt_a_session_that_asks_hears_why(start_gateway: StartGateway):
    """The echo responder has no STT: a transcription session, and a realtime one that asks for
    transcription, get .failed naming the reason (no param: the JS Agents SDK rejects null there)."""
    gateway = await start_gateway()
    async with connect(gateway) as client:
        await client.send({"type": "session.update", "session": {"type": "transcription"}})
        assert (await client.until("session.updated"))[-1]["session"]["type"] == "transcription"
        await client.append(SPEECH + silence(800))
        failed = (await client.until(FAILED))[-1]
        assert failed["error"] == {
            "type": "transcription_error", "code": "stt_unavailable",
            "message": "No speech-to-text backend is available to transcribe input audio ([stt] base_url is empty, "
                       "and the local STT is off or not installed).",
        }
        await client.quiet(0.3)
        assert no_responses(client.received)

        await client.send({"type": "session.update", "session": {
            "type": "realtime", "audio": {"input": {"transcription": {"model": "whisper-1"}}}}})
        await client.until("session.updated")
        await client.append(SPEECH + silence(800))
        events = await client.until("response.done")
        if FAILED not in types(events):
            events += await client.until(FAILED)
        assert [e["error"]["code"] for e in events if e["type"] == FAILED] == ["stt_unavailable"]


async def test_a_stt_failure_mid_stream_fails_the_item(fake: FakeOpenAI, start_gateway: StartGateway):
    fake.stt_failure, fake.fail_after_tokens = "break", 3
    gateway = await start(start_gateway, fake, stream=True)
    async with connect(gateway, transcription=True) as client:
        await client.append(SPEECH + silence(800))
        events = await client.until(FAILED)
    assert [e["delta"] for e in events if e["type"] == DELTA] == tokenize(TRANSCRIPT)[:3]
    error = events[-1]["error"]
    assert error["code"] == "stt_backend_error" and "stream broken" in error["message"] and "param" not in error


@pytest.mark.parametrize("dialect", [Dialect.GA, Dialect.BETA])
def test_a_configuration_handed_over_before_session_created(dialect: Dialect):
    """A transport (WebRTC's offer, a REST client secret) applies its configuration as a client event
    before open(): the session is born a transcription session."""
    session = Session(make_config(), dialect)
    if dialect is Dialect.GA:
        event = {"type": "session.update", "session": {"type": "transcription", "audio": {"input": {
            "transcription": {"model": "gpt-4o-transcribe"}}}}}
    else:
        event = {"type": "transcription_session.update", "session": {
            "input_audio_transcription": {"model": "gpt-4o-transcribe"}}}
    assert "error" not in session.handle(orjson.dumps(event))[0].event
    (created,) = [e.event for e in session.open()]
    if dialect is Dialect.GA:
        assert created["type"] == "session.created" and created["session"]["type"] == "transcription"
        assert created["session"]["audio"]["input"]["transcription"]["model"] == "gpt-4o-transcribe"
    else:
        assert created["type"] == "transcription_session.created"
        assert created["session"]["input_audio_transcription"]["model"] == "gpt-4o-transcribe"
    assert not session.responds


# --- early transcription: a VAD turn transcribed in its closing pause ----------------------------------

WINDOW = 1536  # bytes of pcm16 24 kHz per 32 ms VAD window


def append(pcm: bytes) -> bytes:
    return orjson.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm).decode()})


def vad(session: Session, *probabilities: float) -> list:
    return session.vad_result(list(probabilities))


def pause_session(**config) -> Session:
    session = Session(make_config(**config))
    session.transcription.available = session.transcription.always = True  # as the pipeline sets them
    session.handle(append(SPEECH[: 120 * WINDOW]))
    return session


def test_early_transcription_takes_exactly_the_audio_the_turn_commits():
    session = pause_session()
    vad(session, *[0.9] * 20)
    assert not [e for e in vad(session, *[0.0] * 6) if isinstance(e, PrepareTranscript)]  # 192 ms < early_ms
    early = [e for e in vad(session, 0.0) if isinstance(e, PrepareTranscript)]
    assert len(early) == 1 and early[0].pcm
    effects = vad(session, *[0.0] * 9)  # 512 ms of silence: the turn ends
    commit = next(e for e in effects if isinstance(e, Transcribe))
    assert commit.pcm == early[0].pcm
    # After the commit, what is left of the early one is dropped (the runner took it at the Transcribe).
    assert effects.index(commit) < effects.index(PrepareTranscript(None))


def test_speech_after_the_pause_drops_the_early_transcription():
    session = pause_session()
    vad(session, *[0.9] * 20, *[0.0] * 8)
    assert PrepareTranscript(None) in vad(session, 0.9)
    vad(session, *[0.9] * 5)
    early = next(e for e in vad(session, *[0.0] * 8) if isinstance(e, PrepareTranscript))
    effects = vad(session, *[0.0] * 8)
    commit = next(e for e in effects if isinstance(e, Transcribe))
    assert commit.pcm == early.pcm and len(commit.pcm) == (20 + 8 + 6) * WINDOW  # both parts of the turn


def test_early_transcription_off():
    session = pause_session(stt__early_ms=0)
    effects = vad(session, *[0.9] * 20, *[0.0] * 16)
    assert not [e for e in effects if isinstance(e, PrepareTranscript) and e.pcm]
    assert [e for e in effects if isinstance(e, Transcribe)]


class RecordingTranscriber:
    def __init__(self, sent: list[dict]) -> None:
        self.sent = sent
        self.calls: list[int] = []  # how many events had been sent at each call

    async def transcribe(self, pcm: bytes, language: str | None = None, prompt: str | None = None):
        self.calls.append(len(self.sent))
        yield f"{len(pcm)} bytes"


@pytest.mark.parametrize("early_ms", [200, 0])
async def test_a_spoken_turn_is_transcribed_once_early_or_not(early_ms: int):
    """Silero on a spoken sentence: the turn is transcribed once; early, the call starts before the
    turn is committed, and the transcript is of the committed audio."""
    sent: list[dict] = []

    async def record(message: str) -> None:
        sent.append(orjson.loads(message))

    transcriber = RecordingTranscriber(sent)
    session = Session(make_config(stt__early_ms=early_ms))
    runner = SessionRunner(session, EchoResponder(pace=0), SileroVAD(SileroModel()), record,
                           transcriber=transcriber)
    await runner.start()
    await runner.receive(orjson.dumps({"type": "session.update", "session": {
        "type": "realtime", "audio": {"input": {"transcription": {"model": "whisper-1"}}}}}))
    for pcm in [SPEECH[i : i + 960] for i in range(0, len(SPEECH), 960)] + [silence(20)] * 50:
        await runner.receive(append(pcm))
        await asyncio.sleep(0)  # as between a client's messages
    for _ in range(200):
        if COMPLETED in types(sent):
            break
        await asyncio.sleep(0.01)
    await runner.close()
    committed = types(sent).index("input_audio_buffer.committed")
    assert len(transcriber.calls) == 1 and (transcriber.calls[0] < committed) == bool(early_ms)
    stopped = next(e for e in sent if e["type"] == "input_audio_buffer.speech_stopped")
    started = next(e for e in sent if e["type"] == "input_audio_buffer.speech_started")
    completed = next(e for e in sent if e["type"] == COMPLETED)
    assert completed["transcript"] == f"{(stopped['audio_end_ms'] - started['audio_start_ms']) * 48} bytes"
