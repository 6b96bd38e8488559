"""`python -m gateway serve --workers 2` as a real subprocess on a loopback port, its sessions opened by the
openai SDK: sessions land on both workers, /metrics of any worker counts them all, a worker killed outright
is started again and the gateway goes on, SIGTERM ends it all; with [engine] mode = "process" both workers
speak through the one engine process the parent started; `--workers auto` is 1 unless a GPU engine runs in
engine processes."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.conftest import Client, audio_of, connect, load_pcm, silence
from tests.fake_openai import FakeOpenAI
from tests.helpers.workers import Gateway, engine_processes, gone, serve
from tests.paths import TINY_CHECKPOINT

pytestmark = pytest.mark.slow  # `serve --workers 2` in subprocesses

FIXTURE = TINY_CHECKPOINT


@contextlib.asynccontextmanager
async def sessions(gateway: Gateway, count: int) -> AsyncIterator[list[tuple[Client, int]]]:
    """`count` sessions held open at once, each with the worker it landed on."""
    async with contextlib.AsyncExitStack() as stack:
        opened = []
        for _ in range(count):
            client = await stack.enter_async_context(connect(SimpleNamespace(port=gateway.port)))
            opened.append((client, await gateway.worker_of(client.received[0]["session"]["id"])))
        yield opened


async def test_workers_share_the_port_the_count_and_the_metrics_and_a_killed_one_comes_back(tmp_path: Path) -> None:
    async with serve(tmp_path, GATEWAY_RESPONDER_KIND="echo") as gateway:
        async with sessions(gateway, 12) as first:
            workers = [worker for _, worker in first]
            # The parent hands each connection to the worker with fewer sessions: six each.
            assert workers.count(0) == workers.count(1) == 6, workers
            # One worker's /metrics counts both workers' sessions: the live gauges added up, and the shared count.
            assert await gateway.metric("gateway_active_sessions") == 12
            assert await gateway.metric("gateway_sessions") == 12
            # /healthz from whichever worker answers: the gateway's total, and each worker's share.
            for _ in range(8):
                health = await gateway.healthz()
                assert health["active_sessions"] == 12, health
                assert health["active_sessions_by_worker"] == [workers.count(0), workers.count(1)], health
            # An echo turn on a session of each worker.
            for client, worker in [next(s for s in first if s[1] == w) for w in (0, 1)]:
                speech = load_pcm("one_sentence.wav")
                await client.append(speech + silence(800))
                events = await client.until("response.done", timeout=30)
                assert events[-1]["response"]["status"] == "completed", worker
                assert len(audio_of(events)) > 48 * 500

            pids = gateway.worker_pids()
            os.kill(pids[1], signal.SIGKILL)
            held = workers.count(1)
            await gateway.wait_for(rf"worker 1 \(pid \d+\) exited with status -9 .* holding {held} sessions; restart")
            await gateway.wait_for(r"worker\[1\] gateway\.server\.serve: gateway \S+ ready: open http", 2)
            assert gateway.worker_pids()[1] != pids[1]
            # The killed worker's live gauge is gone and its slot zeroed: the counts are worker 0's sessions.
            assert await gateway.metric("gateway_active_sessions") == workers.count(0)
            assert await gateway.metric("gateway_sessions") == workers.count(0)
            assert (await gateway.healthz())["active_sessions_by_worker"] == [workers.count(0), 0]
            # New sessions work, on both workers again (the restarted one, empty, takes more), and the count adds up.
            async with sessions(gateway, 12) as second:
                placed = [w for _, w in second]
                assert abs(workers.count(0) + placed.count(0) - placed.count(1)) <= 1, placed
                assert await gateway.metric("gateway_active_sessions") == workers.count(0) + 12
                assert await gateway.metric("gateway_sessions") == workers.count(0) + 12

        pids = gateway.worker_pids()
        gateway.process.send_signal(signal.SIGTERM)
        assert gateway.process.wait(30) == 0
        assert all(gone(pid) for pid in pids.values())


@pytest.mark.skipif(not FIXTURE.exists(), reason="the tiny Qwen3-TTS checkpoint is missing")
async def test_two_workers_speak_through_one_engine_process(tmp_path: Path) -> None:
    reply = "Hello world, this is a test."
    async with FakeOpenAI(reply=reply, transcript="Hi.") as fake:
        env = {"GATEWAY_RESPONDER_KIND": "pipeline", "GATEWAY_LLM_BASE_URL": fake.base_url,
               "GATEWAY_STT_BASE_URL": fake.base_url, "GATEWAY_TTS_ENGINE": "qwen3",
               "GATEWAY_ENGINE_CHECKPOINT": str(FIXTURE), "GATEWAY_ENGINE_MODE": "process",
               "GATEWAY_ENGINE_DEVICES": "cpu", "GATEWAY_ENGINE_VOICES": "alloy=vivian",
               "GATEWAY_ENGINE_MAX_FRAMES": "200"}
        async with serve(tmp_path, **env) as gateway:
            assert len(engine_processes(gateway.process.pid)) == 1
            async with sessions(gateway, 8) as opened:
                by_worker = {worker: client for client, worker in opened}
                assert set(by_worker) == {0, 1}

                async def turn(client: Client) -> list[dict]:
                    await client.append(load_pcm("one_sentence.wav") + silence(800), chunk_ms=100)
                    return await client.until("response.done", timeout=90)

                for events in await asyncio.gather(*(turn(client) for client in by_worker.values())):
                    assert events[-1]["response"]["status"] == "completed"
                    spoken = "".join(e["delta"] for e in events
                                     if e["type"] == "response.output_audio_transcript.delta")
                    assert spoken.strip() == reply
                    assert len(audio_of(events)) >= 48 * 80 * 4
            gateway.process.send_signal(signal.SIGTERM)
            assert gateway.process.wait(60) == 0
            assert not engine_processes(gateway.process.pid)  # stopped last, by the parent


def test_the_worker_count_auto_is_one_unless_a_gpu_engine_runs_in_engine_processes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from gateway.config import ConfigError
    from gateway.server import workers
    from tests.conftest import make_config

    monkeypatch.setattr(workers, "cpu_count", lambda: 16)
    assert workers.worker_count(make_config(tts__engine="tone")) == 1  # auto, no GPU engine: one process
    assert workers.worker_count(make_config(tts__engine="tone", server__workers=3)) == 3
    engines = {"tts__engine": "qwen3", "engine__mode": "process", "engine__endpoints": "ipc:///a,ipc:///b"}
    assert workers.worker_count(make_config(**engines)) == 16 - 2 * 2  # two cores per engine process
    on_cpu = {"engine__endpoints": "", "engine__checkpoint": "x", "engine__devices": "cpu"}
    assert workers.worker_count(make_config(**engines | on_cpu)) == 1
    with pytest.raises(ConfigError, match='mode = "process"'):
        workers.worker_count(make_config(tts__engine="qwen3", engine__checkpoint="x", server__workers=2))
    with pytest.raises(ConfigError, match="server.workers"):
        workers.worker_count(make_config(server__workers=-1))
