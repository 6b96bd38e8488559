"""Custom voices through the unmodified openai SDK: consent recordings heard by the local whisper, voices
cloned from a sample (tiny Base checkpoint) or designed from a prompt (tiny VoiceDesign), spoken by the
speech endpoint and by realtime sessions (WebSocket, a client secret); the consent checks; hostile uploads
(nothing stored); the store shared by two gateways, surviving a restart, preparing a voice again; the limits."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import openai
import orjson
import pytest
from openai import AsyncOpenAI

from bench.fake_openai import FakeOpenAI
from gateway.audio import wav_bytes
from gateway.runtime.voices.consent import CONSENT_PHRASES
from tests import speakers
from tests.conftest import Served, StartGateway, audio_of, connect, make_config
from tests.paths import DATA, TINY_CHECKPOINT

pytestmark = [pytest.mark.skipif(speakers.missing() is not None, reason=speakers.missing() or ""),
              pytest.mark.usefixtures("one_torch_thread")]

CHECKPOINTS = ",".join(str(p) for p in (TINY_CHECKPOINT, DATA / "qwen3_tts_tiny_base", DATA / "qwen3_tts_tiny_design"))
# The tiny Base checkpoint's random speaker encoder puts every voice near cosine 1; 0.998 separates piper's joe
# from espeak-ng's voices there (python -m scripts.calibrate_consent).
TINY_THRESHOLD = 0.998


def family(tmp_path: Path, **overrides: Any) -> dict[str, Any]:
    return {"tts__engine": "qwen3", "engine__checkpoint": CHECKPOINTS, "engine__device": "cpu",
            "engine__voices": {"alloy": "vivian"}, "engine__max_frames": 40, "local__stt": True,
            "voices__dir": str(tmp_path / "voices"), "voices__similarity_threshold": TINY_THRESHOLD, **overrides}


def sdk(gateway: Served, key: str = "test-key") -> AsyncOpenAI:
    return AsyncOpenAI(api_key=key, base_url=f"http://127.0.0.1:{gateway.port}/v1", max_retries=0)


def stored(tmp_path: Path) -> list[str]:
    """What the store's folder holds of consents and voices."""
    root = tmp_path / "voices"
    return sorted(p.name for kind in ("consents", "voices") if (root / kind).is_dir() for p in (root / kind).iterdir())


async def speak(client: AsyncOpenAI, voice: Any, **fields: Any) -> bytes:
    async with client.audio.speech.with_streaming_response.create(
            model="tts-1", voice=voice, input="Hello there.", response_format="pcm", **fields) as response:
        return await response.read()


async def make_consent(client: AsyncOpenAI) -> Any:
    return await client.audio.voice_consents.create(name="Joe", language="en-US",
                                                    recording=("consent.wav", speakers.joe_consent(), "audio/wav"))


async def test_consents_and_voices_through_the_sdk(start_gateway: StartGateway, tmp_path: Path) -> None:
    gateway = await start_gateway(**family(tmp_path))
    client = sdk(gateway)
    consent = await make_consent(client)
    assert consent.object == "audio.voice_consent" and consent.id.startswith("cons_") and consent.language == "en-US"
    assert (await client.audio.voice_consents.retrieve(consent.id)).name == "Joe"
    assert (await client.audio.voice_consents.update(consent.id, name="Joe R.")).name == "Joe R."
    page = await client.audio.voice_consents.list(limit=10)
    assert [c.id for c in page.data] == [consent.id] and not page.has_more

    sample = ("sample.wav", speakers.joe(speakers.SAMPLE_TEXT), "audio/wav")
    clone = await client.audio.voices.create(name="Joe's voice", consent=consent.id, audio_sample=sample)
    assert clone.object == "audio.voice" and clone.type == "audio_sample" and clone.id.startswith("voice_")
    design = await client.audio.voices.create(name="Calm", type="prompt", prompt="A calm, low voice, speaking slowly.")
    assert design.type == "prompt" and design.prompt == "A calm, low voice, speaking slowly."

    for voice in (clone.id, design.id):
        assert len(await speak(client, {"id": voice})) > 0
    assert await speak(client, {"id": clone.id}, extra_body={"seed": 4}) != await speak(client, "alloy",
                                                                                        extra_body={"seed": 4})
    listed = await client.get("/audio/voices", cast_to=object)
    assert {v["id"] for v in listed["data"]} == {clone.id, design.id}

    deleted = await client.audio.voices.delete(clone.id)
    assert deleted.deleted and deleted.id == clone.id and deleted.object == "audio.voice.deleted"
    with pytest.raises(openai.NotFoundError):
        await client.audio.voices.delete(clone.id)
    with pytest.raises(openai.BadRequestError) as gone:
        await speak(client, {"id": clone.id})
    assert gone.value.body["param"] == "voice.id" and gone.value.body["code"] == "voice_not_found"
    assert (await client.audio.voice_consents.delete(consent.id)).deleted
    with pytest.raises(openai.NotFoundError):
        await client.audio.voice_consents.retrieve(consent.id)
    assert stored(tmp_path) == [design.id]


async def test_the_consent_is_checked_not_just_stored(start_gateway: StartGateway, tmp_path: Path) -> None:
    """A recording that does not say the phrase is refused; a sample of another speaker (espeak-ng) than the
    consent's (piper's joe) is refused; the same speaker is accepted (the test above)."""
    gateway = await start_gateway(**family(tmp_path))
    client = sdk(gateway)
    with pytest.raises(openai.BadRequestError) as wrong:
        await client.audio.voice_consents.create(name="Joe", language="en",
                                                 recording=("c.wav", speakers.joe(speakers.SAMPLE_TEXT), "audio/wav"))
    assert wrong.value.body["param"] == "recording" and wrong.value.body["code"] == "consent_phrase_not_heard"
    assert CONSENT_PHRASES["en"] in wrong.value.body["message"]
    consent = await make_consent(client)
    with pytest.raises(openai.BadRequestError) as other:
        await client.audio.voices.create(name="Not Joe", consent=consent.id,
                                         audio_sample=("s.wav", speakers.espeak(speakers.SAMPLE_TEXT), "audio/wav"))
    assert other.value.body["param"] == "audio_sample" and other.value.body["code"] == "speaker_mismatch"
    with pytest.raises(openai.BadRequestError) as german:
        await client.audio.voice_consents.create(name="Joe", language="de-DE",
                                                 recording=("c.wav", speakers.joe_consent(), "audio/wav"))
    assert german.value.body["param"] == "language" and "whisper tiny.en" in german.value.body["message"]
    assert stored(tmp_path) == [consent.id]


@pytest.mark.parametrize(("upload", "status", "code"), [
    ("over_10_mib", 413, "file_too_large"),
    ("31_seconds", 400, "audio_too_long"),
    ("not_audio", 415, "unsupported_audio"),
    ("truncated", 400, "invalid_audio"),
])
async def test_a_hostile_upload_is_refused_naming_its_field(start_gateway: StartGateway, tmp_path: Path, upload: str,
                                                            status: int, code: str) -> None:
    gateway = await start_gateway(**family(tmp_path))
    client = sdk(gateway)
    consent = await make_consent(client)
    sample = speakers.joe(speakers.SAMPLE_TEXT)
    pcm = sample[44:]
    data = {"over_10_mib": b"\0" * (10 * 1024 * 1024 + 1),
            "31_seconds": wav_bytes(pcm * (31 * 48000 // len(pcm) + 1)),
            "not_audio": b"This is a text file, not a recording.\n" * 100,
            "truncated": sample[:len(sample) // 2]}[upload]
    for create in (lambda: client.audio.voices.create(name="x", consent=consent.id,
                                                      audio_sample=("s.wav", data, "audio/wav")),
                   lambda: client.audio.voice_consents.create(name="x", language="en",
                                                              recording=("c.wav", data, "audio/wav"))):
        with pytest.raises(openai.APIStatusError) as refused:
            await create()
        assert refused.value.status_code == status and refused.value.body["code"] == code
        assert refused.value.body["param"] in ("audio_sample", "recording")
    assert stored(tmp_path) == [consent.id]


async def test_bad_fields_and_credentials(start_gateway: StartGateway, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GATEWAY_API_KEYS", "sk-voices-key-0123456789")
    gateway = await start_gateway(**family(tmp_path, voices__max_voices=1))
    client = sdk(gateway, "sk-voices-key-0123456789")
    sample = ("s.wav", speakers.joe(speakers.SAMPLE_TEXT), "audio/wav")
    for create, param in [
        (lambda: client.audio.voice_consents.create(name="x", language="tlh", recording=("c.wav", b"", "audio/wav")),
         "language"),
        (lambda: client.audio.voice_consents.create(name="x", language="en-" + "x" * 60_000,
                                                    recording=("c.wav", b"", "audio/wav")), "language"),
        (lambda: client.audio.voice_consents.create(name="x", language="en US!", recording=("c.wav", b"", "audio/wav")),
         "language"),
        (lambda: client.audio.voice_consents.create(name=" ", language="en", recording=("c.wav", b"", "audio/wav")),
         "name"),
        (lambda: client.audio.voices.create(name="x", consent="cons_000000000000000000000000", audio_sample=sample),
         "consent"),
        (lambda: client.audio.voices.create(name="x", type="prompt", prompt="   "), "prompt"),
        (lambda: client.post("/audio/voices", body={"name": "x", "type": "robot"}, cast_to=object), "type"),
    ]:
        with pytest.raises(openai.BadRequestError) as refused:
            await create()
        assert refused.value.body["param"] == param, refused.value.body
    await client.audio.voices.create(name="One", type="prompt", prompt="A bright voice.")
    with pytest.raises(openai.BadRequestError) as full:
        await client.audio.voices.create(name="Two", type="prompt", prompt="A dark voice.")
    assert full.value.body["code"] == "voice_limit_reached"
    # Voices belong to the deployment: a client secret can neither list, create nor delete one.
    secret = (await client.realtime.client_secrets.create(session={"type": "realtime"})).value
    with pytest.raises(openai.AuthenticationError):
        await sdk(gateway, secret).audio.voices.create(name="Two", type="prompt", prompt="A dark voice.")
    with pytest.raises(openai.AuthenticationError):
        await sdk(gateway, secret).audio.voice_consents.list()


async def test_without_the_models_creation_says_what_is_missing(start_gateway: StartGateway, tmp_path: Path) -> None:
    gateway = await start_gateway(tts__engine="tone", voices__dir=str(tmp_path / "voices"))
    client = sdk(gateway)
    with pytest.raises(openai.InternalServerError) as no_stt:
        await make_consent(client)
    assert no_stt.value.status_code == 501 and "speech-to-text" in no_stt.value.body["message"]
    assert no_stt.value.response.headers["x-should-retry"] == "false"
    with pytest.raises(openai.InternalServerError) as no_base:
        await client.audio.voices.create(name="x", consent="cons_000000000000000000000000",
                                         audio_sample=("s.wav", speakers.joe(speakers.SAMPLE_TEXT), "audio/wav"))
    assert no_base.value.body["code"] == "voice_cloning_unavailable"
    assert "Base checkpoint" in no_base.value.body["message"]
    with pytest.raises(openai.InternalServerError) as no_design:
        await client.audio.voices.create(name="x", type="prompt", prompt="Calm.")
    assert "VoiceDesign checkpoint" in no_design.value.body["message"]
    assert stored(tmp_path) == []


async def test_the_store_is_shared_survives_a_restart_and_prepares_a_voice_again(
        start_gateway: StartGateway, tmp_path: Path) -> None:
    """Two gateways on one folder: a voice made on one is spoken by the other at once; a third started later
    lists it; a voice whose prepared form is gone (the Base checkpoint changed) is prepared again from its
    sample; what an interrupted write left in tmp/ is not a voice."""
    first = await start_gateway(**family(tmp_path))
    second = await start_gateway(**family(tmp_path))
    consent = await make_consent(sdk(first))
    clone = await sdk(first).audio.voices.create(name="Joe", consent=consent.id, audio_sample=(
        "s.wav", speakers.joe(speakers.SAMPLE_TEXT), "audio/wav"))
    spoken = await speak(sdk(second), {"id": clone.id}, extra_body={"seed": 1})
    assert len(spoken) > 0
    folder = tmp_path / "voices" / "voices" / clone.id
    (prepared,) = folder.glob("*.voice")
    prepared.unlink()
    (tmp_path / "voices" / "tmp" / "voice_half-written").mkdir()
    await first.stop()
    third = await start_gateway(**family(tmp_path))
    listed = (await sdk(third).get("/audio/voices", cast_to=object))["data"]
    assert [v["id"] for v in listed] == [clone.id]
    assert await speak(sdk(third), {"id": clone.id}, extra_body={"seed": 1}) == spoken
    assert [p.name for p in folder.glob("*.voice")] == [prepared.name]


async def test_a_realtime_session_speaks_in_a_custom_voice(start_gateway: StartGateway, tmp_path: Path) -> None:
    """session.audio.output.voice = {"id": ...} over the Realtime WebSocket and WebRTC, from session.update,
    an offer's session and a client secret: the reply is spoken in the voice (the engine's stream gets its
    prompt); an id there is no voice of is refused."""
    pytest.importorskip("aiortc")
    from tests.helpers.webrtc import RtcClient  # noqa: PLC0415 - needs the webrtc extra

    async with FakeOpenAI(reply="Sure, here you go.", transcript="Hi.") as fake:
        gateway = Served(make_config(**family(tmp_path, responder__kind="pipeline", llm__base_url=fake.base_url,
                                              webrtc__enabled=True)))
        await gateway.start()
        client = sdk(gateway)
        design = await client.audio.voices.create(name="Calm", type="prompt", prompt="A calm, low voice.")
        engine = gateway.gateway.responder.tts_engine
        opened: list[Any] = []
        open_stream = engine.open

        def recording_open(voice: str, language: str | None = None, **kw: Any) -> Any:
            opened.append(kw.get("prompt"))
            return open_stream(voice, language, **kw)

        engine.open = recording_open
        async with connect(gateway) as session:
            await session.send({"type": "session.update", "session": {
                "type": "realtime", "audio": {"output": {"voice": {"id": design.id}}}}})
            await session.until("session.updated")
            await session.send({"type": "session.update", "session": {
                "type": "realtime", "audio": {"output": {"voice": {"id": "voice_ffffffffffffffffffffffff"}}}}})
            error = (await session.until("error"))[-1]
            assert error["error"]["param"] == "session.audio.output.voice"
            await session.send({"type": "conversation.item.create", "item": {
                "type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi."}]}})
            await session.send({"type": "response.create"})
            events = await session.until("response.done", timeout=60)
        assert len(audio_of(events)) > 0 and opened[-1] is not None and opened[-1].mode == "design"
        opened.clear()
        peer = RtcClient(f"http://127.0.0.1:{gateway.port}")
        try:
            await peer.connect(session={"type": "realtime", "audio": {"output": {"voice": {"id": design.id}}}})
            created = (await peer.until("session.created"))[-1]
            assert created["session"]["audio"]["output"]["voice"] == design.id
            while peer.channel.readyState != "open":
                await asyncio.sleep(0.01)
            await peer.send({"type": "conversation.item.create", "item": {
                "type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi."}]}})
            await peer.send({"type": "response.create"})
            done = (await peer.until("response.done", timeout=60))[-1]
            assert done["response"]["status"] == "completed" and not peer.invalid
            assert opened and opened[-1] is not None and opened[-1].mode == "design"
        finally:
            await peer.close()
        secret = await client.realtime.client_secrets.create(
            session={"type": "realtime", "audio": {"output": {"voice": {"id": design.id}}}})
        async with AsyncOpenAI(api_key=secret.value, base_url=f"http://127.0.0.1:{gateway.port}/v1",
                               websocket_base_url=f"ws://127.0.0.1:{gateway.port}/v1").realtime.connect(
                model="gpt-realtime") as connection:
            created = orjson.loads(await asyncio.wait_for(connection.recv_bytes(), 10))
            assert created["session"]["audio"]["output"]["voice"] == design.id
        await gateway.stop()
