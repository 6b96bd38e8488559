"""The engine process (engine.process) and its client (gateway.responders.engine_client), on the tiny checkpoint: the
same audio as the in-process engine, cancel within a step, a vanished client's streams freed, a killed
engine's streams failed and a restarted one serving, a pipeline turn through a real gateway."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from bench.fake_openai import FakeOpenAI
from engine import ipc
from engine.api import Sampling, TTSChunk, TTSError
from engine.config import EngineConfig
from engine.supervisor import EngineStartError, EngineSupervisor
from engine.threaded import QwenTTSEngine
from engine.voices import VoicePrompt
from gateway.audio import decode_wav
from gateway.config import VoiceConfig
from gateway.core.responder import BackendError
from gateway.responders.engine_client import EngineClient
from tests.conftest import Served, audio_of, connect, load_pcm, make_config, silence
from tests.engine.conftest import supervised
from tests.paths import DATA, FIXTURES, TINY_CHECKPOINT

pytestmark = pytest.mark.slow  # engine processes

FIXTURE = TINY_CHECKPOINT
CONFIG = EngineConfig(checkpoint=str(FIXTURE), device="cpu", mode="process", devices="cpu", max_frames=200,
                      heartbeat_ms=250, voices={"alloy": "vivian"})
SHORT = "Hello world, this is a test."  # 9 frames with seed 0
LONG = "Speech synthesis streams audio while the text is still arriving."  # 148 frames with seed 0
HEARTBEAT_S = CONFIG.heartbeat_ms / 1000


@pytest.fixture(scope="module")
def supervisor() -> Iterator[EngineSupervisor]:
    with supervised(CONFIG, ["cpu"]) as engines:
        yield engines


@pytest.fixture
async def client(supervisor: EngineSupervisor) -> AsyncIterator[EngineClient]:
    engine = await asyncio.to_thread(EngineClient, supervisor.endpoints, HEARTBEAT_S)
    yield engine
    await engine.aclose()


async def collect(stream, timeout: float = 60) -> list[TTSChunk]:
    async with asyncio.timeout(timeout):
        return [chunk async for chunk in stream]


async def speak(engine, text: str, sampling: Sampling | None = None) -> list[TTSChunk]:
    stream = engine.open("alloy", "english", sampling=sampling)
    stream.feed(text)
    stream.end()
    return await collect(stream)


async def counters(client: EngineClient) -> dict:
    (stats,) = await client.stats()
    return stats


async def settled(client: EngineClient, timeout: float = 10) -> dict:
    """The engine's counters once it holds no stream, or after `timeout`."""
    deadline = time.monotonic() + timeout
    while ((stats := await counters(client))["streams"] or stats["waiting"]) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    return stats


async def test_the_same_audio_as_the_in_process_engine(client: EngineClient) -> None:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    own = Sampling(seed=3, temperature=0.7, top_k=9, subtalker_top_p=0.9)  # a stream's own, through IPC
    local = QwenTTSEngine.from_config(dataclasses.replace(CONFIG, mode="thread"))
    try:
        expected = await speak(local, SHORT)
        expected_own = await speak(local, SHORT, own)
    finally:
        local.close()
        torch.set_num_threads(threads)
    got = await speak(client, SHORT)
    assert [c.text for c in got] == [c.text for c in expected] and "".join(c.text for c in got) == SHORT
    assert b"".join(c.pcm for c in got) == b"".join(c.pcm for c in expected)
    assert len(got) > 1 and got[0].pcm  # sampled (seed 0), several packets
    got_own = b"".join(c.pcm for c in await speak(client, SHORT, own))
    assert got_own == b"".join(c.pcm for c in expected_own) != b"".join(c.pcm for c in got)


async def test_bad_input_is_refused_at_once(client: EngineClient) -> None:
    with pytest.raises(TTSError, match="unknown voice"):
        client.open("nova")
    with pytest.raises(TTSError, match="unknown language"):
        client.open("alloy", "klingon")
    with pytest.raises(TTSError, match="'seed' must be an integer from 0"):
        client.open("alloy", sampling=Sampling(seed=-1))
    stream = client.open("alloy", "en")
    stream.feed("  ")
    with pytest.raises(TTSError, match="empty text"):
        stream.end()
    assert await collect(stream, timeout=5) == []
    long = client.open("ryan")
    with pytest.raises(TTSError, match="longer than 2000"):
        long.feed("a" * 2001)
    long.cancel()
    assert (await settled(client))["streams"] == 0  # no row is left held


async def test_cancel_takes_effect_within_a_step(client: EngineClient) -> None:
    stream = client.open("alloy", "english")
    stream.feed(LONG)
    stream.end()
    async with asyncio.timeout(30):
        first = await anext(stream)
    assert first.pcm
    before = asyncio.create_task(client.stats())
    await asyncio.sleep(0)  # its request is on the socket before the cancel: the engine takes them in order
    stream.cancel()
    frames = (await before)[0]["frames"]
    assert await collect(stream, timeout=1) == []  # iteration ends at once
    await asyncio.sleep(0.5)  # dozens of steps' time
    after = await counters(client)
    # The frame launched while the cancel was on its way, at most; 148 frames were due.
    assert after["frames"] - frames <= 1
    assert after["streams"] == after["waiting"] == 0


async def test_text_goes_with_the_open_or_after_it(client: EngineClient) -> None:
    before = (await counters(client))["opened"]
    gone = client.open("alloy", "english")
    gone.feed(SHORT)
    gone.cancel()  # before its OPEN left: the engine never hears of it
    assert await collect(gone, timeout=1) == []
    at_once = await speak(client, SHORT)  # text and end in the OPEN
    later = client.open("alloy", "english")
    await asyncio.sleep(0.05)  # the OPEN leaves alone; the text follows as FEEDs, then END
    later.feed(SHORT[:12])
    await asyncio.sleep(0.01)
    later.feed(SHORT[12:])
    later.end()
    fed = await collect(later)
    assert "".join(c.text for c in at_once) == "".join(c.text for c in fed) == SHORT
    assert b"".join(c.pcm for c in at_once) and b"".join(c.pcm for c in fed)
    stats = await settled(client)
    assert stats["opened"] - before == 2 and stats["streams"] == 0


def test_an_open_reads_back_as_written_and_a_malformed_one_is_an_input_error() -> None:
    spec = ipc.Open("ryan", "english", b"voice bytes", "Whisper.", Sampling(seed=7, top_k=20))
    frames = ipc.open_frames(ipc.sid_bytes(3), spec, "Hello.", end=True)
    assert frames[0] == ipc.OPEN and len(frames) == 4  # kind, sid, the JSON object, the prompt
    assert ipc.read_open(frames[1:]) == (spec, "Hello.", True)
    plain = ipc.Open("alloy")
    assert ipc.read_open(ipc.open_frames(b"x" * 8, plain)[1:]) == (plain, "", False)
    for header in (b"{not json", b"[]", b'{"language": "en"}', b'{"voice": 3}', b'{"voice": "a", "end": "yes"}',
                   b'{"voice": "a", "sampling": {"nucleus": 1}}', b'{"voice": "a", "sampling": 5}'):
        with pytest.raises(TTSError, match="not engine.ipc.open_frames's"):
            ipc.read_open([b"x" * 8, header])


async def test_streams_go_to_the_least_loaded_engine(supervisor: EngineSupervisor) -> None:
    """Two links to the one engine process stand for two engines: new streams alternate between them, and
    one that is down gets none."""
    endpoint = supervisor.endpoints[0]
    client = await asyncio.to_thread(EngineClient, [endpoint, endpoint], HEARTBEAT_S)
    try:
        first, second = client.links
        streams = [client.open("alloy") for _ in range(4)]
        assert [s._link for s in streams] == [first, second, first, second]
        first.fail("is gone (test)")
        later = [client.open("alloy") for _ in range(3)]
        assert {s._link for s in later} == {second}
        for s in streams + later:
            s.cancel()
    finally:
        await client.aclose()


CHILD = """
import asyncio, sys
from gateway.responders.engine_client import EngineClient

async def main():
    client = EngineClient([sys.argv[1]], float(sys.argv[2]))
    streams = [client.open("alloy", "english") for _ in range(2)]
    for s in streams:
        s.feed("Hello world, this is")  # no end: each stream holds its row, waiting for more text
    for s in streams:
        await anext(s)
    print("holding", flush=True)
    await asyncio.sleep(60)

asyncio.run(main())
"""


async def test_a_vanished_client_frees_its_streams(client: EngineClient, supervisor: EngineSupervisor) -> None:
    child = subprocess.Popen([sys.executable, "-c", CHILD, supervisor.endpoints[0], str(HEARTBEAT_S)],
                             stdout=subprocess.PIPE, text=True)
    try:
        line = await asyncio.wait_for(asyncio.to_thread(child.stdout.readline), 60)
        assert line.strip() == "holding"
        held = await counters(client)
        assert held["streams"] == 2, held
    finally:
        child.kill()
        child.wait()
    assert (await settled(client))["streams"] == 0


async def test_a_pipeline_turn_through_the_engine_process(supervisor: EngineSupervisor) -> None:
    async with FakeOpenAI(reply=SHORT, transcript="Hi.") as fake:
        config = make_config(
            responder__kind="pipeline", llm__base_url=fake.base_url, stt__base_url=fake.base_url,
            tts__engine="qwen3", engine__mode="process", engine__endpoints=supervisor.endpoints[0],
            engine__heartbeat_ms=CONFIG.heartbeat_ms,
        )
        gateway = Served(config)  # the responder built from the config: the pipeline on the engine process
        await gateway.start()
        try:
            async with connect(gateway) as client:
                await client.append(load_pcm("one_sentence.wav") + silence(800), chunk_ms=100)
                events = await client.until("response.done", timeout=60)
                assert events[-1]["response"]["status"] == "completed"
                spoken = "".join(e["delta"] for e in events if e["type"] == "response.output_audio_transcript.delta")
                assert spoken.strip() == SHORT
                assert len(audio_of(events)) >= 48 * 80 * 4

                # Cancelled while the engine process speaks: nothing of it after its response.done.
                fake.reply = LONG
                await client.send({"type": "response.create"})
                events = await client.until("response.output_audio.delta", timeout=60)
                response_id = events[-1]["response_id"]
                await client.send({"type": "response.cancel"})
                done = (await client.until("response.done"))[-1]["response"]
                assert (done["id"], done["status"]) == (response_id, "cancelled")
                assert not [e for e in await client.quiet(0.5) if e.get("response_id") == response_id]
            # /readyz and /metrics read the engine processes' free streams through the responder.
            assert gateway.gateway.engine_streams_free() is not None
        finally:
            await gateway.stop()


async def test_an_engine_without_the_end_of_turn_model_refuses_turns(client: EngineClient) -> None:
    assert not client.has_turn_model  # started without [engine] turn_model (tests/engine/test_turn_engine.py has one)
    with pytest.raises(BackendError, match="no end-of-turn model"):
        await client.turn(np.zeros(16_000, np.float32))
    assert await speak(client, SHORT)  # and it goes on speaking


async def test_free_streams_follow_what_the_engine_reports(client: EngineClient) -> None:
    """What the gateway's /readyz and /metrics report: the engine's rows (its hello) less its streams."""
    rows = client.links[0].hello["rows"]
    assert client.free_streams == rows
    stream = client.open("alloy", "english")
    # No text yet: it holds its row, waiting for some.
    assert client.free_streams == rows - 1  # counted here until the next heartbeat
    await asyncio.sleep(3 * HEARTBEAT_S)
    assert client.links[0].load == 1 and client.free_streams == rows - 1  # now as the engine reports it
    stream.cancel()
    deadline = time.monotonic() + 10
    while client.free_streams != rows and time.monotonic() < deadline:
        await asyncio.sleep(HEARTBEAT_S)
    assert client.free_streams == rows


async def test_a_gateway_links_to_the_engine_at_start(client: EngineClient, supervisor: EngineSupervisor) -> None:
    """A gateway process is linked to the engine process once started, before any request of its own: its
    free streams count the ones another process holds there (a worker's /readyz and its speech admission)."""
    rows = client.links[0].hello["rows"]
    held = client.open("alloy", "english")  # another gateway process's stream, waiting for its text
    config = make_config(tts__engine="qwen3", engine__mode="process", engine__endpoints=supervisor.endpoints[0],
                         engine__heartbeat_ms=CONFIG.heartbeat_ms)
    gateway = Served(config)
    await gateway.start()
    try:
        engine = await gateway.gateway.speech.engine()
        deadline = time.monotonic() + 10
        while engine.free_streams != rows - 1 and time.monotonic() < deadline:
            await asyncio.sleep(HEARTBEAT_S)
        assert engine.free_streams == rows - 1
    finally:
        held.cancel()
        await gateway.stop()


def test_an_engine_that_cannot_start_says_why(tmp_path: Path) -> None:
    options = dataclasses.asdict(dataclasses.replace(CONFIG, checkpoint=str(tmp_path / "absent")))
    with pytest.raises(EngineStartError, match="huggingface-cli download"):
        EngineSupervisor(options, ["cpu"]).start(timeout=60)


FAMILY = dataclasses.replace(CONFIG, checkpoint=f"{DATA / 'qwen3_tts_tiny_base'},{DATA / 'qwen3_tts_tiny_design'}",
                             max_frames=12, max_streams=2)  # the [engine.voices] map goes unused
REFERENCE = "The quick brown fox jumps over the lazy dog."


@pytest.fixture(scope="module")
def family_supervisor() -> Iterator[EngineSupervisor]:
    """An engine process holding a Base and a VoiceDesign checkpoint."""
    with supervised(FAMILY, ["cpu"]) as engines:
        yield engines


async def test_voices_prepared_and_spoken_in_an_engine_process(family_supervisor: EngineSupervisor) -> None:
    """A clone prepared over IPC is the one the in-process engine prepares, and it and a designed voice
    speak as they do there."""
    samples, rate = decode_wav((FIXTURES / "one_sentence.wav").read_bytes())
    audio = samples[:, 0]
    design = VoicePrompt.design("A warm, low female voice, speaking calmly.")
    client = await asyncio.to_thread(EngineClient, family_supervisor.endpoints, HEARTBEAT_S)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    local = QwenTTSEngine.from_config(dataclasses.replace(FAMILY, mode="thread"))
    try:
        assert client.kinds == ["base", "voice_design"] and not client.voices
        remote_clone = await client.prepare(audio, rate, REFERENCE)
        local_clone = await local.prepare(audio, rate, REFERENCE)
        assert remote_clone.key == local_clone.key
        for voice in (remote_clone, design):
            stream = client.open("mine", "english", prompt=voice)
            stream.feed(SHORT)
            stream.end()
            got = await collect(stream)
            expected = await speak_in(local, voice)
            assert b"".join(c.pcm for c in got) == b"".join(c.pcm for c in expected) and got[0].pcm
        with pytest.raises(TTSError, match="reference audio of 0.5 s"):
            await client.prepare(audio[:rate // 2], rate)
        stream = client.open("calm", prompt=design, instructions="Whisper.")
        with pytest.raises(TTSError, match="takes no separate instructions"):
            await collect(stream)
    finally:
        local.close()
        torch.set_num_threads(threads)
        await client.aclose()


async def speak_in(engine: QwenTTSEngine, voice: VoicePrompt) -> list[TTSChunk]:
    stream = engine.open("mine", "english", prompt=voice)
    stream.feed(SHORT)
    stream.end()
    return await collect(stream)


async def test_a_realtime_session_speaks_in_prepared_voices(family_supervisor: EngineSupervisor) -> None:
    """The unmodified openai SDK over a real gateway: the configured default voice is a clone of a reference
    recording ([voices.narrator]); {"id": "calm"} switches to a designed one ([voices.calm]); an unknown id
    is refused, naming the field."""
    async with FakeOpenAI(reply=SHORT, transcript="Hi.") as fake:
        config = make_config(
            responder__kind="pipeline", llm__base_url=fake.base_url, stt__base_url=fake.base_url,
            tts__engine="qwen3", engine__mode="process", engine__endpoints=family_supervisor.endpoints[0],
            engine__heartbeat_ms=FAMILY.heartbeat_ms, session__voice="narrator",
        )
        config.voices.named = {
            "narrator": VoiceConfig(reference=str(FIXTURES / "one_sentence.wav"), transcript=REFERENCE),
            "calm": VoiceConfig(description="A warm, low female voice, speaking calmly.")}
        gateway = Served(config)
        await gateway.start()
        try:
            spoken = {}
            for voice in ("narrator", "calm"):  # a session's voice is fixed once it has spoken: one session each
                async with connect(gateway) as client:
                    assert client.received[0]["session"]["audio"]["output"]["voice"] == "narrator"
                    if voice == "calm":
                        await client.send({"type": "session.update", "session": {
                            "type": "realtime", "audio": {"output": {"voice": {"id": "nobody"}}}}})
                        error = (await client.until("error"))[-1]["error"]
                        assert (error["code"], error["param"]) == ("invalid_value", "session.audio.output.voice")
                        await client.send({"type": "session.update", "session": {
                            "type": "realtime", "audio": {"output": {"voice": {"id": "calm"}}}}})
                        await client.until("session.updated")
                    await client.send({"type": "conversation.item.create", "item": {
                        "type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi."}]}})
                    await client.send({"type": "response.create"})
                    events = await client.until("response.done", timeout=60)
                    done = events[-1]["response"]
                    assert done["status"] == "completed", done
                    assert done["audio"]["output"]["voice"] == voice
                    text = "".join(e["delta"] for e in events if e["type"] == "response.output_audio_transcript.delta")
                    assert text.strip() == SHORT
                    spoken[voice] = audio_of(events)
                    assert len(spoken[voice]) >= 48 * 80 * 2
            assert spoken["narrator"] != spoken["calm"]
        finally:
            await gateway.stop()


# Last: it kills the module's engine process (the supervisor starts it again).
async def test_a_killed_engine_fails_its_streams_and_a_restarted_one_serves(
        client: EngineClient, supervisor: EngineSupervisor) -> None:
    instance = (await counters(client))["instance"]
    stream = client.open("alloy", "english")
    stream.feed("Hello world, this is")  # waits for more text
    async with asyncio.timeout(30):
        await anext(stream)
    os.kill(supervisor.pids[0], signal.SIGKILL)
    # Its connection drops at once (or, on a starved machine, its silence is noticed first).
    with pytest.raises(BackendError, match="tts backend failed: the TTS engine process (stopped|did not answer)"):
        await collect(stream, timeout=5)
    with pytest.raises(BackendError, match="no TTS engine process is up"):
        client.open("alloy")
    deadline = time.monotonic() + 90
    while not client.links[0].up and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    assert (await counters(client))["instance"] != instance
    assert "".join(c.text for c in await speak(client, SHORT)) == SHORT
