"""/healthz reports each backend (reachable, last error, latency) and "degraded" while one is down; /readyz stays
about capacity unless [server] ready_requires_backends; a turn that fails on a backend has it checked at once."""

from __future__ import annotations

import asyncio
import logging
import urllib.error
import urllib.request
from typing import Any

import orjson
import pytest

from bench.fake_openai import FakeOpenAI
from bench.launcher import free_port
from gateway.responders.pipeline import BridgeSettings, PipelineResponder
from gateway.responders.remote import LlmClient
from gateway.responders.tone_tts import ToneEngine
from tests.conftest import StartGateway, connect, load_pcm, silence


def pipeline(llm_url: str) -> PipelineResponder:
    return PipelineResponder(LlmClient(llm_url, "llm-test", timeout_s=2), ToneEngine(first_audio_ms=0),
                             BridgeSettings(10, 80))


async def get(port: int, path: str) -> tuple[int, dict[str, Any], bytes]:
    def call() -> tuple[int, dict[str, Any], bytes]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as answer:
                body = answer.read()
                return answer.status, orjson.loads(body), body
        except urllib.error.HTTPError as error:
            body = error.read()
            return error.code, orjson.loads(body), body

    return await asyncio.to_thread(call)


async def until_health(port: int, condition, timeout: float = 10.0) -> dict[str, Any]:
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        body = (await get(port, "/healthz"))[1]
        if condition(body) or asyncio.get_running_loop().time() > deadline:
            return body
        await asyncio.sleep(0.05)


async def test_a_dead_llm_makes_healthz_degraded_and_recovers(start_gateway: StartGateway,
                                                              caplog: pytest.LogCaptureFixture):
    caplog.set_level(logging.INFO, logger="gateway.runtime.health")
    llm_port = free_port()
    async with FakeOpenAI() as stt:
        gateway = await start_gateway(pipeline(f"http://127.0.0.1:{llm_port}/v1"), stt__base_url=stt.base_url,
                                      stt__model="whisper-test", server__backend_check_s=0.2)
        # Both checked (they are checked side by side: the refused one is often told first).
        body = await until_health(gateway.port, lambda b: b["backends"]["llm"]["reachable"] is False
                                  and b["backends"]["stt"]["reachable"] is not None)
        status, _, raw = await get(gateway.port, "/healthz")
        assert status == 200 and body["status"] == "degraded"  # alive: a liveness probe must not restart it
        assert body["backends"]["llm"] | {"latency_ms": 0, "checked_at": 0} == {
            "model": "llm-test", "remote": True, "reachable": False, "last_error": "connection refused",
            "latency_ms": 0, "checked_at": 0}
        assert body["backends"]["stt"]["reachable"] is True and body["backends"]["stt"]["latency_ms"] > 0
        assert body["backends"]["tts"] == {"model": "tone (a test signal, no speech)", "remote": False,
                                           "reachable": True, "latency_ms": None, "last_error": None,
                                           "checked_at": None}
        assert str(llm_port).encode() not in raw and stt.base_url.encode() not in raw  # public: no addresses
        ready = await get(gateway.port, "/readyz")
        assert ready[0] == 200 and ready[1]["reason"] is None  # about capacity only, by default

        # The LLM server comes up: the next check sees it.
        async with FakeOpenAI(port=llm_port):
            body = await until_health(gateway.port, lambda b: b["status"] == "ok")
            assert body["backends"]["llm"]["reachable"] is True
            assert body["backends"]["llm"]["last_error"] == "connection refused"  # kept: it was down
    logged = [r.getMessage() for r in caplog.records]
    assert logged == [f"llm backend at http://127.0.0.1:{llm_port}/v1/ is not reachable: connection refused; turns "
                      "will fail until it answers", f"llm backend at http://127.0.0.1:{llm_port}/v1/ answers again"]


async def test_readyz_can_require_the_backends(start_gateway: StartGateway):
    gateway = await start_gateway(pipeline(f"http://127.0.0.1:{free_port()}/v1"),
                                  server__ready_requires_backends=True)
    await until_health(gateway.port, lambda b: b["status"] == "degraded")
    status, body, _ = await get(gateway.port, "/readyz")
    assert (status, body["status"], body["reason"]) == (503, "not_ready", "backend unreachable: llm")


async def test_a_turn_that_fails_on_a_backend_has_it_checked_at_once(start_gateway: StartGateway):
    """With no periodic checks, the servers going away shows in /healthz right after the turn they failed."""
    fake = FakeOpenAI()
    await fake.start()
    gateway = await start_gateway(pipeline(fake.base_url), stt__base_url=fake.base_url, stt__model="whisper-test",
                                  server__backend_check_s=0)
    body = await until_health(gateway.port, lambda b: b["backends"]["llm"]["checked_at"])
    assert body["status"] == "ok"
    await fake.stop()
    await asyncio.sleep(0.5)
    assert (await get(gateway.port, "/healthz"))[1]["status"] == "ok"  # nobody checked since
    async with connect(gateway) as client:
        await client.append(load_pcm("one_sentence.wav") + silence(800))
        done = (await client.until("response.done", timeout=20))[-1]["response"]
    assert done["status"] == "failed"
    body = await until_health(gateway.port, lambda b: b["status"] == "degraded", 3)
    assert body["backends"]["stt"]["reachable"] is False and body["backends"]["llm"]["reachable"] is False
