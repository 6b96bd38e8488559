"""Capacity and draining on one gateway: refusal before the upgrade, /readyz, the capacity metrics, and a
drain's notice, 1001 close and early end. (tests/server/test_balancer.py does the same through nginx, by SIGTERM.)"""

from __future__ import annotations

import asyncio
import re
from typing import Any

import orjson
import pytest
import websockets

from tests.conftest import Served, connect, load_pcm, silence, types
from tests.helpers.http import http


def url(gateway: Served, path: str) -> str:
    return f"http://127.0.0.1:{gateway.port}{path}"


async def readyz(gateway: Served) -> tuple[int, dict[str, Any]]:
    status, _, body = await http("GET", url(gateway, "/readyz"))
    return status, orjson.loads(body)


async def refusal(gateway: Served) -> tuple[int, dict[str, str], dict[str, Any]]:
    """A WebSocket handshake that the gateway must refuse: (status, headers, JSON body)."""
    with pytest.raises(websockets.InvalidStatus) as refused:
        async with websockets.connect(f"ws://127.0.0.1:{gateway.port}/v1/realtime"):
            pass
    response = refused.value.response
    return response.status_code, dict(response.headers), orjson.loads(response.body)


def metric(text: str, name: str) -> float | None:
    found = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
    return float(found.group(1)) if found else None


async def test_a_full_gateway_refuses_before_the_upgrade_and_says_so(start_gateway):
    gateway = await start_gateway(server__max_sessions=1)
    assert await readyz(gateway) == (200, {"status": "ready", "reason": None, "sessions": 0, "session_slots_free": 1,
                                           "engine_streams_free": None, "draining": False})
    async with connect(gateway):
        status, headers, body = await refusal(gateway)
        assert (status, body["error"]["code"], body["error"]["type"]) == (503, "session_limit_reached", "server_error")
        assert headers["retry-after"] == "1"
        assert await readyz(gateway) == (503, {"status": "not_ready", "reason": "full", "sessions": 1,
                                               "session_slots_free": 0, "engine_streams_free": None,
                                               "draining": False})
        _, _, text = await http("GET", url(gateway, "/metrics"))
        metrics = text.decode()
        assert (metric(metrics, "gateway_sessions"), metric(metrics, "gateway_session_slots_free"),
                metric(metrics, "gateway_draining")) == (1, 0, 0)
        # The echo responder has no TTS engine: no stream cap to report.
        assert "gateway_engine_streams_free" not in metrics
    for _ in range(50):  # the slot comes back once the session has closed on the server
        if gateway.gateway.capacity.sessions == 0:
            break
        await asyncio.sleep(0.02)
    assert (await readyz(gateway))[0] == 200
    async with connect(gateway) as client:
        assert client.received[0]["type"] == "session.created"


async def test_a_draining_session_is_told_then_closed_with_1001(start_gateway):
    gateway = await start_gateway(server__drain_seconds=3.0, server__drain_notice_seconds=2.0)
    async with connect(gateway) as client:
        loop = asyncio.get_running_loop()
        began = loop.time()
        drain = asyncio.create_task(gateway.drain())
        await asyncio.sleep(0.05)
        status, body = await readyz(gateway)
        assert (status, body["reason"], body["draining"]) == (503, "draining", True)
        status, headers, refused = await refusal(gateway)
        assert (status, refused["error"]["code"]) == (503, "server_shutting_down") and "retry-after" in headers
        _, _, text = await http("GET", url(gateway, "/metrics"))
        assert metric(text.decode(), "gateway_draining") == 1
        # The session goes on meanwhile: a turn is still answered.
        await client.append(load_pcm("one_sentence.wav") + silence(800), chunk_ms=100)
        events = await client.until("response.done", timeout=2.5)
        if "error" not in types(events):
            events += await client.until("error", timeout=2.5)
        notice = next(e for e in events if e["type"] == "error")
        assert notice["error"] == {
            "type": "server_error", "code": "server_shutting_down", "param": None, "event_id": None,
            "message": "This server is shutting down: the session closes in 2 s. Start a new session to continue."}
        assert loop.time() - began > 0.9
        with pytest.raises(websockets.ConnectionClosed) as closed:
            await client.quiet(5)
        assert closed.value.rcvd.code == 1001
        await asyncio.wait_for(drain, 2)
    assert not gateway.sessions and gateway.gateway.capacity.sessions == 0


async def test_a_drain_ends_when_the_last_session_does(start_gateway):
    gateway = await start_gateway(server__drain_seconds=60.0, server__drain_notice_seconds=30.0)
    async with connect(gateway) as client:
        drain = asyncio.create_task(gateway.drain())
        assert not (await client.quiet(0.3))  # no notice yet: the end is a minute away
        assert not drain.done()
    await asyncio.wait_for(drain, 2)  # the client left: nothing to wait for


async def test_hurry_ends_every_session_at_once_with_1001(start_gateway):
    gateway = await start_gateway(server__drain_seconds=60.0, server__drain_notice_seconds=30.0)
    async with connect(gateway) as first, connect(gateway) as second:
        drain = asyncio.create_task(gateway.drain())
        await asyncio.sleep(0.05)
        gateway.gateway.hurry()
        await asyncio.wait_for(drain, 3)
        for client in (first, second):
            with pytest.raises(websockets.ConnectionClosed) as closed:
                await client.quiet(2)
            assert closed.value.rcvd.code == 1001
            assert not [e for e in client.received if e["type"] == "error"]  # no "closes in N s" that is untrue


async def test_a_draining_webrtc_call_is_told_on_its_data_channel_then_hung_up(start_gateway):
    pytest.importorskip("aiortc")
    from tests.helpers.webrtc import RtcClient, session_count  # noqa: PLC0415 - aiortc is an optional extra

    gateway = await start_gateway(webrtc__enabled=True, server__drain_seconds=1.5, server__drain_notice_seconds=1.0)
    client = RtcClient(f"http://127.0.0.1:{gateway.port}")
    try:
        await client.connect()
        await client.until("session.created")
        assert await session_count(gateway, 1) == 1
        drain = asyncio.create_task(gateway.drain())
        notice = (await client.until("error", timeout=3))[-1]
        assert (notice["error"]["code"], notice["error"]["type"]) == ("server_shutting_down", "server_error")
        await asyncio.wait_for(drain, 3)
        assert not gateway.sessions and not gateway.webrtc.calls and gateway.gateway.capacity.sessions == 0
        for _ in range(100):  # the hang-up reaches the client's side too
            if client.channel.readyState == "closed":
                break
            await asyncio.sleep(0.05)
        assert client.channel.readyState == "closed"
    finally:
        await client.close()
