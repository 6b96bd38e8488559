"""`python -m gateway serve --workers 2` as a real subprocess on a loopback port, its sessions opened by the
openai SDK: sessions land on both workers, /metrics of any worker counts them all, a worker killed outright
is started again and the gateway goes on, SIGTERM ends it all; with [engine] mode = "process" both workers
speak through the one engine process the parent started; `--workers auto` is 1 unless a GPU engine runs in
engine processes."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import websockets

from bench.fake_openai import FakeOpenAI
from gateway.server.certs import make_certificate
from tests.conftest import Client, audio_of, connect, load_pcm, silence
from tests.helpers.http import seconds_until_closed
from tests.helpers.workers import Gateway, engine_processes, gone, launch, serve
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


async def echo_turn(client: Client) -> list[dict]:
    await client.append(load_pcm("one_sentence.wav") + silence(800))
    return await client.until("response.done", timeout=30)


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
            # An echo turn on a session of each worker, both at once: each echo takes its speech's time.
            pair = [next(s for s in first if s[1] == w) for w in (0, 1)]
            turns = await asyncio.gather(*(echo_turn(client) for client, _ in pair))
            for (_, worker), events in zip(pair, turns, strict=True):
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


async def open_session(port: int, held: list[websockets.ClientConnection]) -> str:
    """'served' (session.created came, the connection is kept in `held`), 'refused' (a 503 with OpenAI's error
    body) or what went wrong: the connection was lost."""
    try:
        ws = await websockets.connect(f"ws://127.0.0.1:{port}/v1/realtime", open_timeout=30)
    except websockets.InvalidStatus as exc:
        error = json.loads(exc.response.body)["error"]
        return "refused" if exc.response.status_code == 503 and error["message"] and error["type"] else repr(exc)
    except (OSError, TimeoutError, websockets.WebSocketException) as exc:
        return repr(exc)
    held.append(ws)
    try:
        event = json.loads(await asyncio.wait_for(ws.recv(), 30))
    except (TimeoutError, websockets.WebSocketException) as exc:
        return repr(exc)
    return "served" if event["type"] == "session.created" else repr(event)


async def test_connections_handed_to_a_worker_as_it_is_killed_are_served_by_the_other(tmp_path: Path) -> None:
    """The parent keeps each connection until a worker has adopted it. Worker 0 is stopped (it adopts nothing)
    while sessions arrive, half of them handed to it, and then killed; more arrive as it dies. Every one is
    served by worker 1 or refused with a 503, none lost."""
    async with serve(tmp_path, GATEWAY_RESPONDER_KIND="echo") as gateway:
        pid = gateway.worker_pids()[0]
        held: list[websockets.ClientConnection] = []
        os.kill(pid, signal.SIGSTOP)
        try:
            first = [asyncio.create_task(open_session(gateway.port, held)) for _ in range(8)]
            await asyncio.sleep(1.0)
        finally:
            os.kill(pid, signal.SIGKILL)
        second = []
        for _ in range(8):  # while it dies and is reaped
            second.append(asyncio.create_task(open_session(gateway.port, held)))
            await asyncio.sleep(0.02)
        outcomes = await asyncio.gather(*first, *second)
        for ws in held:
            await ws.close()
        assert all(outcome in ("served", "refused") for outcome in outcomes), outcomes
        assert outcomes.count("served") == 16  # room enough: none was refused either
        assert re.search(r"worker 0 is gone: \d+ connection\(s\) it had not adopted go to the others", gateway.text())
        await gateway.wait_for(r"worker 0 \(pid \d+\) exited with status -9")


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
    assert workers.worker_count(make_config(**engines, server__max_sessions=5000)) == 16 - 2 * 2  # two cores
    assert workers.worker_count(make_config(**engines, server__max_sessions=250)) == 3  # 100 sessions a worker
    config = make_config(**engines)  # max_sessions auto: 1000 a GPU engine process
    assert (workers.worker_count(config), config.server.max_sessions) == (16 - 2 * 2, 2000)
    on_cpu = {"engine__endpoints": "", "engine__checkpoint": "x", "engine__devices": "cpu"}
    assert workers.worker_count(make_config(**engines | on_cpu)) == 1
    with pytest.raises(ConfigError, match='mode = "process"'):
        workers.worker_count(make_config(tts__engine="qwen3", engine__checkpoint="x", engine__mode="thread",
                                         server__workers=2))
    with pytest.raises(ConfigError, match="server.workers"):
        workers.worker_count(make_config(server__workers=-1))


def test_the_defaults_size_a_host_by_its_cores_gpus_and_sessions(monkeypatch: pytest.MonkeyPatch) -> None:
    """[engine] mode "auto", [server] workers and max_sessions 0: one engine process per GPU, 1000 sessions a GPU
    and a worker per 100 of them, at most one per core less two per GPU, with no option; on a host without a
    GPU, one process with the engine in a thread and 1000 sessions."""
    from engine import supervisor
    from gateway.server import workers
    from tests.conftest import make_config

    monkeypatch.setattr(workers, "cpu_count", lambda: 64)
    monkeypatch.setattr(supervisor, "gpu_count", lambda python=None: 4)
    config = make_config(tts__engine="qwen3", engine__checkpoint="x")
    assert (workers.worker_count(config), config.server.max_sessions) == (40, 4000)  # 1000 a GPU, 100 a worker
    assert (config.engine.mode, config.engine.devices) == ("process", "cuda:0,cuda:1,cuda:2,cuda:3")
    config = make_config(tts__engine="qwen3", engine__checkpoint="x", server__max_sessions=1500)
    assert (workers.worker_count(config), config.server.max_sessions) == (15, 1500)  # the operator's limit holds
    config = make_config(tts__engine="qwen3", engine__checkpoint="x", server__workers=8)
    assert (workers.worker_count(config), config.server.max_sessions) == (8, 4000)
    config = make_config(tts__engine="qwen3", engine__checkpoint="x", server__max_sessions=100_000)
    assert workers.worker_count(config) == 64 - 2 * 4  # the cores are the limit
    monkeypatch.setattr(supervisor, "gpu_count", lambda python=None: 0)
    config = make_config(tts__engine="qwen3", engine__checkpoint="x")
    assert workers.worker_count(config) == 1 and config.engine.mode == "thread"
    assert config.server.max_sessions == 1000
    config = make_config(tts__engine="qwen3", engine__checkpoint="x", server__workers=3)  # several: processes
    assert workers.worker_count(config) == 3
    assert workers.engine_mode(config) == "process" and config.engine.devices == "auto"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
async def test_a_signal_while_the_workers_start_stops_them_all_quietly(tmp_path: Path, sig: int) -> None:
    """Stopped while its workers start: those still starting end without a traceback (SIGINT would interrupt
    their imports), none is started after the signal, and the parent exits."""
    gateway = launch(tmp_path, 3)
    process = gateway.process
    try:
        await gateway.wait_for(r"worker 0 started", timeout=60)
        process.send_signal(sig)
        assert await asyncio.to_thread(process.wait, 60) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    text = gateway.text()
    assert "Traceback" not in text and "Fatal Python error" not in text, text
    assert not re.search(r"stopping the workers(.|\n)*worker \d started", text), text
    assert all(gone(pid) for pid in gateway.worker_pids().values())


async def test_a_signal_while_the_engine_process_loads_stops_the_gateway_once_it_has(tmp_path: Path) -> None:
    """SIGTERM while the engine process loads: the parent waits for it, then stops it in order and exits 0,
    starting no worker; it used to die at once, leaving the engine process a traceback and its socket."""
    gateway = launch(tmp_path, 2, GATEWAY_RESPONDER_KIND="echo", GATEWAY_TTS_ENGINE="qwen3",
                     GATEWAY_ENGINE_CHECKPOINT=str(FIXTURE), GATEWAY_ENGINE_MODE="process",
                     GATEWAY_ENGINE_DEVICES="cpu", GATEWAY_ENGINE_VOICES="alloy=vivian")
    process, log = gateway.process, gateway.log
    try:
        while not engine_processes(process.pid):
            assert process.poll() is None, log.read_text()
            await asyncio.sleep(0.05)
        process.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(process.wait, 120) == 0, log.read_text()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    text = log.read_text()
    assert "Traceback" not in text and "worker 0 started" not in text, text
    assert not engine_processes(process.pid)


async def test_a_silent_tls_connection_is_closed_after_the_head_deadline(tmp_path: Path) -> None:
    """Under `serve --workers N` a TLS handshake gets [server] request_head_timeout_s, not asyncio's 60 s: a
    connection that never starts one does not hold its worker's file descriptor for a minute."""
    _, cert, key = make_certificate(tmp_path / "tls")
    async with serve(tmp_path, GATEWAY_SERVER_TLS_CERT=str(cert), GATEWAY_SERVER_TLS_KEY=str(key),
                     GATEWAY_SERVER_REQUEST_HEAD_TIMEOUT_S="1") as gateway:
        assert await seconds_until_closed(gateway.port) < 10
