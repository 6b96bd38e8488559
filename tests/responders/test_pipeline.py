"""PipelineResponder against the fake OpenAI server, reached over real HTTP by the openai package."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import io
import logging
import wave
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from bench.fake_openai import FakeOpenAI, tokenize
from bench.launcher import free_port
from engine.api import TTSError
from engine.voices import VoicePrompt
from gateway.config import ConfigError, VoiceConfig, load_config
from gateway.core.responder import (
    AudioOut,
    BackendError,
    Message,
    ResponseOutput,
    ResponseRequest,
    SpeechText,
    TextOut,
    TraceMark,
    transcript_of,
)
from gateway.responders import build
from gateway.responders.build import build_responder
from gateway.responders.echo import EchoResponder
from gateway.responders.pipeline import BridgeSettings, PipelineResponder
from gateway.responders.remote import LlmClient, SttClient
from gateway.responders.tone_tts import ToneEngine, ToneStream, tone_pcm
from tests.conftest import StartGateway, audio_of, connect

REPLY = "Sure, I can help with that. The weather today is sunny and warm, with a light breeze."
TRANSCRIPT = "What is the weather like?"
USER_AUDIO = tone_pcm("hello")  # 300 ms


class RecordingEngine(ToneEngine):
    """The tone engine, keeping every stream it opens and everything fed to them."""

    def __init__(self, incremental: bool = False, **kwargs: Any) -> None:
        super().__init__(first_audio_ms=0, **kwargs)
        self.incremental = incremental
        self.streams: list[ToneStream] = []
        self.fed: list[str] = []
        self.prompts: list[VoicePrompt | None] = []

    def open(self, voice: str, language: str | None = None, *, prompt: VoicePrompt | None = None,
             instructions: str | None = None) -> ToneStream:
        stream = super().open(voice, language)
        self.prompts.append(prompt)
        feed = stream.feed

        def recording_feed(text: str) -> None:
            self.fed.append(text)
            feed(text)

        stream.feed = recording_feed  # type: ignore[method-assign]
        self.streams.append(stream)
        return stream


@pytest.fixture
async def fake() -> AsyncIterator[FakeOpenAI]:
    async with FakeOpenAI(reply=REPLY, transcript=TRANSCRIPT) as server:
        yield server


class Transcribing(PipelineResponder):
    """The pipeline with the STT client the gateway's runner would transcribe its user audio with."""

    def __init__(self, stt: SttClient | None, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.stt = stt

    async def aclose(self) -> None:
        if self.stt is not None:
            await self.stt.aclose()
        await super().aclose()


Make = Callable[..., Transcribing]


@pytest.fixture
async def make() -> AsyncIterator[Make]:
    """Builds responders (STT and LLM clients on the given URLs) and closes their connection pools."""
    built: list[Transcribing] = []

    def build(
        base_url: str,
        engine: RecordingEngine | None = None,
        *,
        stt_url: str | None = None,
        timeout_s: float = 5.0,
        audio_in: bool = False,
        stt: bool = True,
    ) -> Transcribing:
        built.append(
            Transcribing(
                SttClient(stt_url or base_url, "whisper-test", language="en", timeout_s=timeout_s) if stt else None,
                LlmClient(base_url, "llm-test", temperature=0.5, max_output_tokens=256, timeout_s=timeout_s),
                engine or RecordingEngine(),
                BridgeSettings(starter_chars=10, max_segment_chars=80),
                audio_in=audio_in,
            )
        )
        return built[-1]

    yield build
    for r in built:
        await r.aclose()


def request(*messages: Message, modalities: list[str] | None = None, **kwargs: Any) -> ResponseRequest:
    return ResponseRequest(
        response_id="resp_1",
        item_id="item_out",
        instructions=kwargs.pop("instructions", "You are terse."),
        messages=list(messages),
        voice="alloy",
        modalities=modalities or ["audio"],
        **kwargs,
    )


def respond(responder: Transcribing, req: ResponseRequest,
            transcripts: dict[str, asyncio.Future[str]] | None = None) -> AsyncIterator[ResponseOutput]:
    """responder.respond as the session runner calls it: the transcription of each user audio item was
    started when the item was committed (gateway.runtime.session_runner). ``transcripts``: those started so far,
    and where the ones started here go."""
    transcripts = {} if transcripts is None else transcripts
    if responder.stt is not None and responder.reads_transcripts:
        for m in req.messages:
            if m.role == "user" and m.audio and not m.text and m.item_id not in transcripts:
                transcripts[m.item_id] = asyncio.ensure_future(transcript_of(responder.stt, m.audio))
    return responder.respond(req, transcripts)


def user_audio(item_id: str = "item_user") -> Message:
    return Message(item_id, "user", audio=USER_AUDIO)


async def collect(stream: AsyncIterator[ResponseOutput]) -> list[ResponseOutput]:
    return [out async for out in stream]


def pipeline_tasks() -> list[asyncio.Task[Any]]:
    return [t for t in asyncio.all_tasks() if t.get_coro().__qualname__.startswith("PipelineResponder.")]


def marks(outs: list[ResponseOutput]) -> list[str]:
    return [o.name for o in outs if isinstance(o, TraceMark)]


async def test_full_turn(make: Make, fake: FakeOpenAI):
    engine = RecordingEngine()
    transcripts: dict[str, asyncio.Future[str]] = {}
    outs = await collect(respond(make(fake.base_url, engine), request(user_audio()), transcripts))

    assert transcripts["item_user"].result() == TRANSCRIPT
    assert marks(outs) == ["stt_done", "llm_first_token", "llm_first_segment", "tts_first_audio"]
    speech = [o.text for o in outs if isinstance(o, SpeechText)]
    # the transcript keeps the reply's spaces; the engine gets each segment stripped
    assert speech == [
        "Sure,",
        " I can help with that.",
        " The weather today is sunny and warm,",
        " with a light breeze.",
    ]
    assert "".join(speech) == REPLY
    assert engine.fed == [s.strip() for s in speech]
    audio = b"".join(o.pcm for o in outs if isinstance(o, AudioOut))
    assert audio == b"".join(tone_pcm(s) for s in engine.fed)
    # each segment's text comes right before its audio
    kinds = [type(o).__name__ for o in outs if isinstance(o, SpeechText | AudioOut)]
    assert kinds[0] == "SpeechText" and kinds.count("SpeechText") == 4

    (stt,) = fake.stt_requests
    assert stt.body["model"] == "whisper-test" and stt.body["language"] == "en"
    assert stt.body["file"]["rate"] == 24000 and stt.body["file"]["channels"] == 1
    assert stt.body["file"]["pcm"] == USER_AUDIO
    (chat,) = fake.chat_requests
    assert chat.body["model"] == "llm-test" and chat.body["stream"] is True
    assert chat.body["max_completion_tokens"] == 256 and chat.body["temperature"] == 0.5
    assert chat.messages == [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": TRANSCRIPT},
    ]
    assert chat.finished and not chat.closed_by_client
    assert engine.streams[0].cancelled is False
    assert pipeline_tasks() == []


async def test_llm_sees_instructions_and_history(make: Make, fake: FakeOpenAI):
    history = [
        Message("i1", "system", text="The user is in Paris."),  # created by the client
        Message("i2", "user", text="Hi there."),  # a text item created by the client
        Message("i3", "assistant", text="Hello! How"),  # cut off by barge-in: only what was heard
        Message("i4", "user", text="Can you hear me?", audio=USER_AUDIO),  # transcribed on its turn
        Message("i5", "assistant", text=""),  # interrupted before anything was heard
        Message("i6", "user", audio=USER_AUDIO),  # this turn
    ]
    req = request(*history, instructions="Be brief.", max_output_tokens=40, temperature=0.2)
    transcripts: dict[str, asyncio.Future[str]] = {}
    await collect(respond(make(fake.base_url), req, transcripts))
    assert transcripts["i6"].result() == TRANSCRIPT
    assert len(fake.stt_requests) == 1  # only the new turn is transcribed
    (chat,) = fake.chat_requests
    assert chat.messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "system", "content": "The user is in Paris."},
        {"role": "user", "content": "Hi there."},
        {"role": "assistant", "content": "Hello! How"},
        {"role": "user", "content": "Can you hear me?"},
        {"role": "user", "content": TRANSCRIPT},
    ]
    assert chat.body["max_completion_tokens"] == 40  # min(session 40, config 256)
    assert chat.body["temperature"] == 0.2
    assert history[5].text is None  # the request is not modified; the session stores the transcript


async def test_text_item_turn_needs_no_stt(make: Make, fake: FakeOpenAI):
    outs = await collect(respond(make(fake.base_url), request(Message("i1", "user", text="Hi."))))
    assert fake.stt_requests == []
    assert marks(outs) == ["llm_first_token", "llm_first_segment", "tts_first_audio"]
    assert fake.chat_requests[0].messages[-1] == {"role": "user", "content": "Hi."}


async def test_cancel_while_llm_streams_closes_the_http_stream_and_tts(make: Make, fake: FakeOpenAI):
    fake.tokens_per_s = 20  # the whole reply would take about 0.9 s
    engine = RecordingEngine()
    stream = respond(make(fake.base_url, engine), request(user_audio()))
    async for out in stream:
        if isinstance(out, AudioOut):
            break
    chat = fake.chat_requests[0]
    assert not chat.finished  # speech started while the LLM was still streaming
    await stream.aclose()
    await asyncio.wait_for(chat.done.wait(), 5)
    assert chat.closed_by_client and not chat.finished
    assert chat.tokens_sent < len(tokenize(REPLY))
    assert engine.streams[0].cancelled
    assert pipeline_tasks() == []


async def test_task_cancel_before_first_token_closes_the_http_stream(make: Make, fake: FakeOpenAI):
    fake.ttft_ms = 60_000
    engine = RecordingEngine()
    got: list[ResponseOutput] = []

    async def consume() -> None:
        async for out in respond(make(fake.base_url, engine), request(user_audio())):
            got.append(out)

    task = asyncio.create_task(consume())
    while not fake.chat_requests:
        await asyncio.sleep(0.005)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    chat = fake.chat_requests[0]
    await asyncio.wait_for(chat.done.wait(), 5)
    assert chat.closed_by_client and chat.tokens_sent == 0
    assert engine.streams[0].cancelled
    assert marks(got) == ["stt_done"]
    assert pipeline_tasks() == []


async def test_cancel_during_stt_leaves_the_transcription_running(make: Make, fake: FakeOpenAI):
    """A response cut short while its turn is being transcribed stops waiting; the item still gets its
    transcript (and the conversation keeps the turn), so the transcription goes on."""
    fake.stt_ms = 300
    transcripts: dict[str, asyncio.Future[str]] = {}
    task = asyncio.create_task(collect(respond(make(fake.base_url), request(user_audio()), transcripts)))
    while not fake.stt_requests:
        await asyncio.sleep(0.005)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await asyncio.wait_for(transcripts["item_user"], 5) == TRANSCRIPT
    assert not fake.stt_requests[0].closed_by_client
    assert fake.chat_requests == []


async def test_an_earlier_turn_still_transcribing_joins_the_prompt(make: Make, fake: FakeOpenAI):
    """The user spoke again while the first turn was being transcribed (barge-in): the next response
    waits for both transcripts and the LLM sees both turns."""
    fake.stt_ms = 200
    req = request(user_audio("i1"), user_audio("i2"))
    await collect(respond(make(fake.base_url), req))
    assert len(fake.stt_requests) == 2
    assert [m for m in fake.chat_requests[0].messages if m["role"] == "user"] == [
        {"role": "user", "content": TRANSCRIPT}, {"role": "user", "content": TRANSCRIPT}]


async def test_cancel_while_tts_plays(make: Make, fake: FakeOpenAI):
    engine = RecordingEngine(realtime=True)  # the speech takes seconds to come out
    stream = respond(make(fake.base_url, engine), request(user_audio()))
    n = 0
    async for out in stream:
        if isinstance(out, AudioOut):
            n += 1
            if n == 3:
                break
    chat = fake.chat_requests[0]
    await asyncio.wait_for(chat.done.wait(), 5)
    assert chat.finished  # the LLM was done; the speech was still playing
    await stream.aclose()
    assert engine.streams[0].cancelled
    assert pipeline_tasks() == []


@pytest.mark.parametrize(
    ("failure", "fail_after", "cause"),
    [
        ("refused", 0, "connection refused by 127.0.0.1:"),
        ("500", 0, "HTTP 500: The server had an error"),
        ("hang", 0, "timed out after 0.3 s"),
        ("hang", 3, "stream broken: timed out after 0.3 s"),
        ("break", 0, "failed: Server disconnected"),
        ("break", 3, "stream broken: connection to 127.0.0.1:"),
        ("garbage", 2, "stream broken: ValueError: not a chat.completion.chunk: ['not', 'a', 'chunk']"),
    ],
)
async def test_llm_failures(make: Make, fake: FakeOpenAI, failure: str, fail_after: int, cause: str):
    engine = RecordingEngine()
    if failure == "refused":
        base_url = f"http://127.0.0.1:{free_port()}/v1"
    else:
        base_url = fake.base_url
        fake.llm_failure, fake.fail_after_tokens = failure, fail_after
    transcripts: dict[str, asyncio.Future[str]] = {}
    stream = respond(make(base_url, engine, stt_url=fake.base_url, timeout_s=0.3), request(user_audio()), transcripts)
    got: list[ResponseOutput] = []
    with pytest.raises(BackendError) as info:
        async for out in stream:
            got.append(out)
    assert info.value.backend == "llm"
    assert cause in info.value.cause
    assert str(info.value).startswith("llm backend failed: ")
    assert transcripts["item_user"].result() == TRANSCRIPT
    assert engine.streams[0].cancelled
    assert pipeline_tasks() == []


@pytest.mark.parametrize(
    ("failure", "cause"),
    [
        ("refused", "connection refused by 127.0.0.1:"),
        ("500", "HTTP 500: The server had an error"),
        ("hang", "timed out after 0.3 s"),
        ("break", "failed: Server disconnected"),
    ],
)
async def test_stt_failures(make: Make, fake: FakeOpenAI, failure: str, cause: str):
    if failure == "refused":
        stt_url = f"http://127.0.0.1:{free_port()}/v1"
    else:
        stt_url = fake.base_url
        fake.stt_failure = failure
    stream = respond(make(fake.base_url, stt_url=stt_url, timeout_s=0.3), request(user_audio()))
    got: list[ResponseOutput] = []
    with pytest.raises(BackendError) as info:
        async for out in stream:
            got.append(out)
    assert info.value.backend == "stt" and cause in info.value.cause
    assert got == []
    assert fake.chat_requests == []


async def test_a_failed_earlier_turn_is_left_out(make: Make, fake: FakeOpenAI):
    responder = make(fake.base_url)
    req = request(user_audio("i1"), Message("i2", "assistant", text="Pardon?"), user_audio("i3"))
    failed: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    failed.set_exception(BackendError("stt", "HTTP 500"))
    await collect(respond(responder, req, {"i1": failed}))
    assert [m["role"] for m in fake.chat_requests[0].messages] == ["system", "assistant", "user"]


async def test_no_stt_backend(make: Make, fake: FakeOpenAI):
    got: list[ResponseOutput] = []
    with pytest.raises(BackendError) as info:
        async for out in respond(make(fake.base_url, stt=False), request(user_audio())):
            got.append(out)
    assert info.value.backend == "stt" and "not transcribed: no STT" in info.value.cause
    assert got == []


async def test_tts_failure(make: Make, fake: FakeOpenAI):
    class BrokenEngine(RecordingEngine):
        def open(self, voice: str, language: str | None = None, **kw: Any) -> ToneStream:
            stream = super().open(voice, language, **kw)

            def feed(text: str) -> None:
                raise TTSError("text too long")

            stream.feed = feed  # type: ignore[method-assign]
            return stream

    engine = BrokenEngine()
    with pytest.raises(BackendError) as info:
        await collect(respond(make(fake.base_url, engine), request(user_audio())))
    assert info.value.backend == "tts" and "text too long" in info.value.cause
    assert engine.streams[0].cancelled
    await asyncio.wait_for(fake.chat_requests[0].done.wait(), 5)
    assert pipeline_tasks() == []


async def test_empty_transcript_ends_the_response(make: Make, fake: FakeOpenAI):
    fake.transcript = ""
    outs = await collect(respond(make(fake.base_url), request(user_audio())))
    assert outs == [TraceMark("stt_done")]
    assert fake.chat_requests == []


@pytest.mark.parametrize("reply", ["", "  🙂 "])
async def test_a_reply_with_nothing_to_say_aloud_completes_without_audio(make: Make, fake: FakeOpenAI, reply: str):
    """Nothing reaches the engine, which refuses an utterance without words; an emoji is still the reply's
    transcript (its item holds it, and the next prompt has the assistant's turn)."""
    fake.reply = reply
    engine = RecordingEngine()
    outs = await collect(respond(make(fake.base_url, engine), request(Message("i1", "user", text="Hi."))))
    assert not any(isinstance(o, AudioOut) for o in outs)
    assert [o.text for o in outs if isinstance(o, SpeechText)] == ([reply.strip()] if reply.strip() else [])
    assert engine.fed == [] and engine.streams[0].cancelled
    assert fake.chat_requests[0].finished


async def test_text_modality(make: Make, fake: FakeOpenAI):
    engine = RecordingEngine()
    outs = await collect(respond(make(fake.base_url, engine), request(user_audio(), modalities=["text"])))
    text = [o.text for o in outs if isinstance(o, TextOut)]
    assert text == tokenize(REPLY)
    assert not any(isinstance(o, AudioOut | SpeechText) for o in outs)
    assert marks(outs) == ["stt_done", "llm_first_token"]
    assert engine.streams == []


async def test_text_modality_close_closes_the_http_stream(make: Make, fake: FakeOpenAI):
    fake.tokens_per_s = 20
    stream = respond(make(fake.base_url), request(user_audio(), modalities=["text"]))
    async for out in stream:
        if isinstance(out, TextOut):
            break
    await stream.aclose()
    chat = fake.chat_requests[0]
    await asyncio.wait_for(chat.done.wait(), 5)
    assert chat.closed_by_client


async def test_audio_in_mode_sends_input_audio(make: Make, fake: FakeOpenAI):
    history = [Message("i1", "user", text="Hi."), Message("i2", "assistant", text="Hello!"), user_audio()]
    outs = await collect(respond(make(fake.base_url, audio_in=True, stt=False), request(*history)))
    assert fake.stt_requests == []
    assert marks(outs) == ["llm_first_token", "llm_first_segment", "tts_first_audio"]
    (chat,) = fake.chat_requests
    assert chat.messages[:3] == [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Hi."},
        {"role": "assistant", "content": "Hello!"},
    ]
    (part,) = chat.messages[3]["content"]
    assert chat.messages[3]["role"] == "user" and part["type"] == "input_audio"
    assert part["input_audio"]["format"] == "wav"
    with wave.open(io.BytesIO(base64.b64decode(part["input_audio"]["data"]))) as w:
        assert (w.getframerate(), w.getnchannels(), w.getsampwidth()) == (24000, 1, 2)
        assert w.readframes(w.getnframes()) == USER_AUDIO
    assert any(isinstance(o, AudioOut) for o in outs)


async def test_incremental_engine_gets_raw_deltas(make: Make, fake: FakeOpenAI):
    engine = RecordingEngine(incremental=True)
    await collect(respond(make(fake.base_url, engine), request(Message("i1", "user", text="Hi."))))
    assert engine.fed == tokenize(REPLY)


def test_build_responder(monkeypatch: pytest.MonkeyPatch):
    config = load_config(env={})
    config.tts.engine = "tone"
    config.llm.base_url = "http://127.0.0.1:1/v1"
    built = build_responder(config)
    assert isinstance(built, PipelineResponder) and isinstance(built.llm, LlmClient)
    assert isinstance(built.tts_engine, ToneEngine) and built.reads_transcripts
    assert built.bridge == BridgeSettings(config.tts.starter_chars, config.tts.max_segment_chars)

    config.stt.audio_in = True
    assert not build_responder(config).reads_transcripts

    config.responder.kind = "echo"
    assert isinstance(build_responder(config), EchoResponder)
    config.voices.named = {"calm": VoiceConfig(description="Calm.")}
    with pytest.raises(ConfigError, match="echo responder"):
        build_responder(config)
    config.voices.named = {}

    # What the options cannot do together is gateway.config.check's (tests/test_config.py), before any build.
    config.responder.kind = "pipeline"
    config.tts.engine = "piper"
    monkeypatch.setattr(build, "installed", lambda modules: False)
    with pytest.raises(ConfigError, match=r'tts.engine = "piper" needs the local models'):
        build_responder(config)


def test_voices_config(tmp_path: Any) -> None:
    """[voices.NAME] tables: a clone (reference, read from the config file's folder; transcript) or a design;
    beside the store's options of [voices] itself."""
    path = tmp_path / "config.toml"
    path.write_text('[voices]\nmax_voices = 5\n[voices.Narrator]\nreference = "ref.wav"\ntranscript = "Hello."\n'
                    '[voices.calm]\ndescription = "A calm, low voice."\n')
    config = load_config(path, env={})
    voices = config.voices.named
    assert config.voices.max_voices == 5
    assert voices == {"narrator": VoiceConfig(reference=str(tmp_path / "ref.wav"), transcript="Hello."),
                      "calm": VoiceConfig(description="A calm, low voice.")}
    for body, problem in [('[voices.x]\nreference = "a.wav"\ndescription = "b"\n', "either reference"),
                          ("[voices.x]\n", "either reference"),
                          ('[voices.x]\ndescription = "b"\ntranscript = "c"\n', "voices.x.transcript"),
                          ('[voices.x]\ndescription = "b"\n[voices.X]\ndescription = "c"\n', "differ in more than"),
                          ('[voices]\nx = "b"\n', "unknown option voices.x"),
                          ('[voices]\nnamed = "b"\n', "unknown option voices.named"),
                          ('[voices.x]\nvoice = "b"\n', "unknown option voices.x.voice")]:
        path.write_text(body)
        with pytest.raises(ConfigError, match=problem):
            load_config(path, env={})


async def test_prepared_voices(make: Make, fake: FakeOpenAI, tmp_path: Any) -> None:
    """A designed voice is a name sessions may use, and reaches the engine with each of its streams; a clone
    needs an engine that prepares voices; a voice may not take a name the engine has."""
    engine = RecordingEngine()
    engine.voices = frozenset({"alloy"})
    responder = make(fake.base_url, engine)
    responder.voice_configs = {"calm": VoiceConfig(description="A calm, low voice.")}
    await responder.prepare()
    assert responder.voices == {"alloy", "calm"}
    for voice in ("calm", "alloy"):
        await collect(respond(responder, dataclasses.replace(request(Message("i1", "user", text="Hi.")), voice=voice)))
    assert [p and (p.mode, p.text) for p in engine.prompts] == [("design", "A calm, low voice."), None]
    responder.voice_configs = {"alloy": VoiceConfig(description="Another.")}
    with pytest.raises(ConfigError, match=r"\[voices.alloy\]: the TTS engine has a voice of that name"):
        await responder.prepare()
    responder.voice_configs = {"mine": VoiceConfig(reference=str(tmp_path / "absent.wav"))}
    with pytest.raises(ConfigError, match=r"\[voices.mine\]: cloning a voice needs the qwen3 TTS engine"):
        await responder.prepare()


async def commit_by_hand(client: Any) -> None:
    """Turn detection off, then the user's audio appended and committed."""
    await client.send(
        {"type": "session.update", "session": {"type": "realtime", "audio": {"input": {"turn_detection": None}}}}
    )
    await client.until("session.updated")
    await client.append(USER_AUDIO)
    await client.send({"type": "input_audio_buffer.commit"})


async def test_through_the_gateway(make: Make, fake: FakeOpenAI, start_gateway: StartGateway):
    """A manual-commit turn over the Realtime protocol: transcript, spoken reply, then a cancelled turn."""
    gateway = await start_gateway(make(fake.base_url), stt__base_url=fake.base_url)
    async with connect(gateway) as client:
        await commit_by_hand(client)
        await client.send({"type": "response.create"})
        events = await client.until("response.done")
        transcribed = next(
            e for e in client.received if e["type"] == "conversation.item.input_audio_transcription.completed"
        )
        assert transcribed["transcript"] == TRANSCRIPT
        spoken = [e["delta"] for e in events if e["type"] == "response.output_audio_transcript.delta"]
        assert "".join(spoken) == REPLY
        assert events[-1]["response"]["status"] == "completed"
        assert audio_of(events)

        fake.tokens_per_s = 20
        await client.send({"type": "response.create"})
        await client.until("response.output_audio.delta")
        await client.send({"type": "response.cancel"})
        assert (await client.until("response.done"))[-1]["response"]["status"] == "cancelled"
        chat = fake.chat_requests[-1]
        await asyncio.wait_for(chat.done.wait(), 5)
        assert chat.closed_by_client
        assert chat.messages[-2:] == [
            {"role": "user", "content": TRANSCRIPT},
            {"role": "assistant", "content": REPLY},
        ]

        fake.llm_failure = "500"
        await client.send({"type": "response.create"})
        done = (await client.until("response.done"))[-1]["response"]
        assert done["status"] == "failed"
        assert done["status_details"]["error"]["code"] == "llm_backend_error"


async def test_committed_turns_are_transcribed_without_a_response(make: Make, fake: FakeOpenAI,
                                                                 start_gateway: StartGateway):
    """Transcription follows the commit, not the response: a client that creates responses itself (or
    never) gets each item's transcript, and a failed one is reported on the item and fails the response."""
    gateway = await start_gateway(make(fake.base_url), stt__base_url=fake.base_url)
    async with connect(gateway) as client:
        await commit_by_hand(client)
        done = (await client.until("conversation.item.input_audio_transcription.completed"))[-1]
        assert done["transcript"] == TRANSCRIPT and fake.chat_requests == []

        fake.stt_failure = "500"
        await client.append(USER_AUDIO)
        await client.send({"type": "input_audio_buffer.commit"})
        failed = (await client.until("conversation.item.input_audio_transcription.failed"))[-1]
        assert "HTTP 500" in failed["error"]["message"]
        await client.send({"type": "response.create"})
        response = (await client.until("response.done"))[-1]["response"]
        assert response["status"] == "failed"
        assert response["status_details"]["error"]["code"] == "stt_backend_error"
        assert fake.chat_requests == []


async def test_backend_check(fake: FakeOpenAI):
    """Each backend is asked for its models: any HTTP answer means it is up; the cause names no address."""
    port = free_port()
    for client in (LlmClient(f"http://127.0.0.1:{port}/v1", "llm-test"), SttClient(f"http://127.0.0.1:{port}/v1", "w")):
        assert await client.check() == "connection refused"
        assert client.where == f"http://127.0.0.1:{port}/v1/"
        await client.aclose()
    no_model_list = fake.base_url.removesuffix("/v1") + "/stt-only"  # answers 404
    for url in (fake.base_url, no_model_list):
        stt = SttClient(url, "whisper-test")
        assert await stt.check() is None
        await stt.aclose()


async def test_gateway_warns_of_a_backend_down_at_start(
    make: Make, fake: FakeOpenAI, start_gateway: StartGateway, caplog: pytest.LogCaptureFixture
):
    caplog.set_level(logging.WARNING, logger="gateway.runtime.health")
    port = free_port()
    await start_gateway(make(f"http://127.0.0.1:{port}/v1"), stt__base_url=fake.base_url)
    for _ in range(100):
        if caplog.records:
            break
        await asyncio.sleep(0.05)
    assert [r.getMessage() for r in caplog.records] == [
        f"llm backend at http://127.0.0.1:{port}/v1/ is not reachable: connection refused; "
        "turns will fail until it answers"
    ]


@pytest.mark.parametrize("speed", [0.5, 1.5])
async def test_the_sessions_speed_stretches_the_voice(make: Make, fake: FakeOpenAI, speed: float):
    """audio.output.speed reaches the voice: the same reply lasts 1/speed as long (FFmpeg's atempo), its words
    the same."""
    fake.reply = "Hello there. This is a reply of a few words."

    async def spoken(at: float) -> tuple[int, str]:
        outs = await collect(respond(make(fake.base_url, RecordingEngine()),
                                     request(Message("i1", "user", text="Hi."), speed=at)))
        audio = sum(len(o.pcm) for o in outs if isinstance(o, AudioOut))
        return audio, "".join(o.text for o in outs if isinstance(o, SpeechText))

    (normal, words), (stretched, same) = await spoken(1.0), await spoken(speed)
    assert same == words and stretched == pytest.approx(normal / speed, rel=0.02)
