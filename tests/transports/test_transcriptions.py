"""POST /v1/audio/transcriptions through the unmodified openai SDK: the gateway's speech-to-text (the fake OpenAI
server here, over real HTTP) hears the file's audio, every response format and the stream, and each request the
gateway cannot serve gets a 4xx or 503 naming why."""

from __future__ import annotations

import asyncio
import io
from collections.abc import AsyncIterator

import av
import numpy as np
import openai
import pytest
from openai import AsyncOpenAI

from bench.fake_openai import FakeOpenAI
from gateway.audio import wav_bytes
from gateway.responders.echo import EchoResponder
from tests.conftest import StartGateway, load_pcm

KEY = "sk-transcriptions-0123456789"
SENTENCE = load_pcm("one_sentence.wav")  # pcm16 24 kHz


@pytest.fixture
async def fake() -> AsyncIterator[FakeOpenAI]:
    async with FakeOpenAI(transcript="The sky is blue today.", stt_streams=True) as server:
        yield server


def sdk(gateway, key: str = KEY) -> AsyncOpenAI:
    return AsyncOpenAI(api_key=key, base_url=f"http://127.0.0.1:{gateway.port}/v1", max_retries=0)


def mp3(pcm16_24k: bytes) -> bytes:
    """The audio as an MP3 at 44.1 kHz stereo, as a phone's recorder might give it."""
    out = io.BytesIO()
    with av.open(out, "w", "mp3") as container:
        stream = container.add_stream("mp3", rate=44100, layout="stereo")
        frame = av.AudioFrame.from_ndarray(np.frombuffer(pcm16_24k, np.int16)[None, :], format="s16", layout="mono")
        frame.rate = 24000
        resampler = av.AudioResampler("fltp", "stereo", 44100)
        for piece in [*resampler.resample(frame), *resampler.resample(None)]:
            for packet in stream.encode(piece):
                container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
    return out.getvalue()


async def test_a_file_is_heard_by_the_sessions_speech_to_text(start_gateway: StartGateway, fake: FakeOpenAI,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GATEWAY_API_KEYS", KEY)
    gateway = await start_gateway(EchoResponder(), stt__base_url=fake.base_url, stt__model="whisper-test",
                                  stt__stream=True)
    client = sdk(gateway)
    seconds = len(SENTENCE) / 48000
    done = await client.audio.transcriptions.create(model="whisper-1", file=("q.mp3", mp3(SENTENCE)), language="en",
                                                    prompt="Weather.")
    assert done.text == "The sky is blue today."
    assert done._request_id is not None and done._request_id.startswith("req_")  # as OpenAI's answers carry
    assert done.usage is not None and done.usage.type == "duration"
    assert done.usage.seconds == pytest.approx(seconds, abs=0.1)
    (request,) = fake.stt_requests
    assert request.body["model"] == "whisper-test" and request.body["language"] == "en"
    assert request.body["prompt"] == "Weather."
    assert len(request.body["file"]["pcm"]) / 48000 == pytest.approx(seconds, abs=0.1)  # the whole file was heard
    text = await client.audio.transcriptions.create(model="whisper-1", file=("q.wav", wav_bytes(SENTENCE)),
                                                    response_format="text")
    assert text.strip() == "The sky is blue today."
    verbose = await client.audio.transcriptions.create(model="whisper-1", file=("q.wav", wav_bytes(SENTENCE)),
                                                       response_format="verbose_json",
                                                       timestamp_granularities=["segment"],
                                                       chunking_strategy={"type": "server_vad", "threshold": 0.5})
    assert verbose.text == "The sky is blue today." and verbose.duration == pytest.approx(seconds, abs=0.01)
    assert [(s.start, s.text) for s in verbose.segments or []] == [(0.0, "The sky is blue today.")]
    stream = await client.audio.transcriptions.create(model="gpt-4o-transcribe", file=("q.wav", wav_bytes(SENTENCE)),
                                                      stream=True, include=["logprobs"])  # taken, none given
    events = [event async for event in stream]
    assert [e.type for e in events][-1] == "transcript.text.done" and len(events) > 2
    assert "".join(e.delta for e in events if e.type == "transcript.text.delta") == events[-1].text
    assert events[-1].text == "The sky is blue today."


async def test_what_cannot_be_served_is_refused_naming_why(start_gateway: StartGateway, fake: FakeOpenAI,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GATEWAY_API_KEYS", KEY)
    gateway = await start_gateway(EchoResponder(), stt__base_url=fake.base_url, transcriptions__max_seconds=2.0)
    client = sdk(gateway)
    wav = ("q.wav", wav_bytes(SENTENCE[:48000]))
    cases = [
        ({"file": ("q.txt", b"not audio at all")}, openai.BadRequestError, "unsupported_audio", "file"),
        ({"file": ("q.wav", wav_bytes(SENTENCE))}, openai.BadRequestError, "audio_too_long", "file"),
        ({"file": wav, "response_format": "srt"}, openai.BadRequestError, "invalid_value", "response_format"),
        ({"file": wav, "response_format": "verbose_json", "timestamp_granularities": ["word"]},
         openai.BadRequestError, "unsupported_value", "timestamp_granularities"),
        ({"file": wav, "known_speaker_names": ["ann"]}, openai.BadRequestError, "unsupported_parameter",
         "known_speaker_names"),
    ]
    for fields, error, code, param in cases:
        with pytest.raises(error) as refused:
            await client.audio.transcriptions.create(model="whisper-1", **fields)
        assert (refused.value.code, refused.value.body["param"]) == (code, param), fields
    assert not fake.stt_requests  # nothing reached the speech-to-text
    secret = (await client.realtime.client_secrets.create(session={"type": "realtime"})).value
    with pytest.raises(openai.AuthenticationError):
        await sdk(gateway, secret).audio.transcriptions.create(model="whisper-1", file=wav)


async def test_transcriptions_beyond_the_running_bound_get_503_at_once(start_gateway: StartGateway) -> None:
    async with FakeOpenAI(transcript="Slowly.", stt_ms=1500) as fake:
        gateway = await start_gateway(EchoResponder(), stt__base_url=fake.base_url, transcriptions__max_running=1)
        client = sdk(gateway)
        wav = ("q.wav", wav_bytes(SENTENCE[:48000]))
        first = asyncio.ensure_future(client.audio.transcriptions.create(model="whisper-1", file=wav))
        while not fake.stt_requests:
            await asyncio.sleep(0.02)
        with pytest.raises(openai.InternalServerError) as busy:
            await client.audio.transcriptions.create(model="whisper-1", file=wav)
        assert busy.value.status_code == 503 and busy.value.response.headers["retry-after"] == "1"
        assert (await first).text == "Slowly."
        assert (await client.audio.transcriptions.create(model="whisper-1", file=wav)).text == "Slowly."
