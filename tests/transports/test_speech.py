"""POST /v1/audio/speech through the unmodified openai SDK: every response format in both stream formats,
the audio decoded and checked against the engine's own, the extra body's sampling, hostile requests, a
burst over the engine's share, a client that leaves mid-stream, and the Qwen3-TTS engine in engine
processes and shared with a realtime session."""

from __future__ import annotations

import asyncio
import base64
import io
import time
from typing import Any, Literal

import aiohttp
import av
import numpy as np
import openai
import orjson
import pytest
from openai import AsyncOpenAI
from prometheus_client import REGISTRY
from pydantic import BaseModel, ConfigDict

from bench.fake_openai import FakeOpenAI
from engine.api import Sampling
from gateway.audio_codecs import RESPONSE_FORMATS
from gateway.responders.build import LOCAL_EXTRA, LOCAL_TTS, installed
from gateway.responders.pipeline import BridgeSettings, PipelineResponder
from gateway.responders.remote import LlmClient
from gateway.responders.text_bridge import TextBridge
from gateway.responders.tone_tts import ToneEngine, tone_pcm
from gateway.runtime.voices.library import BASE_CHECKPOINT, DESIGN_CHECKPOINT, SPEECH_TO_TEXT
from tests.conftest import Served, StartGateway, audio_of, connect
from tests.paths import DATA, TINY_CHECKPOINT

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TEXT = "Hello there. This is the speech endpoint, streaming as it goes."
# Samples a decoder yields beyond the audio: the encoder's priming (LAME's 1105-sample delay, AAC's 1024),
# which a stream written before its length is known cannot tell the decoder to skip (Ogg Opus and FLAC
# can), then at most one codec frame of padding (576 samples for MPEG-2 Layer III at 24 kHz, 1024 for AAC,
# none for the others).
PRIMING = {"mp3": 1105, "aac": 1024, "opus": 0, "flac": 0, "wav": 0}
FRAME = {"mp3": 576, "aac": 1024, "opus": 1, "flac": 1, "wav": 1}
QWEN3 = {"tts__engine": "qwen3", "engine__checkpoint": str(TINY_CHECKPOINT), "engine__device": "cpu",
         "engine__voices": {"alloy": "vivian"}, "engine__max_frames": 60}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Usage(_Strict):
    input_tokens: int
    output_tokens: int
    total_tokens: int


class AudioDelta(_Strict):
    """OpenAI's SpeechAudioDeltaEvent (the API reference; the SDKs have no type for the speech stream)."""

    type: Literal["speech.audio.delta"]
    audio: str


class AudioDone(_Strict):
    type: Literal["speech.audio.done"]
    usage: Usage


def sdk(gateway: Served) -> AsyncOpenAI:
    return AsyncOpenAI(api_key="test-key", base_url=f"http://127.0.0.1:{gateway.port}/v1", max_retries=0)


async def speak(client: AsyncOpenAI, fmt: str, stream_format: str = "audio", **fields: Any) -> bytes:
    """The response body as it streams (SSE: the audio its deltas carry, their events checked)."""
    options: dict[str, Any] = {"model": "tts-1", "voice": "alloy", "input": TEXT, **fields}
    async with client.audio.speech.with_streaming_response.create(
            response_format=fmt, stream_format=stream_format, **options) as response:
        assert response.headers["content-type"].startswith(
            "text/event-stream" if stream_format == "sse" else RESPONSE_FORMATS[fmt].content_type)
        if stream_format == "audio":
            return await response.read()
        events = [orjson.loads(line[6:]) async for line in response.iter_lines() if line.startswith("data: ")]
    *deltas, done = events
    for event in deltas:
        AudioDelta.model_validate(event)
    usage = AudioDone.model_validate(done).usage
    audio = b"".join(base64.b64decode(e["audio"]) for e in deltas)
    assert usage.input_tokens == len(options["input"])
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    return audio


def decode(data: bytes) -> np.ndarray:
    """Any format's bytes as int16 mono 24 kHz samples, through PyAV."""
    with av.open(io.BytesIO(data)) as container:
        resampler = av.AudioResampler(format="s16", layout="mono", rate=24000)
        frames = [f.to_ndarray()[0] for frame in container.decode(audio=0) for f in resampler.resample(frame)]
        frames += [f.to_ndarray()[0] for f in resampler.resample(None)]
    return np.concatenate(frames)


def tone_of(text: str) -> np.ndarray:
    """What the tone engine says for `text`, cut as the endpoint cuts it for an engine of whole segments."""
    bridge = TextBridge(24, 160)
    segments = [s.strip() for s in bridge.feed(text) + bridge.end() if s.strip()]
    return np.frombuffer(b"".join(tone_pcm(s) for s in segments), "<i2")


@pytest.mark.parametrize("stream_format", ["audio", "sse"])
@pytest.mark.parametrize("fmt", list(RESPONSE_FORMATS))
async def test_every_format_decodes_to_the_engines_audio(start_gateway: StartGateway, fmt: str,
                                                         stream_format: str) -> None:
    gateway = await start_gateway(tts__engine="tone")
    data = await speak(sdk(gateway), fmt, stream_format)
    want = tone_of(TEXT)
    if fmt == "pcm":
        assert np.array_equal(np.frombuffer(data, "<i2"), want)
        return
    got = decode(data)
    if fmt in ("wav", "flac"):  # lossless
        assert np.array_equal(got, want)
        return
    extra = len(got) - len(want) - PRIMING[fmt]
    assert 0 <= extra < FRAME[fmt], f"{len(got)} samples for {len(want)}"
    # The same sound, not only its length: the lossy codec's output correlates with the engine's.
    got = got[PRIMING[fmt]:PRIMING[fmt] + len(want)].astype(float)
    assert np.corrcoef(got, want.astype(float))[0, 1] > 0.9


async def test_speed_changes_the_duration_not_the_format(start_gateway: StartGateway) -> None:
    gateway = await start_gateway(tts__engine="tone")
    client = sdk(gateway)
    normal = len(decode(await speak(client, "wav")))
    for speed in (0.25, 2.0, 4.0):
        got = len(decode(await speak(client, "wav", speed=speed)))
        assert abs(got * speed / normal - 1) < 0.03, speed


async def test_pcm_and_wav_are_the_engines_own_samples_for_a_seed(start_gateway: StartGateway) -> None:
    """The Qwen3-TTS engine with a stream's seed and sampling from the extra body: the response's samples are
    exactly the engine's own for that seed, and another seed speaks differently."""
    gateway = await start_gateway(**{**QWEN3, "engine__max_frames": 20})  # 1.6 s of speech tells two seeds apart
    client = sdk(gateway)
    extra = {"seed": 7, "temperature": 0.8, "top_k": 20, "subtalker_top_p": 0.9, "language": "english"}
    pcm = await speak(client, "pcm", extra_body=extra)
    wav = decode(await speak(client, "wav", "sse", extra_body=extra))
    engine = await gateway.gateway.speech.engine()
    stream = engine.open("alloy", "english", sampling=Sampling(seed=7, temperature=0.8, top_k=20,
                                                               subtalker_top_p=0.9))
    stream.feed(TEXT)
    stream.end()
    own = b"".join([chunk.pcm async for chunk in stream])
    assert len(own) > 0 and pcm == own and np.array_equal(wav, np.frombuffer(own, "<i2"))
    assert await speak(client, "pcm", extra_body={**extra, "seed": 8}) != own


@pytest.mark.parametrize(("fields", "param"), [
    ({"input": ""}, "input"),
    ({"input": "   "}, "input"),
    ({"input": "x" * 4097}, "input"),
    ({"voice": "nobody"}, "voice"),
    ({"voice": {"id": "voice_0123456789abcdef01234567"}}, "voice.id"),
    ({"voice": {"id": "../../etc/passwd"}}, "voice.id"),
    ({"voice": {"name": "alloy"}}, "voice.name"),
    ({"voice": {"id": 5}}, "voice.id"),
    ({"voice": {}}, "voice.id"),
    ({"model": ""}, "model"),
    ({"response_format": ""}, "response_format"),
    ({"stream_format": ""}, "stream_format"),
    ({"speed": 4.5}, "speed"),
    ({"speed": 0.1}, "speed"),
    ({"speed": "fast"}, "speed"),
    ({"response_format": "ogg"}, "response_format"),
    ({"stream_format": "chunks"}, "stream_format"),
    ({"instructions": 5}, "instructions"),
    ({"extra_body": {"temperature": 0}}, "temperature"),
    ({"extra_body": {"top_p": 1.5}}, "top_p"),
    ({"extra_body": {"top_k": 2.5}}, "top_k"),
    ({"extra_body": {"seed": -1}}, "seed"),
    ({"extra_body": {"repetition_penalty": 3}}, "repetition_penalty"),
    ({"extra_body": {"subtalker_temperature": 9}}, "subtalker_temperature"),
    ({"extra_body": {"language": "klingon"}}, "language"),
    ({"extra_body": {"temprature": 0.5}}, "temprature"),
], ids=lambda v: str(v)[:40])
async def test_a_bad_request_is_a_400_naming_the_field(start_gateway: StartGateway, fields: dict[str, Any],
                                                       param: str) -> None:
    gateway = await start_gateway(**QWEN3)
    options = {"model": "tts-1", "voice": "alloy", "input": TEXT, **fields}
    with pytest.raises(openai.BadRequestError) as raised:
        await sdk(gateway).audio.speech.create(**options)
    assert raised.value.body["param"] == param, raised.value.body
    assert gateway.gateway.speech.running == 0


@pytest.mark.skipif(not installed(LOCAL_TTS), reason=LOCAL_EXTRA)
@pytest.mark.parametrize("stream_format", ["audio", "sse"])
async def test_an_input_with_nothing_to_say_is_a_400_not_an_empty_file(start_gateway: StartGateway,
                                                                         stream_format: str) -> None:
    gateway = await start_gateway(tts__engine="piper")
    for text in ("\U0001f600\U0001f389", "...!?", "\u200b\u200b"):
        with pytest.raises(openai.BadRequestError) as refused:
            await sdk(gateway).audio.speech.create(model="tts-1", voice="alloy", input=text, response_format="wav",
                                                   stream_format=stream_format)  # type: ignore[arg-type]
        assert refused.value.body["param"] == "input" and "no speech" in refused.value.body["message"]
    assert gateway.gateway.speech.running == 0
    spoken = await sdk(gateway).audio.speech.create(model="tts-1", voice="alloy", input="Hi \U0001f600",
                                                    response_format="wav")
    with av.open(io.BytesIO(spoken.content)) as container:
        assert sum(frame.samples for frame in container.decode(audio=0)) > 2400  # the words, the emoji aside


async def test_a_burst_over_the_engines_share_is_refused_with_retry_after(start_gateway: StartGateway) -> None:
    """100 requests at once, 4 may generate and 8 wait: the others get 503 with Retry-After at once, and
    every accepted one streams its whole audio. (One client here, so its connection budget is raised to
    let the whole burst reach the speech queue.)"""
    responder = PipelineResponder(LlmClient("http://127.0.0.1:9", "none", timeout_s=1),
                                  ToneEngine(first_audio_ms=0, realtime=True), BridgeSettings())
    gateway = await start_gateway(responder, speech__max_streams=4, speech__max_waiting=8,
                                  speech__wait_timeout_s=20.0, speech__retry_after_s=2,
                                  server__max_connections_per_client=200)
    body = {"model": "tts-1", "voice": "alloy", "input": "Hello world.", "response_format": "pcm"}
    url = f"http://127.0.0.1:{gateway.port}/v1/audio/speech"

    async def post(session: aiohttp.ClientSession) -> tuple[int, dict[str, str], bytes]:
        async with session.post(url, json=body) as answer:
            return answer.status, dict(answer.headers), await answer.read()

    connector = aiohttp.TCPConnector(limit=200)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=30)) as session:
        answers = await asyncio.gather(*(post(session) for _ in range(100)))
    refused = [a for a in answers if a[0] == 503]
    served = [a for a in answers if a[0] == 200]
    assert len(refused) + len(served) == 100
    assert len(served) >= 12 and len(refused) >= 50
    assert all(headers["Retry-After"] == "2" and orjson.loads(body)["error"]["code"] == "speech_capacity_reached"
               for _, headers, body in refused)
    assert all(body == tone_pcm("Hello world.") for _, _, body in served)
    assert gateway.gateway.speech.running == 0
    await responder.aclose()


async def test_a_client_that_leaves_frees_its_engine_stream(start_gateway: StartGateway) -> None:
    gateway = await start_gateway(**{**QWEN3, "engine__max_frames": 1500})
    engine = await gateway.gateway.speech.engine()
    rows = engine.free_streams
    long_text = "Streaming speech keeps going while the text lasts, one frame after another. " * 20
    before = engine.counters()["frames"]
    async with sdk(gateway).audio.speech.with_streaming_response.create(
            model="tts-1", voice="alloy", input=long_text, response_format="pcm", extra_body={"seed": 1}) as response:
        async for _ in response.iter_bytes():
            break
    started = time.monotonic()
    while engine.free_streams < rows and time.monotonic() - started < 5:
        await asyncio.sleep(0.01)
    assert engine.free_streams == rows and engine.counters()["streams"] == 0
    assert gateway.gateway.speech.running == 0
    frames = engine.counters()["frames"] - before
    await asyncio.sleep(0.3)
    assert engine.counters()["frames"] - before == frames < 500  # stopped, long before the text's end


async def test_a_client_that_leaves_before_its_first_audio_frees_its_place(start_gateway: StartGateway) -> None:
    """One place: a client that gives up while its request waits for it, and one that gives up while the
    engine has not spoken yet, each free what they held at once; the next request is served in full."""
    engine = ToneEngine(first_audio_ms=1500, realtime=True)
    responder = PipelineResponder(LlmClient("http://127.0.0.1:9", "none", timeout_s=1), engine, BridgeSettings())
    gateway = await start_gateway(responder, speech__max_streams=1, speech__wait_timeout_s=20.0)
    service = gateway.gateway.speech
    url = f"http://127.0.0.1:{gateway.port}/v1/audio/speech"
    body = {"model": "tts-1", "voice": "alloy", "input": "Hello world.", "response_format": "pcm"}

    async def give_up(after_s: float) -> None:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=after_s)) as session:
            with pytest.raises(TimeoutError):
                async with session.post(url, json=body) as answer:
                    await answer.read()

    await asyncio.gather(give_up(0.5), give_up(0.3))  # one holds the place, the other waits for it
    started = time.monotonic()
    while service.running and time.monotonic() - started < 1.0:
        await asyncio.sleep(0.01)
    assert service.running == 0
    engine.first_audio_ms = 0
    async with aiohttp.ClientSession() as session, session.post(url, json=body) as answer:
        assert answer.status == 200 and await answer.read() == tone_pcm("Hello world.")
    await responder.aclose()


async def test_the_engine_processes_serve_speech(start_gateway: StartGateway, monkeypatch: pytest.MonkeyPatch) -> None:
    """[engine] mode = "process": the speech request's stream runs in an engine process, its sampling
    carried over IPC, the same samples as the in-process engine's for the seed."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # as this process's (one_torch_thread): the same float sums
    gateway = await start_gateway(**{**QWEN3, "engine__mode": "process", "engine__devices": "cpu",
                                     "engine__heartbeat_ms": 250.0})
    extra = {"seed": 3, "top_p": 0.8}
    remote = await speak(sdk(gateway), "pcm", extra_body=extra)
    local = await start_gateway(**QWEN3)
    assert remote == await speak(sdk(local), "pcm", extra_body=extra) and len(remote) > 0


async def test_speech_and_a_realtime_session_share_the_engines_batches(start_gateway: StartGateway) -> None:
    """The speech endpoint speaks with the realtime responder's own Qwen3-TTS engine: a speech request and a
    session's reply, at the same time, run in the same engine steps."""
    from engine import checkpoint  # noqa: PLC0415 - the model stack (torch): only the engine's tests import it
    from engine.threaded import QwenTTSEngine  # noqa: PLC0415

    engine = QwenTTSEngine(checkpoint.load(str(TINY_CHECKPOINT), device="cpu"), max_frames=60, max_streams=4,
                           voices={"alloy": "vivian"})
    async with FakeOpenAI(reply="Sure. Here is a reply that takes a while to say, sentence after sentence.") as fake:
        responder = PipelineResponder(LlmClient(fake.base_url, "fake-llm", timeout_s=5), engine, BridgeSettings())
        gateway = await start_gateway(responder)
        assert await gateway.gateway.speech.engine() is engine
        batches = REGISTRY.get_sample_value("tts_engine_batch_size_count") or 0.0
        singles = REGISTRY.get_sample_value("tts_engine_batch_size_bucket", {"le": "1.0"}) or 0.0
        async with connect(gateway) as client:
            await client.send({"type": "conversation.item.create", "item": {
                "type": "message", "role": "user", "content": [{"type": "input_text", "text": "Talk to me."}]}})
            await client.send({"type": "response.create"})
            speech, events = await asyncio.gather(speak(sdk(gateway), "pcm", extra_body={"seed": 2}),
                                                  client.until("response.done", timeout=60))
        assert len(speech) > 0 and len(audio_of(events)) > 0
        steps = (REGISTRY.get_sample_value("tts_engine_batch_size_count") or 0.0) - batches
        shared = steps - ((REGISTRY.get_sample_value("tts_engine_batch_size_bucket", {"le": "1.0"}) or 0.0) - singles)
        assert shared > 0, "no engine step held both streams"
        await responder.aclose()
    engine.close()


async def test_speech_needs_an_api_key_not_a_client_secret(start_gateway: StartGateway,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GATEWAY_API_KEYS", "sk-speech-key-0123456789")
    gateway = await start_gateway(tts__engine="tone")
    keyed = AsyncOpenAI(api_key="sk-speech-key-0123456789", base_url=f"http://127.0.0.1:{gateway.port}/v1",
                        max_retries=0)
    assert len(await speak(keyed, "pcm")) > 0
    secret = (await keyed.realtime.client_secrets.create(session={"type": "realtime"})).value
    for key in (secret, "wrong"):
        with pytest.raises(openai.AuthenticationError):
            await AsyncOpenAI(api_key=key, base_url=f"http://127.0.0.1:{gateway.port}/v1",
                              max_retries=0).audio.speech.create(model="tts-1", voice="alloy", input="Hi.")


async def test_instructions_reach_a_checkpoint_that_follows_them(start_gateway: StartGateway) -> None:
    """CustomVoice 1.7B follows `instructions` (the tiny checkpoint of that kind): the same seed speaks
    otherwise with an instruction; /v1/audio/capabilities says the engine follows them."""
    gateway = await start_gateway(**{**QWEN3, "engine__checkpoint": str(DATA / "qwen3_tts_tiny_instruct")})
    client = sdk(gateway)
    plain = await speak(client, "pcm", extra_body={"seed": 5})
    instructed = await speak(client, "pcm", instructions="Speak slowly, in a whisper.", extra_body={"seed": 5})
    assert len(plain) > 0 and len(instructed) > 0 and plain != instructed
    assert await speak(client, "pcm", extra_body={"seed": 5}) == plain
    capabilities = await client.get("/audio/capabilities", cast_to=object)
    assert capabilities["instructions"] is True and "alloy" in capabilities["voices"]
    assert not capabilities["cloning"] and not capabilities["design"]


async def test_the_capabilities_offer_each_voice_once_and_name_what_is_missing(start_gateway: StartGateway) -> None:
    """Names that [engine.voices] maps to one speaker are one voice, the speaker's own name with them; an
    engine that speaks every name alike is one voice; what the gateway lacks to clone or design is named."""
    voices = {"alloy": "vivian", "coral": "serena", "marin": "Serena"}
    gateway = await start_gateway(**{**QWEN3, "engine__voices": voices})
    capabilities = await sdk(gateway).get("/audio/capabilities", cast_to=object)
    assert capabilities["voices"] == ["alloy", "coral", "dylan", "eric", "marin", "ryan", "serena", "vivian"]
    assert capabilities["distinct_voices"] == [  # the tiny checkpoint's speakers: vivian, ryan, serena, eric, dylan
        {"voice": "alloy", "names": ["alloy", "vivian"], "speaker": "vivian"},
        {"voice": "coral", "names": ["coral", "marin", "serena"], "speaker": "serena"},
        {"voice": "dylan", "names": ["dylan"], "speaker": "dylan"},
        {"voice": "eric", "names": ["eric"], "speaker": "eric"},
        {"voice": "ryan", "names": ["ryan"], "speaker": "ryan"},
    ]
    assert capabilities["missing"] == {"cloning": [BASE_CHECKPOINT, SPEECH_TO_TEXT], "design": [DESIGN_CHECKPOINT]}
    assert not capabilities["cloning"] and not capabilities["design"]

    async with FakeOpenAI() as stt:  # a speech-to-text: cloning now lacks the checkpoint only
        tone = await start_gateway(tts__engine="tone", stt__base_url=stt.base_url, stt__model="whisper-test")
        capabilities = await sdk(tone).get("/audio/capabilities", cast_to=object)
    assert capabilities["voices"] is None
    assert capabilities["distinct_voices"] == [{"voice": "alloy", "names": None,
                                                "speaker": "tone (a test signal, no speech)"}]
    assert capabilities["missing"] == {"cloning": [BASE_CHECKPOINT], "design": [DESIGN_CHECKPOINT]}


async def test_without_pyav_pcm_is_still_served(start_gateway: StartGateway, monkeypatch: pytest.MonkeyPatch) -> None:
    """A host that lacks PyAV (the GPU benchmark's bare wheels) answers pcm, and says what the other formats
    need; every answer says when the engine's first audio came (Server-Timing)."""
    from gateway import audio_codecs  # noqa: PLC0415 - the module whose PyAV is taken away

    monkeypatch.setattr(audio_codecs, "av", None)
    gateway = await start_gateway(tts__engine="tone")
    client = sdk(gateway)
    async with client.audio.speech.with_streaming_response.create(
            model="tts-1", voice="alloy", input=TEXT, response_format="pcm") as response:
        assert np.array_equal(np.frombuffer(await response.read(), "<i2"), tone_of(TEXT))
        timing = dict(part.strip().split(";dur=") for part in response.headers["server-timing"].split(","))
        assert 0 <= float(timing["queue"]) <= float(timing["audio"])
    with pytest.raises(openai.InternalServerError) as refused:
        await client.audio.speech.create(model="tts-1", voice="alloy", input=TEXT, response_format="mp3")
    assert refused.value.status_code == 501 and refused.value.body["param"] == "response_format"
    assert "PyAV" in refused.value.body["message"]


async def test_an_input_past_the_engines_limit_names_the_option(start_gateway: StartGateway) -> None:
    gateway = await start_gateway(**QWEN3, engine__max_text_chars=100)
    with pytest.raises(openai.BadRequestError) as raised:
        await sdk(gateway).audio.speech.create(model="tts-1", voice="alloy", input="word " * 40)
    assert "[engine] max_text_chars" in raised.value.body["message"], raised.value.body
