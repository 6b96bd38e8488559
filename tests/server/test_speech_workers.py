"""/v1/audio/speech and custom voices behind `serve --workers 2` with one engine process: a voice made through
one connection is spoken at once through many others (which the kernel spreads over both workers, each
reading the store on access), every request's stream runs in the shared engine process, and a stream's seed
gives the same samples whichever worker carried it."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

import aiohttp
import numpy as np
import pytest

from gateway.config import Config
from gateway.runtime.speech import SpeechService
from tests.helpers.workers import engine_processes, serve
from tests.paths import DATA, TINY_CHECKPOINT

pytestmark = pytest.mark.slow  # `serve --workers 2` and an engine process

DESIGN = DATA / "qwen3_tts_tiny_design"


@pytest.mark.skipif(not DESIGN.exists(), reason="the tiny VoiceDesign checkpoint is missing")
async def test_speech_and_a_new_voice_behind_two_workers(tmp_path: Path) -> None:
    env = {"GATEWAY_RESPONDER_KIND": "echo", "GATEWAY_TTS_ENGINE": "qwen3",
           "GATEWAY_ENGINE_CHECKPOINT": f"{TINY_CHECKPOINT},{DESIGN}", "GATEWAY_ENGINE_MODE": "process",
           "GATEWAY_ENGINE_DEVICES": "cpu", "GATEWAY_ENGINE_VOICES": "alloy=vivian", "GATEWAY_ENGINE_MAX_FRAMES": "40",
           "GATEWAY_VOICES_DIR": str(tmp_path / "voices")}
    async with serve(tmp_path, **env) as gateway:
        assert len(engine_processes(gateway.process.pid)) == 1
        base = f"http://127.0.0.1:{gateway.port}/v1"
        async with aiohttp.ClientSession() as http, http.post(f"{base}/audio/voices", json={
                "type": "prompt", "name": "Calm", "prompt": "A calm, low voice."}) as made:
            assert made.status == 200, await made.text()
            voice = (await made.json())["id"]

        async def speak(voice: object, seed: int) -> bytes:
            # A connection each: the kernel spreads them over the workers.
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as http, http.post(
                    f"{base}/audio/speech", json={"model": "tts-1", "input": "Hello there.", "voice": voice,
                                                  "response_format": "pcm", "seed": seed}) as answer:
                assert answer.status == 200, await answer.text()
                return await answer.read()

        def same(a: bytes, b: bytes) -> bool:
            # The same codes: streams sharing a batch may have a sample rounded one step apart by the codec.
            x, y = np.frombuffer(a, "<i2").astype(int), np.frombuffer(b, "<i2").astype(int)
            return len(x) == len(y) > 0 and np.abs(x - y).max() <= 1

        spoken = await asyncio.gather(*(speak({"id": voice}, 1) for _ in range(6)),
                                      *(speak("alloy", 1) for _ in range(6)))
        assert all(same(spoken[0], pcm) for pcm in spoken[:6]) and all(same(spoken[6], pcm) for pcm in spoken[6:])
        assert not same(spoken[0], spoken[6])


@pytest.mark.parametrize(("workers", "share"), [(1, 4), (2, 2), (3, 1), (16, 1)])
async def test_the_speech_share_of_the_engine_is_split_among_the_workers(workers: int, share: int) -> None:
    """[speech] max_streams = 0 gives the speech API half the engine's streams, split among the processes that
    share the engine: two workers taking half each would leave the sessions none."""
    config = Config()
    config.server.workers = workers
    service = SpeechService(config)
    await service.start(SimpleNamespace(free_streams=8, voices=None))  # an engine of 8 streams
    assert service.max_streams == share
    await service.aclose()
