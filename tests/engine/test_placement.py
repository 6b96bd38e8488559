"""Streams across several engine processes (one per GPU on a GPU host; here two CPU engine processes of the tiny
checkpoints): each new stream goes to the least loaded one, a voice prepared in one is spoken by every one, and
an engine process killed mid-stream fails that response with an error event while the session's next response
is spoken by the other (a real gateway on loopback, the unmodified openai SDK)."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator, Iterator

import pytest

from bench.fake_openai import FakeOpenAI
from engine import ipc
from engine.config import EngineConfig
from engine.supervisor import EngineSupervisor
from gateway.audio import decode_wav
from gateway.responders.engine_client import EngineClient, EngineLink
from tests.conftest import Served, audio_of, connect, make_config
from tests.engine.conftest import supervised
from tests.paths import DATA, FIXTURES, TINY_CHECKPOINT

CONFIG = EngineConfig(checkpoint=f"{TINY_CHECKPOINT},{DATA / 'qwen3_tts_tiny_base'}", device="cpu", mode="process",
                      max_frames=200, max_streams=4, heartbeat_ms=1000, voices={"alloy": "vivian"})
HEARTBEAT_S = CONFIG.heartbeat_ms / 1000
SHORT = "Hello world, this is a test."
LONG = "Speech synthesis streams audio while the text is still arriving."
REFERENCE = "The quick brown fox jumps over the lazy dog."


@pytest.fixture(scope="module")
def engines() -> Iterator[EngineSupervisor]:
    """Two engine processes, as on a two-GPU host."""
    with supervised(CONFIG, ["cpu", "cpu"], timeout=180) as supervisor:
        yield supervisor


@pytest.fixture
async def client(engines: EngineSupervisor) -> AsyncIterator[EngineClient]:
    engine = await asyncio.to_thread(EngineClient, engines.endpoints, HEARTBEAT_S)
    await engine.connect()
    yield engine
    await engine.aclose()


async def heartbeats(n: int = 3) -> None:
    """Long enough for every link's load to come back with a heartbeat's answer."""
    await asyncio.sleep(n * HEARTBEAT_S)


async def loads(client: EngineClient, expected: list[int]) -> list[int]:
    """Each link's load once it is `expected`, or as it is after three heartbeats' answers."""
    deadline = time.monotonic() + 3 * HEARTBEAT_S
    while (now := [link.load for link in client.links]) != expected and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    return now


def holding(stream: object) -> str:
    return stream._link.endpoint  # type: ignore[attr-defined]


async def test_new_streams_go_to_the_least_loaded_engine_process(engines: EngineSupervisor,
                                                                 client: EngineClient) -> None:
    first, second = engines.endpoints
    streams = [client.open("alloy") for _ in range(4)]
    assert [holding(s) for s in streams] == [first, second, first, second]
    for s in streams:
        s.cancel()
    await heartbeats()
    # Another gateway process (its own client, here of the first engine only) holds three streams there: this
    # one learns it from the engines' answers to its heartbeats and sends its next three to the second.
    other = await asyncio.to_thread(EngineClient, [first], HEARTBEAT_S)
    try:
        held = [other.open("alloy") for _ in range(3)]
        for s in held:
            s.feed("Hello world, this is")  # no end: each holds its row, waiting for more text
        assert await loads(client, [3, 0]) == [3, 0]
        later = [client.open("alloy") for _ in range(4)]
        assert [holding(s) for s in later] == [second, second, second, first]
        for s in held + later:
            s.cancel()
    finally:
        await other.aclose()


async def test_the_gateway_processes_take_the_engine_processes_vads_in_turn(engines: EngineSupervisor,
                                                                          client: EngineClient) -> None:
    first, second = (ipc.vad_endpoint(endpoint) for endpoint in engines.endpoints)
    assert [client.vad_endpoint(slot) for slot in range(5)] == [first, second, first, second, first]


async def test_a_voice_prepared_in_one_engine_process_is_spoken_by_each(client: EngineClient) -> None:
    samples, rate = decode_wav((FIXTURES / "one_sentence.wav").read_bytes())
    voice = await client.prepare(samples[:, 0], rate, REFERENCE)
    streams = [client.open("mine", "english", prompt=voice) for _ in range(2)]  # one on each engine process
    for stream in streams:
        stream.feed(SHORT)
        stream.end()

    async def spoken(stream: object) -> bytes:
        return b"".join([chunk.pcm async for chunk in stream])  # type: ignore[attr-defined]

    async with asyncio.timeout(120):
        audio = await asyncio.gather(*(spoken(s) for s in streams))
    assert len({holding(s) for s in streams}) == 2
    assert audio[0] and audio[0] == audio[1]  # the same voice, seed and text: the same audio on each


def stream_holder(gateway: Served) -> EngineLink:
    """The engine process holding the gateway's one stream."""
    links = gateway.gateway.responder.tts_engine.links  # type: ignore[union-attr]
    (link,) = [link for link in links if link.streams]
    return link


# Last: it kills one of the module's engine processes (its supervisor starts it again).
async def test_an_engine_process_killed_mid_stream_fails_that_response_and_the_next_is_spoken(
        engines: EngineSupervisor) -> None:
    async with FakeOpenAI(reply=LONG, transcript="Hi.") as fake:
        config = make_config(
            responder__kind="pipeline", llm__base_url=fake.base_url, stt__base_url=fake.base_url,
            tts__engine="qwen3", engine__endpoints=",".join(engines.endpoints),
            engine__heartbeat_ms=CONFIG.heartbeat_ms)  # [engine] mode "auto": engine processes named
        gateway = Served(config)
        await gateway.start()
        try:
            async with connect(gateway) as client:
                await client.send({"type": "conversation.item.create", "item": {
                    "type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi."}]}})
                await client.send({"type": "response.create"})
                await client.until("response.output_audio.delta", timeout=60)
                killed = stream_holder(gateway)
                os.kill(engines.pids[engines.endpoints.index(killed.endpoint)], signal.SIGKILL)
                events = await client.until("response.done", timeout=30)
                error = next(e for e in events if e["type"] == "error")["error"]
                assert error["code"] == "tts_backend_error" and "TTS engine process" in error["message"], error
                assert events[-1]["response"]["status"] == "failed"

                fake.reply = SHORT
                await client.send({"type": "response.create"})
                events = await client.until("response.output_audio.delta", timeout=60)
                assert stream_holder(gateway) is not killed
                events += await client.until("response.done", timeout=60)
                assert events[-1]["response"]["status"] == "completed"
                text = "".join(e["delta"] for e in events if e["type"] == "response.output_audio_transcript.delta")
                assert text.strip() == SHORT and audio_of(events)

            # The killed one is started again, and new streams go to it once it answers.
            deadline = time.monotonic() + 120
            while not killed.up and time.monotonic() < deadline:
                await asyncio.sleep(0.2)
            assert killed.up
        finally:
            await gateway.stop()
