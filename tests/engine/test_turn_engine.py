"""Smart Turn in the engine process ([semantic_vad] device = "engine"): turns judged there by engine.turn_model
(its parity with onnxruntime: tests/engine/test_turn_model.py), batched, bad requests refused, and semantic_vad
turns through a real gateway on it. An engine without the model: tests/engine/test_process.py."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Iterator

import numpy as np
import pytest

from engine.config import EngineConfig
from engine.supervisor import EngineSupervisor
from engine.turn_model import TurnModel
from gateway.config import ConfigError
from gateway.core.responder import BackendError
from gateway.responders.engine_client import EngineClient
from gateway.runtime.smart_turn import N_SAMPLES, EngineSmartTurn, last_seconds, resampled_tail
from gateway.shipped import SMART_TURN_MODEL
from tests.conftest import Served, load_pcm, make_config
from tests.paths import TINY_CHECKPOINT
from tests.runtime.test_smart_turn import PAUSE_START, PAUSED, SPEECH_END, turn_ends

pytestmark = pytest.mark.slow  # engine processes

CONFIG = EngineConfig(checkpoint=str(TINY_CHECKPOINT), device="cpu", mode="process", devices="cpu", max_frames=200,
                      heartbeat_ms=250, voices={"alloy": "vivian"}, turn_model=str(SMART_TURN_MODEL))
HEARTBEAT_S = CONFIG.heartbeat_ms / 1000


@pytest.fixture(scope="module")
def supervisor() -> Iterator[EngineSupervisor]:
    with pytest.MonkeyPatch.context() as env:
        env.setenv("OMP_NUM_THREADS", "1")
        engines = EngineSupervisor(dataclasses.asdict(CONFIG), ["cpu"], heartbeat_ms=CONFIG.heartbeat_ms)
        engines.start(timeout=120)
        yield engines
        engines.stop()


@pytest.fixture
async def client(supervisor: EngineSupervisor) -> AsyncIterator[EngineClient]:
    engine = await asyncio.to_thread(EngineClient, supervisor.endpoints, HEARTBEAT_S)
    yield engine
    await engine.aclose()


def turns() -> list[bytes]:
    """The paused sentence cut 200 ms into its pause ("... Boston to": unfinished) and after its end."""
    pcm = load_pcm(PAUSED)
    return [pcm[: (PAUSE_START + 200) * 48], pcm[: (SPEECH_END + 200) * 48]]


async def test_turns_judged_in_the_engine_as_the_model_judges_them_here(client: EngineClient) -> None:
    assert client.has_turn_model
    here = TurnModel.from_onnx(SMART_TURN_MODEL).predict(np.stack([last_seconds(resampled_tail(t)) for t in turns()]))
    with_engine = EngineSmartTurn(client, None)  # the loop's default executor resamples
    judged = await asyncio.gather(*(with_engine.predict(t) for t in turns() * 4))  # arriving together: batched
    assert judged[0] < 0.3 < 0.7 < judged[1]
    assert judged == pytest.approx(list(here) * 4, abs=1e-5)
    assert judged[:2] * 4 == judged  # a turn's verdict does not depend on its batch
    (stats,) = await client.stats()
    assert stats["turns"] >= 8


async def test_bad_turn_requests_are_refused_and_the_engine_goes_on(client: EngineClient) -> None:
    for audio in (np.zeros(0, np.float32), np.zeros(N_SAMPLES + 1, np.float32)):
        with pytest.raises(BackendError, match=f"a turn is 1 to {N_SAMPLES} samples"):
            await client.turn(audio)
    assert await client.turn(resampled_tail(turns()[1])) > 0.7


async def test_a_gateway_told_to_judge_turns_on_an_engine_it_has_not_does_not_start() -> None:
    gateway = Served(make_config(tts__engine="tone", semantic_vad__device="engine"))
    with pytest.raises(ConfigError, match='semantic_vad.device = "engine" needs'):
        await gateway.start()


async def test_semantic_vad_turns_through_a_gateway_on_the_engine(supervisor: EngineSupervisor) -> None:
    config = make_config(tts__engine="qwen3", engine__mode="process", engine__endpoints=supervisor.endpoints[0],
                         engine__heartbeat_ms=CONFIG.heartbeat_ms, semantic_vad__device="engine")
    gateway = Served(config)
    await gateway.start()
    try:
        ends, _ = await turn_ends(gateway, load_pcm(PAUSED), SPEECH_END, type="semantic_vad")
        assert len(ends) == 1 and abs(ends[0] - SPEECH_END) <= 150  # the pause did not end the turn
        stats = await gateway.gateway.speech.loaded.stats()
        assert stats[0]["turns"] >= 2  # the pause and the end were judged in the engine
    finally:
        await gateway.stop()
