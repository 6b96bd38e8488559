"""The gateway's detectors in the engine process.

- Smart Turn ([semantic_vad] device = "engine"): turns judged there by engine.turn_model (its parity with
  onnxruntime: tests/engine/test_turn_model.py), batched, bad requests refused, and semantic_vad turns
  through a real gateway on it. An engine without the model: tests/engine/test_process.py.
- Silero VAD ([vad] device = "engine"): every session's windows stepped there by engine.vad_model (its parity:
  tests/engine/test_vad_model.py) find the turns the gateway's own VAD finds, to the sample; bad steps are
  refused; steps nobody answers fall back on the gateway's model; and a real gateway's sessions use it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import numpy as np
import pytest

from engine import ipc
from engine.config import EngineConfig
from engine.supervisor import EngineSupervisor
from engine.turn_model import TurnModel
from gateway.config import ConfigError
from gateway.core.responder import BackendError
from gateway.core.vad import SpeechStopped, TurnDetector
from gateway.responders.engine_client import EngineClient
from gateway.runtime.silero import EngineVad, SileroModel, SileroVAD, process_many
from gateway.runtime.smart_turn import N_SAMPLES, EngineSmartTurn, last_seconds, resampled_tail
from gateway.shipped import SILERO_TORCHSCRIPT, SMART_TURN_MODEL, silero_file
from tests.conftest import FIXTURES, Served, load_pcm, make_config
from tests.engine.conftest import supervised
from tests.paths import TINY_CHECKPOINT
from tests.runtime.test_smart_turn import PAUSE_START, PAUSED, SPEECH_END, turn_ends

pytestmark = pytest.mark.slow  # engine processes

CONFIG = EngineConfig(checkpoint=str(TINY_CHECKPOINT), device="cpu", mode="process", devices="cpu", max_frames=200,
                      heartbeat_ms=250, voices={"alloy": "vivian"}, turn_model=str(SMART_TURN_MODEL),
                      vad_model=str(silero_file(SILERO_TORCHSCRIPT)))
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


@pytest.mark.parametrize("option", ["semantic_vad", "vad"])
async def test_a_gateway_told_to_run_a_detector_on_an_engine_it_has_not_does_not_start(option: str) -> None:
    gateway = Served(make_config(tts__engine="tone", **{f"{option}__device": "engine"}))
    with pytest.raises(ConfigError, match=f'option {option}.device = "engine" needs'):
        await gateway.start()


@asynccontextmanager
async def gateway_on(supervisor: EngineSupervisor, **overrides: Any) -> AsyncIterator[Served]:
    """A gateway whose TTS engine is the supervisor's engine process, started and stopped."""
    gateway = Served(make_config(tts__engine="qwen3", engine__mode="process", engine__endpoints=supervisor.endpoints[0],
                                 engine__heartbeat_ms=CONFIG.heartbeat_ms, **overrides))
    await gateway.start()
    try:
        yield gateway
    finally:
        await gateway.stop()


async def test_semantic_vad_turns_through_a_gateway_on_the_engine(supervisor: EngineSupervisor) -> None:
    async with gateway_on(supervisor, semantic_vad__device="engine") as gateway:
        ends, _ = await turn_ends(gateway, load_pcm(PAUSED), SPEECH_END, type="semantic_vad")
        assert len(ends) == 1 and abs(ends[0] - SPEECH_END) <= 150  # the pause did not end the turn
        stats = await gateway.gateway.speech.loaded.stats()
        assert stats[0]["turns"] >= 2  # the pause and the end were judged in the engine


WAVS = sorted(path.name for path in FIXTURES.glob("*.wav"))


def steps_with(model: object) -> list[np.ndarray]:
    """Every fixture twice, stepped together in shared batches through `model`: each stream's probabilities."""
    return process_many([(SileroVAD(model), load_pcm(name)) for name in WAVS * 2])


async def test_vad_steps_on_the_engine_find_the_gateways_turns_to_the_sample(client: EngineClient) -> None:
    assert client.has_vad
    local = SileroModel.shared()
    engine_vad = EngineVad(client.vad_endpoint(0), fallback=local)
    (before,) = await client.stats()
    try:
        on_engine, here = await asyncio.to_thread(steps_with, engine_vad), steps_with(local)
    finally:
        engine_vad.close()
    for name, got, expected in zip(WAVS * 2, on_engine, here, strict=True):
        assert np.abs(got - expected).max() < 1e-4, name
        assert TurnDetector().feed(got) == TurnDetector().feed(expected), name
    assert sum(isinstance(e, SpeechStopped) for p in here for e in TurnDetector().feed(p)) >= 16
    (after,) = await client.stats()
    assert after["vad_windows"] - before["vad_windows"] == sum(map(len, here))  # every one: no fallback


async def test_bad_vad_steps_are_refused_and_the_engine_goes_on(client: EngineClient) -> None:
    import zmq

    socket = zmq.Context.instance().socket(zmq.DEALER)
    socket.connect(client.vad_endpoint(0))
    try:
        for x, state in ((b"\0" * 100, b""), (np.zeros((1, 576), "<f4").tobytes(), b"\0" * 8)):
            socket.send_multipart([b"t", x, state])
            assert await asyncio.to_thread(socket.poll, 5000)
            assert socket.recv_multipart()[:2] == [b"t", ipc.INPUT]
        socket.send_multipart([b"a frame too few"])
        state = np.zeros((2, 1, 128), "<f4")
        socket.send_multipart([b"ok", np.zeros((1, 576), "<f4").tobytes(), state.tobytes()])
        assert await asyncio.to_thread(socket.poll, 5000)
        token, answer, probs, _ = socket.recv_multipart()
        assert (token, answer, len(probs)) == (b"ok", ipc.OK, 4)
    finally:
        socket.close(linger=0)


def test_vad_steps_nobody_answers_run_on_the_gateways_model(tmp_path) -> None:
    """An engine that is gone: each step waits for its timeout once, then runs here for retry_s."""
    local = SileroModel.shared()
    gone = EngineVad(f"ipc://{tmp_path}/no-engine.sock", local, timeout_s=0.05, retry_s=60)
    try:
        for got, expected in zip(steps_with(gone), steps_with(local), strict=True):
            assert np.array_equal(got, expected)
    finally:
        gone.close()


async def test_server_vad_turns_through_a_gateway_on_the_engine(supervisor: EngineSupervisor) -> None:
    async with gateway_on(supervisor, vad__device="engine") as gateway:
        before = (await gateway.gateway.speech.loaded.stats())[0]["vad_windows"]
        ends, _ = await turn_ends(gateway, load_pcm(PAUSED), SPEECH_END, type="server_vad", silence_duration_ms=500)
        assert len(ends) == 2 and abs(ends[0] - PAUSE_START) <= 150 and abs(ends[1] - SPEECH_END) <= 150
        after = (await gateway.gateway.speech.loaded.stats())[0]["vad_windows"]
        assert after - before >= SPEECH_END // 32  # the session's windows were stepped in the engine
